"""Error bars that cover (issue 27, item 4): over independent repetitions of a Markov chain,
the RMS of the reported error of the mean against the standard deviation of the means.

The chains are Metropolis walks on a ladder of levels ``E_k = k`` with Boltzmann weights
``e^{−βk}`` (the thermal occupation of an oscillator), and, at the end, Metropolis chains of
a Heisenberg ring. Importance-weighted chains sample ``e^{−βk/2}`` (as ``|ψ|^p`` sampling
does ``|ψ|²``) and carry the weights ``e^{−βk/2}`` back to ``β``. The band 0.85–1.15 holds
the ratio's own statistical spread, ``≈ 1/sqrt(2 reps) = 0.022`` at 1000 repetitions,
several times over. Before the fix, the single-chain estimates fell outside it (measured on
these very data, and asserted below through the old formulas): 0.79 plain, 1.64 weighted
(τ of the unweighted series; on the Heisenberg ring the same formula gave 0.69).
"""

import math

import numpy as np
import pytest
import torch
from helpers import ComplexRBM

from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg
from vitqs.vmc.estimators import (
    importance_statistics,
    importance_weights,
    integrated_time,
    local_energy,
    statistics,
)
from vitqs.vmc.sampler import MetropolisSampler

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: no thread hand-offs

BAND = (0.85, 1.15)
BETA = math.log(2.0)
N_LEVELS = 16


def _ladder_walks(n_walks: int, n_steps: int, beta: float, seed: int) -> np.ndarray:
    """Returns levels ``(n_walks, n_steps)`` of Metropolis walks (moves ±1, one per step) on
    ``k = 0 .. N_LEVELS−1`` with weights ``e^{−βk}``, each started in equilibrium."""
    rng = np.random.default_rng(seed)
    log_q = -beta * np.arange(N_LEVELS)
    q = np.exp(log_q) / np.exp(log_q).sum()
    k = rng.choice(N_LEVELS, size=n_walks, p=q)
    walks = np.empty((n_walks, n_steps), dtype=np.int64)
    for step in range(n_steps):
        proposal = k + rng.choice((-1, 1), size=n_walks)
        inside = (proposal >= 0) & (proposal < N_LEVELS)
        proposal = np.where(inside, proposal, k)
        accept = np.log(rng.random(n_walks)) < log_q[proposal] - log_q[k]
        k = np.where(inside & accept, proposal, k)
        walks[:, step] = k
    return walks


def _coverage(means, errors) -> float:
    """Returns RMS(reported error) / standard deviation of the means."""
    return math.sqrt(np.mean(np.square(errors))) / np.std(means, ddof=1)


def _old_plain_error(chain: torch.Tensor) -> float:
    """The single-chain error before issue 27: ``sqrt(σ² (1 + 2τ) / n)``."""
    variance = float(chain.var(unbiased=False))
    tau = integrated_time(chain[None], chain.mean(), variance)
    return math.sqrt(variance * (1 + 2 * tau) / chain.numel())


def _old_weighted_error(chain: torch.Tensor, weights: torch.Tensor) -> float:
    """The single-chain error before issue 27: ``sqrt(Σ w² |v − mean|² (1 + 2τ))``, τ of the
    unweighted series."""
    deviation = chain - (weights * chain).sum()
    tau = integrated_time(chain[None], chain.mean(), float(chain.var(unbiased=False)))
    return math.sqrt(float((weights**2 * deviation**2).sum()) * (1 + 2 * tau))


def _repeat_plain(n_reps, n_chains, n_steps, seed, old=False):
    walks = _ladder_walks(n_reps * n_chains, n_steps, BETA, seed)
    levels = torch.as_tensor(walks, dtype=torch.float64).reshape(n_reps, n_chains, n_steps)
    means, errors = [], []
    for chains in levels:
        stats = statistics(chains)
        means.append(stats.mean.real)
        errors.append(_old_plain_error(chains[0]) if old else stats.error_of_mean)
    return means, errors


def _repeat_weighted(n_reps, n_chains, n_steps, seed, old=False):
    walks = _ladder_walks(n_reps * n_chains, n_steps, BETA / 2, seed)
    levels = torch.as_tensor(walks, dtype=torch.float64).reshape(n_reps, n_chains, n_steps)
    means, errors = [], []
    for chains in levels:
        weights = importance_weights(-BETA / 2 * chains)
        stats = importance_statistics(chains, weights)
        means.append(stats.mean.real)
        errors.append(_old_weighted_error(chains[0], weights[0]) if old else stats.error_of_mean)
    return means, errors


def test_one_chain_plain_error_bars_cover_the_spread_of_means():
    """One chain of 500 steps (τ_int = 10.9, τ_exp = 17 steps): the autocovariance about the
    chain's own mean needs Wolff's bias correction; without it 0.79."""
    means, errors = _repeat_plain(1000, 1, 500, seed=1)
    assert BAND[0] < _coverage(means, errors) < BAND[1]
    assert _coverage(means, _repeat_plain(1000, 1, 500, seed=1, old=True)[1]) < BAND[0]


def test_many_chains_plain_error_bars_cover_the_spread_of_means():
    """16 chains of 100 steps: batch means over chains."""
    assert BAND[0] < _coverage(*_repeat_plain(400, 16, 100, seed=2)) < BAND[1]


def test_one_chain_weighted_error_bars_cover_the_spread_of_means():
    """One chain of 2000 steps at β/2 reweighted to β: the error is that of the series
    ``n w (v − mean)``, whose τ is not that of the levels (the old formula gave 1.64)."""
    means, errors = _repeat_weighted(1000, 1, 2000, seed=3)
    assert BAND[0] < _coverage(means, errors) < BAND[1]
    old_errors = _repeat_weighted(1000, 1, 2000, seed=3, old=True)[1]
    assert _coverage(means, old_errors) > BAND[1]


def test_many_chains_weighted_error_bars_cover_the_spread_of_means():
    """16 chains of 100 steps at β/2 reweighted to β: the delta method over chains."""
    assert BAND[0] < _coverage(*_repeat_weighted(400, 16, 100, seed=4)) < BAND[1]


def _ring_chains(machine_pow: float):
    """Returns 2000 independent Metropolis chains of ``|ψ|^machine_pow`` (one proposal per
    sample, 500 samples each) for an RBM on a 6-site Heisenberg ring: local energies and
    normalised weights ``|ψ|^(2 − p)`` per chain."""
    hamiltonian = Heisenberg(Lattice((6,)), sign_rule=True)
    model = ComplexRBM(6, scale=0.6, seed=1)
    n_chains, n_per_chain = 2000, 500
    sampler = MetropolisSampler(
        hamiltonian,
        n_samples=n_chains * n_per_chain,
        n_chains=n_chains,
        sweep_size=1,
        n_discard=200,
        seed=3,
        machine_pow=machine_pow,
    )
    samples = sampler.sample(model)
    e_loc = local_energy(hamiltonian, model, samples.x, samples.log_psi).real
    if samples.log_importance is None:
        return e_loc, None
    return e_loc, [importance_weights(log_r) for log_r in samples.log_importance]


def test_one_metropolis_chain_of_a_heisenberg_ring_weighted():
    """Each chain of ``|ψ|`` weighted to ``|ψ|²`` gives its own error bar; against the spread
    of the chains' estimates 1.09 (the old formula, τ of the unweighted series: 0.69)."""
    e_loc, weights = _ring_chains(machine_pow=1.0)
    stats = [importance_statistics(e, w) for e, w in zip(e_loc, weights, strict=True)]
    coverage = _coverage([s.mean.real for s in stats], [s.error_of_mean for s in stats])
    assert BAND[0] < coverage < BAND[1]


def test_one_metropolis_chain_of_a_heisenberg_ring_plain():
    """Each chain of ``|ψ|²`` gives its own error bar: 0.97 of the spread (old formula 0.87)."""
    e_loc, _ = _ring_chains(machine_pow=2.0)
    stats = [statistics(e) for e in e_loc]
    coverage = _coverage([s.mean.real for s in stats], [s.error_of_mean for s in stats])
    assert BAND[0] < coverage < BAND[1]
