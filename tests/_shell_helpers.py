"""Tiny configs and CLI helpers for the shell tests (config, cli, run, sweep)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from vitqs import cli


def tiny_heisenberg(out_dir, **sections) -> dict:
    """Returns config data for a 6-site Heisenberg ring with a ViT small enough to run in ~1 s."""
    data = {
        "name": "tiny",
        "seed": 3,
        "threads": 1,
        "lattice": {"shape": [6], "pbc": True},
        "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "sign_rule": True},
        "model": {"kind": "vit", "patch_size": 2, "d_model": 8, "heads": 2, "layers": 1},
        "sampler": {"n_samples": 64, "n_chains": 16, "n_discard": 2},
        "optimizer": {"lr": 0.02, "n_iter": 4},
        "final": {"n_samples": 128},
        "output": {"dir": str(out_dir), "checkpoint_every": 2},
    }
    for section, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return data


def tiny_bose_hubbard(out_dir, **sections) -> dict:
    """Returns config data for a 4-site Bose-Hubbard ring at unit filling."""
    data = tiny_heisenberg(out_dir)
    data["name"] = "tiny_bh"
    data["hamiltonian"] = {"kind": "bose_hubbard", "J": 1.0, "U": 4.0, "n_particles": 4}
    data["lattice"]["shape"] = [4]
    for section, values in sections.items():
        data[section].update(values)
    return data


def write_config(path, data) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(copy.deepcopy(data), sort_keys=False))
    return path


def run_main(capsys, *argv) -> tuple[int, str, str]:
    """Returns (exit code, stdout, stderr) of ``vitqs argv`` run in this process."""
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def vitqs_process(*argv, **kwargs):
    """Returns the ``Popen`` of ``python -m vitqs argv`` (env inherited: the ED cache too)."""
    return subprocess.Popen(
        [sys.executable, "-m", "vitqs", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        **kwargs,
    )


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def assert_one_line_error(code: int, err: str, *names: str) -> None:
    """The CLI refused bad input: exit 2, one line on stderr naming ``names``, no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], (name, lines[0])


def run_files(out_dir) -> list[str]:
    """Returns the names of results and temporary files under ``out_dir``."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return []
    return sorted(p.name for p in out_dir.rglob("*") if p.suffix in (".h5", ".tmp"))


@pytest.fixture(autouse=True)
def keep_torch_threads():
    # configs with threads: 1 set torch's global thread count; give the other tests theirs back
    n_threads = torch.get_num_threads()
    yield
    torch.set_num_threads(n_threads)
