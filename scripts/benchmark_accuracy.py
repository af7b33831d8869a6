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

The rows, their verdicts and the tables are `vitqs.accuracy`'s (importable from the
installed package); only the blocks between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``
markers in ``accuracy.md`` are rewritten: the prose around them is kept.

    python scripts/benchmark_accuracy.py --systems heisenberg_chain16 --with-netket
    vitqs bench accuracy --systems heisenberg_4x4 --with-netket --side-by-side --enumerate
    vitqs bench accuracy --ablation --budget 60
    vitqs bench accuracy --systems j1j2_6x6 --from-results results/benchmarks/j1j2_6x6.h5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

# no torch: the netket worker imports this file too
from vitqs.accuracy import (
    cpu_name,
    defaults_row,
    enumerate_rows,
    relative_curve,
    row_file,
    row_from_results,
    store_row,
    summary_line,
    write_report,
)
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


# The defaults table's configs (issue 52): only the lattice, the Hamiltonian and a budget;
# their goals are vitqs.accuracy.DEFAULT_GOALS.
DEFAULTS_DIR = REPO / "configs" / "defaults"


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


# ---- our side ----------------------------------------------------------------------------


def run_vitqs(config_path: Path, overrides: dict, name: str, rows_dir: Path) -> dict:
    """Runs one config with overrides; returns the table row and the error-vs-time curve."""
    from vitqs.config import load
    from vitqs.runner import run_config

    sets = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    config = load(config_path, [*sets, f"name={name}", f"output.dir={rows_dir}"])
    summary = run_config(config, overwrite=True, progress=sys.stderr.isatty())
    return row_from_results(config_path.stem, Path(summary["results_file"]))


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
        "machine": cpu_name(),
        # per-step times are not returned: compile time on the first step, then the median
        "curve_seconds": [compile_s + per_iter * (i + 1) for i in range(n_done)],
        "curve_relative_error": relative_curve(result["energy_history"], exact_energy),
    }


def _netket_worker(spec_json: str) -> None:
    """Runs in the netket subprocess: prints netket_peer's result as one JSON line."""
    import torch

    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    from netket_peer import run_netket_vit

    print(json.dumps(run_netket_vit(spec["system"], **spec["options"])))


# ---- main ---------------------------------------------------------------------------------


def _load_row(rows_dir: Path, system: str) -> dict | None:
    """Returns ``system``'s stored accuracy row, or None if there is none."""
    path = row_file(rows_dir, "accuracy", system)
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
        store_row(rows_dir, "accuracy", system, row)
        print(summary_line(system, row), flush=True)


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
        store_row(rows_dir, "ablation", key, row)
        print(summary_line(label, row), flush=True)


def _parse_set(text: str):
    key, _, value = text.partition("=")
    return key, yaml.safe_load(value)


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
            store_row(args.rows_dir, "defaults", f"{row['system']}_s{row['seed']}", row)
            print(summary_line(f"{row['system']} seed {row['seed']}", row), flush=True)
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
