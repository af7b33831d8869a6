"""The final measurement's samples of ``|ψ|²`` and their local energies: a fixed number
drawn at once, or, open-ended (a whole-run budget or a target error), batch by batch until
the budget's deadline, the target error or the most samples ends it.

Open-ended, the chains keep running between batches, so the samples are those of one long
draw; by default the first half of every chain is discarded at the end (the rule of a fixed
measurement, `Sampler.discard_before`: half of every chain, whatever distribution the chains
came from), and the error bar and the target are judged on the half kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from vitqs.distributed import agree_max
from vitqs.vmc.estimators import Stats, sample_statistics
from vitqs.vmc.samples import Samples, joined

# What ended a final measurement (``final/stopped_by``).
STOPPED_BY = ("n_samples", "budget", "target_error")


@dataclass
class Measured:
    """The kept samples, their local energies and statistics, the discarding sweeps per
    chain before them, and what ended the measurement (one of `STOPPED_BY`)."""

    samples: Samples
    e_loc: torch.Tensor
    energy: Stats
    n_discard: int
    stopped_by: str


def measure(
    sampler,
    hamiltonian,
    model,
    n_samples: int,
    n_discard: int | None,
    *,
    chunk_size: int | None = None,
    deadline: float | None = None,
    target_error: float | None = None,
) -> Measured:
    """Returns the final measurement of ``model`` by ``sampler`` (a sampler of ``|ψ|²``).

    Args:
        n_samples: the samples (open-ended: the most).
        n_discard: sweeps per chain before samples are kept; None: as many as each chain
            keeps (at least the sampler's own).
        deadline: a ``time.perf_counter()`` by which drawing stops (no batch is started
            that the batches so far say would end after it); None: none.
        target_error: stop once the error of the mean is at most this × |E|; None: none.
    Without a deadline or a target the ``n_samples`` are drawn at once.
    """
    if sampler.exact or (deadline is None and target_error is None):
        discard = sampler.discard_before(n_samples, n_discard)
        samples = sampler.draw(model, n_samples, discard)
        e_loc = sampler.local_energy(hamiltonian, model, samples, chunk_size)
        stats = sample_statistics(e_loc, samples)
        return Measured(samples, e_loc, stats, discard, "n_samples")
    return _open_ended(
        sampler, hamiltonian, model, n_samples, n_discard, chunk_size, deadline, target_error
    )


def _open_ended(sampler, hamiltonian, model, n_samples, n_discard, chunk_size, deadline, target):
    halve = n_discard is None
    first_discard = sampler.n_discard if halve else n_discard
    most = sampler.n_batches(n_samples)
    batches, e_locs = [], []
    started = time.perf_counter()
    stopped_by = "n_samples"
    while True:
        group = min(max(1, len(batches)), most - len(batches))  # doubling: few checks
        if deadline is not None and batches:
            per_batch = max(agree_max(time.perf_counter() - started) / len(batches), 1e-9)
            left = deadline - time.perf_counter()
            # every rank draws as many as the slowest can: their collectives stay paired
            group = min(group, int(-agree_max(-left) // per_batch))
        if group <= 0:
            stopped_by = "budget"
            break
        for _ in range(group):
            batch = sampler.sample(model, n_discard=first_discard if not batches else 0)
            batches.append(batch)
            e_locs.append(sampler.local_energy(hamiltonian, model, batch, chunk_size))
        samples, e_loc = _kept(batches, e_locs, halve)
        energy = sample_statistics(e_loc, samples)
        if len(batches) >= most:
            break
        if target is not None and energy.error_of_mean <= target * abs(energy.mean.real):
            stopped_by = "target_error"
            break
    discarded = len(batches) // 2 * batches[0].n_per_chain if halve else 0
    return Measured(samples, e_loc, energy, first_discard + discarded, stopped_by)


def _kept(batches: list[Samples], e_locs: list[torch.Tensor], halve: bool):
    """Returns the samples and local energies kept: the later half of the batches (the
    first half of every chain discarded) or all of them."""
    first = len(batches) // 2 if halve else 0
    return joined(batches[first:]), torch.cat(e_locs[first:], dim=1)
