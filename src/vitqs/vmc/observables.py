"""Sampled estimators of correlations, structure factors, densities and the one-body density
matrix.

An operator ``A`` is estimated as the mean of its local value
``A_loc(x) = Σ_x' A_{xx'} ψ(x')/ψ(x)`` under ``|ψ|²``, with error bars from independent
chain means (`estimators.chain_error`); under the exact sampler the mean is the exact
weighted sum and the error is 0. The same quantities of a state vector over the sector, and
the conventions (S = σ/2, the sign rule's exchange sign, ``S(q)``'s momenta), are in
`vitqs.physics.observables`.

Bosons: ``⟨b_i† b_j⟩``'s local value is ``√(n_i (n_j + 1)) ψ(x')/ψ(x)`` with ``x'`` = x
with one particle moved i → j (the state that ``b_i† b_j`` maps onto x).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from vitqs.distributed import gather_rows, total_count
from vitqs.physics.observables import (
    Estimate,
    condensate_estimators,
    condensate_fraction,
    fourier_phases,
    pair_signs,
)
from vitqs.vmc.estimators import amplitude_ratios, chain_error, sample_mean

# --------------------------------------------------------------- from samples


def first_of_each_chain(samples, n_samples: int | None):
    """Returns the first ``⌈n_samples / n_chains⌉`` samples of every chain (``n_chains`` over
    all ranks), or ``samples`` itself for None, exact weights or fewer samples than that.

    The observables cost about as much per sample as the energy (a connected configuration
    per pair or hop), but need far fewer samples: a final energy meant for 1e-5 can take
    500,000 samples where 1% error bars on the correlations take a few ten thousand.
    Keeping whole chain prefixes keeps the chain structure the error bars are built from.
    """
    if n_samples is None or samples.weights is not None:
        return samples
    per_chain = math.ceil(n_samples / total_count(samples.n_chains, samples.x.device))
    if per_chain >= samples.n_per_chain:
        return samples
    log_importance = samples.log_importance
    return dataclasses.replace(
        samples,
        x=samples.x[:, :per_chain],
        log_psi=samples.log_psi[:, :per_chain],
        log_importance=None if log_importance is None else log_importance[:, :per_chain],
    )


# Samples whose pair-exchanged configurations are built at once when no chunk size is given:
# all pairs of every sample together reach GBs (12 sites: 144 configurations a sample).
_SAMPLES_PER_CHUNK = 1024


def _chain_means(samples, local_values, chunk_size) -> list[torch.Tensor]:
    """Returns per-chain means ``(n_chains, ...)`` of each output of ``local_values``.

    ``local_values(x (B, N), log_psi (B,), chunk_size)`` returns a list of ``(B, ...)``
    tensors; with exact weights the "mean" of the single chain is the weighted sum.
    """
    n_chains, n_per_chain, n_sites = samples.x.shape
    samples_per_chunk = _SAMPLES_PER_CHUNK if chunk_size is None else chunk_size
    per_chunk = max(1, samples_per_chunk // n_per_chain)
    chunks = []
    for c0 in range(0, n_chains, per_chunk):
        x = samples.x[c0 : c0 + per_chunk]  # (c, S, N)
        log_psi = samples.log_psi[c0 : c0 + per_chunk].reshape(-1)
        outs = local_values(x.reshape(-1, n_sites), log_psi, chunk_size)
        outs = [o.reshape(x.shape[0], n_per_chain, *o.shape[1:]) for o in outs]
        if samples.weights is None:
            chunks.append([o.mean(dim=1) for o in outs])  # inside a chain: no cross-rank sum
        else:
            w = samples.weights[c0 : c0 + per_chunk]
            chunks.append([torch.einsum("cs,cs...->c...", w.to(o.dtype), o) for o in outs])
    return [torch.cat(parts) for parts in zip(*chunks, strict=True)]


def _estimate(chain_means: torch.Tensor, exact: bool) -> Estimate:
    """Returns the mean over chains and its error (0 for exact weights, NaN for one chain)."""
    if exact:
        return Estimate(chain_means[0].cpu().numpy(), np.zeros(chain_means.shape[1:]))
    mean = sample_mean(chain_means)
    if total_count(chain_means.shape[0], chain_means.device) < 2:
        return Estimate(mean.cpu().numpy(), np.full(mean.shape, np.nan))
    return Estimate(mean.cpu().numpy(), chain_error(chain_means, mean).cpu().numpy())


def _pairs(n_sites: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    i, j = torch.triu_indices(n_sites, n_sites, offset=1, device=device)
    return i, j


def spin_observables(
    hamiltonian, model, samples, *, chunk_size=None, translation_invariant=False
) -> dict[str, Estimate]:
    """Returns ``spin_correlations`` ``(N, N)`` and ``structure_factor`` ``(n_q,)`` estimates.

    Args:
        hamiltonian: a `Heisenberg` (lattice and sign rule).
        model: ``(B, N) -> log ψ (B,)``.
        samples: `Samples` of ``|ψ|²`` with ``log_psi``.
        chunk_size: samples whose exchanged configurations are evaluated at once.
        translation_invariant: ψ is invariant under every translation of a periodic lattice.
            Then ``⟨S_i·S_j⟩`` depends on the pair's orbit only, and only the rows of the
            first cell's sites are sampled (``n_basis · N`` pairs, not ``N²/2``: 32× fewer
            on a 64-site chain); the others are filled in by translation.
    """
    lattice = hamiltonian.lattice
    sign = pair_signs(lattice, hamiltonian.sign_rule)
    phases = torch.as_tensor(fourier_phases(lattice), device=samples.x.device)
    orbit = None
    if translation_invariant and lattice.periodic:
        orbit = tuple(
            torch.as_tensor(t, device=samples.x.device) for t in _pair_orbit_table(lattice)
        )

    def local_values(x, log_psi, chunk):
        corr = _spin_correlation_values(model, x, log_psi, sign, chunk, orbit)  # (B, N, N)
        s_q = torch.einsum("qi,bij,qj->bq", phases, corr.to(phases.dtype), phases.conj()).real
        return [corr, s_q]

    exact = samples.weights is not None
    corr, s_q = (_estimate(m, exact) for m in _chain_means(samples, local_values, chunk_size))
    return {"spin_correlations": corr, "structure_factor": s_q}


def _pair_orbit_table(lattice) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(row, column)`` ``(N, N)``: the pair ``(row[a, b], column[a, b])`` with ``row``
    a site of the first cell that a translation maps onto ``(a, b)``."""
    cell = np.arange(lattice.n_sites) // lattice.n_basis  # on a periodic lattice: its shift
    row = np.broadcast_to(lattice.basis_index[:, None], (lattice.n_sites,) * 2)
    column = lattice.translations[cell]  # translations[t][b]: b shifted back by a's cell
    return np.ascontiguousarray(row), column


def _spin_correlation_values(model, x, log_psi, sign, chunk_size, orbit=None) -> torch.Tensor:
    """Returns the local values of ``S_i·S_j`` ``(B, N, N)`` real: of every pair, or with
    ``orbit`` (`_pair_orbit_table`) of the first cell's rows, spread over their orbits."""
    n_sites = x.shape[1]
    i, j = _pairs(n_sites, x.device)
    if orbit is not None:  # only the pairs (first-cell site, any later site)
        first = int(orbit[0].max()) + 1
        i, j = i[i < first], j[i < first]
    x_conn = x.unsqueeze(1).repeat(1, len(i), 1)  # (B, P, N)
    pair = torch.arange(len(i), device=x.device)
    x_conn[:, pair, i], x_conn[:, pair, j] = x[:, j], x[:, i]
    active = x[:, i] != x[:, j]  # (B, P)
    ratios = amplitude_ratios(model, x_conn, active, log_psi, chunk_size)  # (B, P)
    pair_sign = torch.as_tensor(sign, device=x.device, dtype=x.dtype)[i, j]
    off = (0.5 * pair_sign * ratios).real.to(x.dtype)
    corr = (x[:, :, None] * x[:, None, :]) / 4  # diagonal part; S_i·S_i = 3/4 below
    corr[:, i, j] += off
    corr[:, j, i] += off
    corr[:, torch.arange(n_sites), torch.arange(n_sites)] = 0.75
    if orbit is not None:
        row, column = orbit
        corr = corr[:, row, column]
    return corr


def boson_observables(
    hamiltonian, model, samples, *, chunk_size=None, translation_invariant=False
) -> dict[str, Estimate]:
    """Returns ``densities`` ``(N,)``, ``density_correlations`` ``⟨n_i n_j⟩`` ``(N, N)``,
    ``one_body_density_matrix`` ``⟨b_i† b_j⟩`` ``(N, N)`` complex, the condensate fraction by
    `condensate_estimators` (``condensate_fraction``, and beside it
    ``condensate_fraction_max_eigenvalue``, the largest eigenvalue of ``ρ`` over N with a
    leave-one-chain-out jackknife error).

    Args:
        translation_invariant: ψ is invariant under every lattice translation (averaged over
            them), which makes ``ρ(k = 0)/N`` the condensate fraction.
    """
    n_max = hamiltonian.hilbert.n_max

    def local_values(x, log_psi, chunk):
        rho = _one_body_values(model, x, log_psi, n_max, chunk)
        return [x, x[:, :, None] * x[:, None, :], rho]

    exact = samples.weights is not None
    chain_means = _chain_means(samples, local_values, chunk_size)
    densities, density_corr, rho = (_estimate(m, exact) for m in chain_means)
    n_particles = hamiltonian.hilbert.n_particles
    fraction = condensate_fraction(rho.mean, n_particles)
    error = 0.0
    if not exact:  # leave-one-chain-out over the chains of every rank
        error = _jackknife_error(gather_rows(chain_means[2]).cpu().numpy(), n_particles)
    largest = Estimate(np.asarray(fraction), np.asarray(error))
    # linear in ρ: the chains' own values give the mean and its error
    k0 = _estimate(chain_means[2].sum(dim=(1, 2)).real / (hamiltonian.n_sites * n_particles), exact)
    return {
        "densities": densities,
        "density_correlations": density_corr,
        "one_body_density_matrix": rho,
        **condensate_estimators(hamiltonian, largest, k0, translation_invariant),
    }


def _jackknife_error(rho_chain_means: np.ndarray, n_particles: int) -> float:
    """Returns the leave-one-chain-out jackknife error of the condensate fraction."""
    n = len(rho_chain_means)
    if n < 2:
        return float("nan")
    loo = (rho_chain_means.sum(axis=0) - rho_chain_means) / (n - 1)  # (C, N, N)
    values = np.array([condensate_fraction(r, n_particles) for r in loo])
    return float(np.sqrt((n - 1) / n * ((values - values.mean()) ** 2).sum()))


def _one_body_values(model, x, log_psi, n_max, chunk_size) -> torch.Tensor:
    """Returns the local values of ``b_i† b_j`` ``(B, N, N)`` complex."""
    n_sites = x.shape[1]
    i, j = (~torch.eye(n_sites, dtype=torch.bool, device=x.device)).nonzero(as_tuple=True)
    x_conn = x.unsqueeze(1).repeat(1, len(i), 1)  # (B, P, N)
    n_i, n_j = x[:, i], x[:, j]
    active = (n_i > 0) & (n_j < n_max)
    pair = torch.arange(len(i), device=x.device)
    x_conn[:, pair, i] = n_i - active.to(x.dtype)
    x_conn[:, pair, j] = n_j + active.to(x.dtype)
    ratios = amplitude_ratios(model, x_conn, active, log_psi, chunk_size)  # (B, P)
    rho = torch.zeros((x.shape[0], n_sites, n_sites), dtype=ratios.dtype, device=x.device)
    rho[:, i, j] = torch.sqrt(n_i * (n_j + 1)).to(ratios.dtype) * ratios
    rho[:, torch.arange(n_sites), torch.arange(n_sites)] = x.to(ratios.dtype)
    return rho
