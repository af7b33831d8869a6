"""Metropolis chains on a small sector by table look-up: the same chains, without a forward
pass per proposal.

A sampler call on a 6-site chain evaluates hundreds of proposals in tens of forward passes of
16 rows each, where per-op dispatch, not arithmetic, is the cost; its sector holds 20 states.
When the sector has no more states than the call makes proposals, one forward pass over the
whole sector gives every ``log ψ`` the chains can meet, and a table of where each move leads
from each state, built once, replaces the proposal's configuration:

    target[s, m] = index of the state move m makes from state s   (−1: an invalid move)

A Metropolis step is then a few gathers: pick ``m``, ``s' = target[s, m]``, accept with
``min(1, exp(p (Re log ψ(s') − Re log ψ(s))))``. Both paths take their random numbers from
`MetropolisSampler._sweep_draws`, so they produce the same chains up to the rounding of the
forward passes. Where the model itself tables the sector, the local energies come from the
same table (`MetropolisSampler.local_energy`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# The move table holds dimension × n_moves int64 entries: 128 MiB at most
MAX_TABLE_ENTRIES = 1 << 24


@dataclass(frozen=True)
class SectorMoves:
    """Every state of a sector and where each move leads from it.

    Attributes:
        states: every state ``(S, N)`` float64, in `Hilbert.all_states` order.
        targets: ``(S, n_moves)`` int64, the index of the state move ``m`` makes from state
            ``s``; −1 where the move is invalid (equal spins exchanged, an empty source or a
            full target of a hop).
    """

    states: torch.Tensor
    targets: torch.Tensor


def apply_moves(x: torch.Tensor, src, dst, rule: str, n_max: int | None = None):
    """Returns the configurations ``(C, N)`` that moves ``src → dst`` ``(C, 1)`` make of
    ``x`` ``(C, N)``, and whether each move is valid ``(C,)``.

    ``exchange`` swaps the two sites (equal values: invalid); ``hop`` moves one boson from
    ``src`` to ``dst`` (an empty source or a target holding ``n_max``: invalid, unchanged).
    """
    x_src, x_dst = x.gather(1, src), x.gather(1, dst)  # (C, 1) each
    if rule == "exchange":
        valid = x_src != x_dst
        x_new = x.scatter(1, src, x_dst).scatter_(1, dst, x_src)
    elif rule == "hop":
        valid = (x_src > 0) & (x_dst < n_max)
        step = valid.to(x.dtype)
        x_new = x.scatter(1, src, x_src - step).scatter_(1, dst, x_dst + step)
    else:
        raise ValueError(f"sector moves: rule {rule!r} has no move table")
    return x_new, valid[:, 0]


def sector_moves(hilbert, moves: np.ndarray, rule: str) -> SectorMoves | None:
    """Returns the sector's states and move table, or None when the table would hold more
    than `MAX_TABLE_ENTRIES` entries or the sector cannot be enumerated.

    Args:
        hilbert: a fixed sector (`SpinHalf`, `Bosons`).
        moves: the site pairs ``(n_moves, 2)`` a proposal picks from.
        rule: ``exchange`` or ``hop``.
    """
    n_moves = len(moves)
    if hilbert.dimension * n_moves > MAX_TABLE_ENTRIES or hilbert.n_sites * hilbert.bits > 62:
        return None
    states = torch.as_tensor(hilbert.all_states(), dtype=torch.float64)  # (S, N)
    n_states = len(states)
    targets = torch.full((n_states, n_moves), -1, dtype=torch.int64)
    n_max = getattr(hilbert, "n_max", None)
    for m, (i, j) in enumerate(moves):
        src = torch.full((n_states, 1), int(i), dtype=torch.int64)
        dst = torch.full((n_states, 1), int(j), dtype=torch.int64)
        moved, valid = apply_moves(states, src, dst, rule, n_max)
        index = hilbert.state_index(moved[valid].to(torch.int64).numpy())
        targets[valid, m] = torch.as_tensor(index)
    return SectorMoves(states, targets)


def walk(targets, log_weight, index, draws, sweep_size: int, n_discard: int):
    """Walks chains through a sector by table look-up; returns each chain's last state, the
    states kept ``(C, kept sweeps)`` and the number of accepted moves.

    Runs in numpy on the host, whatever the device: a step is a few gathers on ``C``
    integers, ~1 µs each there against ~10 µs a torch op.

    Args:
        targets: `SectorMoves.targets` as numpy ``(S, n_moves)``, −1 for an invalid move.
        log_weight: ``p Re log ψ`` of every state ``(S,)``, the chains' log weights.
        index: each chain's state ``(C,)``.
        draws: per sweep, the picks and uniforms ``(sweep_size, C)`` each (torch tensors, as
            `MetropolisSampler._sweep_draws` gives them: the per-proposal path's numbers).
        sweep_size: proposals per chain between kept states.
        n_discard: sweeps before the first kept one.
    """
    # entry −1 (an invalid move's target) weighs nothing: log u < −inf is never true
    log_weight = np.append(log_weight, np.array([-np.inf], dtype=log_weight.dtype))
    weight = log_weight[index]  # of each chain's state
    accepted = np.zeros(len(index), dtype=np.int64)  # per chain
    kept = []
    with np.errstate(invalid="ignore"):  # −inf − (−inf): a chain where ψ = 0, rejected
        for sweep, (picks, log_u) in enumerate(draws):
            picks, log_u = picks.cpu().numpy(), log_u.cpu().numpy()
            for t in range(sweep_size):
                target = targets[index, picks[t]]
                target_weight = log_weight[target]
                accept = log_u[t] < target_weight - weight  # NaN ratios compare False
                accepted += accept
                index = np.where(accept, target, index)
                weight = np.where(accept, target_weight, weight)
            if sweep >= n_discard:
                kept.append(index)
    return index, np.stack(kept, axis=1), int(accepted.sum())
