"""Metropolis proposal rules: where a chain may move from a configuration.

Every rule is symmetric (a move and its reverse are proposed with the same probability) and
conserves the sector, so a move ``x → x'`` is accepted with ``min(1, |ψ(x')/ψ(x)|^p)``:

- `Exchange`: pick a bond uniformly (the neighbour orders the Hamiltonian couples: order 1,
  plus order 2 when ``J2 ≠ 0``) and swap its two spins; equal spins make a rejected move.
- `Hop`: pick an order-1 bond and a direction uniformly and move one boson along it; an empty
  source or a full target (``n_max``) makes a rejected move.

A step of the chains draws, per chain, one move index below ``n_moves`` and asks the rule to
`propose` it; a rule with a move table also maps the whole sector for the table walk
(`sector_walk`, `SectorMoves`). `proposal_rule` builds the rule of a Hamiltonian: exchange
for spins, hop for bosons. (A global exchange of any up-down pair was removed at issue 51:
no shipped run chose it over the bond exchange.)
"""

from __future__ import annotations

import numpy as np
import torch

from vitqs.physics.hilbert import SpinHalf
from vitqs.vmc.sector_walk import SectorMoves, apply_moves, sector_moves


class BondRule:
    """A rule that moves along the site pairs of a table ``(n_moves, 2)``: `Exchange` and
    `Hop` (``name`` is the config's word, ``n_max`` the bosons' cutoff)."""

    name = ""

    def __init__(self, moves: np.ndarray, n_max: int | None = None):
        self.moves = np.ascontiguousarray(moves, dtype=np.int64)  # (n_moves, 2)
        self.n_max = n_max
        self._on: dict[torch.device, torch.Tensor] = {}

    @property
    def n_moves(self) -> int:
        return len(self.moves)

    def propose(self, x: torch.Tensor, pick: torch.Tensor, generator=None):
        """Returns the proposals ``(C, N)`` of moves ``pick`` ``(C,)`` from ``x`` ``(C, N)``,
        and whether each is valid ``(C,)`` (an invalid one leaves its row unchanged)."""
        table = self._on.get(x.device)
        if table is None:
            table = self._on[x.device] = torch.as_tensor(self.moves, device=x.device)
        src, dst = table[pick, 0:1], table[pick, 1:2]  # (C, 1) each
        return apply_moves(x, src, dst, self.name, self.n_max)

    def sector_moves(self, hilbert) -> SectorMoves | None:
        """Returns every state of the sector and where each move leads (None: too large)."""
        return sector_moves(hilbert, self.moves, self.name)


class Exchange(BondRule):
    name = "exchange"


class Hop(BondRule):
    name = "hop"


def proposal_rule(hamiltonian) -> BondRule:
    """Returns the rule of ``hamiltonian`` (its sector and bonds): `Exchange` along the bonds
    it couples for spins, `Hop` in both directions along the nearest-neighbour bonds for
    bosons; ValueError for a lattice without bonds."""
    hilbert, lattice = hamiltonian.hilbert, hamiltonian.lattice
    is_spin = isinstance(hilbert, SpinHalf)
    bonds = lattice.bonds(1)
    if is_spin and getattr(hamiltonian, "J2", 0.0) != 0.0:
        bonds = np.concatenate([bonds, lattice.bonds(2)])
    if len(bonds) == 0:
        raise ValueError(
            f"lattice.shape={list(lattice.shape)} has no bonds for the Metropolis moves to follow"
        )
    if is_spin:
        return Exchange(bonds)
    return Hop(np.concatenate([bonds, bonds[:, ::-1]]), getattr(hilbert, "n_max", None))
