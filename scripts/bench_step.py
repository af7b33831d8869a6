"""Seconds per VMC step, phase by phase, of vitqs and (``--with-netket``) netket's ViT side by side.

Usage::

    python scripts/bench_step.py configs/bench/heisenberg_chain16.yaml --n-iter 10 --with-netket
    python scripts/bench_step.py CONFIG --set sampler.n_samples=4096 --json

Ours: ``vitqs.benchmark.time_steps`` (the builders of ``vitqs run``). Netket: the peer of
``scripts/netket_peer.py`` on the same system with the same ViT (layers, d_model, heads, patch
size, factored translation-invariant attention), samples, chains, sweep size, thermalisation
sweeps, lr, diagonal shift and the same kernel-vs-SR rule; its whole-step time is
``run_netket_vit`` (median of ``--n-iter`` steps after two warm-up steps), its phases
``phase_timings``. Ratios are ours / netket (< 1: ours is faster). Netket's phase
``natural_gradient`` (Jacobian + solve) is compared with our ``jacobian + solve``.

Both sides run on ``--threads`` cores (default 1): set before torch, jax and BLAS load, through
``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``, ``XLA_FLAGS`` and
``torch.set_num_threads``, so that the ratio compares the code and not the thread pools; and
the process is pinned to the first ``--threads`` cores (``sched_setaffinity``), because jax
0.4+ / XLA runs its matrix products on every core whatever ``XLA_FLAGS`` says (measured on a
2-core machine: a 2048 × 6128 Gram product took 0.56 s of wall time and 1.11 s of CPU time
with the flags, 1.19 s pinned to one core). The JSON records the cores used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="YAML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    parser.add_argument("--n-iter", type=int, default=10, help="timed steps after warm-up")
    parser.add_argument("--n-warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1, help="cores for each side")
    parser.add_argument(
        "--phase-repeats", type=int, default=3, help="netket: calls per phase (0: step only)"
    )
    parser.add_argument("--with-netket", action="store_true", help="also time netket's ViT")
    parser.add_argument("--json", action="store_true", help="end stdout with one JSON line")
    parser.add_argument(
        "--store",
        default=None,
        metavar="FILE",
        help="also write the row as JSON to FILE (scripts/performance_report.py renders the "
        "rows of results/benchmarks/speed__*.json into results/performance.md)",
    )
    parser.add_argument("--label", default=None, help="the row's name in the table")
    parser.add_argument(
        "--compile",
        choices=("auto", "yes", "no"),
        default="auto",
        help="compile our chains: as a run of the config would (auto), or not",
    )
    return parser.parse_args(argv)


def _limit_threads(n: int) -> list[int] | None:
    """Holds every thread pool to ``n`` threads and pins the process to ``n`` cores; returns
    the cores (None where the platform cannot pin)."""
    # must run before numpy, torch and jax are imported: their pools read these at load time
    for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[key] = str(n)
    cores = None
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))[:n]
        os.sched_setaffinity(0, cores)
    if n == 1:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    return cores


def netket_options(config) -> dict:
    """Returns ``make_driver`` keyword arguments matching a vitqs config."""
    from vitqs.config import schedule_values  # after _limit_threads: vitqs loads torch

    model, sampler, opt = config.model, config.sampler, config.optimizer
    if not model.translation_invariant:
        raise ValueError(
            "the netket peer is the translation-invariant ViT: model.translation_invariant=true"
        )
    patch = model.patch_size
    patch = patch[0] if isinstance(patch, list) else patch
    return {
        "d_model": model.d_model,
        "heads": model.heads,
        "layers": model.layers,
        "patch_size": patch,
        "n_samples": sampler.n_samples,
        "n_chains": sampler.n_chains,
        "sweep_size": config.n_sites,  # vitqs's: one proposal per site
        "n_discard_per_chain": sampler.n_discard,
        # netket's peer takes constants: a schedule's start (the step's time does not depend
        # on the values)
        "lr": schedule_values(opt.lr)[0],
        "diag_shift": schedule_values(opt.diag_shift)[0],
        "method": "auto",  # vitqs's rule: the smaller of SR's and minSR's matrices
        "seed": config.seed,
    }


def _run_netket(config, args) -> dict | str:
    """Returns netket's timings, or a one-line reason why they were skipped.

    The whole-step time is printed as soon as it is known, before the phase timings (which
    build and compile a second driver): a long row that runs out of time keeps its result.
    """
    import netket_peer  # a sibling: scripts/ is on the path of a script run as a program

    reason = netket_peer.netket_available()
    if reason is not None:
        return reason
    resolved = config.to_dict()
    system = {"lattice": resolved["lattice"], "hamiltonian": resolved["hamiltonian"]}
    options = netket_options(config)
    run = netket_peer.run_netket_vit(
        system, **options, n_iter=args.n_warmup + args.n_iter, final_n_samples=options["n_samples"]
    )
    netket = {
        "seconds_per_iter": run["seconds_per_iter"],
        "seconds_compile": run["seconds_compile"],
        "seconds": None,
        "n_params": run["n_params"],
        "method_used": run["method_used"],
        "sampler_used": run["sampler_used"],
        "netket_version": netket_peer.nk.__version__,
    }
    print(f"netket step {netket['seconds_per_iter']:.4f} s (median of {args.n_iter})", flush=True)
    if args.phase_repeats > 0:
        phases = netket_peer.phase_timings(system, n_repeats=args.phase_repeats, **options)
        netket["seconds"] = phases["seconds"]
    return netket


def ratios(ours: dict, netket: dict) -> dict:
    """Returns ours / netket seconds for the step and the phases both sides measure."""
    result = {"step": ours["seconds_per_iter"] / netket["seconds_per_iter"]}
    mine, theirs = ours["seconds"], netket["seconds"]
    if theirs is not None:
        result["sampling"] = mine["sampling"] / theirs["sampling"]
        result["local_energy"] = mine["local_energy"] / theirs["local_energy"]
        result["jacobian+solve"] = (mine["jacobian"] + mine["solve"]) / theirs["natural_gradient"]
    return result


def _comparison_table(ours: dict, netket: dict) -> str:
    mine, theirs = ours["seconds"], netket["seconds"]
    rows = []
    if theirs is not None:
        rows = [
            ("sampling", mine["sampling"], theirs["sampling"]),
            ("local_energy", mine["local_energy"], theirs["local_energy"]),
            ("jacobian+solve", mine["jacobian"] + mine["solve"], theirs["natural_gradient"]),
        ]
    rows.append(("step", ours["seconds_per_iter"], netket["seconds_per_iter"]))
    lines = [f"{'phase':<16}{'ours s':>10}{'netket s':>10}{'ours/netket':>13}"]
    lines += [f"{name:<16}{a:>10.4f}{b:>10.4f}{a / b:>13.2f}" for name, a, b in rows]
    lines.append(
        f"netket {netket['netket_version']}: {netket['n_params']} params, "
        f"method {netket['method_used']}, {netket['sampler_used']}, "
        f"compile {netket['seconds_compile']:.1f} s; step = median of the run's steps"
        + ("" if theirs is not None else "; phases not timed (--phase-repeats 0)")
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse_args(argv)
    cores = _limit_threads(args.threads)
    import torch

    from vitqs.benchmark import machine, phase_table, time_steps
    from vitqs.config import ConfigError, load

    torch.set_num_threads(args.threads)
    try:
        config = load(args.config, [*args.overrides, f"threads={args.threads}"])
        compile_chains = {"auto": None, "yes": True, "no": False}[args.compile]
        ours = time_steps(
            config, n_warmup=args.n_warmup, n_iter=args.n_iter, compile_chains=compile_chains
        )
    except ConfigError as err:
        print(f"bench_step: error: {err}", file=sys.stderr)
        return 2
    print(f"{config.name}: {machine()}; pinned to cores {cores}")
    print(phase_table(ours))
    record = {"name": config.name, "machine": machine(), "cores": cores, "ours": ours}
    record |= {"label": args.label or config.name, "overrides": args.overrides}
    record["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    if args.with_netket:
        try:
            netket = _run_netket(config, args)
        except ValueError as err:
            print(f"bench_step: error: --with-netket: {err}", file=sys.stderr)
            return 2
        if isinstance(netket, str):
            print(f"--with-netket: skipped, netket is not available ({netket})")
        else:
            record["netket"], record["ratio"] = netket, ratios(ours, netket)
            print(_comparison_table(ours, netket))
    if args.json:
        print(json.dumps(record))
    if args.store:
        Path(args.store).write_text(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
