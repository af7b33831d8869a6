"""Metropolis proposal rules: where a chain may move from a configuration.

Every rule is symmetric (a move and its reverse are proposed with the same probability) and
conserves the sector, so a move ``x → x'`` is accepted with ``min(1, |ψ(x')/ψ(x)|^p)``:

- `Exchange`: pick a bond uniformly (the neighbour orders the Hamiltonian couples: order 1,
  plus order 2 when ``J2 ≠ 0``) and swap its two spins; equal spins make a rejected move.
- `GlobalExchange`: swap a uniformly chosen up spin with a uniformly chosen down spin.
- `Hop`: pick an order-1 bond and a direction uniformly and move one boson along it; an empty
  source or a full target (``n_max``) makes a rejected move.

A step of the chains draws, per chain, one move index below ``n_moves`` and asks the rule to
`propose` it; a rule with a move table also maps the whole sector for the table walk
(`sector_walk`, `SectorMoves`). `proposal_rule` builds the rule a config names (``auto``:
exchange for spins, hop for bosons).
"""

from __future__ import annotations

import numpy as np
import torch

from vitqs.config import BOSON_RULES, RULES, SPIN_RULES
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


class GlobalExchange:
    """Swaps a uniformly chosen up spin with a uniformly chosen down spin: the argmax of iid
    uniform keys over a set picks a uniform member, and the up and down sets are disjoint,
    so the two picks are independent, with probability ``1/(n_up n_down)`` both ways."""

    name = "exchange_global"
    n_moves = 1  # the chains' draws are unused: the rule draws its own pair

    def __init__(self, hilbert):
        self.has_pair = 0 < hilbert.n_up < hilbert.n_sites

    def propose(self, x: torch.Tensor, pick: torch.Tensor, generator=None):
        keys = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float64)
        up = keys.masked_fill(x < 0, -1.0).argmax(dim=1, keepdim=True)  # (C, 1)
        down = keys.masked_fill(x > 0, -1.0).argmax(dim=1, keepdim=True)
        x_new = x.scatter(1, up, -1.0).scatter_(1, down, 1.0)
        valid = torch.full((x.shape[0],), self.has_pair, dtype=torch.bool, device=x.device)
        return x_new, valid

    def sector_moves(self, hilbert) -> None:
        """None: a pair of every up and every down spin is no table the walk can use."""
        return None


def proposal_rule(rule: str, hamiltonian):
    """Returns the rule ``sampler.rule`` names for ``hamiltonian`` (its sector and bonds);
    ValueError naming the key for one that does not apply."""
    hilbert, lattice = hamiltonian.hilbert, hamiltonian.lattice
    if rule not in RULES:
        raise ValueError(f"sampler.rule={rule!r} is not one of {list(RULES)}")
    is_spin = isinstance(hilbert, SpinHalf)
    allowed = SPIN_RULES if is_spin else BOSON_RULES
    if rule == "auto":
        rule = allowed[0]
    if rule not in allowed:
        kind = "spin" if is_spin else "boson"
        raise ValueError(
            f"sampler.rule={rule!r} does not apply to a {kind} model; use {list(allowed)}"
        )
    if rule == "exchange_global":
        return GlobalExchange(hilbert)
    bonds = lattice.bonds(1)
    if rule == "exchange" and getattr(hamiltonian, "J2", 0.0) != 0.0:
        bonds = np.concatenate([bonds, lattice.bonds(2)])
    if rule == "hop":
        bonds = np.concatenate([bonds, bonds[:, ::-1]])  # both directions
    if len(bonds) == 0:
        raise ValueError(
            f"sampler.rule={rule!r} needs lattice bonds; shape={list(lattice.shape)} has none"
        )
    if rule == "hop":
        return Hop(bonds, getattr(hilbert, "n_max", None))
    return Exchange(bonds)
