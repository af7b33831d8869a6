"""Small wave functions for the VMC tests: a complex RBM and an exact lookup table."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn


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


def exact_ground_state(hamiltonian) -> tuple[float, np.ndarray]:
    """Returns the ground-state energy and vector of ``hamiltonian.to_dense()`` (np.linalg.eigh)."""
    energies, vectors = np.linalg.eigh(hamiltonian.to_dense())
    return float(energies[0]), vectors[:, 0]


def model_vector(model, hilbert) -> np.ndarray:
    """Returns ψ over the sector as a numpy vector (unnormalised)."""
    x = torch.as_tensor(hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        return torch.exp(model(x)).numpy()


@pytest.fixture
def single_thread():
    """Runs a test on one intra-op thread: tiny batched ops on a shared 2-core machine are
    many times faster without OpenMP hand-offs. Restores the previous setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
