"""Hamiltonians: Heisenberg J1-J2 (spin-1/2) and Bose-Hubbard (fixed N).

Both follow the operator contract of DESIGN.md: ``get_conn_padded(x)`` takes configurations
``(B, N)`` and returns the connected configurations ``(B, K, N)`` and matrix elements
``(B, K)`` with ``K = max_conn`` fixed, the diagonal first, and padding rows equal to ``x``
with element 0. Row ``k ≥ 1`` belongs to one fixed term of H (a bond, or a bond and a hop
direction), so the same term sits in the same column for every sample.

``to_sparse()`` gives H on the conserved sector as a ``scipy.sparse.csr_matrix`` ordered by
the Hilbert space's ``all_states()``; it is built from the same term table as
``get_conn_padded`` but on integer state codes, which is what makes it fast.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import scipy.sparse as sp
import torch

from vitqs.hilbert import Bosons, SpinHalf
from vitqs.lattice import Lattice

# Rows of the sector handled at once while building a sparse matrix (bounds memory).
_SPARSE_BLOCK = 1 << 19


class Hamiltonian(ABC):
    """Common interface; subclasses give the term table and the diagonal."""

    lattice: Lattice
    hilbert: SpinHalf | Bosons

    @property
    def n_sites(self) -> int:
        return self.lattice.n_sites

    @property
    def max_conn(self) -> int:
        """Returns K: the diagonal plus one column per off-diagonal term."""
        return 1 + len(self._src)

    @abstractmethod
    def diagonal(self, x: torch.Tensor) -> torch.Tensor:
        """Returns ``H_{xx}`` for configurations ``(B, N)`` as ``(B,)``."""

    @abstractmethod
    def off_diagonal(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns, per term, new values at the two sites and the element, each ``(B, K-1)``."""

    @abstractmethod
    def describe(self) -> dict:
        """Returns a JSON-ready description: every parameter that changes the matrix."""

    def _index(self, name: str, device) -> torch.Tensor:
        # site-index tensors, cached per device so the hot path does no host-device copies
        key = (name, str(device))
        cache = self.__dict__.setdefault("_index_cache", {})
        if key not in cache:
            cache[key] = torch.as_tensor(getattr(self, name), device=device)
        return cache[key]

    def get_conn_padded(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns connected configurations ``(B, K, N)`` and matrix elements ``(B, K)``.

        Column 0 is the diagonal; a term that does not act on ``x`` gives a copy of ``x``
        with element 0. Elements share ``x``'s floating dtype.
        """
        src, dst = self._index("_src", x.device), self._index("_dst", x.device)
        new_src, new_dst, mels_off = self.off_diagonal(x)  # (B, K-1) each
        n_terms = src.shape[0]
        x_conn = x.unsqueeze(1).repeat(1, n_terms + 1, 1)  # (B, K, N)
        term = torch.arange(1, n_terms + 1, device=x.device)
        x_conn[:, term, src] = new_src
        x_conn[:, term, dst] = new_dst
        mels = torch.cat([self.diagonal(x).unsqueeze(1), mels_off], dim=1)  # (B, K)
        return x_conn, mels

    def to_sparse(self) -> sp.csr_matrix:
        """Returns H on the sector as CSR float64, rows and columns in ``all_states()`` order."""
        codes = self.hilbert.codes
        blocks = [
            self._sparse_rows(codes[start : start + _SPARSE_BLOCK])
            for start in range(0, len(codes), _SPARSE_BLOCK)
        ]
        return sp.vstack(blocks, format="csr")

    def _sparse_rows(self, codes: np.ndarray) -> sp.csr_matrix:
        # One block of rows in ELL form (rows × K), then compressed to CSR without a sort.
        hilbert = self.hilbert
        digits = hilbert.codes_to_digits(codes)
        x = torch.from_numpy(hilbert.from_digits(digits).astype(np.float64))
        new_src, new_dst, mels_off = (t.numpy() for t in self.off_diagonal(x))
        # a term changes the digits of two sites: shift the code by the two differences
        shift_src, shift_dst = hilbert.bits * self._src, hilbert.bits * self._dst
        delta_src = hilbert.to_digits(new_src).astype(np.int64) - digits[:, self._src]
        delta_dst = hilbert.to_digits(new_dst).astype(np.int64) - digits[:, self._dst]
        acts = mels_off != 0
        new_codes = codes[:, None] + (delta_src << shift_src) + (delta_dst << shift_dst)
        cols = np.zeros(new_codes.shape, dtype=np.int64)
        cols[acts] = hilbert.code_index(new_codes[acts])
        cols = np.concatenate([hilbert.code_index(codes)[:, None], cols], axis=1)
        vals = np.concatenate([self.diagonal(x).numpy()[:, None], mels_off], axis=1)
        keep = vals != 0
        indptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))])
        shape = (len(codes), hilbert.dimension)
        return sp.csr_matrix((vals[keep], cols[keep].astype(np.int32), indptr), shape=shape)

    def to_dense(self) -> np.ndarray:
        """Returns H on the sector as a dense float64 array (tiny systems only)."""
        return self.to_sparse().toarray()


class Heisenberg(Hamiltonian):
    """Spin-1/2 J1-J2 Heisenberg model, ``H = J1 Σ_<ij> S_i·S_j + J2 Σ_<<ij>> S_i·S_j``, S = σ/2.

    With σ^z eigenvalues ``x_i = ±1``: the diagonal is ``Σ_b J_b x_i x_j / 4`` and a bond with
    opposite spins connects to the exchanged configuration with element ``J_b / 2``.
    ``sign_rule=True`` rotates one sublattice (Marshall): J1 exchange elements become
    ``−J1 / 2``, which leaves the spectrum unchanged and makes the unfrustrated ground state
    positive. NetKet's ``Heisenberg`` uses Pauli matrices: its energies are 4× these.

    Args:
        lattice: the lattice; J1 on its order-1 bonds, J2 on its order-2 bonds.
        J1, J2: couplings.
        sign_rule: apply the Marshall sign on J1 bonds (bipartite lattices only).
        total_sz: the S^z sector.
    """

    def __init__(self, lattice: Lattice, J1=1.0, J2=0.0, sign_rule=False, total_sz=0.0):
        if sign_rule and not lattice.is_bipartite():
            raise ValueError(
                f"hamiltonian.sign_rule=true needs a bipartite lattice; shape={list(lattice.shape)} "
                f"with pbc={lattice.pbc} is not (use even extents or open boundaries)"
            )
        self.lattice = lattice
        self.hilbert = SpinHalf(lattice.n_sites, total_sz)
        self.J1, self.J2, self.sign_rule = float(J1), float(J2), bool(sign_rule)
        bonds1 = lattice.bonds(1)
        bonds2 = lattice.bonds(2) if self.J2 != 0.0 else np.zeros((0, 2), dtype=np.int64)
        self._src = np.concatenate([bonds1[:, 0], bonds2[:, 0]])
        self._dst = np.concatenate([bonds1[:, 1], bonds2[:, 1]])
        self._coupling = np.concatenate(
            [np.full(len(bonds1), self.J1), np.full(len(bonds2), self.J2)]
        )
        exchange1 = -self.J1 if self.sign_rule else self.J1
        self._exchange = (
            np.concatenate([np.full(len(bonds1), exchange1), np.full(len(bonds2), self.J2)]) / 2
        )

    def diagonal(self, x):
        src, dst = self._index("_src", x.device), self._index("_dst", x.device)
        coupling = self._index("_coupling", x.device).to(x.dtype)
        return (x[:, src] * x[:, dst] * coupling).sum(dim=1) / 4

    def off_diagonal(self, x):
        src, dst = self._index("_src", x.device), self._index("_dst", x.device)
        exchange = self._index("_exchange", x.device).to(x.dtype)
        x_src, x_dst = x[:, src], x[:, dst]  # (B, K-1)
        mels = exchange * (x_src != x_dst).to(x.dtype)
        return x_dst, x_src, mels

    def describe(self):
        return {
            "kind": "heisenberg",
            "lattice": self.lattice.describe(),
            "J1": self.J1,
            "J2": self.J2,
            "sign_rule": self.sign_rule,
            "total_sz": self.hilbert.total_sz,
        }


class BoseHubbard(Hamiltonian):
    """Bose-Hubbard model at fixed N, ``H = −J Σ_<ij> (b_i† b_j + h.c.) + (U/2) Σ_i n_i(n_i − 1) − μ Σ_i n_i``.

    Each nearest-neighbour bond gives two terms, a hop each way; a hop from ``s`` to ``d`` has
    element ``−J √n_s √(n_d + 1)`` and is allowed when ``n_s > 0`` and ``n_d < n_max``.

    Args:
        lattice: the lattice (order-1 bonds).
        J, U, mu: hopping, on-site interaction, chemical potential.
        n_particles: total particle number.
        n_max: per-site cutoff; default ``n_particles``.
    """

    def __init__(self, lattice: Lattice, J=1.0, U=4.0, mu=0.0, n_particles=None, n_max=None):
        n_particles = lattice.n_sites if n_particles is None else n_particles
        self.lattice = lattice
        self.hilbert = Bosons(lattice.n_sites, n_particles, n_max)
        self.J, self.U, self.mu = float(J), float(U), float(mu)
        bonds = lattice.bonds(1)
        # a hop moves one particle from _src to _dst; both directions of every bond
        self._src = np.concatenate([bonds[:, 1], bonds[:, 0]])
        self._dst = np.concatenate([bonds[:, 0], bonds[:, 1]])

    @property
    def n_max(self) -> int:
        return self.hilbert.n_max

    def diagonal(self, x):
        return (self.U / 2) * (x * (x - 1)).sum(dim=1) - self.mu * x.sum(dim=1)

    def off_diagonal(self, x):
        src, dst = self._index("_src", x.device), self._index("_dst", x.device)
        n_src, n_dst = x[:, src], x[:, dst]  # (B, K-1)
        allowed = ((n_src > 0) & (n_dst < self.n_max)).to(x.dtype)
        mels = -self.J * torch.sqrt(n_src * (n_dst + 1)) * allowed
        return n_src - allowed, n_dst + allowed, mels

    def describe(self):
        return {
            "kind": "bose_hubbard",
            "lattice": self.lattice.describe(),
            "J": self.J,
            "U": self.U,
            "mu": self.mu,
            "n_particles": self.hilbert.n_particles,
            "n_max": self.n_max,
        }
