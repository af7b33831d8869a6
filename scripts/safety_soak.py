"""Soak tests of vitqs's safety, longer than the test suite runs them.

1. ``--kills N``: N real runs of the tiny ring (``vitqs run`` subprocesses) killed with
   SIGKILL at a random moment (during steps, checkpoint writes or the final measurement),
   each resumed with ``--resume``; every resumed run must end with the final energy of the
   same run done in one go, and every killed file must read as a whole version.
2. ``--fuzz N``: N generated bad configs (tests/test_config_fuzz.py) from ``--seed``.

    python scripts/safety_soak.py --kills 60 --fuzz 5000 --seed 1

Prints one line per trial kind with the counts; exits 1 if any trial failed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from vitqs import results

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "name": "tiny",
    "seed": 3,
    "threads": 1,
    "lattice": {"shape": [6], "pbc": True},
    "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "sign_rule": True},
    "model": {"patch_size": 2, "d_model": 8, "heads": 2, "layers": 1},
    "sampler": {"n_samples": 64, "n_chains": 16, "n_discard": 2},
    "optimizer": {"lr": 0.02, "n_iter": 20},
    "final": {"n_samples": 4096},
    "output": {"checkpoint_every": 1},
}


def _vitqs(*argv, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "VITQS_CACHE_DIR": str(cache)}
    return subprocess.Popen(
        [sys.executable, "-m", "vitqs", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _config(folder: Path) -> Path:
    data = {**TINY, "output": {**TINY["output"], "dir": str(folder / "out")}}
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _final_energy(h5: Path) -> float:
    return results.read_results(h5).final["energy"]


def kill_trials(n_trials: int, gen: random.Random, cache: Path) -> tuple[int, int, list[str]]:
    """Returns (trials, trials killed after their first write and before they finished,
    failures)."""
    with tempfile.TemporaryDirectory() as straight:
        config = _config(Path(straight))
        start = time.monotonic()
        done = _vitqs("run", config, "--quiet", cache=cache)
        _, err = done.communicate()
        duration = time.monotonic() - start  # the process's whole life, imports included
        if done.returncode != 0:
            return 0, 0, [f"the uninterrupted run failed: {err.strip()[-300:]}"]
        expected = _final_energy(Path(straight) / "out" / "tiny.h5")
    failures, killed = [], 0
    for trial in range(n_trials):
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            config = _config(folder)
            h5 = folder / "out" / "tiny.h5"
            process = _vitqs("run", config, "--quiet", cache=cache)
            time.sleep(gen.uniform(0.0, duration))  # any moment of its life
            process.send_signal(signal.SIGKILL)
            process.communicate()
            if process.returncode == 0 or not h5.exists():
                continue  # finished before the signal, or killed before its first write
            killed += 1
            try:
                record = results.read_results(h5)
            except results.ResultsError as err:
                failures.append(f"trial {trial}: the killed file does not read ({err})")
                continue
            argv = ("run", config, "--quiet") + (("--resume",) if record.checkpoint else ())
            argv += ("--overwrite",) if not record.checkpoint else ()
            resumed = _vitqs(*argv, cache=cache)
            _, err = resumed.communicate()
            if resumed.returncode != 0:
                failures.append(f"trial {trial}: the resume failed ({err.strip()[-300:]})")
            elif _final_energy(h5) != expected:
                failures.append(f"trial {trial}: {_final_energy(h5)!r} != {expected!r}")
    return n_trials, killed, failures


def fuzz(n_examples: int, seed: int) -> int:
    env = {**os.environ, "VITQS_FUZZ_EXAMPLES": str(n_examples), "VITQS_FUZZ_SEED": str(seed)}
    test = "tests/test_config_fuzz.py::test_every_generated_bad_config_exits_2_naming_its_key"
    test += "_and_writes_nothing"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:])
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=60, help="SIGKILL-and-resume trials")
    parser.add_argument("--fuzz", type=int, default=5000, help="generated bad configs")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    status = 0
    with tempfile.TemporaryDirectory() as cache:
        n, killed, failures = kill_trials(args.kills, random.Random(args.seed), Path(cache))
    print(f"SIGKILL at random moments: {n} trials, {killed} killed mid-run, {len(failures)} failed")
    for failure in failures:
        print(f"  {failure}")
    status |= bool(failures)
    if args.fuzz:
        print(f"fuzzed configs ({args.fuzz} from seed {args.seed}): ", end="", flush=True)
        status |= fuzz(args.fuzz, args.seed) != 0
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
