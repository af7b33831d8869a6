"""The ``vitqs`` command line: parses arguments and calls ``run``; nothing else lives here."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from vitqs import __version__
from vitqs.config import ConfigError, load
from vitqs.errors import first_line
from vitqs.yamlfile import yaml_value

# `vitqs ed --sectors --levels`: Lanczos's cost grows with the levels asked; a few say what a
# stalled run may have found
MAX_SECTOR_LEVELS = 20


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key by its dotted path, value parsed as YAML (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="end stdout with one JSON line")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitqs", description=__doc__)
    parser.add_argument("--version", action="version", version=f"vitqs {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    ed = commands.add_parser("ed", help="exact ground-state energy of a config's Hamiltonian")
    _add_config_arguments(ed)
    ed.add_argument("--no-cache", action="store_true", help="solve again, ignoring the ED cache")
    ed.add_argument(
        "--sectors",
        action="store_true",
        help="also the lowest level of each candidate sector of a sector search",
    )
    ed.add_argument(
        "--levels",
        type=int,
        default=1,
        help=f"with --sectors: levels of each sector, lowest first (1-{MAX_SECTOR_LEVELS})",
    )

    run = commands.add_parser("run", help="optimize a ground state and write results/<name>.h5")
    _add_config_arguments(run)
    run.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    run.add_argument("--overwrite", action="store_true", help="replace an existing results file")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--no-cache", action="store_true", help="solve ED again, ignoring its cache")

    sweep = commands.add_parser("sweep", help="run a grid of configs, with tables and figures")
    sweep.add_argument("sweep", help="sweep YAML: base, name, sweep (grid), warm_start")
    sweep.add_argument("--json", action="store_true", help="end stdout with one JSON line")
    sweep.add_argument("--quiet", action="store_true", help="no progress bars")
    sweep.add_argument("--no-cache", action="store_true", help="solve ED again, ignoring its cache")

    report = commands.add_parser("report", help="tables and figures of results files")
    report.add_argument("path", help="a results file or a folder of them")

    lanczos = commands.add_parser(
        "lanczos", help="one Lanczos step on a finished run's final state, kept in its file"
    )
    lanczos.add_argument("path", help="a finished run's results file")
    lanczos.add_argument(
        "--n-samples",
        type=int,
        default=None,
        help="Monte Carlo samples, rounded up to whole batches of sampler.n_samples (default "
        "final.n_samples)",
    )
    lanczos.add_argument(
        "--full-sum", action="store_true", help="sum every state of the sector (no noise)"
    )
    lanczos.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default the run's own `threads`, as `vitqs run` used them)",
    )
    lanczos.add_argument("--json", action="store_true", help="end stdout with one JSON line")

    sectors = commands.add_parser(
        "sectors", help="find the ground state's symmetry sector by short runs, without ED"
    )
    _add_config_arguments(sectors)
    sectors.add_argument(
        "--seconds", type=float, default=None, help="wall-clock time of the whole search"
    )
    sectors.add_argument(
        "--first-steps",
        type=int,
        default=None,
        help="steps of the first round without --seconds (doubling each round), the least a "
        "candidate makes in a round with it (100 for sectors, 50 for sign priors)",
    )
    sectors.add_argument(
        "--sign-prior",
        action="store_true",
        help="race the sign priors (model.sign_prior) instead of the sectors",
    )

    bench = commands.add_parser("bench", help="benchmarks: accuracy against ED, speed per step")
    benches = bench.add_subparsers(dest="bench", required=True)
    benches.add_parser(
        "accuracy",
        help="run configs/benchmarks/ against ED and write results/accuracy.md",
        add_help=False,  # its options, --help included, are scripts/benchmark_accuracy.py's
    )
    speed = benches.add_parser("speed", help="seconds per VMC step, split by phase")
    _add_config_arguments(speed)
    speed.add_argument("--n-iter", type=int, default=10, help="timed steps after 2 warm-up steps")
    speed.add_argument(
        "--compile",
        choices=("auto", "yes", "no"),
        default="auto",
        help="compile the chains' network: as a run of the config would (auto), or not",
    )
    return parser


def _cmd_ed(args) -> int:
    from vitqs.build import run_exact

    if not 1 <= args.levels <= MAX_SECTOR_LEVELS:
        raise ConfigError(
            f"--levels={args.levels}: the levels of each sector to print, an integer in "
            f"1..{MAX_SECTOR_LEVELS}"
        )
    if args.levels > 1 and not args.sectors:
        raise ConfigError(f"--levels={args.levels} prints the sectors' levels: add --sectors")
    config = load(args.config, args.overrides)
    summary = run_exact(config, use_cache=not args.no_cache)
    ham = config.hamiltonian
    lattice = summary["lattice"]
    where = f"{lattice['kind']} {lattice['shape']} (pbc={lattice['pbc']})"
    print(f"{config.name}: {ham.kind} on {where}")
    print(f"  energy           {summary['energy']:.12f}")
    print(f"  energy per site  {summary['energy_per_site']:.12f}")
    print(f"  dimension        {summary['dimension']}")
    print(f"  sector           {_sector_text(summary['sector'])}")
    given = _model_sector(summary["sector"])
    if given:
        print(f"  model.sector     {given}")
    cached = " (from cache)" if summary["cached"] else ""
    print(f"  seconds          {summary['seconds']:.3f}{cached}")
    if args.sectors:
        summary["sector_levels"] = _print_sector_levels(config, summary["energy"], args.levels)
    if args.json:
        print(json_line(summary))
    return 0


def _print_sector_levels(config, energy: float, n_levels: int) -> list[dict]:
    """Prints the lowest exact level of each candidate sector (`sector_search.exact_levels`)
    and its height above the ground state, and with ``n_levels`` > 1 the heights of the next
    levels; returns them as rows for ``--json`` (``energy`` the lowest, ``levels`` all)."""
    from vitqs.sector_search import exact_levels

    more = "   next levels above E_0" if n_levels > 1 else ""
    print(f"  {'candidate sector':<28} {'lowest level':>18} {'above E_0':>11}{more}")
    rows = []
    for sector, levels in exact_levels(config, n_levels):
        if not levels:
            print(f"  {sector.label():<28} {'no state':>18}")
        else:
            above = "".join(f" {level - energy:>10.3e}" for level in levels[1:])
            print(f"  {sector.label():<28} {levels[0]:>18.10f} {levels[0] - energy:>11.3e}{above}")
        lowest = levels[0] if levels else None
        rows.append({"sector": sector.label(), **sector.keys(), "energy": lowest, "levels": levels})
    return rows


def _model_sector(sector: dict) -> str:
    """Returns a sector as a config writes it (``model.sector``), for a model trained in
    it; empty where its momentum is degenerate."""
    if sector["momentum"] is None:
        return ""
    keys = ("momentum", "point_characters", "spin_flip")
    return yaml_value({key: sector[key] for key in keys if sector.get(key) is not None})


def _sector_text(sector: dict) -> str:
    """Returns the ground state's symmetry sector as `vitqs ed` prints it."""
    momentum = sector["momentum"]
    parts = ["momentum degenerate" if momentum is None else f"momentum {momentum} (2π n_i / L_i)"]
    if sector["spin_flip"] is not None:
        parts.append(f"spin inversion {sector['spin_flip']:+d}")
    if sector["space_group_symmetric"] is not None:
        symmetric = sector["space_group_symmetric"]
        parts.append("space-group symmetric" if symmetric else "not space-group symmetric")
    if sector.get("point_characters") is not None:
        parts.append(f"point_characters {sector['point_characters']}")
    return ", ".join(parts)


def json_line(data) -> str:
    """Returns ``data`` as one line of strict JSON: a NaN or infinity (no exact energy, one
    sample's variance) becomes null, which every JSON reader accepts."""
    return json.dumps(_finite(data), allow_nan=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _cmd_run(args) -> int:
    from vitqs import distributed
    from vitqs.build import resolve_device
    from vitqs.runner import run_config

    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    config = load(args.config, args.overrides)
    device = resolve_device(config.device)
    with distributed.process_group(device, config.distributed.timeout):
        flags = {"resume": args.resume, "overwrite": args.overwrite, "no_cache": args.no_cache}
        distributed.agree_on_config({**config.to_dict(), "options": flags})
        summary = run_config(
            config,
            resume=args.resume,
            overwrite=args.overwrite,
            progress=not args.quiet,
            use_cache=not args.no_cache,
        )
        if not distributed.is_root():  # rank 0 speaks for the run
            return 0
    print(_run_text(summary))
    if args.json:
        print(json_line(summary))
    return 0


def _run_text(summary: dict) -> str:
    lines = [
        f"{summary['name']}: {summary['n_iter']} iterations, {summary['n_params']} parameters, "
        f"{summary['seconds']:.1f} s ({summary['seconds_per_iter']:.3f} s per iteration)",
        f"  energy          {summary['energy']:.10f} ± {summary['energy_error']:.2e}",
        f"  variance        {summary['variance']:.4e}   V-score {summary['v_score']:.3e}",
    ]
    if summary.get("stopped_by") not in (None, "n_samples"):
        lines.append(
            f"  final samples   {summary['final_samples']} (the {summary['stopped_by']} ended "
            "the measurement)"
        )
    extrapolated = summary.get("extrapolated_energy")
    if extrapolated is not None and math.isfinite(extrapolated):
        lines.append(
            f"  zero variance   {extrapolated:.10f} ± {summary['extrapolated_error']:.2e}   "
            "(E against Var over the last half of the steps, 4 stages)"
        )
    if summary["exact_energy"] is not None:
        source = summary.get("reference") or "exact diagonalization"
        lines.append(f"  exact energy    {summary['exact_energy']:.10f}   ({source})")
    if summary["relative_error"] is not None:  # None when there is no exact energy, or it is 0
        relative = summary["relative_error"]
        lines.append(f"  relative error  {relative:+.3e}   (E − E_exact)/|E_exact|")
    if summary.get("note"):
        lines.append(f"  note            {summary['note']}")
    lines.append(f"  results         {summary['results_file']}")
    return "\n".join(lines)


def _cmd_report(args) -> int:
    from vitqs.report import printable, report
    from vitqs.results import ResultsError, read_results

    try:
        if Path(args.path).is_file():  # one file: unreadable is an error, not a table row
            read_results(args.path)
        table, pngs = report(args.path)
    except ResultsError as err:
        raise ConfigError(str(err)) from None
    print(table)
    for png in pngs:
        print(printable(str(png)))  # a file's name comes from whoever named it
    return 0


def _lanczos_progress(line: str) -> None:
    print(f"lanczos: {line}", file=sys.stderr, flush=True)


def _cmd_lanczos(args) -> int:
    from vitqs.lanczos_file import lanczos_of_file

    if args.n_samples is not None and args.n_samples < 1:
        raise ConfigError(f"lanczos: --n-samples={args.n_samples} must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"lanczos: --threads={args.threads} must be >= 1")
    row = lanczos_of_file(
        args.path,
        n_samples=args.n_samples,
        full_sum=args.full_sum,
        progress=_lanczos_progress,
        threads=args.threads,
    )
    how = "full sum"
    if not row["full_sum"]:  # the split R̂ of the step's chains: whether they reached H's tails
        how = f"{row['n_samples']} samples of g², chains' R̂ {row['r_hat']:.2f}"
    lines = [
        f"{args.path}: one Lanczos step, ψ₁ = (1 + αH)ψ with α = {row['alpha']:.6g} ({how})",
        f"  ψ   energy {row['energy_0']:.10f} ± {row['energy_0_error']:.2e}   variance "
        f"{row['variance_0']:.4e}",
        f"  ψ₁  energy {row['energy']:.10f} ± {row['energy_error']:.2e}   variance "
        f"{row['variance']:.4e}",
        f"  zero-variance extrapolation of the two  {row['extrapolated']:.10f}",
    ]
    if not math.isnan(row["relative_error"]):
        lines.append(f"  ψ₁ relative error  {row['relative_error']:+.3e}   (E − E_exact)/|E_exact|")
    if not row["full_sum"]:  # a full sum's gain is exact: its two energies say it
        lines.append(
            f"  gain E₁ − E₀  {row['gain']:.4e} ± {row['gain_error']:.1e}   (the same samples)"
        )
    if "final_plus_gain" in row:
        lines.append(
            f"  ψ₁ as the final measurement + gain  {row['final_plus_gain']:.10f} ± "
            f"{row['final_plus_gain_error']:.2e}"
        )
        relative = row["final_plus_gain_relative_error"]
        if not math.isnan(relative):
            lines.append(f"  its relative error  {relative:+.3e}")
    if row.get("note"):
        lines.append(f"  note: {row['note']}")
    print("\n".join(lines))
    if args.json:
        print(json_line(row))
    return 0


def _cmd_sectors(args) -> int:
    from vitqs.build import build_hamiltonian, run_exact
    from vitqs.models.sectors import same_sector
    from vitqs.sector_search import FIRST_STEPS, SECTOR_STEPS, search, search_sign_prior

    if args.seconds is not None and not 0 < args.seconds <= 1e7:
        raise ConfigError(f"sectors: --seconds={args.seconds:g} must be in (0, 1e7]")
    if args.first_steps is not None and args.first_steps < 1:
        raise ConfigError(f"sectors: --first-steps={args.first_steps} must be >= 1")
    config = load(args.config, args.overrides)
    race = search_sign_prior if args.sign_prior else search
    result = race(
        config,
        seconds=args.seconds,
        first_steps=args.first_steps or (FIRST_STEPS if args.sign_prior else SECTOR_STEPS),
        say=lambda line: print(line, file=sys.stderr),
    )
    what = "sign priors" if args.sign_prior else "candidate sectors"
    print(f"{config.name}: {len(result.trials)} {what}, {result.seconds:.1f} s")
    header = f"{'late energy ± σ':<28} {'variance':>9}  {'zero-variance E ± σ':<26}"
    print(f"  {'candidate':<36} {header}")
    for row in result.rows():
        energy = "" if row["energy"] is None else f"{row['energy']:.8f} ± {row['energy_error']:.1e}"
        variance = "" if row["variance"] is None else f"{row['variance']:.2e}"
        zero = row["zero_variance"]
        zero = "" if zero is None else f"{zero:.6f} ± {row['zero_variance_error']:.1e}"
        why = f"  {row['refused']}" if row["refused"] else ""
        print(
            f"  {row['candidate']:<36} {energy:<28} {variance:>9}  {zero:<26} "
            f"{row['steps']:>5} steps{why}"
        )
    chosen = result.chosen
    print(f"chosen  {chosen.label()}, {result.margin_sigma:.3g} σ below the runner-up")
    print(f"        {result.settled_text()}")
    if args.sign_prior:  # ED has no sign prior to check the choice against
        print(f"        model.sign_prior: {chosen.name}")
        if args.json:
            print(json_line(_race_json(result, None)))
        return 0
    print(f"        model.sector: {_model_sector(chosen.keys())}")
    check = None
    if config.exact.enabled is not False:
        try:
            exact_sector = run_exact(config)["sector"]
        except ConfigError as err:
            print(f"ED      none ({first_line(err, 120)})")
        else:
            check = same_sector(build_hamiltonian(config).lattice, chosen, exact_sector)
            print(f"ED      {_sector_text(exact_sector)}: {'agrees' if check else 'DIFFERS'}")
    if args.json:
        print(json_line(_race_json(result, check)))
    return 0


def _race_json(result, ed_agrees) -> dict:
    return {
        "chosen": result.chosen.keys(),
        "margin_sigma": result.margin_sigma,
        "settled": not result.unsettled(),
        "seconds": result.seconds,
        "ed_agrees": ed_agrees,
        "trials": result.rows(),
    }


def _cmd_sweep(args) -> int:
    from vitqs import distributed
    from vitqs.build import resolve_device
    from vitqs.report import markdown_table
    from vitqs.sweep import load_sweep, point_configs, run_sweep

    spec = load_sweep(args.sweep)
    configs = point_configs(spec)
    first = configs[0][1]
    with distributed.process_group(resolve_device(first.device), first.distributed.timeout):
        distributed.agree_on_config(
            {
                **spec,
                "base_path": str(spec["base_path"]),
                "points": [config.to_dict() for _, config in configs],
                "options": {"no_cache": args.no_cache},
            }
        )
        outcome = run_sweep(args.sweep, progress=not args.quiet, use_cache=not args.no_cache)
        if not distributed.is_root():
            return 0
    rows = outcome["rows"]
    print(markdown_table(rows, list(dict.fromkeys(k for row in rows for k in row))))
    for path in outcome["tables"] + outcome["figures"]:
        print(path)
    if args.json:
        print(json_line({"name": outcome["name"], "points": rows}))
    return 0


def _cmd_bench(args) -> int:
    return _BENCHES[args.bench](args)


def _bench_accuracy(args) -> int:
    import os
    import subprocess

    def direct(stream):  # a caller's io.StringIO has no file descriptor for the child
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            return subprocess.PIPE
        return stream

    # a checkout's script: it drives netket beside vitqs, and nothing in src/ imports netket.
    # Run as a program, it finds its sibling scripts (netket_peer) on its own path.
    script = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_accuracy.py"
    if not script.exists():
        raise ConfigError(f"bench accuracy runs '{script}', which needs a checkout of vitqs")
    sys.stdout.flush()
    sys.stderr.flush()
    done = subprocess.run(
        [sys.executable, str(script), *args.extra],
        stdout=direct(sys.stdout),
        stderr=direct(sys.stderr),
        env={**os.environ, "VITQS_PROG": "vitqs bench accuracy"},  # its usage and errors
        text=True,
    )
    for text, stream in ((done.stdout, sys.stdout), (done.stderr, sys.stderr)):
        if text:  # what went through a pipe
            stream.write(text)
    if "-h" in args.extra or "--help" in args.extra:
        raise SystemExit(done.returncode)  # as every other command's --help: argparse exits
    return done.returncode


def _bench_speed(args) -> int:
    from vitqs.benchmark import machine, phase_table, time_steps

    if args.extra:
        raise ConfigError(f"bench speed: unrecognized arguments: {' '.join(args.extra)}")
    if args.n_iter < 1:
        raise ConfigError(f"bench speed: --n-iter={args.n_iter} must be >= 1")
    config = load(args.config, args.overrides)
    compile_chains = {"auto": None, "yes": True, "no": False}[args.compile]
    result = time_steps(config, n_iter=args.n_iter, compile_chains=compile_chains)
    print(f"{config.name}: {machine()}")
    print(phase_table(result))
    if args.json:
        print(json_line(result))
    return 0


_BENCHES = {"accuracy": _bench_accuracy, "speed": _bench_speed}

_DISTRIBUTED_COMMANDS = ("run", "sweep")
_COMMANDS = {
    "ed": _cmd_ed,
    "run": _cmd_run,
    "sweep": _cmd_sweep,
    "report": _cmd_report,
    "lanczos": _cmd_lanczos,
    "sectors": _cmd_sectors,
    "bench": _cmd_bench,
}


def _failures():
    """Returns the run's exception classes; imported late (torch loads with them)."""
    from vitqs.distributed import CollectiveFailed
    from vitqs.runner import RunInterrupted, RunStopped

    return RunInterrupted, RunStopped, CollectiveFailed


def _check_launch(command: str) -> None:
    """Refuses, under ``torchrun`` with several ranks, a command that runs in one process."""
    from vitqs.distributed import launched

    if launched() and command not in _DISTRIBUTED_COMMANDS:
        raise ConfigError(
            f"'vitqs {command}' runs in one process; under torchrun only "
            f"{' and '.join(_DISTRIBUTED_COMMANDS)} spread over ranks (start it without torchrun)"
        )


def main(argv: list[str] | None = None) -> int:
    """Runs one ``vitqs`` command; returns the exit code (2 for bad input)."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench":  # only a bench script takes options of its own
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    interrupted, stopped, collective_failed = _failures()
    try:
        _check_launch(args.command)
        return _COMMANDS[args.command](args)
    except ConfigError as err:
        return _failed(args, f"error: {err}", 2)
    except KeyboardInterrupt:
        return _failed(args, "interrupted", 130)
    except interrupted as err:
        return _failed(args, f"{err}. {_resume_hint(args)}", 128 + err.signal_number)
    except stopped as err:
        hint = _resume_hint(args) if err.resumable else ""
        return _failed(args, f"error: {err}. {hint}".rstrip(), 2)
    except collective_failed as err:
        return _failed(args, f"error: {err}. {_resume_hint(args)}", 2)
    except MemoryError:
        return _failed(args, f"error: {_OUT_OF_MEMORY}", 2)
    except RuntimeError as err:
        if not _out_of_memory(err):
            raise
        return _failed(args, f"error: {_OUT_OF_MEMORY}", 2)


_OUT_OF_MEMORY = (
    "out of memory; lower sampler.n_samples, sampler.n_chains, final.n_samples or the model's "
    "size, or set sampler.chunk_size to bound each forward pass"
)


def _out_of_memory(err: RuntimeError) -> bool:
    """Returns whether torch's error says an allocation failed (CPU or CUDA)."""
    import torch

    if isinstance(err, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(err)
    return "can't allocate memory" in text or "out of memory" in text


def _failed(args, message: str, code: int) -> int:
    """Prints ``message`` on stderr and, under ``--json``, a last stdout line saying the same
    (a script reading that line learns why there is no result); returns the exit code."""
    message = " ".join(message.split())  # one line, whatever the reason's text held
    print(f"vitqs {args.command}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json_line({"error": message.removeprefix("error: "), "exit_code": code}))
    return code


def _resume_hint(args) -> str:
    """Returns the command that resumes an interrupted run or sweep, as the user typed it."""
    if args.command == "sweep":  # a sweep resumes its unfinished point by itself
        return f"Resume with: vitqs sweep {shlex.quote(args.sweep)}"
    overrides = "".join(f" --set {shlex.quote(item)}" for item in args.overrides)
    return f"Resume with: vitqs run {shlex.quote(args.config)}{overrides} --resume"


if __name__ == "__main__":
    sys.exit(main())
