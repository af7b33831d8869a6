"""Helpers shared by the tests: tiny configs and CLI runners, small wave functions (a complex
RBM, an exact lookup table), model configs and random configurations, and dense reference
numbers (the Rayleigh quotient). Fixtures live in ``conftest.py``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from vitqs import cli
from vitqs.config import ModelConfig
from vitqs.physics import exact
from vitqs.physics.hilbert import Bosons, SpinHalf
from vitqs.physics.lattice import Lattice

# ---- configs and the command line -------------------------------------------------------


def tiny_heisenberg(out_dir, **sections) -> dict:
    """Returns config data for a 6-site Heisenberg ring with a ViT small enough to run in ~1 s."""
    data = {
        "name": "tiny",
        "seed": 3,
        "threads": 1,
        "lattice": {"shape": [6], "pbc": True},
        "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "sign_rule": True},
        "model": {"patch_size": 2, "d_model": 8, "heads": 2, "layers": 1},
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
        data.setdefault(section, {}).update(values)
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


# ---- small wave functions ----------------------------------------------------------------


class ComplexRBM(nn.Module):
    """Returns ``log ψ(x) = a·x + Σ_h log cosh(W x + b)_h`` with complex a, W, b from real parts.

    Real parameters (real and imaginary parts stored separately), complex output.
    """

    def __init__(self, n_sites: int, n_hidden: int = 4, scale: float = 0.3, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)

        def param(*shape):
            return nn.Parameter(scale * torch.randn(*shape, generator=gen, dtype=torch.float64))

        self.a_re, self.a_im = param(n_sites), param(n_sites)
        self.w_re, self.w_im = param(n_hidden, n_sites), param(n_hidden, n_sites)
        self.b_re, self.b_im = param(n_hidden), param(n_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.a_re.dtype)
        a = torch.complex(self.a_re, self.a_im)
        w = torch.complex(self.w_re, self.w_im)
        b = torch.complex(self.b_re, self.b_im)
        xc = x.to(a.dtype)
        theta = xc @ w.T + b  # (B, H)
        return xc @ a + torch.log(torch.cosh(theta)).sum(dim=-1)


class LookupTable(nn.Module):
    """Returns ``log ψ(x)`` read from a table over the sector (``hilbert.all_states()`` order).

    The table holds real and imaginary parts of log ψ as parameters; a state is found by
    its own integer code ``Σ_i digit_i · d^i`` (d the local dimension) with a binary search.
    """

    def __init__(self, hilbert, log_psi: np.ndarray):
        super().__init__()
        states = torch.as_tensor(hilbert.all_states(), dtype=torch.float64)
        self.spin = tuple(hilbert.local_states) == (-1, 1)
        self.register_buffer("weights", len(hilbert.local_states) ** torch.arange(hilbert.n_sites))
        codes, order = torch.sort(self._codes(states))
        log_psi = torch.as_tensor(np.asarray(log_psi, dtype=np.complex128))[order]
        self.register_buffer("codes", codes)
        self.log_re = nn.Parameter(log_psi.real.clone())
        self.log_im = nn.Parameter(log_psi.imag.clone())

    def _codes(self, x: torch.Tensor) -> torch.Tensor:
        digits = (x > 0).to(torch.int64) if self.spin else x.round().to(torch.int64)
        return digits @ self.weights

    @classmethod
    def from_vector(cls, hilbert, vector: np.ndarray) -> LookupTable:
        return cls(hilbert, np.log(np.asarray(vector, dtype=np.complex128)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = torch.searchsorted(self.codes, self._codes(x))
        return torch.complex(self.log_re, self.log_im)[index]


def random_log_table(hilbert, seed: int = 0, scale: float = 1.0) -> LookupTable:
    """Returns a `LookupTable` with random complex log amplitudes."""
    rng = np.random.default_rng(seed)
    d = hilbert.dimension
    return LookupTable(hilbert, scale * rng.normal(size=d) + 1j * np.pi * rng.uniform(-1, 1, d))


# Above this dimension the dense eigh costs minutes (13,051 states: 400 s on one core)
DENSE_ED_MAX_DIM = 2000


def exact_ground_state(hamiltonian) -> tuple[float, np.ndarray]:
    """Returns the ground-state energy and vector: ``np.linalg.eigh`` of the dense matrix, or
    above `DENSE_ED_MAX_DIM` states the tool's own Lanczos (`exact.ground_state`, a fixed
    start vector, uncached)."""
    if hamiltonian.hilbert.dimension <= DENSE_ED_MAX_DIM:
        energies, vectors = np.linalg.eigh(hamiltonian.to_dense())
        return float(energies[0]), vectors[:, 0]
    found = exact.ground_state(hamiltonian, return_vector=True, use_cache=False)
    return found.energy, found.vector


def model_vector(model, hilbert) -> np.ndarray:
    """Returns ψ over the sector as a numpy vector (unnormalised)."""
    x = torch.as_tensor(hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        return torch.exp(model(x)).numpy()


# ---- model configs and configurations ----------------------------------------------------


def random_spins(n_states: int, n_sites: int, seed: int = 0) -> torch.Tensor:
    """Returns ``(n_states, n_sites)`` float64 spins at total Sz = 0."""
    return SpinHalf(n_sites, 0).random_states(n_states, torch.Generator().manual_seed(seed))


def random_bosons(n_states: int, n_sites: int, n_max: int = 2, seed: int = 0) -> torch.Tensor:
    """Returns ``(n_states, n_sites)`` float64 occupations at filling one."""
    hilbert = Bosons(n_sites, n_sites, n_max)
    return hilbert.random_states(n_states, torch.Generator().manual_seed(seed))


def model_config(**overrides) -> ModelConfig:
    """Returns a small model config; keyword arguments replace its fields."""
    cfg = dict(
        patch_size=2,
        d_model=8,
        heads=2,
        layers=1,
        translation_invariant=True,
        embedding="linear",
        jastrow=False,
        symmetrize="none",
        sector=None,
    )
    cfg.update(overrides)
    return ModelConfig(**cfg)


def widen_head(model: torch.nn.Module, factor: float) -> torch.nn.Module:
    """Returns ``model`` with its ViT heads' output weights scaled by ``factor`` in place (a
    head started at std ``0.1 · factor``): ψ far from uniform, ratios far from 1."""
    from vitqs.models.vit import LogCoshHead

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LogCoshHead):
                for name, parameter in module.named_parameters():
                    if name.startswith("weight"):
                        parameter.mul_(factor)
    return model


CHAIN = Lattice((8,))
SQUARE = Lattice((4, 4))


# ---- dense reference numbers --------------------------------------------------------------


def rayleigh_quotient(hamiltonian, psi: np.ndarray) -> float:
    """Returns ``⟨ψ|H|ψ⟩ / ⟨ψ|ψ⟩`` with the dense matrix of ``hamiltonian`` on its sector."""
    return np.vdot(psi, hamiltonian.to_dense() @ psi).real / np.vdot(psi, psi).real


def model_energy(model, hamiltonian) -> float:
    """Returns the Rayleigh quotient of ``model``'s ψ over the sector of ``hamiltonian``."""
    return rayleigh_quotient(hamiltonian, model_vector(model, hamiltonian.hilbert))
