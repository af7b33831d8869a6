"""Results files written before the redesign of issue 28 (vitqs at aa58571) still read,
resume and report: the file layout is the contract.

``tests/data/pre_redesign/`` holds three runs made with that version: ``chain`` (a 6-site
Heisenberg ring, Monte Carlo, finished), ``bh`` (a 4-site Bose-Hubbard ring, full sum,
finished) and ``chain_running`` (the chain stopped by SIGTERM after 395 steps).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import last_json, run_main, write_config

from vitqs import results
from vitqs.checkpoint import stored_config

OLD = Path(__file__).parent / "data" / "pre_redesign"


@pytest.fixture
def old_runs(tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(OLD, out)
    return out


def _config_of(path: Path, tmp_path: Path, **changes) -> Path:
    """Returns a config file holding the run's stored config, with ``output.dir`` and the
    dotted ``changes`` set (keys a resume may change)."""
    # the stored config in today's keys: its schedules as one value each (issue 51)
    data = stored_config(results.read_results(path))
    data["output"]["dir"] = str(path.parent)
    for key, value in changes.items():
        section, name = key.split("__")
        data[section][name] = value
    return write_config(tmp_path / f"{path.stem}.yaml", data)


@pytest.mark.parametrize(
    "name, status, n_steps",
    [("chain", "finished", 6), ("bh", "finished", 4), ("chain_running", "interrupted", 395)],
)
def test_an_old_file_reads_with_its_status_history_and_checkpoint(name, status, n_steps):
    record = results.read_results(OLD / f"{name}.h5")
    assert (record.status, len(record.history)) == (status, n_steps)
    assert record.checkpoint_step == n_steps
    assert set(results.load_checkpoint(record)) >= {"model", "vmc", "sampler", "torch_rng"}
    if status == "finished":
        assert record.final["energy"] > record.exact["energy"]  # variational


@pytest.mark.parametrize("name, n_steps", [("chain", 6), ("bh", 4), ("chain_running", 395)])
def test_an_old_run_resumes_to_a_finished_file(name, n_steps, old_runs, tmp_path, capsys):
    path = old_runs / f"{name}.h5"
    config = _config_of(path, tmp_path, optimizer__n_iter=n_steps + 2)
    code, out, err = run_main(capsys, "run", config, "--resume", "--json")
    assert code == 0, err
    summary = last_json(out)
    assert summary["n_iter"] == n_steps + 2
    record = results.read_results(path)
    assert record.status == "finished" and len(record.history) == n_steps + 2
    assert summary["energy"] >= summary["exact_energy"] - 5 * summary["energy_error"] - 1e-9
    if name == "chain_running":  # it goes on from the stored parameters, not a random start
        assert summary["relative_error"] < 0.05


def test_old_files_report(old_runs, capsys):
    code, out, err = run_main(capsys, "report", old_runs)
    assert code == 0, err
    for name in ("chain", "bh", "chain_running"):
        assert name in out
