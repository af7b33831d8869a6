"""The results file: round trip of every field, atomic rewrites, clear errors on bad files."""

import math

import h5py
import numpy as np
import pytest
import torch

from vitqs import results
from vitqs.results import (
    FORMAT_VERSION,
    HISTORY_FIELDS,
    ResultsError,
    RunRecord,
    checkpoint_bytes,
    load_checkpoint,
    read_results,
    relative_error,
    results_path,
    summary_row,
    v_score,
    write_results,
)

N_SITES = 8
EXACT_ENERGY = -3.651093408937  # 8-site Heisenberg ring, S = sigma/2 (ED value, used as data)


def history_row(step: int) -> dict:
    """A plausible optimisation row converging towards EXACT_ENERGY."""
    gap = 0.5 * math.exp(-0.3 * step)
    row = {name: 0.01 * (step + 1) + i for i, name in enumerate(HISTORY_FIELDS)}
    row.update(step=step, energy=EXACT_ENERGY + gap, energy_error=0.1 * gap, variance=gap)
    return row


def make_record(n_steps: int = 5, *, finished: bool = True, exact: bool = True) -> RunRecord:
    record = RunRecord(
        name="chain8",
        seed=7,
        config_yaml="name: chain8\nlattice:\n  shape: [8]\n",
        n_sites=N_SITES,
        n_params=1234,
    )
    for step in range(n_steps):
        record.append_history(history_row(step))
    if exact:
        record.exact = {
            "energy": EXACT_ENERGY,
            "energy_per_site": EXACT_ENERGY / N_SITES,
            "dimension": 70,
            "seconds": 0.01,
        }
    if finished:
        record.status = "finished"
        energy, variance = EXACT_ENERGY + 1e-3, 2e-3
        record.final = {
            "energy": energy,
            "energy_error": 5e-4,
            "variance": variance,
            "v_score": v_score(energy, variance, N_SITES),
            "tau": 1.5,
            "r_hat": 1.01,
            "n_samples": 4096,
            "relative_error": relative_error(energy, EXACT_ENERGY if exact else None),
            "seconds": 12.5,
            "seconds_per_iter": 2.5,
        }
        record.observables = {
            "structure_factor": np.linspace(0.0, 1.0, 8).reshape(2, 4),
            "structure_factor_error": np.full((2, 4), 0.01),
            "one_body_density_matrix": np.eye(3) + 0.5j * np.ones((3, 3)),
            "condensate_fraction": np.float64(0.42),
        }
    return record


def checkpoint_dict(step: int) -> dict:
    generator = torch.Generator().manual_seed(3)
    return {
        "model": {"weight": torch.arange(6.0).reshape(2, 3), "bias": torch.zeros(3)},
        "chains": torch.tensor([[1, -1, 1, -1]], dtype=torch.int8),
        "rng": generator.get_state(),
        "iteration": step,
    }


def test_round_trip_keeps_every_field(tmp_path):
    record = make_record()
    record.set_checkpoint(checkpoint_dict(len(record.history)))
    path = write_results(tmp_path / "chain8.h5", record)
    back = read_results(path)

    for key in ("name", "status", "seed", "config_yaml", "n_sites", "n_params", "created"):
        assert getattr(back, key) == getattr(record, key)
    assert back.updated == record.updated
    assert back.versions == record.versions
    assert set(back.versions) == {"vitqs", "torch", "numpy", "python", "h5py", "platform", "gpu"}
    assert "S = sigma/2" in back.conventions
    assert back.history == record.history
    for name, column in back.history_arrays().items():
        np.testing.assert_array_equal(column, record.history_arrays()[name])
    assert back.exact == pytest.approx(record.exact)
    assert back.final == pytest.approx(record.final)
    assert isinstance(back.final["n_samples"], int)
    assert set(back.observables) == set(record.observables)
    for name, value in record.observables.items():
        np.testing.assert_array_equal(back.observables[name], value)
    assert np.iscomplexobj(back.observables["one_body_density_matrix"])
    assert back.checkpoint == record.checkpoint
    assert back.checkpoint_step == 5


def test_file_layout_matches_the_contract(tmp_path):
    record = make_record()
    record.set_checkpoint(checkpoint_dict(5))
    path = write_results(tmp_path / "chain8.h5", record)
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "vitqs-results"
        assert f.attrs["format_version"] == FORMAT_VERSION
        assert set(f["history"]) == set(HISTORY_FIELDS)
        step = f["history/step"]
        assert step.dtype == np.int64 and step.maxshape == (None,) and step.chunks is not None
        assert f["history/energy"].dtype == np.float64
        assert f["checkpoint/state"].dtype == np.uint8
        assert f["checkpoint"].attrs["step"] == len(f["history/step"])
        assert "observables" in f["final"]


def test_checkpoint_loads_back_to_the_same_tensors(tmp_path):
    record = make_record(3, finished=False)
    original = checkpoint_dict(3)
    record.set_checkpoint(original)
    back = read_results(write_results(tmp_path / "run.h5", record))
    loaded = load_checkpoint(back)
    assert loaded["iteration"] == 3
    torch.testing.assert_close(loaded["model"]["weight"], original["model"]["weight"])
    torch.testing.assert_close(loaded["chains"], original["chains"])
    assert torch.equal(loaded["rng"], original["rng"])


def test_missing_values_are_nan_and_optional_groups_absent(tmp_path):
    record = RunRecord(name="bare", n_sites=4)
    record.append_history({"step": 0, "energy": -1.0})
    back = read_results(write_results(tmp_path / "bare.h5", record))
    assert back.exact is None and back.final is None and back.checkpoint is None
    assert math.isnan(back.history[0]["tau"])
    with pytest.raises(ResultsError, match="no checkpoint"):
        load_checkpoint(back)


def test_empty_history_round_trips(tmp_path):
    back = read_results(write_results(tmp_path / "empty.h5", RunRecord(name="empty")))
    assert back.history == []
    assert back.history_arrays()["step"].dtype == np.int64


def test_inconsistent_records_are_refused(tmp_path):
    record = make_record(4, finished=False)
    record.set_checkpoint({"iteration": 4})
    record.append_history(history_row(4))  # history moved on without a new checkpoint
    with pytest.raises(ResultsError, match="checkpoint is for step 4 but history has 5"):
        write_results(tmp_path / "x.h5", record)
    with pytest.raises(ResultsError, match="unknown keys"):
        make_record().append_history({"step": 1, "enrgy": 1.0})
    finished = make_record()
    finished.observables["s/q"] = np.zeros(2)
    with pytest.raises(ResultsError, match="without '/'"):
        write_results(tmp_path / "x.h5", finished)
    with pytest.raises(ResultsError, match="status"):
        write_results(tmp_path / "x.h5", RunRecord(name="x", status="done"))
    assert not (tmp_path / "x.h5").exists()


def test_crash_mid_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "run.h5"
    write_results(path, make_record(3, finished=False))
    before = path.read_bytes()

    def crash(group, record):
        group.attrs["energy"] = 1.0  # part of the new file is on disk already
        raise RuntimeError("killed while writing")

    monkeypatch.setattr(results, "_write_final", crash)
    with pytest.raises(RuntimeError, match="killed"):
        write_results(path, make_record(6, finished=True))
    assert path.read_bytes() == before
    assert len(read_results(path).history) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]


def test_stray_tmp_from_a_killed_writer_is_harmless(tmp_path):
    path = tmp_path / "run.h5"
    write_results(path, make_record(2, finished=False))
    tmp = tmp_path / "run.h5.tmp"
    tmp.write_bytes(b"\x89HDF\r\n\x1a\n half a file")  # what SIGKILL mid-write leaves
    assert len(read_results(path).history) == 2
    write_results(path, make_record(4, finished=False))
    assert len(read_results(path).history) == 4
    assert not tmp.exists()


def test_text_tables_are_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "rows" / "accuracy__chain.json"
    results.write_text_atomic(path, '{"energy": -7.1}')
    assert path.read_text() == '{"energy": -7.1}'

    def crash(src, dst):
        raise OSError("disk full at the rename")

    monkeypatch.setattr(results.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        results.write_text_atomic(path, '{"energy": -7.2}')
    assert path.read_text() == '{"energy": -7.1}'
    assert sorted(p.name for p in path.parent.iterdir()) == ["accuracy__chain.json"]


def test_truncated_file_raises_results_error(tmp_path):
    path = write_results(tmp_path / "run.h5", make_record())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ResultsError, match="run.h5"):
        read_results(path)


def test_not_hdf5_and_missing_files_raise_results_error(tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("not hdf5")
    with pytest.raises(ResultsError, match="notes.h5: not a readable HDF5"):
        read_results(text)
    with pytest.raises(ResultsError, match="no such results file"):
        read_results(tmp_path / "absent.h5")


def test_foreign_hdf5_file_is_not_a_results_file(tmp_path):
    path = tmp_path / "foreign.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.arange(3)
    with pytest.raises(ResultsError, match="is not a vitqs results file"):
        read_results(path)


def test_newer_format_version_is_refused(tmp_path):
    path = write_results(tmp_path / "run.h5", make_record())
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(ResultsError, match="newer"):
        read_results(path)


def test_unequal_history_columns_are_refused(tmp_path):
    path = write_results(tmp_path / "run.h5", make_record(4))
    with h5py.File(path, "a") as f:
        f["history/energy"].resize((2,))
    with pytest.raises(ResultsError, match="unequal lengths"):
        read_results(path)


def test_results_path_and_its_name_check(tmp_path):
    assert results_path(tmp_path, "chain8") == tmp_path / "chain8.h5"
    for bad in ("", "../up", "a/b", ".hidden"):
        with pytest.raises(ResultsError, match="plain file name"):
            results_path(tmp_path, bad)


def test_summary_row_of_finished_and_running_runs():
    finished = summary_row(make_record())
    assert finished["iterations"] == 5
    assert finished["energy"] == pytest.approx(EXACT_ENERGY + 1e-3)
    assert finished["relative_error"] == pytest.approx(1e-3 / abs(EXACT_ENERGY))
    assert finished["exact_energy"] == EXACT_ENERGY

    running = summary_row(make_record(3, finished=False, exact=False))
    last = history_row(2)
    assert running["status"] == "running"
    assert running["energy"] == pytest.approx(last["energy"])
    assert running["v_score"] == pytest.approx(N_SITES * last["variance"] / last["energy"] ** 2)
    assert running["relative_error"] is None and running["exact_energy"] is None


def test_checkpoint_bytes_of_garbage_fail_clearly():
    record = make_record(0, finished=False)
    record.checkpoint, record.checkpoint_step = b"garbage", 0
    with pytest.raises(ResultsError, match="does not load"):
        load_checkpoint(record)
    assert checkpoint_bytes({"a": 1})[:2] == b"PK"  # torch.save writes a zip archive
