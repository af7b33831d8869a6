"""Runs across torch.distributed ranks: real processes started by torchrun, gloo on CPU.

Each rank holds its own chains; the estimates and updates that cross ranks must be those of
all samples in one process (to rounding), and the run must behave as one run: one results
file, equal parameters on every rank, one decision to stop, a checkpoint that resumes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
import torch
import yaml
from _distributed_worker import dataset, estimates, share
from helpers import (
    assert_one_line_error,
    last_json,
    run_main,
    tiny_bose_hubbard,
    tiny_heisenberg,
    write_config,
)

from vitqs import results
from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg

WORKER = Path(__file__).with_name("_distributed_worker.py")
N_RANKS = 2


def torchrun(*argv, n_ranks: int = N_RANKS, module: bool = False) -> subprocess.CompletedProcess:
    """Returns the finished ``torchrun --standalone`` of a script (or ``-m`` module)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launch += ["--nproc-per-node", str(n_ranks)]
    launch += ["-m"] if module else []
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*launch, *map(str, argv)], capture_output=True, text=True, env=env, timeout=300
    )


def assert_ranks_refused(done: subprocess.CompletedProcess, *names: str) -> None:
    """A rank exited 2 with the one-line error naming ``names`` (torchrun may stop the other
    before it says the same), none with a traceback of vitqs code (torchrun adds its own
    report of the failed ranks)."""
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("vitqs run: error")]
    assert 1 <= len(errors) <= N_RANKS and len(set(errors)) == 1, done.stderr[-3000:]
    assert all(name in errors[0] for name in names), errors[0]
    assert "exitcode  : 2" in done.stderr
    frames = [line for line in done.stderr.splitlines() if line.strip().startswith('File "')]
    assert not any("vitqs" in frame for frame in frames if "bin/torchrun" not in frame)


def vitqs_on_ranks(*argv, n_ranks: int = N_RANKS) -> subprocess.CompletedProcess:
    return torchrun("vitqs", *argv, n_ranks=n_ranks, module=True)


@pytest.fixture(scope="module")
def reductions(tmp_path_factory):
    out = tmp_path_factory.mktemp("reductions")
    done = torchrun(WORKER, "reductions", out)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out / "reductions.pt")


def test_estimates_across_ranks_equal_those_of_all_samples_in_one_process(reductions):
    whole = estimates(share(dataset(), 0, 1))
    assert set(reductions) == set(whole)
    for name, value in whole.items():
        torch.testing.assert_close(reductions[name], value, rtol=1e-10, atol=1e-12, msg=name)


def test_the_data_set_gives_the_estimates_something_to_get_wrong(reductions):
    # a rank's own share gives other numbers: the sums over ranks are not a no-op
    own = estimates(share(dataset(), 0, 2))
    names = ("stats", "sr_uniform", "minsr_weighted", "gradient", "structure_factor_error")
    for name in (*names, "condensate_fraction_error", "densities_mean"):
        assert not torch.allclose(own[name], reductions[name], rtol=1e-3), name
    assert int(reductions["stats_n"]) == 128  # samples of both ranks
    assert float(reductions["stats"][4]) > 0.5  # correlated chains: τ matters


@pytest.fixture(scope="module")
def run_on_ranks(tmp_path_factory):
    """A 6-site ring optimized on two ranks (16 chains, 8 each), via the worker."""
    out = tmp_path_factory.mktemp("run")
    data = tiny_heisenberg(
        out / "results",
        optimizer={"lr": 0.05, "n_iter": 60},
        sampler={"n_samples": 256, "n_chains": 16, "n_discard": 2},
        final={"n_samples": 2048},
    )
    config = write_config(out / "tiny.yaml", data)
    done = torchrun(WORKER, "run", config, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, data


def test_every_rank_ends_with_the_same_parameters_and_its_own_chains(run_on_ranks):
    out, _ = run_on_ranks
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(N_RANKS)]
    assert torch.equal(ranks[0]["parameters"], ranks[1]["parameters"])
    assert ranks[0]["chains"].shape == ranks[1]["chains"].shape == (8, 6)
    assert not torch.equal(ranks[0]["chains"], ranks[1]["chains"])  # seeds of their own


def test_no_rank_keeps_gloo_threads_running_once_its_process_group_is_gone(run_on_ranks):
    # threads left running meet the interpreter's shutdown, where one releasing a collective's
    # tensors aborts the rank now and then (SIGABRT after a finished run)
    out, _ = run_on_ranks
    assert [(out / f"gloo_threads{r}.txt").read_text() for r in range(N_RANKS)] == ["0", "0"]


def test_a_run_on_two_ranks_writes_one_file_and_reaches_the_ground_state(run_on_ranks):
    out, data = run_on_ranks
    assert sorted(p.name for p in (out / "results").iterdir()) == ["tiny.h5"]
    record = results.read_results(out / "results" / "tiny.h5")
    assert record.status == "finished" and len(record.history) == 60
    assert all(row["n_samples"] == 256 for row in record.history)  # both ranks' samples
    assert record.final["n_samples"] == 2048
    exact_energy = exact.ground_state(Heisenberg(Lattice((6,)), J1=1.0, sign_rule=True)).energy
    assert record.exact["energy"] == pytest.approx(exact_energy, rel=1e-12)
    # 60 SR steps at lr 0.05 take this ring from the random start's 28 % error to 4e-5
    assert abs(record.final["relative_error"]) < 1e-3
    state = results.load_checkpoint(record)["sampler"]
    assert state["chains"].shape == (16, 6)  # every rank's chains
    assert len(state["generators"]) == N_RANKS


def test_the_cli_on_two_ranks_prints_once_and_resumes_in_one_process_or_two(tmp_path):
    data = tiny_heisenberg(tmp_path / "results", optimizer={"n_iter": 3})
    config = write_config(tmp_path / "tiny.yaml", data)
    first = vitqs_on_ranks("run", config, "--quiet", "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("results ") == 1  # rank 0 alone prints
    assert last_json(first.stdout)["n_iter"] == 3
    again = vitqs_on_ranks("run", config, "--quiet", "--resume", "--set", "optimizer.n_iter=5")
    assert again.returncode == 0, again.stderr[-3000:]
    path = tmp_path / "results" / "tiny.h5"
    record = results.read_results(path)
    assert len(record.history) == 5 and record.status == "finished"
    # a checkpoint of two ranks resumes in one process: the chains, shared out anew
    alone = subprocess.run(
        [sys.executable, "-m", "vitqs", "run", config, "--quiet", "--resume"]
        + ["--set", "optimizer.n_iter=7"],
        capture_output=True,
        text=True,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    record = results.read_results(path)
    assert len(record.history) == 7
    with h5py.File(path) as f:
        assert f.attrs["status"] == "finished"
    chains = results.load_checkpoint(record)["sampler"]["chains"]
    assert chains.shape == (16, 6)


def test_chains_that_do_not_share_out_evenly_are_refused_by_every_rank(tmp_path):
    data = tiny_heisenberg(tmp_path / "out", sampler={"n_samples": 45, "n_chains": 15})
    done = vitqs_on_ranks("run", write_config(tmp_path / "c.yaml", data), "--quiet")
    assert_ranks_refused(done, "sampler.n_chains=15", "ranks (2)")
    assert not (tmp_path / "out").exists()


def test_a_full_sum_is_refused_across_ranks(tmp_path):
    data = tiny_heisenberg(tmp_path / "out", sampler={"kind": "full_sum"})
    done = vitqs_on_ranks("run", write_config(tmp_path / "c.yaml", data), "--quiet")
    assert_ranks_refused(done, "sampler.kind=full_sum", "torchrun")
    assert not (tmp_path / "out").exists()


def test_commands_of_one_process_are_refused_under_torchrun(tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path / "c.yaml", tiny_heisenberg(tmp_path / "out"))
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets for each rank
    code, _, err = run_main(capsys, "ed", config)
    assert_one_line_error(code, err, "vitqs ed", "torchrun")


def _rank_processes(launcher: subprocess.Popen, timeout: float = 60.0) -> dict[int, int]:
    """Returns the pids of the ranks torchrun started, by rank (read from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = {}
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
        for pid in children.read_text().split():
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                values = dict(item.split(b"=", 1) for item in environ if b"=" in item)
                if b"RANK" in values:
                    ranks[int(values[b"RANK"])] = int(pid)
        if len(ranks) == N_RANKS:
            return ranks
        time.sleep(0.1)
    raise AssertionError("torchrun started no ranks")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads ranks from /proc")
def test_a_signal_to_one_rank_stops_all_at_one_step_with_a_checkpoint(tmp_path):
    data = tiny_heisenberg(
        tmp_path / "out", optimizer={"n_iter": 100_000}, output={"checkpoint_every": 2}
    )
    config = write_config(tmp_path / "tiny.yaml", data)
    h5 = tmp_path / "out" / "tiny.h5"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launch += ["--nproc-per-node", str(N_RANKS), "-m", "vitqs", "run", str(config), "--quiet"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen(launch, stderr=subprocess.PIPE, text=True, env=env)
    pids = {}
    try:
        pids = _rank_processes(launcher)
        deadline = time.monotonic() + 120
        while not (h5.exists() and results.read_results(h5).checkpoint is not None):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.05)
        os.kill(pids[1], signal.SIGTERM)  # rank 1 alone: rank 0 must learn of it
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:  # stuck: a rank left behind would run 100,000 steps
            launcher.kill()
            launcher.wait()
            for pid in pids.values():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert launcher.returncode != 0
    assert "SIGTERM received" in err and "--resume" in err
    record = results.read_results(h5)
    assert record.status == "interrupted"
    assert record.checkpoint_step == len(record.history) >= 2

    n_iter = len(record.history) + 2
    done = vitqs_on_ranks(
        "run", config, "--quiet", "--resume", "--set", f"optimizer.n_iter={n_iter}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = results.read_results(h5)
    assert record.status == "finished" and len(record.history) == n_iter


def test_a_warm_started_sweep_on_two_ranks_writes_its_points_and_tables_once(tmp_path):
    write_config(tmp_path / "base.yaml", tiny_bose_hubbard(tmp_path / "out"))
    spec = {"base": "base.yaml", "name": "u_scan", "sweep": {"hamiltonian.U": [2.0, 6.0]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**spec, "warm_start": True}))
    done = vitqs_on_ranks("sweep", path, "--quiet", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    points = last_json(done.stdout)["points"]
    assert done.stdout.count("summary.csv") == 1  # rank 0 alone writes and prints
    folder = tmp_path / "out" / "u_scan"
    assert sorted(p.name for p in folder.glob("*.h5")) == ["U=2.0.h5", "U=6.0.h5"]
    for point in points:
        record = results.read_results(folder / f"U={point['U']}.h5")
        assert record.status == "finished" and point["energy"] == record.final["energy"]
        assert record.exact["energy"] == point["exact_energy"]
        assert len(results.load_checkpoint(record)["sampler"]["generators"]) == N_RANKS


def test_the_benchmark_script_times_one_process_against_two_ranks(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "unused"))
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_distributed.py"
    done = subprocess.run(
        [sys.executable, str(script), config, "--n-iter", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[2:]] == [
        "sampling",
        "local_energy",
        "jacobian",
        "solve",
        "total",
    ]
    for row in rows[2:]:  # seconds of each side, and their ratio
        one, ranks, ratio = (float(cell) for cell in row.split("|")[2:5])
        assert one > 0 and ranks > 0 and ratio == pytest.approx(one / ranks, rel=1e-2)
    energies = [line for line in done.stdout.splitlines() if "E = " in line]
    assert [line.split(":")[0] for line in energies] == ["1 process", "2 ranks"]
    assert not (tmp_path / "unused").exists()  # the runs' files went to a temporary folder


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ranks_by_hand(*per_rank_argv, cwds=None) -> list[subprocess.Popen]:
    """Starts one ``python -m vitqs`` per argument list as the ranks of one job, without
    torchrun (which would stop the others itself when one fails): what the ranks do on
    their own, with the rendezvous variables torchrun would set; ``cwds``: each rank's
    working folder (as each node sees its own disk)."""
    port = str(_free_port())
    processes = []
    for rank, argv in enumerate(per_rank_argv):
        env = {
            **os.environ,
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": str(len(per_rank_argv)),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "vitqs", *map(str, argv)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=None if cwds is None else cwds[rank],
            )
        )
    return processes


def test_ranks_that_read_different_configs_refuse_at_the_start(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    processes = ranks_by_hand(
        ("run", config, "--quiet"), ("run", config, "--quiet", "--set", "optimizer.lr=0.05")
    )
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert_one_line_error(process.returncode, err, "optimizer.lr", "rank 1")
    assert not (tmp_path / "out").exists()


def test_ranks_run_with_other_options_refuse_at_the_start(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    processes = ranks_by_hand(("run", config, "--quiet"), ("run", config, "--quiet", "--no-cache"))
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert_one_line_error(process.returncode, err, "options.no_cache", "rank 1")
    assert not (tmp_path / "out").exists()


def test_ranks_that_read_other_bytes_from_init_from_refuse_at_the_start(tmp_path, capsys):
    # one relative model.init_from, two nodes' disks (each rank's own working folder)
    prior = write_config(tmp_path / "prior.yaml", tiny_heisenberg(tmp_path / "prior"))
    assert run_main(capsys, "run", prior, "--quiet")[0] == 0
    finished = tmp_path / "prior" / "tiny.h5"
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
        (node / "prior.h5").write_bytes(finished.read_bytes())
    record = results.read_results(nodes[1] / "prior.h5")
    results.write_results(nodes[1] / "prior.h5", record)  # another 'updated': other bytes
    data = tiny_heisenberg(tmp_path / "out", model={"init_from": "prior.h5"}, name="next")
    config = write_config(tmp_path / "next.yaml", data)
    processes = ranks_by_hand(("run", config, "--quiet"), ("run", config, "--quiet"), cwds=nodes)
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert_one_line_error(process.returncode, err, "model.init_from", "rank 1", "prior.h5")
    assert not (tmp_path / "out").exists()


def test_a_nan_on_one_rank_is_retried_by_every_rank(tmp_path):
    # rank 1 alone drew a NaN: before, it alone undid the last update and drew again while
    # rank 0 went on, their collectives parted and the job hung until distributed.timeout
    data = tiny_heisenberg(
        tmp_path / "results",
        optimizer={"n_iter": 6},
        sampler={"n_samples": 64, "n_chains": 16, "n_discard": 2},
        distributed={"timeout": 30},
    )
    config = write_config(tmp_path / "tiny.yaml", data)
    done = torchrun(WORKER, "nan", config, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(N_RANKS)]
    assert torch.equal(ranks[0]["parameters"], ranks[1]["parameters"])
    record = results.read_results(tmp_path / "results" / "tiny.h5")
    shifts = [row["diag_shift"] for row in record.history]
    # the third draw, step 2, was retried with the diagonal shift x10, on both ranks
    assert shifts[2] == pytest.approx(10 * shifts[0]) and shifts[3] == shifts[0]
    assert record.status == "finished" and len(record.history) == 6


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_within_the_timeout_and_the_run_resumes(tmp_path, capsys):
    timeout = 20
    data = tiny_heisenberg(
        tmp_path / "out",
        optimizer={"n_iter": 100_000},
        output={"checkpoint_every": 2},
        distributed={"timeout": timeout},
    )
    config = write_config(tmp_path / "tiny.yaml", data)
    h5 = tmp_path / "out" / "tiny.h5"
    processes = ranks_by_hand(("run", config, "--quiet"), ("run", config, "--quiet"))
    try:
        deadline = time.monotonic() + 120
        while not (h5.exists() and results.read_results(h5).checkpoint is not None):
            assert time.monotonic() < deadline and processes[0].poll() is None
            time.sleep(0.05)
        processes[1].kill()  # SIGKILL: rank 1 is gone without a word
        killed = time.monotonic()
        _, err = processes[0].communicate(timeout=timeout + 60)
        waited = time.monotonic() - killed
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert waited < timeout + 15, waited
    assert_one_line_error(processes[0].returncode, err, "rank 0", "collective", "Resume with:")
    record = results.read_results(h5)
    assert record.status == "interrupted" and record.checkpoint is not None

    # one process goes on from the last checkpoint
    n_iter = record.checkpoint_step + 2
    code, _, err = run_main(
        capsys, "run", config, "--resume", "--quiet", "--set", f"optimizer.n_iter={n_iter}"
    )
    assert code == 0, err
    assert len(results.read_results(h5).history) == n_iter
