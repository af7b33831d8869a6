"""Whether a final Monte Carlo measurement means anything: frozen chains, a zero variance.

A collapsed state — every chain stuck on its configuration — measures a variance of 0 with
acceptance 0, which read as a result looks like an exact eigenstate (a 4-site ring at
``optimizer.lr: 5`` ended "−1.0000908 ± 0.0, variance 0" where E₀ = −2). Three signs give a
collapse away: the final measurement's chains accepted no move, the last steps of the
optimisation accepted none, or the Monte Carlo variance is 0 to rounding. Each is also what a
genuine eigenstate concentrated on few configurations can show, so on a sector small enough
the state is summed over every configuration: a variance of 0 there is an eigenstate, and
the record says so; anything else is a failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vitqs.physics import exact
from vitqs.vmc.estimators import Stats
from vitqs.vmc.lanczos_step import full_sum_moments

# Var(E)/max(1, E²) at or below this is 0 to rounding: a float64 sum of equal local energies
# leaves ~1e-32; a trained 4-site ring 1e-9 above its ground state has Var/E² ~ 1e-9.
ZERO_VARIANCE = 1e-20
# Sectors up to this size are summed whole to tell an eigenstate from a collapse (12,870
# states of the 16-site ring: well under a second).
FULL_SUM_MAX_DIM = 20_000
# Consecutive frozen steps at the end of the optimisation that make its last gradients
# meaningless (sampler.max_frozen_steps stops a run sooner or later than this).
FROZEN_AT_END = 10
# Chains that accept fewer moves than this per sweep are frozen: a chain's successive samples
# are then the same configuration 99 times in 100, and a step's samples are a few
# configurations per chain. A collapsed J1-J2 8x8 state accepted ~1e-5 of its proposals (0-2
# moves a step among 128 chains) without ever reaching exactly 0 for long, with E stuck and
# sigma 2e-5. Sound states accept far more: ~0.2 on the J1-J2 8x8, 0.09 on the Mott insulator
# of the Bose-Hubbard 3x3 at U = 16.7 sampled from |psi|^2 (results/accuracy.md).
FROZEN_MOVES_PER_SWEEP = 0.01


@dataclass
class Verdict:
    """What the final measurement's record must say: a ``failure`` (the run failed: the
    numbers mean nothing) or a ``note`` (why a surprising number is genuine), or neither."""

    failure: str | None = None
    note: str | None = None


def chains_frozen(acceptance: float, sweep_size: int) -> bool:
    """Returns whether chains with this Metropolis ``acceptance`` over sweeps of
    ``sweep_size`` proposals have stopped moving (`FROZEN_MOVES_PER_SWEEP`); never for the
    exact sampler's NaN."""
    return acceptance * sweep_size < FROZEN_MOVES_PER_SWEEP


def is_zero_variance(energy: float, variance: float) -> bool:
    """Returns whether ``variance`` is 0 to float64 rounding, beside ``energy``."""
    return variance <= ZERO_VARIANCE * max(1.0, energy**2)


def judge_final(
    hamiltonian,
    model,
    energy: Stats,
    acceptance: float,
    n_frozen_at_end: int,
    *,
    sweep_size: int = 1,
    chunk_size: int | None = None,
    can_sum: bool = True,
) -> Verdict:
    """Returns the `Verdict` on a Monte Carlo final measurement.

    Args:
        hamiltonian: the run's Hamiltonian (its ``hilbert`` is the sector).
        model: the network measured.
        energy: `Stats` of the final measurement's local energies.
        acceptance: of the final measurement's chains (NaN: a full sum, always trusted).
        n_frozen_at_end: frozen steps (`chains_frozen`) at the end of the optimisation.
        sweep_size: proposals per chain between kept samples of the final measurement.
        chunk_size: states per forward pass of the confirming full sum.
        can_sum: whether a full sum may confirm an eigenstate (not across torch.distributed
            ranks, where the exact sampler does not run: the signs alone then fail the run).
    """
    if math.isnan(acceptance) or exact.sector_fits(hamiltonian.hilbert, 1):
        return Verdict()  # a full sum, or a sector of one state: nothing can freeze
    signs = []
    if chains_frozen(acceptance, sweep_size):
        signs.append(f"the final measurement's chains {_accepted(acceptance)}")
    if n_frozen_at_end >= FROZEN_AT_END:
        signs.append(f"the chains of the last {n_frozen_at_end} steps were frozen")
    if is_zero_variance(energy.mean.real, energy.variance):
        signs.append(f"the Monte Carlo variance is {energy.variance:.1e}, zero to rounding")
    if not signs:
        return Verdict()
    seen = "; ".join(signs)
    if not can_sum or not exact.sector_fits(hamiltonian.hilbert, FULL_SUM_MAX_DIM):
        return Verdict(
            failure=f"{seen}: the chains collapsed onto a few configurations, so the "
            f"final energy {energy.mean.real:.10g} and its variance mean nothing"
        )
    summed, variance = full_sum_energy(hamiltonian, model, chunk_size)
    dimension = hamiltonian.hilbert.dimension
    if is_zero_variance(summed, variance):
        return Verdict(
            note=f"{seen}; the full sum over the {dimension} states of the sector gives "
            f"E = {summed:.12g}, Var = {variance:.1e}: an eigenstate"
        )
    return Verdict(
        failure=f"{seen}, but the full sum over the {dimension} states of the sector gives "
        f"E = {summed:.10g} with Var = {variance:.3e}: the chains collapsed "
        f"onto a few configurations, so the Monte Carlo energy {energy.mean.real:.10g} and "
        "its variance mean nothing"
    )


def _accepted(acceptance: float) -> str:
    if acceptance == 0:
        return "accepted no move"
    return f"accepted {acceptance:.1e} of their proposals: frozen"


def full_sum_energy(hamiltonian, model, chunk_size: int | None = None) -> tuple[float, float]:
    """Returns ``(E, Var)`` of ``model`` summed over every state of the sector, from its
    normalised vector ``v``: ``Var = |(H − E)v|²``, zero exactly for an eigenstate
    (`lanczos_step.full_sum_moments`). Unlike ``Σ |ψ|² |E_loc − E|²`` it sees the weight H
    moves onto states where ψ is too small for ``|ψ|²`` to be a float64 (a collapsed state)."""
    moments = full_sum_moments(hamiltonian, model, chunk_size)
    return moments.mean, moments.c2
