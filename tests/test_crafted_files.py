"""Crafted results files through every door that reads one: ``--resume``, ``model.init_from``,
``vitqs report`` and a sweep's point file. A file may be wrong; it must never run code, crash
a command with a traceback, or keep the good files of a folder from being reported.

Each craft starts from the file of a real finished run and changes one thing, as a
collaborator's damaged copy or a malicious supplementary file would.
"""

import io
import shutil

import h5py
import numpy as np
import pytest
import torch
import yaml
from helpers import (
    assert_one_line_error,
    run_main,
    tiny_heisenberg,
    write_config,
)

from vitqs import results


class _Payload:
    """Unpickles to a call of ``os.system``: what a crafted checkpoint would run."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        import os

        return (os.system, (self.command,))


def _pickled_checkpoint(f, marker):
    """Format 1 stored ``torch.save`` bytes; these bytes run ``touch marker`` when unpickled
    by an unrestricted loader."""
    buffer = io.BytesIO()
    torch.save({"model": _Payload(f"touch {marker}"), "seconds": 1.0}, buffer)
    f.attrs["format_version"] = 1
    del f["checkpoint/state"]
    f["checkpoint"].create_dataset("state", data=np.frombuffer(buffer.getvalue(), np.uint8))


def _pickle_in_format_2(f, marker):
    _pickled_checkpoint(f, marker)
    f.attrs["format_version"] = results.FORMAT_VERSION


def _string_attribute(f, marker):
    f.attrs["n_sites"] = "six"


def _external_link(f, marker):
    del f["history/energy"]
    f["history/energy"] = h5py.ExternalLink("/etc/hostname", "/")


def _huge_dataset(f, marker):
    del f["checkpoint/state/model"]
    model = f["checkpoint/state"].create_group("model")
    model.attrs["kind"] = "dict"
    huge = model.create_dataset("weight", shape=(2**40,), dtype="f8", chunks=(2**20,))
    huge.attrs["kind"] = "tensor"


def _wrong_tree(f, marker):
    # well-formed data of the wrong shape: a chain outside the sector, a string for seconds
    del f["checkpoint/state/seconds"]
    f["checkpoint/state"].create_dataset("seconds", data="later").attrs["kind"] = "str"


CRAFTS = {
    "pickle in format 1": _pickled_checkpoint,
    "pickle in format 2": _pickle_in_format_2,
    "string attribute": _string_attribute,
    "external link": _external_link,
    "huge dataset": _huge_dataset,
    "wrong checkpoint entry": _wrong_tree,
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real finished run of the tiny ring: its config path and results file."""
    from vitqs.config import from_dict
    from vitqs.runner import run_config

    root = tmp_path_factory.mktemp("finished")
    data = tiny_heisenberg(root / "out")
    summary = run_config(from_dict(data), progress=False)
    return data, summary["results_file"]


def _crafted(finished_run, craft, path, marker):
    _, good = finished_run
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(good, path)
    with h5py.File(path, "a") as f:
        CRAFTS[craft](f, marker)
    return path


@pytest.mark.parametrize("craft", sorted(CRAFTS))
def test_resume_and_init_from_refuse_a_crafted_file_and_run_no_code(
    craft, finished_run, tmp_path, capsys
):
    data, _ = finished_run
    marker = tmp_path / "pwned"
    data = {**data, "output": {"dir": str(tmp_path / "out")}, "name": "tiny"}
    config = write_config(tmp_path / "tiny.yaml", data)
    crafted = _crafted(finished_run, craft, tmp_path / "out" / "tiny.h5", marker)
    before = crafted.read_bytes()

    more = ("--set", "optimizer.n_iter=8", "--quiet")
    code, _, err = run_main(capsys, "run", config, "--resume", *more)
    assert_one_line_error(code, err, "tiny.h5")

    elsewhere = tmp_path / "new"
    code, _, err = run_main(
        capsys,
        *("run", config, *more, "--set", f"model.init_from={crafted}"),
        *("--set", f"output.dir={elsewhere}", "--set", "name=fresh"),
    )
    assert_one_line_error(code, err, "model.init_from")
    assert not elsewhere.exists()  # refused before any file was made

    assert crafted.read_bytes() == before
    assert not marker.exists()


def test_report_of_a_folder_reports_the_good_files_beside_the_crafted(
    finished_run, tmp_path, capsys
):
    _, good = finished_run
    folder = tmp_path / "shared"
    folder.mkdir()
    shutil.copy(good, folder / "good.h5")
    marker = tmp_path / "pwned"
    for i, craft in enumerate(sorted(CRAFTS)):
        _crafted(finished_run, craft, folder / f"crafted{i}.h5", marker)
    code, out, err = run_main(capsys, "report", folder)
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("| ")][2:]
    good_rows = [row for row in rows if "| tiny | finished |" in row]
    unreadable = [row for row in rows if "unreadable" in row]
    # good.h5, and the file whose checkpoint holds well-formed data of the wrong kind: a
    # report reads it as data, and --resume / init_from refuse it (the test above)
    assert len(good_rows) == 2
    assert len(unreadable) == len(CRAFTS) - 1 and len(rows) == len(CRAFTS) + 1
    assert not marker.exists()


def test_report_reads_a_file_whose_checkpoint_is_crafted_as_unreadable(
    finished_run, tmp_path, capsys
):
    marker = tmp_path / "pwned"
    crafted = _crafted(finished_run, "pickle in format 1", tmp_path / "c.h5", marker)
    code, _, err = run_main(capsys, "report", crafted)
    assert_one_line_error(code, err, "c.h5", "does not load as plain data")
    assert not marker.exists()


def test_a_sweep_refuses_a_crafted_point_file_and_leaves_it(finished_run, tmp_path, capsys):
    data, _ = finished_run
    base = {**data, "output": {"dir": str(tmp_path / "out")}}
    write_config(tmp_path / "base.yaml", base)
    spec = {"base": "base.yaml", "name": "scan", "sweep": {"hamiltonian.J1": [1.0]}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    marker = tmp_path / "pwned"
    point = tmp_path / "out" / "scan" / "J1=1.0.h5"
    _crafted(finished_run, "pickle in format 1", point, marker)
    before = point.read_bytes()
    code, _, err = run_main(capsys, "sweep", tmp_path / "sweep.yaml", "--quiet")
    assert_one_line_error(code, err, "J1=1.0.h5", "does not overwrite")
    assert point.read_bytes() == before
    assert not marker.exists()
