"""vitqs from Python: ``vitqs.run`` and ``vitqs.load`` give what ``vitqs run --json`` gives,
in a fresh interpreter, by the same code path; the documented example runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import last_json, run_main, tiny_heisenberg, write_config

import vitqs
from vitqs import results
from vitqs.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# the words, in a fresh interpreter: a path and a section's override
FRESH = """
import json, sys, vitqs
r = vitqs.run(sys.argv[1], optimizer={"n_iter": 5}, output={"dir": sys.argv[2]})
again = vitqs.load(r.path)
print(json.dumps({
    "energy": r.energy, "energy_error": r.energy_error, "variance": r.variance,
    "v_score": r.v_score, "exact_energy": r.exact_energy, "n_iter": r.n_iter,
    "history": r.history["energy"].tolist(), "loaded": again.energy, "path": str(r.path),
}))
"""


def _python(*argv, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, *map(str, argv)], capture_output=True, text=True, env=env, cwd=cwd
    )


def test_a_run_from_python_in_a_fresh_interpreter_is_the_cli_s_run(tmp_path, capsys):
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "unused"))
    done = _python("-c", FRESH, config, tmp_path / "api")
    assert done.returncode == 0, done.stderr
    api = json.loads(done.stdout.strip().splitlines()[-1])

    sets = ("--set", "optimizer.n_iter=5", "--set", f"output.dir={tmp_path / 'cli'}")
    code, out, err = run_main(capsys, "run", config, "--quiet", "--json", *sets)
    assert code == 0, err
    cli = last_json(out)
    for key in ("energy", "energy_error", "variance", "v_score", "exact_energy", "n_iter"):
        assert api[key] == pytest.approx(cli[key], rel=1e-12, abs=1e-15), key
    assert api["loaded"] == api["energy"]
    stored = results.read_results(cli["results_file"]).history_arrays()["energy"]
    np.testing.assert_allclose(api["history"], stored, rtol=1e-12)
    assert Path(api["path"]) == tmp_path / "api" / "tiny.h5"


def test_a_result_holds_the_file_s_numbers_and_its_trained_network(tmp_path):
    data = tiny_heisenberg(tmp_path / "out")
    r = vitqs.run(data, seed=5, optimizer={"n_iter": 3}, name="api")
    assert isinstance(r, vitqs.Result) and r.status == "finished" and r.n_iter == 3
    assert r.config.seed == 5 and r.config.optimizer.lr == 0.02  # merged, not replaced
    summary = results.summary(results.read_results(r.path))
    assert r.energy == summary["energy"] and r.relative_error == summary["relative_error"]
    assert set(r.history) == set(results.HISTORY_FIELDS) and len(r.history["energy"]) == 3
    assert "structure_factor" in r.observables and r.reference == "exact diagonalization"
    # the network of the checkpoint: the final parameters, evaluated as the run evaluates them
    state = results.load_checkpoint(r.record)["model"]
    for name, value in r.model.state_dict().items():
        assert torch.equal(value, state[name]), name
    x = torch.tensor([[1.0, -1, 1, -1, 1, -1]], dtype=torch.float64)
    assert torch.isfinite(r.model(x)).all()
    assert "api" in repr(r) and "finished" in repr(r)


def test_bad_input_raises_the_cli_s_error_and_writes_nothing(tmp_path):
    data = tiny_heisenberg(tmp_path / "out")
    with pytest.raises(ConfigError, match="did you mean 'sampler.n_chains'"):
        vitqs.run(data, sampler={"n_chain": 4})
    with pytest.raises(ConfigError, match="takes a config file's path"):
        vitqs.run(42)
    assert not (tmp_path / "out").exists()
    first = vitqs.run(data)
    with pytest.raises(ConfigError, match="exists; pass --resume"):
        vitqs.run(data)
    again = vitqs.run(data, overwrite=True, optimizer={"n_iter": 2})
    assert again.path == first.path and again.n_iter == 2


def test_load_reads_an_unfinished_file_and_refuses_a_foreign_one(tmp_path):
    from vitqs.results import ResultsError

    r = vitqs.run(tiny_heisenberg(tmp_path / "out"))
    record = results.read_results(r.path)
    record.status, record.final, record.observables = "interrupted", None, {}
    results.write_results(r.path, record)
    unfinished = vitqs.load(r.path)
    assert unfinished.status == "interrupted" and unfinished.note is None
    assert unfinished.energy == r.history["energy"][-1]  # the last step's, as report says
    assert math.isfinite(unfinished.relative_error)
    (tmp_path / "foreign.h5").write_bytes(b"not hdf5")
    with pytest.raises(ResultsError, match="foreign.h5"):
        vitqs.load(tmp_path / "foreign.h5")


@pytest.mark.slow
def test_the_documented_example_runs(tmp_path):
    done = _python(ROOT / "docs" / "example.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Result('ring8', finished")
    assert any(line.startswith("U =    2:") for line in lines)
    assert any(line.startswith("U =   16:") for line in lines)
    assert sorted(p.name for p in (tmp_path / "example_runs").glob("*.h5")) == [
        "bh_U16.h5",
        "bh_U2.h5",
        "ring8.h5",
    ]
