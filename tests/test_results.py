"""The results file: round trip of every field, atomic rewrites, clear errors on bad files."""

import io
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
E_INF = 0.75  # a made-up E∞ (data): the V-score must measure from it, not from 0


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
        e_inf=E_INF,
    )
    for step in range(n_steps):
        record.append_history(history_row(step))
    if exact:
        record.exact = {
            "energy": EXACT_ENERGY,
            "energy_per_site": EXACT_ENERGY / N_SITES,
            "dimension": 70,
            "seconds": 0.01,
            "reference": "exact diagonalization",
        }
    if finished:
        record.status = "finished"
        energy, variance = EXACT_ENERGY + 1e-3, 2e-3
        record.final = {
            "energy": energy,
            "energy_error": 5e-4,
            "variance": variance,
            "v_score": v_score(energy, variance, N_SITES, E_INF),
            "tau": 1.5,
            "r_hat": 1.01,
            "n_samples": 4096,
            "relative_error": relative_error(energy, EXACT_ENERGY if exact else None),
            "seconds": 12.5,
            "seconds_per_iter": 2.5,
            "n_discard": 64,
            "acceptance": 0.31,
            "note": "a note on the numbers",
            "stopped_by": "budget",
            "extrapolated": EXACT_ENERGY + 2e-4,
            "extrapolated_error": 3e-4,
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

    keys = ("name", "status", "seed", "config_yaml", "n_sites", "n_params", "e_inf", "created")
    for key in keys:
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
    assert_same_tree(back.checkpoint, record.checkpoint)
    assert back.checkpoint_step == 5


def assert_same_tree(got, expected):
    """Equal nested dicts, lists and tuples with equal tensors (dtype and values)."""
    assert type(got) is type(expected), (got, expected)
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same_tree(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same_tree(a, b)
    elif isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    else:
        assert got == expected


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
        state = f["checkpoint/state"]  # an h5tree: groups and datasets, no pickled bytes
        assert isinstance(state, h5py.Group) and state.attrs["kind"] == "dict"
        assert state["model/weight"].attrs["kind"] == "tensor"
        np.testing.assert_array_equal(state["model/weight"][()], np.arange(6.0).reshape(2, 3))
        assert state["iteration"].attrs["kind"] == "int" and state["iteration"][()] == 5
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


def test_history_may_run_past_the_checkpoint_but_not_behind_it(tmp_path):
    record = make_record(4, finished=False)
    record.set_checkpoint({"iteration": 4})
    record.append_history(history_row(4))  # a failed run keeps the steps after its checkpoint
    back = read_results(write_results(tmp_path / "x.h5", record))
    assert len(back.history) == 5 and back.checkpoint_step == 4
    record.history = record.history[:3]  # but a checkpoint of a step never recorded is wrong
    with pytest.raises(ResultsError, match="checkpoint is for step 4 but history has 3"):
        write_results(tmp_path / "y.h5", record)
    assert not (tmp_path / "y.h5").exists()


def test_inconsistent_records_are_refused(tmp_path):
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
    tmp = tmp_path / ".run.h5.abc123.tmp"
    tmp.write_bytes(b"\x89HDF\r\n\x1a\n half a file")  # what SIGKILL mid-write leaves
    assert len(read_results(path).history) == 2
    write_results(path, make_record(4, finished=False))
    assert len(read_results(path).history) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [tmp.name, "run.h5"]


def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path):
    # the writer used to write <path>.tmp, a fixed name: a link planted there sent the whole
    # results file into the file it pointed to
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "run.h5"
    (tmp_path / "run.h5.tmp").symlink_to(victim)
    write_results(path, make_record(2, finished=False))
    results.write_text_atomic(tmp_path / "notes.md", "table")
    assert victim.read_text() == "precious"
    assert len(read_results(path).history) == 2
    assert (tmp_path / "notes.md").read_text() == "table"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.md",
        "run.h5",
        "run.h5.tmp",
        "victim.txt",
    ]


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
    assert finished["n_iter"] == 5
    assert finished["energy"] == pytest.approx(EXACT_ENERGY + 1e-3)
    assert finished["relative_error"] == pytest.approx(1e-3 / abs(EXACT_ENERGY))
    assert finished["exact_energy"] == EXACT_ENERGY

    running = summary_row(make_record(3, finished=False, exact=False))
    last = history_row(2)
    assert running["status"] == "running"
    assert running["energy"] == pytest.approx(last["energy"])
    e_minus_e_inf = last["energy"] - E_INF
    assert running["v_score"] == pytest.approx(N_SITES * last["variance"] / e_minus_e_inf**2)
    assert running["relative_error"] is None and running["exact_energy"] is None


def _format_1_file(path, payload: bytes):
    """Turns the results file at ``path`` into format 1: the checkpoint as the bytes of
    ``torch.save`` (what vitqs wrote before format 2)."""
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 1
        del f["checkpoint/state"]
        f["checkpoint"].create_dataset("state", data=np.frombuffer(payload, dtype=np.uint8))


def test_a_format_1_checkpoint_still_loads(tmp_path):
    record = make_record(3, finished=False)
    record.set_checkpoint(checkpoint_dict(3))
    path = write_results(tmp_path / "old.h5", record)
    buffer = io.BytesIO()
    torch.save(checkpoint_dict(3), buffer)
    _format_1_file(path, buffer.getvalue())
    assert_same_tree(read_results(path).checkpoint, checkpoint_dict(3))


class _Payload:
    """Unpickles to a call of ``os.system``: what a crafted checkpoint would run."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        import os

        return (os.system, (self.command,))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_none(tmp_path):
    marker = tmp_path / "pwned"
    record = make_record(3, finished=False)
    record.set_checkpoint(checkpoint_dict(3))
    path = write_results(tmp_path / "crafted.h5", record)
    buffer = io.BytesIO()
    torch.save({"model": _Payload(f"touch {marker}")}, buffer)
    _format_1_file(path, buffer.getvalue())
    with pytest.raises(ResultsError, match="crafted.h5: the checkpoint does not load as plain"):
        read_results(path)
    # the same bytes in a format-2 file are not an h5tree at all
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = FORMAT_VERSION
    with pytest.raises(ResultsError, match="crafted.h5: the checkpoint is not plain data"):
        read_results(path)
    assert not marker.exists()


def _edit(path, change):
    with h5py.File(path, "a") as f:
        change(f)
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: f.attrs.__setitem__("n_sites", "eight"), "'/n_sites' must be an integer"),
        (lambda f: f.attrs.__setitem__("status", 3), "'/status' must be a string"),
        (lambda f: f.attrs.__setitem__("status", "done"), "status 'done' is not one of"),
        (lambda f: f.attrs.__setitem__("versions_json", "[1]"), "must be a JSON object"),
        (lambda f: f["final"].attrs.__setitem__("energy", "low"), "'/final/energy' must be a"),
        (lambda f: f.attrs.__setitem__("format_version", "2"), "invalid format_version"),
        (lambda f: f["checkpoint"].attrs.__setitem__("step", 99), "checkpoint step 99"),
        (
            lambda f: f["checkpoint/state/model/weight"].attrs.__setitem__("kind", "pickle"),
            "kind 'pickle' is not one of",
        ),
        (
            lambda f: (
                f["history"].__setitem__("energy_x", np.zeros(5))
                or f["history"].move("energy_x", "energy_y")
            ),
            None,  # an extra column is ignored: the file still reads
        ),
    ],
)
def test_attributes_and_objects_of_the_wrong_type_are_one_line_errors(tmp_path, change, message):
    record = make_record()
    record.set_checkpoint(checkpoint_dict(5))
    path = _edit(write_results(tmp_path / "odd.h5", record), change)
    if message is None:
        assert len(read_results(path).history) == 5
        return
    with pytest.raises(ResultsError, match="odd.h5") as error:
        read_results(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_links_to_other_files_or_objects_are_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["secret"] = np.arange(3.0)
    record = make_record()
    record.set_checkpoint(checkpoint_dict(5))
    changes = {
        "external history": lambda f: (
            f["history"].__delitem__("energy"),
            f["history"].__setitem__("energy", h5py.ExternalLink(str(other), "/secret")),
        ),
        "soft link in the tree": lambda f: (
            f["checkpoint/state/model"].__delitem__("bias"),
            f["checkpoint/state/model"].__setitem__("bias", h5py.SoftLink("/history/energy")),
        ),
        "external group": lambda f: (
            f.__delitem__("final"),
            f.__setitem__("final", h5py.ExternalLink(str(other), "/")),
        ),
    }
    for name, change in changes.items():
        path = _edit(write_results(tmp_path / f"{name}.h5", record), change)
        with pytest.raises(ResultsError, match="link|Link") as error:
            read_results(path)
        assert str(path) in str(error.value), name


def test_a_huge_dataset_is_refused_before_it_is_read(tmp_path):
    # 2^40 float64 (8 TiB) declared, a few kB on disk: reading it would take the machine down
    record = make_record()
    record.set_checkpoint(checkpoint_dict(5))

    def plant(f):
        del f["checkpoint/state/model/bias"]
        huge = f["checkpoint/state/model"].create_dataset(
            "bias", shape=(2**40,), dtype="f8", chunks=(2**20,), compression="gzip"
        )
        huge.attrs["kind"] = "tensor"

    path = _edit(write_results(tmp_path / "huge.h5", record), plant)
    assert path.stat().st_size < 1_000_000
    with pytest.raises(ResultsError, match="bytes, above"):
        read_results(path)


def _foreign_files(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(64, 4242.5).tobytes())
    with h5py.File(tmp_path / "secret.h5", "w") as f:
        f["x"] = np.full(64, 4242.5)
    return secret, tmp_path / "secret.h5"


def _external(f, where, secret, n=5):
    del f[where]
    parent, name = where.rsplit("/", 1)
    dataset = f[parent].create_dataset(name, (n,), "f8", external=[(str(secret), 0, 8 * n)])
    return dataset


def _virtual(f, where, secret_h5, n=5):
    layout = h5py.VirtualLayout(shape=(n,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(secret_h5), "x", shape=(64,))[:n]
    del f[where]
    parent, name = where.rsplit("/", 1)
    return f[parent].create_virtual_dataset(name, layout)


@pytest.mark.parametrize("where", ["history/energy", "final/observables/structure_factor"])
@pytest.mark.parametrize("kind", ["external", "virtual", "unstored", "compressed"])
def test_a_dataset_whose_values_are_not_stored_in_the_file_is_refused(kind, where, tmp_path):
    # external storage and virtual datasets read other files as if they were this one's
    # data (a --resume then wrote those bytes into an ordinary results file); unwritten
    # chunks and filters declare values the file does not hold (a 13 kB file once declared
    # 200,000 history rows and cost a report 555 MB)
    secret, secret_h5 = _foreign_files(tmp_path)

    def plant(f):
        if kind == "external":
            _external(f, where, secret)
        elif kind == "virtual":
            _virtual(f, where, secret_h5)
        else:
            del f[where]
            parent, name = where.rsplit("/", 1)
            create = {"shape": (5,), "chunks": (5,), "dtype": "f8"}
            if kind == "unstored":
                create["shape"] = (200_000,)
            else:
                create["data"] = np.zeros(5)
                create["compression"] = "gzip"
            f[parent].create_dataset(name, **create)

    path = _edit(write_results(tmp_path / "run.h5", make_record(5)), plant)
    reason = {
        "external": "external files",
        "virtual": "virtual dataset",
        "unstored": "declares 1,600,000 bytes of values but stores 0",
        "compressed": "compressed or filtered",
    }[kind]
    with pytest.raises(ResultsError, match=reason) as error:
        read_results(path)
    assert str(path) in str(error.value) and "4242.5" not in str(error.value)


def test_a_checkpoint_tensor_stored_elsewhere_is_refused(tmp_path):
    secret, secret_h5 = _foreign_files(tmp_path)
    record = make_record()
    record.set_checkpoint(checkpoint_dict(5))
    for craft, reason in ((_external, "external files"), (_virtual, "virtual dataset")):

        def plant(f, craft=craft):
            craft(f, "checkpoint/state/model/bias", secret if craft is _external else secret_h5)
            f["checkpoint/state/model/bias"].attrs["kind"] = "tensor"

        path = _edit(write_results(tmp_path / "run.h5", record), plant)
        with pytest.raises(ResultsError, match=reason):
            read_results(path)


def test_a_long_history_costs_its_numbers_not_a_dict_per_row(tmp_path):
    import tracemalloc

    record = make_record(0, finished=False)
    n_rows = 50_000
    record.history = results.History(
        columns={
            name: np.arange(n_rows, dtype=np.int64 if name == "step" else np.float64)
            for name in HISTORY_FIELDS
        }
    )
    path = write_results(tmp_path / "long.h5", record)
    tracemalloc.start()
    back = read_results(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    stored = n_rows * len(HISTORY_FIELDS) * 8  # 7.2 MB; as dicts it was ~20x that
    assert len(back.history) == n_rows and back.history[-1]["energy"] == n_rows - 1
    assert peak < 2 * stored


def test_a_link_planted_at_the_target_is_refused_and_its_file_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("run.h5", "notes.md"):
        (tmp_path / name).symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        write_results(tmp_path / "run.h5", make_record(2, finished=False))
    with pytest.raises(OSError, match="symbolic link"):
        results.write_text_atomic(tmp_path / "notes.md", "table")
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md", "run.h5", "victim.txt"]


def test_a_write_goes_through_its_descriptor_and_syncs_the_folder(tmp_path, monkeypatch):
    # never by name after mkstemp: a link swapped in under the temporary name would get
    # the chmod, the bytes or the fsync; and the folder is synced after the rename
    import builtins
    import os
    import stat

    real_open, real_fsync = builtins.open, os.fsync
    synced = []

    def no_reopen(file, *args, **kwargs):
        assert ".tmp" not in str(file), f"{file} reopened by name"
        return real_open(file, *args, **kwargs)

    def recording_fsync(descriptor):
        synced.append(stat.S_ISDIR(os.fstat(descriptor).st_mode))
        return real_fsync(descriptor)

    monkeypatch.setattr(builtins, "open", no_reopen)
    monkeypatch.setattr(os, "chmod", lambda *a, **k: pytest.fail("chmod by name"))
    monkeypatch.setattr(os, "fsync", recording_fsync)
    path = write_results(tmp_path / "run.h5", make_record(3, finished=False))
    assert synced == [False, True]  # the file, then its folder after the rename
    monkeypatch.undo()
    assert len(read_results(path).history) == 3
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_current_umask()


def _current_umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask
