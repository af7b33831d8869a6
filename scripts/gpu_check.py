r"""One command that proves the GPU path on one lent GPU (issue 55), in one run of under 6 minutes.

Usage::

    python scripts/gpu_check.py                       # on a GPU; writes to $OUT or a temp folder
    python scripts/gpu_check.py --smoke --out DIR     # the same code on the CPU at toy sizes
    python scripts/gpu_check.py --parts tutorial_10x10/netket,j1j2_6x6/netket   # a rerun

On the GPU machine, with the wheels of ``scripts/gpu_wheels.sh`` carried in ``.whl``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \
        PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py

Parts, in the order they run (a part that fails, times out or finds netket missing is recorded
as an error string in the JSON and the next part runs; each runs in a child process of its own,
so that a hang is killed at its timeout, a CUDA error cannot poison the next part, and the peak
memory is the row's own):

1. ``tests.cuda``: ``pytest -m cuda`` over the test files that carry the mark; counts from
   JUnit XML. On a CPU every one skips itself: reported as skipped, no CUDA.
2. rows, `vitqs.benchmark.time_steps` (``--n-warmup`` 2 then ``--n-iter`` 3 timed steps,
   medians per phase, peak ``torch.cuda.max_memory_allocated`` reset at the row's start):
   ``j1j2_6x6/eager`` (configs/benchmarks/j1j2_6x6.yaml as it stands: 4,096 samples in 4,096
   chains, 8 copies) and ``tutorial_10x10/eager`` (netket's tutorial shape: 10×10 J1-J2, 4
   layers, d_model 60, 10 heads, 2×2 patches; 4,096 samples in 4,096 chains, one sweep of 100
   exchange moves, minSR);
3. ``tutorial_10x10/netket``: netket's ViT (``netket_peer.make_driver`` with
   ``bench_step.netket_options``, the same warm-up and timed steps; peak: jax's
   ``peak_bytes_in_use``);
4. ``compiled_equals_eager``: each problem's float64 ViT on the device, random parameters,
   256 random configurations, the compiled single pass against the eager one (limit 1e-12),
   again after an in-place update; at the same time ``tests.compiled_vs_eager``, the suite's
   compiled-vs-eager tests (tests/models/test_compiled.py, which run on the CPU);
5. ``j1j2_6x6/compiled``, ``tutorial_10x10/compiled``: the rows with compiled chains (what a
   run of 600 s or more chooses on CUDA, `build.compiled_chains`);
6. ``j1j2_6x6/float32``, ``tutorial_10x10/float32``: compiled chains and float32 local
   energies (``sampler.local_energy_dtype``);
7. ``j1j2_6x6/netket``, and ``j1j2_6x6/bare``: our ViT as netket's peer runs its own, one
   network without the average over translations and spin flip (``MODES``), compiled chains
   (their Metropolis steps as compiled graphs, `vmc/compiled_sweep.py`) against netket's
   jitted sampler.

Then the checks (`criteria`): CUDA tests pass, compiled = eager, the fastest of each problem's
rows (eager, compiled, float32) ≤ 1 s (6×6) and ≤ 2 s (10×10) per step, ≤ 0.5 × netket's step
on the same card (the bare row against it where that ran: the same work), and (informative)
the 10×10 row against netket's published 7.51 s on one A100. A time guard (``--budget``,
default 400 s) skips the parts that would start too late and says so.
``--smoke`` shrinks both problems to a 4×4 lattice and a one-layer ViT on the CPU, 1 + 1 steps,
netket on the 10×10 toy only, and skips ``tests.compiled_vs_eager``. Written to ``--out``:
``gpu_check.json`` (after every stage, so a killed run keeps what it measured),
``gpu_check.md`` (the table, also printed) and ``gpu_check.log`` (the children's output).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the check measures this checkout, not an installed copy of vitqs that may be older
for _path in (ROOT / "scripts", ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

SIX_BY_SIX = "configs/benchmarks/j1j2_6x6.yaml"
TUTORIAL_10X10 = {
    # netket's ViT tutorial (Rende & Viteritti): J1-J2 at J2 = 0.5 on the 10×10 torus
    "name": "tutorial_10x10",
    "seed": 0,
    "lattice": {"shape": [10, 10], "pbc": True},
    "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "J2": 0.5, "sign_rule": False, "total_sz": 0},
    "model": {
        "patch_size": 2,
        "d_model": 60,
        "heads": 10,
        "layers": 4,
        "translation_invariant": True,
    },
    # one sweep of 100 exchange moves (one a site) per chain and step, one sample per chain
    "sampler": {"n_samples": 4096, "n_chains": 4096, "n_discard": 0},
    "optimizer": {"lr": 0.01, "diag_shift": 1.0e-4},  # 4,096 samples: minSR's kernel
}
PROBLEMS = ("j1j2_6x6", "tutorial_10x10")
_TOY_MODEL = ["lattice.shape=[4, 4]", "model.d_model=8", "model.heads=2", "model.layers=1"]
_TOY_SAMPLER = ["sampler.n_samples=32", "sampler.n_chains=32"]
TOY = {
    "j1j2_6x6": [*_TOY_MODEL, *_TOY_SAMPLER],
    "tutorial_10x10": [*_TOY_MODEL, *_TOY_SAMPLER],
}
EQUALITY_ATOL = 1e-12
COMPILED_TESTS = ("tests/models/test_compiled.py", "-k", "equals_the_eager or the_eager_chains")


def _parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder (default: $OUT, else a temp one)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU, in seconds")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds for all parts")
    parser.add_argument("--n-warmup", type=int, default=None, help="default 2 (1 with --smoke)")
    parser.add_argument("--n-iter", type=int, default=None, help="default 3 (1 with --smoke)")
    parser.add_argument("--parts", default=None, help="comma-separated part names (default all)")
    parser.add_argument("--netket-phases", action="store_true", help="netket's phases too (slow)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # JSON spec of a part
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True)
class Mode:
    """A row's mode: the overrides it adds to its problem's config, and whether its chains
    are compiled."""

    overrides: tuple[str, ...] = ()
    compiled: bool = True


MODES = {
    "eager": Mode(compiled=False),
    "compiled": Mode(),
    # netket's ViT as its peer runs it: one network, no average over translations or spin flip
    "bare": Mode(("model.symmetrize=none", "model.sector=null")),
    # compiled chains and the local energies' amplitude ratios from a float32 copy
    "float32": Mode(("sampler.local_energy_dtype=float32",)),
}
# samples per chunk of netket's local energies: the 10x10 unchunked asked jax for 73 GiB at
# once and stopped on an H200 (139 GiB)
NETKET_CHUNK = {"tutorial_10x10": 512}
# with it, XLA's Triton GEMM for the 10x10's float64 Jacobian failed on an H200 (jax 0.11.2):
# "No candidates could be compiled" while autotuning, "No supported config found" without
# autotuning (2026-11-28); cuBLAS takes those GEMMs instead. Not yet run on a GPU.
NETKET_XLA_FLAGS = {"tutorial_10x10": "--xla_gpu_enable_triton_gemm=false"}


def problem_config(problem: str, *, smoke: bool, mode: str = "eager"):
    """Returns the validated config of ``problem`` (its toy form with ``smoke``: 4×4, one layer,
    on the CPU) in one of the `MODES`."""
    from vitqs.config import from_dict
    from vitqs.yamlfile import apply_overrides, read_yaml

    data = read_yaml(ROOT / SIX_BY_SIX) if problem == "j1j2_6x6" else TUTORIAL_10X10
    overrides = list(MODES[mode].overrides)
    overrides += [*TOY[problem], "device=cpu", "threads=1"] if smoke else ["device=cuda"]
    return from_dict(apply_overrides(data, overrides), default_name=problem)


def netket_n_params(config) -> int:
    """Returns the parameter count of netket's tutorial ViT (`netket_peer.ViT`) of the config's
    shape, without netket: embedding ``a·d + d`` (``a`` sites per patch), per layer two
    LayerNorms ``4d``, the attention table ``heads · P`` (``P`` patches), V and W ``2(d² + d)``
    and the MLP ``8d² + 5d``; the head's three LayerNorms ``6d`` and two ``d × d`` Dense layers
    with biases. 155,620 for the tutorial's 10×10 shape; the netket rows report netket's own."""
    model, shape = config.model, config.lattice.shape
    patch = model.patch_size[0] if isinstance(model.patch_size, list) else model.patch_size
    area, n_patches = patch ** len(shape), 1
    for extent in shape:
        n_patches *= extent // patch
    d = model.d_model
    block = 4 * d + model.heads * n_patches + 2 * (d * d + d) + 8 * d * d + 5 * d
    return area * d + d + model.layers * block + 6 * d + 2 * (d * d + d)


# ---------------------------------------------------------------------------------------------
# Children: one part each, run as `gpu_check.py --child SPEC --result FILE`


def _child_ours(spec: dict) -> dict:
    """Returns the `time_steps` row of one problem, eager or with compiled chains."""
    import warnings

    from vitqs.benchmark import time_steps

    config = problem_config(spec["problem"], smoke=spec["smoke"], mode=spec["mode"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)  # the compiler's failure is one
        timing = time_steps(
            config,
            n_warmup=spec["n_warmup"],
            n_iter=spec["n_iter"],
            compile_chains=MODES[spec["mode"]].compiled,
        )
    messages = list(dict.fromkeys(str(w.message) for w in caught))
    for message in messages:
        print(f"warning: {message}", file=sys.stderr)
    failed = [message for message in messages if "torch.compile failed" in message]
    return {
        "status": "ok",
        "engine": "vitqs",
        "n_params": timing["n_params"],
        "n_params_netket_shape": netket_n_params(config),
        "n_samples": timing["n_samples"],
        "seconds": {**timing["seconds"], "total": timing["seconds_per_iter"]},
        "seconds_per_iter": timing["seconds_per_iter"],
        "peak_memory_mib": timing["peak_memory_mib"],
        "peak_memory_of": "torch.cuda.max_memory_allocated"
        if timing["device"].startswith("cuda")
        else "process max RSS (CPU)",
        "compile_seconds": timing["compile_seconds"],
        "compile_error": failed[0] if failed else None,
        "method_used": timing["method_used"],
        "device": timing["device"],
        "timing": timing,
    }


def _child_netket(spec: dict) -> dict:
    """Returns netket's ViT steps on one problem: setup, then ``n_warmup`` untimed and
    ``n_iter`` timed steps of ``netket_peer._step`` (the body of the peer's own runs)."""
    import bench_step
    import netket_peer

    reason = netket_peer.netket_available()
    if reason is not None:
        return {"status": "skipped", "error": f"netket is not available: {reason}"}
    config = problem_config(spec["problem"], smoke=spec["smoke"])
    resolved = config.to_dict()
    system = {"lattice": resolved["lattice"], "hamiltonian": resolved["hamiltonian"]}
    options = bench_step.netket_options(config)
    options["chunk_size"] = NETKET_CHUNK.get(spec["problem"])
    start = time.perf_counter()
    parts = netket_peer.make_driver(system, **options)
    seconds_setup = time.perf_counter() - start
    steps = []
    for _ in range(spec["n_warmup"] + spec["n_iter"]):
        start = time.perf_counter()
        netket_peer._step(parts["driver"])
        steps.append(time.perf_counter() - start)
    per_iter = statistics.median(steps[spec["n_warmup"] :])
    phases = None
    if spec.get("netket_phases"):
        phases = netket_peer.phase_timings(system, n_repeats=spec["n_iter"], **options)["seconds"]
    return {
        "status": "ok",
        "engine": "netket",
        "n_params": int(parts["vstate"].n_parameters),
        "n_params_netket_shape": netket_n_params(config),
        "n_samples": int(parts["vstate"].n_samples),
        "seconds": {"total": per_iter, **({} if phases is None else {"netket": phases})},
        "seconds_per_iter": per_iter,
        "seconds_setup": seconds_setup,
        "compile_seconds": sum(steps[: spec["n_warmup"]]) - spec["n_warmup"] * per_iter,
        **_jax_peak_memory(),
        "method_used": parts["method_used"],
        "sampler_used": parts["sampler_used"],
        "device": str(netket_peer.jax.devices()[0]),
        "netket_version": netket_peer.nk.__version__,
        "model_note": "netket's tutorial ViT: no symmetrization, float64 chains",
        "chunk_size": options["chunk_size"],
        "xla_flags": os.environ.get("XLA_FLAGS"),
    }


def _jax_peak_memory() -> dict:
    import resource

    import netket_peer

    stats = netket_peer.jax.devices()[0].memory_stats()  # None on the CPU
    if stats and "peak_bytes_in_use" in stats:
        peak, of = stats["peak_bytes_in_use"] / 2**20, "jax peak_bytes_in_use"
    else:
        peak, of = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10, "process max RSS"
    return {"peak_memory_mib": peak, "peak_memory_of": of}


def _randomised(network, seed: int, scale: float = 0.05):
    """Adds ``scale``-sized noise to every parameter, so that no term of the pass is zero."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in network.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device))


def _eager(network, x):
    """Returns ``network(x)`` with every compiled ViT pass switched off for the call."""
    from vitqs.models.vit import ViT

    vits = [m for m in network.modules() if isinstance(m, ViT)]
    passes = [vit.compiled for vit in vits]
    for vit in vits:
        vit.compiled = None
    try:
        return network(x)
    finally:
        for vit, compiled in zip(vits, passes, strict=True):
            vit.compiled = compiled


def _child_equality(spec: dict) -> dict:
    """Returns, per problem, the largest |compiled − eager| of the float64 log ψ on the device,
    before and after an in-place parameter update."""
    import warnings

    models = {}
    for problem in PROBLEMS:  # one problem's failure (out of memory, say) leaves the other's
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)  # the compiler's failure is one
                models[problem] = _compiled_against_eager(problem, spec["smoke"])
        except Exception as err:
            models[problem] = {"error": f"{type(err).__name__}: {err}"[:300], "pass": False}
            continue
        failed = [str(w.message) for w in caught if "torch.compile failed" in str(w.message)]
        models[problem]["compile_error"] = failed[0] if failed else None
    return {
        "status": "ok",
        "device": "cpu" if spec["smoke"] else "cuda",
        "dtype": "float64",
        "atol": EQUALITY_ATOL,
        "models": models,
        "pass": all(m["pass"] for m in models.values()),
    }


def _compiled_against_eager(problem: str, smoke: bool) -> dict:
    """Returns ``{max_abs_diff, ..., pass}`` of one problem's float64 network."""
    import torch

    from vitqs.build import build_hamiltonian, build_network
    from vitqs.models.compiled import compile_passes

    config = problem_config(problem, smoke=smoke)  # config.dtype: float64
    hamiltonian = build_hamiltonian(config)
    network = build_network(config, hamiltonian)
    device = next(network.parameters()).device
    generator = torch.Generator().manual_seed(2)
    x = hamiltonian.hilbert.random_states(256, generator).to(device)  # (256, n_sites)
    _randomised(network, seed=1)
    network.requires_grad_(False)  # as the chains' copy
    passes = compile_passes(network)
    diffs = []
    with torch.no_grad():
        for update in range(2):  # the compiled graph sees an in-place update
            log_psi = network(x)
            diffs.append(float((log_psi - _eager(network, x)).abs().max()))
            _randomised(network, seed=3 + update)
    ran = all(p.seconds is not None for p in passes)
    return {
        "max_abs_diff": max(diffs),
        "max_abs_log_psi": float(log_psi.abs().max()),
        "compiled_ran": ran,
        "compile_seconds": sum(p.seconds or 0.0 for p in passes),
        "pass": ran and max(diffs) <= EQUALITY_ATOL,
    }


CHILDREN = {"ours": _child_ours, "netket": _child_netket, "equality": _child_equality}


def _die_with_parent() -> None:
    """Asks Linux to SIGKILL this process when its parent dies: a child runs in a session of its
    own (so that a timeout kills its compile workers too), and would otherwise hold the GPU on
    after the parent is killed at the device's time limit."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's SIGTERM handler only
        pass


# pytest as a child that dies with the parent, as `python -m pytest ARGS` otherwise
PYTEST_CHILD = (
    "import gpu_check, sys; gpu_check._die_with_parent(); import pytest; "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


def _run_child(spec_text: str, result_path: str) -> int:
    _die_with_parent()
    spec = json.loads(spec_text)
    result = CHILDREN[spec["kind"]](spec)
    Path(result_path).write_text(json.dumps(result, default=str))
    return 0


# ---------------------------------------------------------------------------------------------
# The parent: stages, time guard, processes


def _plan(smoke: bool) -> list[list[tuple[str, dict, float]]]:
    """Returns the stages in the order they run, each a list of ``(part, spec, timeout cap
    in seconds)``. A stage's parts run at the same time: only the untimed ones share one (the
    equality part and the suite's compiled-vs-eager tests, which run on the CPU)."""

    def row(problem: str, mode: str, cap: float):
        kind = "netket" if mode == "netket" else "ours"
        return [(f"{problem}/{mode}", {"kind": kind, "problem": problem, "mode": mode}, cap)]

    stages = [[("tests.cuda", {"kind": "pytest"}, 150.0)]]
    stages += [row("j1j2_6x6", "eager", 90), row("tutorial_10x10", "eager", 90)]
    stages += [row("tutorial_10x10", "netket", 150)]
    equality = ("compiled_equals_eager", {"kind": "equality"}, 150.0)
    stages += [[equality, ("tests.compiled_vs_eager", {"kind": "pytest"}, 150.0)]]
    stages += [row("j1j2_6x6", "compiled", 150), row("tutorial_10x10", "compiled", 150)]
    stages += [row("j1j2_6x6", "float32", 150), row("tutorial_10x10", "float32", 150)]
    stages += [row("j1j2_6x6", "netket", 120), row("j1j2_6x6", "bare", 150)]
    if smoke:  # one netket row proves the path on the CPU, where each costs ~20 s of jit
        for name, spec, _ in (part for stage in stages for part in stage):
            if name == "j1j2_6x6/netket":
                spec["skip"] = "--smoke runs netket on the 10x10 toy only"
    return stages


def _run_process(command: list[str], *, timeout: float, log: Path, env: dict) -> int | None:
    """Returns the exit code of ``command`` (its output written to ``log``), None when it ran
    past ``timeout`` and its whole process group was killed."""
    with open(log, "w") as output:
        output.write(f"==== {' '.join(command)}  (timeout {timeout:.0f} s)\n")
        output.flush()
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _LIVE.add(process)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # inductor's compile workers too
            process.wait()
            return None
        finally:
            _LIVE.discard(process)


_LIVE: set[subprocess.Popen] = set()  # the children running now, for the SIGTERM handler


def _on_sigterm(signum, frame):
    """Kills every running child's process group, then exits as killed by ``signum``."""
    for process in list(_LIVE):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sys.exit(128 + signum)


def _child_env(kind: str, problem: str | None = None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "scripts"), *filter(None, [env.get("PYTHONPATH")])]
    )
    if kind == "netket":  # jax would take 75 % of the GPU at start: its peak means nothing then
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        flags = NETKET_XLA_FLAGS.get(problem)
        if flags:
            env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), flags]))
    return env


def _run_part(name: str, spec: dict, *, timeout: float, work: Path) -> dict:
    """Returns one child's result dict, or an error dict saying what went wrong."""
    result_path = work / f"{name.replace('/', '.')}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    log = _log_path(work, name)
    code = _run_process(
        [*command, "--result", str(result_path)],
        timeout=timeout,
        log=log,
        env=_child_env(spec["kind"], spec.get("problem")),
    )
    if code is None:
        return {"status": "error", "error": f"timed out after {timeout:.0f} s (killed)"}
    if code != 0 or not result_path.exists():
        return {"status": "error", "error": f"exit code {code}: {_last_error(log)}"}
    return json.loads(result_path.read_text())


def _log_path(work: Path, name: str) -> Path:
    return work / f"{name.replace('/', '.')}.log"


def _last_error(log: Path) -> str:
    """Returns the last line of the log that names an error (the child's traceback's end)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()[-400:]]
    lines = [line for line in lines if line]
    named = [line for line in lines if "Error" in line or "error" in line]
    return (named or lines or ["no output"])[-1][:300]


def _pytest(name: str, *, smoke: bool, timeout: float, work: Path) -> dict:
    """Returns the counts of one pytest run (JUnit XML), or why it did not run."""
    if name == "tests.compiled_vs_eager":
        if smoke:
            return {"status": "skipped", "error": "--smoke: the CPU suite runs these tests"}
        selection = list(COMPILED_TESTS)
    else:
        selection = ["-m", "cuda", *_cuda_test_files()]
    junit = work / f"{name}.xml"
    command = [sys.executable, "-c", PYTEST_CHILD, "-p", "no:cacheprovider", "-q", "-rfEs"]
    code = _run_process(
        [*command, f"--junitxml={junit}", *selection],
        timeout=timeout,
        log=_log_path(work, name),
        env=_child_env("pytest"),
    )
    if code is None:
        return {"status": "error", "error": f"timed out after {timeout:.0f} s (killed)"}
    counts = _junit_counts(junit) if junit.exists() else {}
    result = {"status": "ok", "returncode": code, "selection": selection, **counts}
    if not counts:
        result.update(status="error", error=f"pytest exit code {code}, no JUnit file")
    elif counts["tests"] == 0:
        result.update(status="error", error=f"pytest exit code {code}: no test selected")
    elif counts["passed"] == 0 and counts["skipped"] == counts["tests"]:
        result.update(status="skipped", error="no CUDA device: every test skipped itself")
    result["pass"] = None if result["status"] != "ok" else code == 0 and counts["passed"] > 0
    return result


def _cuda_test_files() -> list[str]:
    """Returns the test files that carry the cuda mark (a text search: collecting the whole
    suite to select them costs ~10 s)."""
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    return [str(p.relative_to(ROOT)) for p in tests if "mark.cuda" in p.read_text()]


def _junit_counts(path: Path) -> dict:
    """Returns ``tests, passed, failed, errors, skipped`` and the failures' names and first
    message lines from pytest's JUnit XML."""
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    keys = ("tests", "failures", "errors", "skipped")
    counts = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in keys}
    failures = []
    for case in root.iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            message = (bad.get("message") or "").splitlines()[:1]
            failures.append(f"{case.get('classname')}::{case.get('name')}: {''.join(message)}")
    return {
        "tests": counts["tests"],
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "failed": counts["failures"],
        "errors": counts["errors"],
        "skipped": counts["skipped"],
        "failures": failures[:20],
    }


def _environment() -> dict:
    import torch

    import vitqs
    from vitqs.benchmark import machine

    cuda = torch.cuda.is_available()
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None
    versions = {}
    for name in ("jax", "jaxlib", "flax", "optax", "equinox", "netket", "numba", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "machine": machine(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "gpu_memory_gib": memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "vitqs_path": str(Path(vitqs.__file__).parent),
        "versions": versions,
    }


def _guarded_part(name: str, spec: dict, cap: float, left: float, work: Path) -> dict:
    """Returns the result of one part run inside the time left, or skipped by the guard."""
    if "skip" in spec:
        result = {"status": "skipped", "error": spec["skip"]}
    elif left < (5.0 if spec["smoke"] else min(cap, 30.0)):
        result = {"status": "skipped", "error": f"time guard: {left:.0f} s of the budget left"}
    else:
        timeout, started = min(cap, left - 2.0), time.perf_counter()
        try:
            if spec["kind"] == "pytest":
                result = _pytest(name, smoke=spec["smoke"], timeout=timeout, work=work)
            else:
                result = _run_part(name, spec, timeout=timeout, work=work)
        except Exception as err:  # a part never stops the others
            result = {"status": "error", "error": f"{type(err).__name__}: {err}"[:300]}
        result["wall_seconds"] = time.perf_counter() - started
    return result | {key: spec[key] for key in ("problem", "mode") if key in spec}


def _run_stage(stage, common: dict, left: float, work: Path, log) -> dict:
    """Returns ``{part: result}`` of one stage (its parts at the same time); appends their
    output to ``log`` and prints one line per part."""
    with ThreadPoolExecutor(max_workers=len(stage)) as pool:
        futures = {
            name: pool.submit(_guarded_part, name, spec | common, cap, left, work)
            for name, spec, cap in stage
        }
        results = {name: future.result() for name, future in futures.items()}
    for name, result in results.items():
        part_log = _log_path(work, name)
        if part_log.exists():
            log.write(part_log.read_text(errors="replace") + "\n")
        print(f"gpu_check: {name}: {_one_line(result)}", flush=True)
    log.flush()
    return results


def main(argv=None) -> int:
    args = _parse_args(argv)
    if args.child is not None:
        return _run_child(args.child, args.result)
    start = time.perf_counter()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_sigterm)
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_check_"))
    out.mkdir(parents=True, exist_ok=True)
    record = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "budget_seconds": args.budget}
    record |= {"smoke": args.smoke, "environment": _environment()}
    if not args.smoke and record["environment"]["device"] == "cpu":
        print("gpu_check: error: no CUDA device; on a CPU run it with --smoke", file=sys.stderr)
        return 2
    steps = {"n_warmup": 1, "n_iter": 1} if args.smoke else {"n_warmup": 2, "n_iter": 3}
    steps |= {key: value for key in steps if (value := getattr(args, key)) is not None}
    if steps["n_iter"] < 1 or steps["n_warmup"] < 0:
        print(f"gpu_check: error: need --n-iter >= 1, --n-warmup >= 0: {steps}", file=sys.stderr)
        return 2
    record |= {**steps, "parts": {}}
    common = {"smoke": args.smoke, "netket_phases": args.netket_phases, **steps}
    chosen = None if args.parts is None else set(args.parts.split(","))
    with open(out / "gpu_check.log", "w") as log, tempfile.TemporaryDirectory() as work:
        for stage in _plan(args.smoke):
            stage = [part for part in stage if chosen is None or part[0] in chosen]
            if stage:
                left = args.budget - (time.perf_counter() - start)
                record["parts"] |= _run_stage(stage, common, left, Path(work), log)
                record["seconds_total"] = time.perf_counter() - start
                _write(record, out)
    text = _write(record, out)
    print(text)
    print(f"gpu_check: wrote {out / 'gpu_check.json'}, gpu_check.md and gpu_check.log")
    return 0


# ---------------------------------------------------------------------------------------------
# The verdict and the table

# netket's ViT tutorial: 10×10 J1-J2, 155,620 parameters, 4,096 samples, on one A100
PUBLISHED = {"seconds_per_iter": 7.51, "n_params": 155_620, "n_samples": 4096, "card": "A100"}
STEP_LIMITS = {"j1j2_6x6": 1.0, "tutorial_10x10": 2.0}  # seconds per step, either mode
NETKET_RATIO_LIMIT = 0.5  # ours / netket's step on the same card


def _best_row(parts: dict, problem: str) -> tuple[float, str] | None:
    """Returns ``(seconds per step, mode)`` of the fastest of our eager, compiled and float32
    rows, None for none."""
    timed = [
        (parts[f"{problem}/{mode}"]["seconds_per_iter"], mode)
        for mode in ("eager", "compiled", "float32")
        if parts.get(f"{problem}/{mode}", {}).get("status") == "ok"
    ]
    return min(timed) if timed else None


def _check(value, limit, passed, **more) -> dict:
    return {"value": value, "limit": limit, "pass": passed, **more}


def criteria(parts: dict) -> dict:
    """Returns the issue's checks, each ``{value, limit, pass}``: pass None where the part
    that measures it did not run (no CUDA, netket missing, an error, the time guard)."""
    tests = parts.get("tests.cuda", {})
    kinds = ("passed", "failed", "errors", "skipped")
    counts = "; ".join(f"{tests[kind]} {kind}" for kind in kinds if kind in tests)
    checks = {"cuda_tests": _check(counts or tests.get("error"), "all pass", tests.get("pass"))}
    equality = parts.get("compiled_equals_eager", {})
    diffs = [m.get("max_abs_diff") for m in equality.get("models", {}).values()]
    worst = max((d for d in diffs if d is not None), default=None)
    checks["compiled_equals_eager"] = _check(
        worst, EQUALITY_ATOL, equality.get("pass"), device=equality.get("device")
    )
    for problem, limit in STEP_LIMITS.items():
        best = _best_row(parts, problem)
        seconds, mode = best if best else (None, None)
        checks[f"{problem}_step"] = _check(seconds, limit, best and seconds <= limit, row=mode)
        netket = parts.get(f"{problem}/netket", {})
        theirs = netket.get("seconds_per_iter") if netket.get("status") == "ok" else None
        # netket's network is one ViT: against it, ours unsymmetrized where that row ran
        bare = parts.get(f"{problem}/bare", {})
        if bare.get("status") == "ok":
            best = (bare["seconds_per_iter"], "bare")
        ratio = best[0] / theirs if best and theirs else None
        note = None if theirs else netket.get("error", "not run")
        checks[f"{problem}_vs_netket"] = _check(
            ratio,
            NETKET_RATIO_LIMIT,
            None if ratio is None else ratio <= NETKET_RATIO_LIMIT,
            netket_seconds=theirs,
            row=best[1] if best else None,
            note=note,
        )
    best = _best_row(parts, "tutorial_10x10")
    ratio = best[0] / PUBLISHED["seconds_per_iter"] if best else None
    checks["tutorial_10x10_vs_published"] = _check(
        ratio,
        NETKET_RATIO_LIMIT,
        None if ratio is None else ratio <= NETKET_RATIO_LIMIT,
        note="informative: netket's tutorial, 7.51 s per step on one A100, another card",
    )
    return checks


def _verdict(checks: dict) -> str:
    decided = [c["pass"] for name, c in checks.items() if not name.endswith("_published")]
    if any(p is False for p in decided):
        return "fail"
    return "pass" if all(p is True for p in decided) else "incomplete"


def _one_line(result: dict) -> str:
    if result.get("status") != "ok":
        return f"{result.get('status')}: {result.get('error')}"
    if "seconds_per_iter" in result:
        return (
            f"{result['seconds_per_iter']:.3f} s/step, peak {result['peak_memory_mib']:.0f} MiB, "
            f"{result['n_params']:,} params"
        )
    if "passed" in result:
        return f"{result['passed']} passed, {result['failed']} failed, {result['errors']} errors"
    return f"pass={result.get('pass')}"


def _number(value, form: str = ".3f") -> str:
    return "—" if value is None else format(value, form)


def _row_line(name: str, row: dict) -> str:
    seconds = row.get("seconds") or {}
    phases = [_number(seconds.get(p)) for p in ("sampling", "local_energy", "jacobian", "solve")]
    ours = "—" if row.get("engine") == "netket" else _number(row.get("n_params"), ",")
    netket = row.get("n_params") if row.get("engine") == "netket" else None
    netket = _number(netket or row.get("n_params_netket_shape"), ",")
    status = "ok" if row.get("status") == "ok" else f"{row.get('status')}: {row.get('error')}"
    if row.get("compile_error"):
        status = f"compile failed, ran eager: {row['compile_error']}"
    cells = [name, f"{ours} / {netket}", _number(row.get("n_samples"), "d"), *phases]
    cells += [_number(row.get("seconds_per_iter")), _number(row.get("compile_seconds"), ".1f")]
    cells += [_number(row.get("peak_memory_mib"), ".0f"), status.replace("|", "/")[:160]]
    return "| " + " | ".join(cells) + " |"


def table(record: dict) -> str:
    """Returns the markdown report: rows, checks, skipped or failed parts."""
    env, parts = record["environment"], record["parts"]
    head = f"## gpu_check: {env['device']}, torch {env['torch']} (CUDA {env['cuda']})"
    lines = [head, ""]
    if record["smoke"]:
        lines += ["**--smoke: toy sizes on the CPU; the limits below do not apply.**", ""]
    lines += [
        f"Median of {record['n_iter']} timed steps after {record['n_warmup']} warm-up; "
        "peak memory: torch.cuda.max_memory_allocated (ours), jax peak_bytes_in_use "
        "(netket), process max RSS on a CPU. Params: ours / netket's count of its ViT of the "
        "same shape (its own where netket ran).",
        "",
        "| row | params ours / netket | samples | sampling s | E_loc s | jacobian s | solve s "
        "| step s | compile s | peak MiB | status |",
        "|" + " --- |" * 11,
    ]
    lines += [_row_line(name, part) for name, part in parts.items() if "/" in name]
    lines += ["", "| check | value | limit | pass |", "| --- | --- | --- | --- |"]
    for name, check in record["criteria"].items():
        value = check["value"]
        value = _number(value, ".3g") if isinstance(value, float) else str(value)
        if check["value"] is None:
            value = f"not measured ({check.get('note') or 'its part did not run'})"
        extra = check.get("row") or check.get("device") or ""
        cells = [name, f"{value} {extra}".strip(), str(check["limit"]), str(check["pass"])]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", f"Verdict: **{record['verdict']}** in {record['seconds_total']:.0f} s."]
    for name, part in parts.items():
        if part.get("status") != "ok":
            lines.append(f"- {name}: {part.get('status')}: {part.get('error')}")
    return "\n".join(lines) + "\n"


def models(parts: dict, smoke: bool) -> dict:
    """Returns per problem our parameter count (from a row that ran) and netket's: its own
    where its row ran, else `netket_n_params` of the same shape."""
    counts = {}
    for problem in PROBLEMS:
        ours = [parts.get(f"{problem}/{mode}", {}) for mode in ("eager", "compiled")]
        ours = [row["n_params"] for row in ours if row.get("status") == "ok"]
        netket = parts.get(f"{problem}/netket", {})
        ran = netket.get("status") == "ok"
        counts[problem] = {
            "n_params_ours": ours[0] if ours else None,
            "n_params_netket": netket["n_params"]
            if ran
            else netket_n_params(problem_config(problem, smoke=smoke)),
            "netket_count_from": "netket's model, built" if ran else "formula (netket_n_params)",
        }
    return counts


def _write(record: dict, out: Path) -> str:
    """Writes gpu_check.json and gpu_check.md (each whole, then renamed); returns the table."""
    record["models"] = models(record["parts"], record["smoke"])
    record["published"] = PUBLISHED
    record["criteria"] = criteria(record["parts"])
    record["verdict"] = _verdict(record["criteria"])
    record.setdefault("seconds_total", 0.0)
    text = table(record)
    for name, content in (("gpu_check.json", json.dumps(record, indent=1)), ("gpu_check.md", text)):
        partial = out / f"{name}.tmp"
        partial.write_text(content)
        partial.replace(out / name)
    return text


if __name__ == "__main__":
    sys.exit(main())
