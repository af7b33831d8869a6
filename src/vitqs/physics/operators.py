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

from vitqs.config import BoseHubbardConfig, HeisenbergConfig
from vitqs.physics.hilbert import Bosons, SpinHalf
from vitqs.physics.lattice import Lattice

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
    def infinite_temperature_energy(self) -> float:
        """Returns ``E∞ = Tr H / dim``, the energy at infinite temperature that the V-score
        measures from (Wu et al., Science 386, 296 (2024))."""

    @abstractmethod
    def lower_bound(self) -> float:
        """Returns a number no eigenvalue of H is below, from the couplings alone: an energy
        estimate beneath it comes from a broken state (`vmc.driver`'s guard), not physics."""

    @abstractmethod
    def diagonal(self, x: torch.Tensor) -> torch.Tensor:
        """Returns ``H_{xx}`` for configurations ``(B, N)`` as ``(B,)``."""

    @abstractmethod
    def _term_action(self, a, b, term):
        """Returns ``(new_a, new_b, element)`` of off-diagonal term ``term`` on site values (a, b).

        Elementwise and broadcasting: ``a`` is the value at the term's source site, ``b`` at its
        target site. This one function defines the off-diagonal physics for both
        ``get_conn_padded`` and ``to_sparse``.
        """

    def off_diagonal(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns, per term, the new values at its two sites and the element, each ``(B, K-1)``."""
        src, dst = self._index("_src", x.device), self._index("_dst", x.device)
        term = torch.arange(src.shape[0], device=x.device)
        return self._term_action(x[:, src], x[:, dst], term)

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
        hilbert = self.hilbert
        codes = hilbert.codes
        # ELL form: column 0 the diagonal, column t+1 term t; compressed row-major into CSR
        # below, which needs no sort (matvecs do not need sorted column indices)
        cols = np.zeros(
            (len(codes), self.max_conn), dtype=np.int32 if len(codes) < 2**31 else np.int64
        )
        vals = np.zeros((len(codes), self.max_conn))
        cols[:, 0], vals[:, 0] = np.arange(len(codes)), self._sparse_diagonal()
        new_src, new_dst, elements = self._term_tables()  # (T, base, base) each
        mask = (1 << hilbert.bits) - 1
        for t, (s, d) in enumerate(zip(self._src, self._dst, strict=True)):
            # a term changes two digits: read them off the code, shift the code by the changes
            a = (codes >> (hilbert.bits * s)) & mask
            b = (codes >> (hilbert.bits * d)) & mask
            element = elements[t][a, b]
            acts = np.flatnonzero(element)
            a, b = a[acts], b[acts]
            shifted = (
                codes[acts]
                + ((new_src[t][a, b] - a) << (hilbert.bits * s))
                + ((new_dst[t][a, b] - b) << (hilbert.bits * d))
            )
            cols[acts, t + 1] = hilbert.code_index(shifted)
            vals[acts, t + 1] = element[acts]
        keep = vals != 0
        indptr = np.zeros(len(codes) + 1, dtype=np.int64)
        np.cumsum(keep.sum(axis=1), out=indptr[1:])
        shape = (len(codes), len(codes))
        return sp.csr_matrix((vals[keep], cols[keep], indptr), shape=shape)

    def _term_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns new source digit, new target digit and element per (term, a, b) digit pair."""
        hilbert = self.hilbert
        values = torch.tensor(hilbert.local_states, dtype=torch.float64)
        a = values[None, :, None]  # (1, base, 1)
        b = values[None, None, :]  # (1, 1, base)
        term = torch.arange(len(self._src))[:, None, None]  # (T, 1, 1)
        new_a, new_b, element = self._term_action(a, b, term)
        shape = (len(self._src), len(values), len(values))
        return (
            hilbert.to_digits(new_a.expand(shape).numpy()).astype(np.int64),
            hilbert.to_digits(new_b.expand(shape).numpy()).astype(np.int64),
            element.expand(shape).numpy(),
        )

    def _sparse_diagonal(self) -> np.ndarray:
        hilbert, codes = self.hilbert, self.hilbert.codes
        blocks = []
        for start in range(0, len(codes), _SPARSE_BLOCK):
            digits = hilbert.codes_to_digits(codes[start : start + _SPARSE_BLOCK])
            x = torch.from_numpy(hilbert.from_digits(digits).astype(np.float64))
            blocks.append(self.diagonal(x).numpy())
        return np.concatenate(blocks)

    def to_dense(self) -> np.ndarray:
        """Returns H on the sector as a dense float64 array (tiny systems only)."""
        return self.to_sparse().toarray()


def _pbc_text(pbc) -> str:
    return str(pbc[0]).lower() if len(set(pbc)) == 1 else str([bool(p) for p in pbc]).lower()


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
        J_leg, J_rung: on a ladder, the order-1 couplings along and across the legs (None:
            J1).
        sign_rule: apply the Marshall sign on J1 bonds (bipartite lattices only).
        total_sz: the S^z sector.
    """

    def __init__(
        self,
        lattice: Lattice,
        J1: float = HeisenbergConfig.J1,
        J2: float = HeisenbergConfig.J2,
        sign_rule: bool = HeisenbergConfig.sign_rule,
        total_sz: float = HeisenbergConfig.total_sz,
        J_leg: float | None = HeisenbergConfig.J_leg,
        J_rung: float | None = HeisenbergConfig.J_rung,
    ):
        if sign_rule and not lattice.is_bipartite():
            raise ValueError(
                "hamiltonian.sign_rule=true needs a bipartite lattice; "
                f"{lattice.kind} shape={list(lattice.shape)} with pbc={_pbc_text(lattice.pbc)} "
                "is not (use even extents or open boundaries on a chain or square, or a "
                "honeycomb or ladder)"
            )
        if (J_leg is not None or J_rung is not None) and lattice.kind != "ladder":
            raise ValueError(
                f"hamiltonian.J_leg/J_rung couple a ladder; lattice.kind={lattice.kind} has J1 "
                "and J2 only"
            )
        self.lattice = lattice
        self.hilbert = SpinHalf(lattice.n_sites, total_sz)
        self.J1, self.J2, self.sign_rule = float(J1), float(J2), bool(sign_rule)
        self.J_leg = None if J_leg is None else float(J_leg)
        self.J_rung = None if J_rung is None else float(J_rung)
        bonds1, coupling1 = self._order_one_bonds(lattice)
        bonds2 = lattice.bonds(2) if self.J2 != 0.0 else np.zeros((0, 2), dtype=np.int64)
        self._src = np.concatenate([bonds1[:, 0], bonds2[:, 0]])
        self._dst = np.concatenate([bonds1[:, 1], bonds2[:, 1]])
        self._coupling = np.concatenate([coupling1, np.full(len(bonds2), self.J2)])
        # the Marshall rotation flips the sign of every exchange between the two sublattices
        exchange1 = -coupling1 if self.sign_rule else coupling1
        self._exchange = np.concatenate([exchange1, np.full(len(bonds2), self.J2)]) / 2

    def _order_one_bonds(self, lattice: Lattice) -> tuple[np.ndarray, np.ndarray]:
        """Returns the order-1 bonds and their couplings: J1, or a ladder's J_leg / J_rung."""
        if lattice.kind != "ladder":
            bonds = lattice.bonds(1)
            return bonds, np.full(len(bonds), self.J1)
        legs, rungs = lattice.ladder_bonds()
        j_leg = self.J1 if self.J_leg is None else self.J_leg
        j_rung = self.J1 if self.J_rung is None else self.J_rung
        couplings = np.concatenate([np.full(len(legs), j_leg), np.full(len(rungs), j_rung)])
        return np.concatenate([legs, rungs]), couplings

    def infinite_temperature_energy(self) -> float:
        """Returns 0: every ``S_i·S_j`` is traceless on the spin space, as in the published
        V-scores of Heisenberg models (Wu et al.; varbench's ``Einf = 0``).

        The trace over one S^z sector alone is not zero (``−Σ_b J_b / (4(N − 1))`` at
        S^z = 0): the published convention takes the whole space, so V-scores stay
        comparable across papers whatever sector a code works in.
        """
        return 0.0

    def lower_bound(self) -> float:
        """Returns Σ_b min(−3J_b/4, J_b/4): each S_i·S_j has the eigenvalues −3/4 (singlet)
        and 1/4 (triplet); the Marshall rotation is unitary and changes no eigenvalue."""
        return float(np.minimum(-0.75 * self._coupling, 0.25 * self._coupling).sum())

    def diagonal(self, x):
        src, dst = self._index("_src", x.device), self._index("_dst", x.device)
        coupling = self._index("_coupling", x.device).to(x.dtype)
        return (x[:, src] * x[:, dst] * coupling).sum(dim=1) / 4

    def _term_action(self, a, b, term):
        # exchange the two spins when they differ
        exchange = self._index("_exchange", a.device).to(a.dtype)[term]
        element = exchange * (a != b).to(a.dtype)
        return b.expand_as(element), a.expand_as(element), element

    def describe(self):
        return {
            "kind": "heisenberg",
            "lattice": self.lattice.describe(),
            "J1": self.J1,
            "J2": self.J2,
            **({"J_leg": self.J_leg} if self.J_leg is not None else {}),
            **({"J_rung": self.J_rung} if self.J_rung is not None else {}),
            "sign_rule": self.sign_rule,
            "total_sz": self.hilbert.total_sz,
        }


class BoseHubbard(Hamiltonian):
    """Bose-Hubbard model at fixed N.

    ``H = −J Σ_<ij> (b_i† b_j + h.c.) + (U/2) Σ_i n_i(n_i − 1) − μ Σ_i n_i``.

    Each nearest-neighbour bond gives two terms, a hop each way; a hop from ``s`` to ``d`` has
    element ``−J √n_s √(n_d + 1)`` and is allowed when ``n_s > 0`` and ``n_d < n_max``.

    Args:
        lattice: the lattice (order-1 bonds).
        J, U, mu: hopping, on-site interaction, chemical potential.
        n_particles: total particle number.
        n_max: per-site cutoff; default ``n_particles``.
    """

    def __init__(
        self,
        lattice: Lattice,
        J: float = BoseHubbardConfig.J,
        U: float = BoseHubbardConfig.U,
        mu: float = 0.0,
        n_particles: int | None = None,
        n_max: int | None = BoseHubbardConfig.n_max,
    ):
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

    def infinite_temperature_energy(self) -> float:
        """Returns ``Tr H / dim`` over the fixed-N sector: hops are traceless, so
        ``E∞ = (U/2) L ⟨n(n − 1)⟩ − μN`` with the site average of `Bosons` (N is a parameter
        of the model, as in the published fixed-particle-number entries of Wu et al.)."""
        pairs = self.hilbert.mean_pair_occupation()
        return (self.U / 2) * self.n_sites * pairs - self.mu * self.hilbert.n_particles

    def lower_bound(self) -> float:
        """Returns −|J| N d_max + min(0, U N(N − 1)/2) − μN: the hops of N bosons are N
        one-particle hops, whose matrix (the bonds' adjacency) has no eigenvalue beyond its
        largest row sum d_max (Gershgorin; cutting occupations at n_max compresses it and
        keeps it within), the interaction is ≥ 0 for U ≥ 0, and μN is fixed."""
        n = self.hilbert.n_particles
        degree = np.bincount(self._src, minlength=self.n_sites).max(initial=0)
        return -abs(self.J) * n * float(degree) + min(0.0, self.U * n * (n - 1) / 2) - self.mu * n

    def diagonal(self, x):
        return (self.U / 2) * (x * (x - 1)).sum(dim=1) - self.mu * x.sum(dim=1)

    def _term_action(self, a, b, term):
        # move one particle from a's site to b's when there is one and room for it
        allowed = ((a > 0) & (b < self.n_max)).to(a.dtype)
        element = -self.J * torch.sqrt(a * (b + 1)) * allowed
        return a - allowed, b + allowed, element

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
