"""Accuracy against exact results: runs the benchmark configs and writes ``results/accuracy.md``.

Each system of ``configs/benchmarks/`` is optimized within the wall-clock budget its config
states (the whole run's ``budget``, overridable with ``--budget``), then measured; one JSON row
per run lands in ``<rows-dir>/`` and ``results/accuracy.md`` is rendered from all stored rows,
so systems can be run one at a time and the table still comes out whole. With
``--with-netket`` each system also runs through netket's ViT (``scripts/netket_peer.py``: same
size, samples and wall-clock budget) in a subprocess, in the same invocation: after ours with
the config's ``threads``, or with ``--side-by-side`` at the same time, each engine's process
held to a core of its own and one thread; ``--netket-only`` runs just that subprocess beside
the stored row. netket's trained state is enumerated like ours when its sector is small.
``--enumerate`` adds to each stored row the energy of its trained state
summed over the whole sector (``vitqs.report.state_energy``: no noise, never below E_exact).
``--ablation`` runs the model variants of the Bose-Hubbard ablation instead.
``--from-results FILE`` reads one system's row from a run made elsewhere (the GPU-scale
``j1j2_6x6``, run with ``vitqs run`` where a GPU is); a system without ED is measured against
its reference past ED (`vitqs.physics.reference`: Bethe ansatz or published), and the table
says which.

Only the blocks between ``<!-- begin NAME -->`` and ``<!-- end NAME -->`` markers in
``accuracy.md`` are rewritten: the prose around them is kept.

    python scripts/benchmark_accuracy.py --systems heisenberg_chain16 --with-netket
    vitqs bench accuracy --systems heisenberg_4x4 --with-netket --side-by-side --enumerate
    vitqs bench accuracy --ablation --budget 60
    vitqs bench accuracy --systems j1j2_6x6 --from-results results/benchmarks/j1j2_6x6.h5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import yaml

# no torch: the netket worker imports this file too
from vitqs.config import OPTIMISATION_SHARE, ConfigError

REPO = Path(__file__).resolve().parents[1]
# The program's name when `vitqs bench accuracy` runs this script (None: the script's own).
PROG_VARIABLE = "VITQS_PROG"
CONFIG_DIR = REPO / "configs" / "benchmarks"
DEFAULT_OUTPUT = REPO / "results" / "accuracy.md"
SYSTEMS = (
    "heisenberg_chain16",
    "heisenberg_4x4",
    "j1j2_4x4",
    "bose_hubbard_chain12_U2",
    "bose_hubbard_chain12_U3.3",
    "bose_hubbard_chain12_U5",
    "bose_hubbard_chain12_U10",
    "bose_hubbard_3x3",
)
# The Bose-Hubbard ablation: one base config, one override set per model variant.
ABLATION_BASE = "bose_hubbard_chain12_U3.3"
ABLATION = {
    "ViT, linear embedding": {"model.embedding": "linear", "model.jastrow": False},
    "ViT, onehot": {"model.embedding": "onehot", "model.jastrow": False},
    "ViT, linear + Jastrow": {"model.embedding": "linear", "model.jastrow": True},
    "ViT, onehot + Jastrow": {"model.embedding": "onehot", "model.jastrow": True},
    "ViT, onehot + Jastrow + translations": {
        "model.embedding": "onehot",
        "model.jastrow": True,
        "model.symmetrize": "translations",
    },
}
# GPU-scale systems: never in the default --systems (an hour on a CPU would not do); their
# rows come from a run made elsewhere, read back with --from-results.
GPU_SYSTEMS = ("j1j2_6x6",)
ORDER = (*SYSTEMS, *GPU_SYSTEMS)  # the rows of the table, top to bottom
MAX_DIM = 2_000_000  # the largest sector whose trained states are enumerated
# The goals on the relative error, judged on the Monte Carlo estimate (`goal_met`).
GOALS = {
    "heisenberg_chain16": 1e-6,
    "heisenberg_4x4": 1e-5,
    "j1j2_4x4": 1e-4,
    "bose_hubbard_chain12_U2": 1e-5,
    "bose_hubbard_chain12_U3.3": 1e-5,
    "bose_hubbard_chain12_U5": 1e-5,
    "bose_hubbard_chain12_U10": 1e-5,
    "bose_hubbard_3x3": 1e-5,
    "j1j2_6x6": 1e-3,
}


# The defaults table (issue 52): configs with only the lattice, the Hamiltonian and a budget
# (configs/defaults/), each run with several seeds; goals on the final Monte Carlo estimate.
DEFAULTS_DIR = REPO / "configs" / "defaults"
DEFAULT_GOALS = {
    "j1j2_4x4": 1e-4,
    "j1j2_chain20": 1e-5,
    "triangular_6x4": 1e-3,
    "kagome_2x3": 1e-3,
    "bose_hubbard_chain12": 1e-5,
    "bose_hubbard_3x3": 1e-4,
    "heisenberg_6x6": 1e-4,
}
# a goal is met when every seed run meets it, and at least this many seeds ran
MIN_SEEDS = 3


def goal_margin(energy: float, error: float, exact: float) -> float:
    """Returns ``(|E − E_exact| + 2σ) / |E_exact|``: the relative error a Monte Carlo estimate
    ``E ± σ`` vouches for at about 95 %, its distance and twice its error bar."""
    return (abs(energy - exact) + 2 * error) / abs(exact)


def goal_met(energy: float, error: float, exact: float, goal: float) -> bool:
    """Returns whether the estimate ``E ± σ`` meets a relative goal:
    ``|E − E_exact| + 2σ ≤ goal · |E_exact|``. A full sum (σ = 0) is judged the same way by
    the caller only where the goal allows one; a Monte Carlo goal does not."""
    return goal_margin(energy, error, exact) <= goal


def thread_env(threads: int) -> dict:
    """Returns the environment that holds BLAS, OpenMP and XLA to ``threads`` threads."""
    n = str(threads)
    multi = "true" if threads > 1 else "false"
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={multi} intra_op_parallelism_threads={n}",
    }


NETKET_LR = {"heisenberg": 0.01, "bose_hubbard": 0.01}  # the reference runs


def machine() -> str:
    """Returns a short description of this CPU, e.g. ``x86_64, 2 cores``."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        name = found.group(1).strip() if found else name
    return f"{name} ({os.cpu_count()} cores)"


# ---- our side ----------------------------------------------------------------------------


def run_vitqs(config_path: Path, overrides: dict, name: str, rows_dir: Path) -> dict:
    """Runs one config with overrides; returns the table row and the error-vs-time curve."""
    from vitqs.config import load
    from vitqs.runner import run_config

    sets = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    config = load(config_path, [*sets, f"name={name}", f"output.dir={rows_dir}"])
    summary = run_config(config, overwrite=True, progress=sys.stderr.isatty())
    return row_from_results(config_path.stem, Path(summary["results_file"]))


def _estimator(full_sum: bool, summed: int | None, dimension: int | None) -> str:
    """Returns the estimator cell's start: Monte Carlo, a full sum, or one over orbits."""
    if not full_sum:
        return "Monte Carlo"
    if summed is None or dimension is None or summed == dimension:
        return "full sum"
    return f"full sum over {summed:,} orbits of the {dimension:,} states"


def row_from_results(system: str, results_file: Path) -> dict:
    """Returns the table row of a finished results file, with the config stored in it: a run
    of this script, or one made elsewhere (``vitqs run`` on a GPU) and read back."""
    import torch

    from vitqs.build import build_hamiltonian
    from vitqs.checkpoint import stored_config
    from vitqs.config import from_dict
    from vitqs.physics.reference import EXACT_DIAGONALIZATION, reference_energy
    from vitqs.results import read_results, relative_error
    from vitqs.runner import summary as run_summary

    record = read_results(results_file)
    if record.status != "finished":
        raise ConfigError(f"{results_file}: the run is {record.status}, not finished")
    config = from_dict(stored_config(record) or {}, default_name=system)  # capped parser
    summary = run_summary(record, results_file)
    with h5py.File(results_file, "r") as f:
        energy = f["history/energy"][:]
        seconds = np.cumsum(f["history/seconds_total"][:])
        summed = int(f["history/n_samples"][-1]) if "history/n_samples" in f else None
    # ED's energy; past ED, the reference of `vitqs.physics.reference` (Bethe ansatz,
    # published), which the row marks as such
    ed = summary["reference"] == EXACT_DIAGONALIZATION
    exact = summary["exact_energy"] if ed else None
    model = config.model
    full_sum = config.sampler.kind == "full_sum"
    row = {
        "engine": "vitqs",
        "system": system,
        "model": describe_model(model.to_dict() if hasattr(model, "to_dict") else vars(model)),
        "n_params": summary["n_params"],
        # a full sum's samples: the states each step sums over (one per orbit when reduced)
        "n_samples": summed if full_sum and summed else config.sampler.n_samples,
        "threads": config.threads or torch.get_num_threads(),
        "estimator": _estimator(full_sum, summed, (record.exact or {}).get("dimension"))
        + _tempered(config.sampler.machine_pow)
        + _final_average(config.final.symmetrize, config.final.spin_flip)
        + _annealed(config.optimizer)
        + _averaged(config.optimizer.average_from),
        "n_iter": summary["n_iter"],
        "seconds": summary["seconds"],
        "budget_seconds": config.budget,
        "energy": summary["energy"],
        "energy_error": summary["energy_error"],
        "exact_energy": exact,
        "relative_error": summary["relative_error"],
        "v_score": summary["v_score"],
        "variance": summary["variance"],
        "e_inf": build_hamiltonian(config).infinite_temperature_energy(),
        "n_sites": config.n_sites,
        "machine": machine(),
        "results_file": str(results_file),
        "curve_seconds": seconds.tolist(),
        "curve_relative_error": _relative(energy, exact),
    }
    gpu = record.versions.get("gpu", "none")  # files written before the key: none recorded
    if gpu != "none" and config.device != "cpu":
        row["device"], row["threads"] = gpu, config.threads  # the GPU did the work
    found = None if ed else reference_energy(build_hamiltonian(config))
    if found is not None:
        row["reference"] = {"energy": found.energy, "source": found.method}
        row["reference_relative_error"] = relative_error(summary["energy"], found.energy)
        row["curve_relative_error"] = _relative(energy, found.energy)
    return row


def _tempered(machine_pow: float) -> str:
    if machine_pow == 2.0:
        return ""
    return f" (steps on samples of |ψ|^{machine_pow:g}, reweighted to |ψ|²)"


def _final_average(symmetrize: str, spin_flip: int = 0) -> str:
    names = {"translations": "translation-averaged", "space_group": "space-group-averaged"}
    averages = [names[symmetrize]] if symmetrize in names else []
    if spin_flip:
        averages.append(f"projected on spin inversion {spin_flip:+d}")
    return f", final ψ {' and '.join(averages)}" if averages else ""


def _annealed(optimizer) -> str:
    if optimizer.anneal_from is None:
        return ""
    start = ", ".join(f"{name} = {value:g}" for name, value in optimizer.anneal_from.items())
    return f", H annealed from {start} over the first {optimizer.anneal_until:.0%} of the run"


def _averaged(average_from) -> str:
    if average_from is None:
        return ""
    return f", parameters averaged over the last {1 - average_from:.0%} of the run"


def describe_model(model: dict) -> str:
    """Returns e.g. ``vit 2L d16 h4 p2 onehot+J+T`` for a model config."""
    text = f"vit {model['layers']}L d{model['d_model']} h{model['heads']} p{model['patch_size']}"
    text += f" {model['embedding']}" + ("+Jastrow" if model["jastrow"] else "")
    text += ", ψ>0" if model.get("positive") else ""
    text += {"translations": "+transl", "space_group": "+space group"}.get(model["symmetrize"], "")
    text += f"+flip{model['spin_flip']:+d}" if model["spin_flip"] else ""
    return text


def _relative(energy, exact) -> list:
    """Returns |E − E_exact|/|E_exact| of a history: the curves are drawn on log axes."""
    if exact is None:
        return []
    return (np.abs(np.asarray(energy) - exact) / abs(exact)).tolist()


# ---- netket's side ------------------------------------------------------------------------


def run_netket(config_path: Path, budget: float | None, exact_energy, max_dim=MAX_DIM) -> dict:
    """Runs netket's ViT on the config's system in a subprocess with the config's thread
    count; returns its row."""
    return netket_row(start_netket(config_path, budget, exact_energy, max_dim=max_dim))


def start_netket(
    config_path: Path, budget: float | None, exact_energy, cpu: int | None = None, max_dim=MAX_DIM
):
    """Starts the netket subprocess: with the config's ``threads`` (default 1), or pinned to
    core ``cpu`` with one thread if given; see `netket_row` for its result. Its trained state
    is enumerated when its sector has at most ``max_dim`` states."""
    from vitqs.build import build_hamiltonian
    from vitqs.config import load

    data = yaml.safe_load(config_path.read_text())
    threads = 1 if cpu is not None else int(data.get("threads") or 1)
    config = load(config_path, [f"name={config_path.stem}"])
    e_inf = build_hamiltonian(config).infinite_temperature_energy()  # our units
    model, sampler, opt = data["model"], data.get("sampler", {}), data["optimizer"]
    kind = data["hamiltonian"]["kind"]
    spec = {
        "system": {"lattice": data["lattice"], "hamiltonian": data["hamiltonian"]},
        "options": {
            "d_model": model.get("d_model", 16),
            "heads": model.get("heads", 4),
            "layers": model.get("layers", 2),
            "patch_size": model.get("patch_size", 2),
            "n_samples": sampler.get("n_samples", 1024),
            "n_chains": sampler.get("n_chains", 256),
            "n_iter": opt.get("n_iter", 300),
            # netket's budget counts its steps: ours' share of the whole run's
            "budget_seconds": _steps_seconds(budget if budget is not None else data.get("budget")),
            "lr": NETKET_LR[kind],
            "diag_shift": opt.get("diag_shift", 1e-3),
            "final_n_samples": data.get("final", {}).get("n_samples", 8192),
            "full_sum": sampler.get("kind") == "full_sum",  # FullSumState beside our full sum
            "exact_energy": exact_energy,
            "enumerate_max_dim": max_dim,
            "e_inf": e_inf,
        },
        "threads": threads,
    }
    env = {**os.environ, **thread_env(threads)}
    process = subprocess.Popen(
        [sys.executable, __file__, "--netket-worker", json.dumps(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # XLA keeps threads of its own whatever the flags say: a core of its own holds it to one
        preexec_fn=None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu})),
    )
    return config_path, spec, exact_energy, process


def netket_row(started) -> dict:
    """Waits for a `start_netket` subprocess; returns its table row (RuntimeError on failure)."""
    config_path, spec, exact_energy, process = started
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"netket run of {config_path.stem} failed:\n{stderr[-2000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    per_iter = result["seconds_per_iter"] or 0.0
    compile_s = result["seconds_compile"] or 0.0
    n_done = result["n_iter_done"]
    return {
        "engine": "netket",
        "system": config_path.stem,
        "model": f"netket tutorial ViT {spec['options']['layers']}L d{spec['options']['d_model']}"
        f" h{spec['options']['heads']} p{spec['options']['patch_size']}",
        "n_params": result["n_params"],
        "n_samples": result["n_samples"],
        "threads": spec["threads"],
        "estimator": "full sum" if spec["options"].get("full_sum") else "Monte Carlo",
        "n_iter": n_done,
        "seconds": result["seconds_setup"]
        + result["seconds_total"]
        + result["seconds_final_estimate"],
        "budget_seconds": spec["options"]["budget_seconds"],
        "energy": result["energy"],
        "energy_error": result["energy_error"],
        "exact_energy": exact_energy,
        "relative_error": result["relative_error"],
        "enumerated_energy": result.get("enumerated_energy"),
        "enumerated_relative_error": result.get("enumerated_relative_error"),
        "v_score": result["v_score"],
        "variance": result["variance"],
        "e_inf": spec["options"]["e_inf"],
        "n_sites": None,
        "machine": machine(),
        # per-step times are not returned: compile time on the first step, then the median
        "curve_seconds": [compile_s + per_iter * (i + 1) for i in range(n_done)],
        "curve_relative_error": _relative(result["energy_history"], exact_energy),
    }


def _netket_worker(spec_json: str) -> None:
    """Runs in the netket subprocess: prints netket_peer's result as one JSON line."""
    import torch

    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    from netket_peer import run_netket_vit

    print(json.dumps(run_netket_vit(spec["system"], **spec["options"])))


# ---- the report ---------------------------------------------------------------------------


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(value, spec)


def _row_cells(row: dict, label: str) -> list[str]:
    per_site = row["n_sites"] or 1
    energy = f"{row['energy'] / per_site:.7f} ± {row['energy_error'] / per_site:.1e}"
    exact = _fmt(None if row["exact_energy"] is None else row["exact_energy"] / per_site, ".9f")
    relative = _fmt(row["relative_error"], "+.2e")
    if row["n_sites"] is None:  # netket rows: divide by the vitqs row's site count
        energy, exact = row["_energy_text"], row["_exact_text"]
    if row.get("reference"):  # no ED: the reference past it, and the error against it, marked
        reference = row["reference"]
        exact = f"{reference['energy'] / per_site:.6f} ({reference['source']})"
        relative = f"{row['reference_relative_error']:+.2e} (vs {_kind(reference)})"
    return [
        label,
        row["engine"],
        row["model"],
        str(row["n_params"]),
        str(row["n_samples"]),
        str(row["n_iter"]),
        f"{row['seconds']:.0f} ({_fmt(row['budget_seconds'], '.0f')})",
        # rows stored before the column: one thread
        f"GPU: {row['device']}" if row.get("device") else str(row.get("threads", 1)),
        energy,
        exact,
        relative,
        _fmt(row.get("enumerated_relative_error"), "+.2e"),
        _fmt(row["v_score"], ".1e"),
        row["estimator"],
    ]


def _reference(row: dict) -> float | None:
    """Returns the energy a row is judged against: ED's, else the reference past ED (Bethe
    ansatz or published), else None."""
    if row.get("exact_energy") is not None:
        return row["exact_energy"]
    return row["reference"]["energy"] if row.get("reference") else None


def _full_sum(row: dict) -> bool:
    return row["estimator"].startswith("full sum")


def _judged(row: dict, goal: float) -> tuple[str, str, str]:
    """Returns the cells estimate, margin and verdict of one engine's row against ``goal``."""
    reference = _reference(row)
    if reference is None:
        return "—", "—", "no reference"
    relative = (row["energy"] - reference) / abs(reference)
    sigma = row["energy_error"] / abs(reference)
    margin = goal_margin(row["energy"], row["energy_error"], reference)
    estimate = f"{relative:+.1e} ± {sigma:.1e}"
    if _full_sum(row):  # exact sums over the sector: no Monte Carlo estimate to judge
        return estimate + " (full sum)", "—", "does not count: full sum, not Monte Carlo"
    met = goal_met(row["energy"], row["energy_error"], reference, goal)
    return estimate, f"{margin:.1e}", "**yes**" if met else "no"


def _one_seed(judged: tuple[str, str, str]) -> tuple[str, str, str]:
    """Returns the cells of a one-run row, whose goal cannot be met on one seed: its margin
    under the goal reads "on 1 seed of the 3 needed"."""
    estimate, margin, verdict = judged
    if verdict == "**yes**":
        verdict = f"under the goal on 1 seed of the {MIN_SEEDS} needed"
    return estimate, margin, verdict


def render_goals(rows: list[dict]) -> str:
    """Returns the goals table: each system's goal judged on the final Monte Carlo estimate
    ``E ± σ`` (met when ``|E − E_exact| + 2σ ≤ goal·|E_exact|``), the enumerated figure and
    the V-scores beside it; netket's estimate judged the same way."""
    header = [
        "system",
        "goal",
        "vitqs MC: (E − E_exact)/\\|E_exact\\| ± σ",
        "(\\|ΔE\\| + 2σ)/\\|E_exact\\|",
        "met on MC? (every seed, ≥ 3)",
        "vitqs enumerated",
        "vitqs V-score",
        "netket MC ± σ",
        "netket (\\|ΔE\\| + 2σ)/\\|E_exact\\|",
        "netket met?",
        "netket V-score",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        goal = GOALS.get(row["system"])
        if goal is None:
            continue
        peer = next((p for p in row.get("peers", []) if p["engine"] == "netket"), None)
        ours = _one_seed(_judged(row, goal))
        theirs = _one_seed(_judged(peer, goal)) if peer else ("—", "—", "—")
        against = f" (vs {_kind(row['reference'])})" if row.get("reference") else ""
        cells = [
            row["system"] + against,
            f"≤ {goal:.0e}",
            *ours,
            _fmt(row.get("enumerated_relative_error"), "+.2e"),
            _fmt(row["v_score"], ".1e"),
            *theirs,
            _fmt(peer["v_score"], ".1e") if peer else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


HEADER = [
    "system",
    "engine",
    "model",
    "params",
    "samples",
    "iters",
    "wall s (budget)",
    "threads / GPU",
    "E/N ± err",
    "E_exact/N",
    "rel. error",
    "rel. error, enumerated",
    "V-score",
    "estimator",
]


def render_table(rows: list[dict], label_key: str) -> str:
    """Returns a markdown table of rows, each netket row right after its vitqs row."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        for entry in [row, *row.get("peers", [])]:
            if entry["engine"] == "netket":
                n = row["n_sites"]
                entry["_energy_text"] = (
                    f"{entry['energy'] / n:.7f} ± {entry['energy_error'] / n:.1e}"
                )
                entry["_exact_text"] = _fmt(
                    None if entry["exact_energy"] is None else entry["exact_energy"] / n, ".9f"
                )
            # a cell's own pipes (|ψ|) would end it early: markdown takes them escaped
            cells = [cell.replace("|", "\\|") for cell in _row_cells(entry, row[label_key])]
            lines.append("| " + " | ".join(cells) + " |")
        if row.get("peer_failure"):
            failed = [row[label_key], "netket", f"did not finish: {row['peer_failure']}"]
            lines.append("| " + " | ".join(failed + [""] * (len(HEADER) - 3)) + " |")
    return "\n".join(lines)


HEADLINE = (
    "system",
    "vitqs, Monte Carlo",
    "reference",
    "(E − E_ref)/\\|E_ref\\|",
    "netket, same budget",
    "wall s (on)",
)


def render_headline(rows: list[dict]) -> str:
    """Returns README's headline table: per system the final Monte Carlo estimate per site
    with its error bar, the reference and its kind, the relative error, netket's at the same
    budget, and the run's wall time (final measurement included). Rows measured by a full
    sum are left out: the headline is what sampling reaches."""
    lines = ["| " + " | ".join(HEADLINE) + " |", "|" + "---|" * len(HEADLINE)]
    for row in rows:
        if not str(row.get("estimator", "")).startswith("Monte Carlo"):
            continue
        n = row["n_sites"]
        reference, kind = row.get("exact_energy"), "ED"
        if reference is None and isinstance(row.get("reference"), dict):  # past ED: published
            reference, kind = row["reference"]["energy"], row["reference"]["source"]
        relative = row.get("relative_error")
        if relative is None:
            relative = row.get("reference_relative_error")
        # rows stored before the threads column ran on one
        threads = row.get("threads") or 1
        where = row.get("device") or f"{threads} thread{'s' if threads > 1 else ''}"
        netket = [p for p in row.get("peers", []) if p.get("engine") == "netket"]
        cells = [
            row["system"],
            f"{row['energy'] / n:.7f} ± {row['energy_error'] / n:.1e}",
            "" if reference is None else f"{reference / n:.7f} ({kind})",
            _fmt(relative, "+.1e"),
            _fmt(netket[0]["relative_error"], "+.1e") if netket else "not run",
            f"{row['seconds']:.0f} ({where})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_machines(rows: list[dict]) -> str:
    """Returns which CPU each row (and its netket peer) ran on, from the rows themselves:
    rows are run at different times, so the machine of the latest invocation says nothing of
    the others. A GPU row names its device in the table instead."""
    runs: dict[str, list[str]] = {}
    for row in rows:
        for entry in [row, *row.get("peers", [])]:
            if entry.get("device"):
                continue
            label = f"{row.get('label', row['system'])} ({entry['engine']})"
            runs.setdefault(entry.get("machine", "not recorded"), []).append(label)
    usual = max(runs, key=lambda name: len(runs[name]))  # the machine most rows ran on
    others = [f"{', '.join(labels)} on {name}" for name, labels in runs.items() if name != usual]
    text = f"Machine: {usual} for every CPU row"
    return text + (f" but {'; '.join(others)}." if others else ".")


def defaults_row(results_file: Path) -> dict:
    """Returns the defaults table's row of a finished run of a ``configs/defaults`` config
    (named ``defaults_<system>_s<seed>``, as ``--defaults`` runs them): `row_from_results`
    with its seed, what ended its final measurement and the recipe it followed."""
    from vitqs.results import read_results

    record = read_results(results_file)
    match = re.fullmatch(r"defaults_(.+)_s(\d+)", record.name)
    if match is None or match.group(1) not in DEFAULT_GOALS:
        raise ConfigError(
            f"--defaults: '{results_file}' holds run '{record.name}', not a run "
            f"defaults_<system>_s<seed> of {', '.join(DEFAULT_GOALS)}"
        )
    row = row_from_results(match.group(1), results_file)
    with h5py.File(results_file, "r") as f:
        final = f["final"].attrs
        row["final_samples"] = int(final["n_samples"]) if "n_samples" in final else None
        row["stopped_by"] = str(final["stopped_by"]) if "stopped_by" in final else None
    row["seed"], row["recipe"] = record.seed, json.loads(record.recipe or "{}")
    return row


def render_defaults(rows: list[dict]) -> str:
    """Returns the defaults table: one line per run (every seed, a missed one included),
    judged on its final Monte Carlo estimate and its whole run's time against its budget,
    then one verdict per system: met when every seed meets the goal and at least
    `MIN_SEEDS` ran."""
    header = [
        "system",
        "goal",
        "seed",
        "budget s",
        "whole run s",
        "steps",
        "final samples (ended by)",
        "MC: (E − E_ref)/\\|E_ref\\| ± σ",
        "(\\|ΔE\\| + 2σ)/\\|E_ref\\|",
        "met?",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    verdicts = {}
    for row in sorted(rows, key=lambda r: (list(DEFAULT_GOALS).index(r["system"]), r["seed"])):
        goal = DEFAULT_GOALS[row["system"]]
        estimate, margin, met = _judged(row, goal)
        within = row["seconds"] <= row["budget_seconds"]  # the whole run within its budget
        if met == "**yes**" and not within:
            met = "no: over its budget"
        verdicts.setdefault(row["system"], []).append(met == "**yes**")
        cells = [
            row["system"],
            f"{goal:.0e}",
            str(row["seed"]),
            f"{row['budget_seconds']:.0f}",
            f"{row['seconds']:.0f}" + ("" if within else " (over)"),
            str(row["n_iter"]),
            f"{row['final_samples']:,} ({row['stopped_by']})",
            estimate,
            margin,
            met,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| system | seeds run | seeds met | goal met? |", "|---|---|---|---|"]
    for system, met in verdicts.items():
        if len(met) < MIN_SEEDS:
            verdict = f"not yet: {len(met)} of {MIN_SEEDS} seeds run"
        else:
            verdict = "**yes**" if all(met) else "no"
        lines.append(f"| {system} | {len(met)} | {sum(met)} | {verdict} |")
    return "\n".join(lines)


def replace_block(text: str, name: str, block: str) -> str:
    """Returns ``text`` with the marked block ``name`` replaced (appended if missing)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    new = f"{begin}\n{block}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: new, text)
    return text.rstrip() + "\n\n" + new + "\n"


def load_rows(rows_dir: Path, table: str) -> list[dict]:
    rows = [json.loads(p.read_text()) for p in sorted(rows_dir.glob(f"{table}__*.json"))]
    return sorted(rows, key=lambda r: r.get("order", 0))


def plot_curves(rows: list[dict], path: Path, title: str) -> None:
    """Draws relative error vs wall time, one panel per system, vitqs and netket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["curve_relative_error"]]
    if not rows:
        return
    n_cols = min(4, len(rows))
    n_rows = math.ceil(len(rows) / n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(4 * n_cols, 3.2 * n_rows), squeeze=False)
    for ax, row in zip(axes.ravel(), rows, strict=False):
        for entry in [row, *row.get("peers", [])]:
            ax.semilogy(
                entry["curve_seconds"], entry["curve_relative_error"], label=entry["engine"]
            )
        panel = row.get("label", row["system"]).split(": ", 1)[-1]
        panel += f" (vs {_kind(row['reference'])})" if row.get("reference") else ""
        ax.set_title(textwrap.fill(panel, 45), fontsize=8)
        ax.set_xlabel("wall time of the optimisation (s)")
        ax.set_ylabel("|E − E_exact| / |E_exact|")
        ax.legend(fontsize=8)
    for ax in axes.ravel()[len(rows) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(output: Path, rows_dir: Path, readme: Path | None = None) -> None:
    """Renders the accuracy and ablation tables and figures from the stored rows, and the
    headline table of ``readme`` (when given)."""
    text = output.read_text() if output.exists() else "# Accuracy against exact results\n"
    accuracy = load_rows(rows_dir, "accuracy")
    ablation = load_rows(rows_dir, "ablation")
    defaults = load_rows(rows_dir, "defaults")
    if defaults:
        text = replace_block(text, "defaults-table", render_defaults(defaults))
    if accuracy and readme is not None and readme.exists():
        headline = replace_block(readme.read_text(), "headline", render_headline(accuracy))
        _write_atomic(readme, headline)
    if accuracy:
        text = replace_block(text, "accuracy-table", render_table(accuracy, "system"))
        text = replace_block(text, "goals-table", render_goals(accuracy))
        plot_curves(
            accuracy, output.parent / "accuracy_vs_time.png", "vitqs vs netket, same wall time"
        )
    if ablation:
        text = replace_block(text, "ablation-table", render_table(ablation, "label"))
        plot_curves(ablation, output.parent / "ablation_vs_time.png", "Bose-Hubbard ablation")
    text = replace_block(text, "machine", render_machines([*accuracy, *ablation, *defaults]))
    _write_atomic(output, text)


# ---- main ---------------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    from vitqs.results import write_text_atomic  # here: the netket worker never loads torch

    write_text_atomic(path, text)


def _row_file(rows_dir: Path, table: str, key: str) -> Path:
    return rows_dir / f"{table}__{key}.json"


def _store(rows_dir: Path, table: str, key: str, row: dict) -> None:
    _write_atomic(_row_file(rows_dir, table, key), json.dumps(row))


def _load_row(rows_dir: Path, system: str) -> dict | None:
    """Returns ``system``'s stored accuracy row, or None if there is none."""
    path = _row_file(rows_dir, "accuracy", system)
    return json.loads(path.read_text()) if path.exists() else None


def _steps_seconds(budget: float | None) -> float | None:
    """Returns the seconds a whole-run ``budget`` gives the steps (None: no budget)."""
    return None if budget is None else budget * OPTIMISATION_SHARE


def _run_systems(args, rows_dir: Path) -> None:
    for system in args.systems:
        path = CONFIG_DIR / f"{system}.yaml"
        overrides = {} if args.budget is None else {"budget": args.budget}
        peer = (run_netket, path, args.budget)
        if args.netket_only:
            row = _stored_row(rows_dir, system)
            _add_peer(row, system, *peer, row["exact_energy"], args.max_dim)
        elif args.with_netket and args.side_by_side:
            row = _side_by_side(path, overrides, system, rows_dir, args.budget, args.max_dim)
        else:
            earlier = _earlier_peers(rows_dir, system) if args.keep_peers else None
            if args.from_results:  # a run made elsewhere (main() refuses it with netket)
                row = row_from_results(system, args.from_results)
            else:
                row = run_vitqs(path, overrides, system, rows_dir)
            if args.with_netket:
                _add_peer(row, system, *peer, row["exact_energy"], args.max_dim)
            elif earlier:
                row["peers"] = earlier
        row["order"] = ORDER.index(system) if system in ORDER else len(ORDER)
        _store(rows_dir, "accuracy", system, row)
        print(_summary_line(system, row), flush=True)


def _stored_row(rows_dir: Path, system: str) -> dict:
    """Returns ``system``'s stored vitqs row, without its peers (ConfigError if none)."""
    row = _load_row(rows_dir, system)
    if row is None:
        raise ConfigError(f"--netket-only: no stored row for {system} in {rows_dir}")
    for key in ("peers", "peer_failure", "side_by_side"):
        row.pop(key, None)
    return row


def _earlier_peers(rows_dir: Path, system: str) -> list[dict] | None:
    """Returns the netket rows stored beside ``system``'s last row, each marked as coming
    from that earlier invocation (its estimator cell says so), or None."""
    peers = (_load_row(rows_dir, system) or {}).get("peers")
    if not peers:
        return None
    for peer in peers:
        if not peer["estimator"].endswith(EARLIER):
            peer["estimator"] += EARLIER
    return peers


EARLIER = ", from an earlier invocation"


def _side_by_side(
    path: Path, overrides: dict, system: str, rows_dir: Path, budget, max_dim=MAX_DIM
) -> dict:
    """Runs netket and vitqs at the same time, each process on a core of its own with one
    thread (whatever the config's ``threads``)."""
    from vitqs.build import exact_ground_state
    from vitqs.config import load

    ground = exact_ground_state(load(path, [f"name={system}"]))  # the cached ED
    exact_energy = None if ground is None else ground.energy
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise ConfigError("--side-by-side needs two cores (one per engine)")
    started = start_netket(path, budget, exact_energy, cpu=cores[1], max_dim=max_dim)
    os.sched_setaffinity(0, {cores[0]})
    try:
        row = run_vitqs(path, {**overrides, "threads": 1}, system, rows_dir)
    finally:
        os.sched_setaffinity(0, set(cores))
    _add_peer(row, system, netket_row, started)
    row["side_by_side"] = True
    return row


def _add_peer(row: dict, system: str, peer, *args) -> None:
    """Adds the row ``peer(*args)`` returns as the peer of ours, or the reason it failed."""
    try:
        row["peers"] = [peer(*args)]
    except RuntimeError as err:  # keep our row; the table says netket did not finish
        print(f"{system}: {err}", file=sys.stderr, flush=True)
        row["peer_failure"] = str(err).splitlines()[0]


def enumerate_rows(rows_dir: Path, table: str, max_dim: int, systems=None) -> None:
    """Adds the enumerated (noise-free, variational) energy of each stored row's final state
    (of ``systems`` only, if given), from its results file, where the sector has at most
    ``max_dim`` states."""
    from vitqs.report import state_energy

    for path in sorted(rows_dir.glob(f"{table}__*.json")):
        row = json.loads(path.read_text())
        if systems is not None and row["system"] not in systems:
            continue
        # rows stored before results_file was recorded: an accuracy run is named after its system
        fallback = rows_dir / f"{row['system']}.h5" if table == "accuracy" else None
        results_file = row.get("results_file") or fallback
        if results_file is None or not Path(results_file).exists():
            continue
        found = state_energy(Path(results_file), max_dim)
        if found is None:
            continue
        row["enumerated_energy"] = found["enumerated"]
        row["enumerated_relative_error"] = found["relative_error"]
        if "last_iterate_relative_error" in found:  # an averaged run: what the mean bought
            row["last_iterate_relative_error"] = found["last_iterate_relative_error"]
        _write_atomic(path, json.dumps(row))
        print(f"{row['system']}: enumerated rel={found['relative_error']:.2e}", flush=True)


def _run_ablation(args, rows_dir: Path) -> None:
    path = CONFIG_DIR / f"{args.ablation_base}.yaml"
    for order, (label, overrides) in enumerate(ABLATION.items()):
        if args.variants and label not in args.variants:
            continue
        if args.budget is not None:
            overrides = {**overrides, "budget": args.budget}
        overrides = {**overrides, **dict(_parse_set(s) for s in args.set)}
        key = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")
        row = run_vitqs(path, overrides, f"ablation_{key}", rows_dir)
        prefix = args.ablation_label or args.ablation_base
        row.update(order=order, label=f"{prefix}: {label}", overrides=overrides)
        _store(rows_dir, "ablation", key, row)
        print(_summary_line(label, row), flush=True)


def _parse_set(text: str):
    key, _, value = text.partition("=")
    return key, yaml.safe_load(value)


def _kind(reference: dict) -> str:
    """Returns "published" or "Bethe ansatz": what a row's reference past ED is."""
    return reference["source"].split(":")[0]


def _summary_line(label: str, row: dict) -> str:
    peers = " ".join(
        f"| netket rel={_fmt(p['relative_error'], '.2e')} its={p['n_iter']}"
        for p in row.get("peers", [])
    )
    relative = _fmt(row["relative_error"], ".2e")
    if row.get("reference"):
        relative = f"{row['reference_relative_error']:.2e} (vs {_kind(row['reference'])})"
    return f"{label}: rel={relative} its={row['n_iter']} {row['seconds']:.0f}s {peers}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=os.environ.get(PROG_VARIABLE), description=__doc__.splitlines()[0]
    )
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), metavar="NAME")
    parser.add_argument("--budget", type=float, default=None, help="seconds per run (override)")
    parser.add_argument("--with-netket", action="store_true", help="netket's ViT beside each row")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="with --with-netket: run netket at the same time as vitqs, one core each",
    )
    parser.add_argument(
        "--keep-peers",
        action="store_true",
        help="without --with-netket: keep the netket rows stored for each system (marked as "
        "from an earlier invocation) instead of dropping them",
    )
    parser.add_argument(
        "--netket-only",
        action="store_true",
        help="run only netket's peer of each system (with the config's threads), beside the "
        "vitqs row stored for it",
    )
    parser.add_argument(
        "--from-results",
        type=Path,
        default=None,
        metavar="FILE",
        help="instead of running the one system of --systems, read its row from a finished "
        "results file of `vitqs run` made elsewhere (e.g. on a GPU: "
        f"{', '.join(GPU_SYSTEMS)}); the config stored in the file is used",
    )
    parser.add_argument("--ablation", action="store_true", help="the Bose-Hubbard model ablation")
    parser.add_argument("--ablation-base", default=ABLATION_BASE, metavar="NAME")
    parser.add_argument("--ablation-label", default=None, help="system name in the table")
    parser.add_argument("--variants", nargs="*", default=None, help="ablation labels to run")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for the ablation")
    parser.add_argument(
        "--defaults",
        nargs="+",
        type=Path,
        default=None,
        metavar="FILE",
        help="store the defaults table's rows of these finished runs of configs/defaults "
        "(named defaults_<system>_s<seed>) and render the table",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--rows-dir", type=Path, default=REPO / "results" / "benchmarks")
    parser.add_argument("--report-only", action="store_true", help="re-render from stored rows")
    parser.add_argument(
        "--enumerate",
        action="store_true",
        help="add the enumerated energy of every stored row's final state (small sectors)",
    )
    parser.add_argument("--max-dim", type=int, default=MAX_DIM, help="largest sector to sum")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Runs the benchmark; raises ConfigError (one line, exit 2) on bad arguments."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--netket-worker"]:
        _netket_worker(argv[1])
        return 0
    args = parse_args(argv)
    unknown = [s for s in args.systems if not (CONFIG_DIR / f"{s}.yaml").exists()]
    if unknown:
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if not p.stem.endswith("_sweep"))
        raise ConfigError(
            f"--systems: no config for {', '.join(unknown)} in {CONFIG_DIR}; "
            f"known: {', '.join(known)}"
        )
    if args.netket_only and (args.ablation or args.with_netket or args.keep_peers):
        raise ConfigError(
            "--netket-only runs netket beside the stored rows of --systems; it does not "
            "combine with --ablation, --with-netket or --keep-peers"
        )
    if args.from_results is not None:
        if len(args.systems) != 1 or args.ablation or args.with_netket or args.netket_only:
            raise ConfigError(
                "--from-results reads the row of one system (--systems NAME); it does not "
                "combine with --ablation, --with-netket or --netket-only"
            )
        if not args.from_results.is_file():
            raise ConfigError(f"--from-results: no file '{args.from_results}'")
    if args.defaults:
        for path in args.defaults:
            row = defaults_row(path)
            _store(args.rows_dir, "defaults", f"{row['system']}_s{row['seed']}", row)
            print(_summary_line(f"{row['system']} seed {row['seed']}", row), flush=True)
    elif not args.report_only:
        if args.ablation:
            _run_ablation(args, args.rows_dir)
        else:
            _run_systems(args, args.rows_dir)
    if args.enumerate:
        table = "ablation" if args.ablation else "accuracy"
        systems = None if args.ablation else set(args.systems)  # default: every system
        enumerate_rows(args.rows_dir, table, args.max_dim, systems)
    # README's headline table follows the stored rows of results/ (not a report elsewhere)
    readme = REPO / "README.md" if args.output == DEFAULT_OUTPUT else None
    write_report(args.output, args.rows_dir, readme)
    print(args.output)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as err:
        if os.environ.get(PROG_VARIABLE):  # worded as vitqs words a failed command: one line
            print(f"vitqs bench: {' '.join(f'error: {err}'.split())}", file=sys.stderr)
        else:
            print(f"{Path(sys.argv[0]).name}: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        if not os.environ.get(PROG_VARIABLE):
            raise
        sys.exit(130)  # vitqs, interrupted with it, says so
