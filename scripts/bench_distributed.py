"""Times one run on K torch.distributed ranks against the same run in one process.

Usage: python scripts/bench_distributed.py CONFIG [--ranks K] [--n-iter N] [--set KEY=VALUE ...]

Runs ``vitqs run CONFIG`` twice with the same total samples and chains: once as one process
with ``threads: K``, once under ``torchrun --standalone --nproc-per-node K`` with one thread
per rank (gloo on CPU, NCCL on GPUs when ``device`` says CUDA). Prints the median seconds
per iteration of each phase (from the results files' history), the ratio one process / K
ranks, and both final energies: the two runs differ only in their Metropolis streams, so the
energies should agree within their error bars.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from vitqs import results

PHASES = ("sampling", "local_energy", "jacobian", "solve", "total")


def _vitqs(launch: list[str], config: str, out_dir: Path, name: str, sets: list[str]) -> dict:
    """Returns the summary of one ``vitqs run`` started by ``launch``."""
    argv = [*launch, "run", config, "--quiet", "--json", "--overwrite"]
    argv += ["--set", f"output.dir={out_dir}", "--set", f"name={name}"]
    for item in sets:
        argv += ["--set", item]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{name}: vitqs run failed\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _phase_medians(path: str) -> dict[str, float]:
    history = results.read_results(path).history[2:]  # warm-up steps left out
    return {
        phase: statistics.median(row[f"seconds_{phase}"] for row in history) for phase in PHASES
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (and threads of one process)")
    parser.add_argument("--n-iter", type=int, default=12, help="iterations of each run")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.n_iter < 3:
        parser.error("--ranks must be >= 2 and --n-iter >= 3")
    sets = [*args.sets, f"optimizer.n_iter={args.n_iter}", "output.checkpoint_every=1000"]
    python = [sys.executable, "-m"]
    torchrun = [*python, "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", str(args.ranks), "-m", "vitqs"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        one = _vitqs([*python, "vitqs"], args.config, out, "one", [*sets, f"threads={args.ranks}"])
        many = _vitqs(torchrun, args.config, out, "ranks", [*sets, "threads=1"])
        rows = {"one": _phase_medians(one["results_file"])}
        rows["ranks"] = _phase_medians(many["results_file"])
    print(f"{args.config}: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
    print(
        f"| seconds per iteration | 1 process, {args.ranks} threads | {args.ranks} ranks | ratio |"
    )
    print("| --- | --- | --- | --- |")
    for phase in PHASES:
        a, b = rows["one"][phase], rows["ranks"][phase]
        print(f"| {phase} | {a:.4g} | {b:.4g} | {a / b:.3g} |")
    for label, summary in (("1 process", one), (f"{args.ranks} ranks", many)):
        print(
            f"{label}: E = {summary['energy']:.8f} ± {summary['energy_error']:.1e}"
            f" after {summary['n_iter']} iterations"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
