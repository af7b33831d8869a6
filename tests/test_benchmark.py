"""Speed benchmark: ``vitqs bench speed`` and ``scripts/bench_step.py`` run on a tiny config and
print the phase table; ``--with-netket`` without netket skips with one clear line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    assert_one_line_error,
    last_json,
    run_main,
    tiny_heisenberg,
    write_config,
)

from vitqs.benchmark import PHASES

BENCH_STEP = Path(__file__).resolve().parents[1] / "scripts" / "bench_step.py"


def _bench_step(*argv, hide_netket=False) -> subprocess.CompletedProcess:
    """Runs ``scripts/bench_step.py argv``; ``hide_netket`` makes ``import netket`` fail."""
    shim = "import sys; sys.modules['netket'] = None; " if hide_netket else ""
    code = (
        f"{shim}import runpy, sys; sys.argv = ['bench_step.py', *sys.argv[1:]]; "
        f"runpy.run_path({str(BENCH_STEP)!r}, run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
        # the script's siblings (netket_peer), as `python scripts/bench_step.py` finds them
        env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(BENCH_STEP.parent)},
    )


def _script(name: str, *argv) -> subprocess.CompletedProcess:
    """Runs ``scripts/NAME argv`` as ``python scripts/NAME`` would."""
    script = BENCH_STEP.parent / name
    return subprocess.run(
        [sys.executable, str(script), *map(str, argv)], capture_output=True, text=True, timeout=120
    )


def _phase_rows(out: str) -> set[str]:
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_bench_speed_prints_the_phase_table(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    code, out, err = run_main(capsys, "bench", "speed", path, "--n-iter", "2", "--json")
    assert code == 0, err
    assert {*PHASES, "step"} <= _phase_rows(out)
    result = last_json(out)
    assert set(result["seconds"]) == set(PHASES)
    # other = step − Σ phases per step, so the phases cannot exceed the step by much
    assert sum(result["seconds"].values()) == pytest.approx(result["seconds_per_iter"], rel=0.5)
    # each phase's counted operations over its median time, beside the matrix-product peak
    seconds = result["seconds"]
    times = {
        "sampling": seconds["sampling"],
        "local_energy": seconds["local_energy"],
        "jacobian+solve": seconds["jacobian"] + seconds["solve"],
    }
    for phase, t in times.items():
        # the 6-site sector's table gives the local energies with no forward pass: 0
        assert result["flops"][phase] > 0 or phase == "local_energy", phase
        assert result["gflops"][phase] == pytest.approx(result["flops"][phase] / t / 1e9)
    assert set(result["peak_gflops"]) == {"float64", "float32"}
    assert all(value > 0 for value in result["peak_gflops"].values())
    assert "GFLOP/s" in out and "matmul peak" in out
    # a profiled step: its operators' own time within its wall time
    assert result["ops_per_step"] > 100
    assert 0 < result["op_seconds"] <= result["profiled_step_seconds"]
    assert "torch ops" in out

    assert result["n_samples"] == 64 and result["n_iter"] == 2
    # auto picks the kernel solve: X has at most 2 x 64 rows against ~900 parameters
    assert result["n_params"] > 2 * 64 and result["method_used"] == "minsr"
    assert not (tmp_path / "out").exists()  # a benchmark writes no results file
    assert "cpu float64 (chains float32) threads" in out  # the default chains


def test_the_counted_operations_follow_the_network():
    # the local energies' matrix products grow with the network's width, at the same samples
    from vitqs.benchmark import phase_flops
    from vitqs.build import build_vmc
    from vitqs.config import from_dict

    counts = []
    for d_model in (8, 16):
        data = tiny_heisenberg("/unused")
        data["model"]["d_model"] = d_model
        # a chain of 16: its sector outnumbers a step's proposals, so the chains step per
        # proposal, a forward pass each
        data["lattice"]["shape"] = [16]
        vmc = build_vmc(from_dict(data))
        counts.append(phase_flops(vmc))
    for phase in ("sampling", "local_energy", "jacobian+solve"):
        assert counts[1][phase] > 1.5 * counts[0][phase], phase


def test_bench_speed_names_the_precision_of_chains_and_local_energies(tmp_path, capsys):
    data = tiny_heisenberg(tmp_path / "out", sampler={"local_energy_dtype": "float32"})
    path = write_config(tmp_path / "tiny.yaml", data)
    code, out, err = run_main(capsys, "bench", "speed", path, "--n-iter", "1", "--json")
    assert code == 0, err
    assert "cpu float64 (chains float32, E_loc float32) threads" in out
    result = last_json(out)
    assert (result["chain_dtype"], result["local_energy_dtype"]) == ("float32", "float32")


def test_bench_speed_refuses_zero_iterations(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    code, _, err = run_main(capsys, "bench", "speed", path, "--n-iter", "0")
    assert_one_line_error(code, err, "--n-iter")


def test_bench_step_script_runs_two_iterations(tmp_path):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    done = _bench_step(path, "--n-iter", "2", "--n-warmup", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert {*PHASES, "step"} <= _phase_rows(done.stdout)
    record = last_json(done.stdout)
    assert record["ours"]["n_iter"] == 2 and record["ours"]["threads"] == 1
    assert len(record["cores"]) == 1  # pinned: jax would use every core otherwise
    assert "netket" not in record


def test_with_netket_skips_with_one_line_when_netket_is_absent(tmp_path):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    done = _bench_step(path, "--n-iter", "1", "--n-warmup", "0", "--with-netket", hide_netket=True)
    assert done.returncode == 0, done.stderr
    skipped = [line for line in done.stdout.splitlines() if "--with-netket" in line]
    assert len(skipped) == 1 and "netket is not available" in skipped[0]
    assert "ours/netket" not in done.stdout


def test_bench_forward_script_prints_a_row_per_dtype(tmp_path):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    done = _script("bench_forward.py", path, "--batches", "8,16", "--total", "32")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| network | dtype | B = 8 | B = 16 |"
    assert [row.split(" | ")[1] for row in rows[1:]] == ["float64", "float32"]
    assert all(row.count("µs") == 2 for row in rows[1:])


def test_compiled_chains_report_what_compiling_cost(tmp_path, capsys, monkeypatch):
    """Compiled chains (and a complex ψ's log-derivatives with them): `vitqs bench speed
    --compile yes` prints the first compiled graphs' seconds (in its JSON too); a run whose
    chains `build.compiled_chains` compiles (told to here: it chooses them for budgets of
    600 s or more) says it once above the progress bar and keeps the choice in its results
    file; a short run does not compile."""
    from vitqs import build, results

    data = tiny_heisenberg(tmp_path / "out")
    data["lattice"]["shape"] = [16]  # chains that step per proposal (not the table walk)
    path = write_config(tmp_path / "tiny.yaml", data)
    code, out, err = run_main(capsys, "bench", "speed", path, "--n-iter", "1", "--json")
    assert code == 0, err
    assert not last_json(out)["compiled_chains"] and "compiled graphs" not in out
    code, out, err = run_main(
        capsys, "bench", "speed", path, "--n-iter", "1", "--json", "--compile", "yes"
    )
    assert code == 0, err
    assert last_json(out)["compiled_chains"] and last_json(out)["compile_seconds"] > 0.0
    assert last_json(out)["compiled_log_derivatives"]  # a bare ViT of complex log ψ
    assert "compile " in out and "the chains' and log-derivatives' first compiled graphs" in out
    code, _, err = run_main(capsys, "run", path, "--set", "optimizer.n_iter=2")
    assert code == 0, err
    assert "compiled graphs" not in err
    assert not results.read_results(tmp_path / "out" / "tiny.h5").compiled_chains
    monkeypatch.setattr(build, "compiled_chains", lambda config, device: True)
    code, _, err = run_main(capsys, "run", path, "--set", "optimizer.n_iter=2", "--overwrite")
    assert code == 0, err
    assert err.count("compiled chains and log-derivatives: their first compiled graphs") == 1
    assert results.read_results(tmp_path / "out" / "tiny.h5").compiled_chains


@pytest.mark.parametrize(
    "changes, device, compiled",
    [
        ({"budget": 600}, "cuda", True),
        ({"budget": 599}, "cuda", False),
        ({"budget": 600}, "cpu", True),
        ({"budget": 599}, "cpu", False),
        ({"optimizer": {"n_iter": 200}}, "cuda", True),
        ({"optimizer": {"n_iter": 199}}, "cuda", False),
        ({"optimizer": {"n_iter": 100000}}, "cpu", False),
        ({"budget": 3600, "sampler": {"kind": "full_sum"}}, "cuda", False),
    ],
)
def test_the_chains_are_compiled_in_runs_long_enough_to_pay_it_back(
    tmp_path, changes, device, compiled
):
    from vitqs.build import compiled_chains
    from vitqs.config import from_dict

    config = from_dict(tiny_heisenberg(tmp_path, **changes))
    assert compiled_chains(config, torch.device(device)) is compiled
