"""Correlations, structure factors, densities and the one-body density matrix.

From samples: an operator ``A`` is estimated as the mean of its local value
``A_loc(x) = Σ_x' A_{xx'} ψ(x')/ψ(x)`` under ``|ψ|²``, with error bars from independent
chain means (`estimators.chain_error`); under the exact sampler the mean is the exact
weighted sum and the error is 0. From a state vector over the sector (``exact_*``): the
same expectation values by direct sums ``Σ_x ψ*(x) A_{xx'} ψ(x') / Σ|ψ|²``. A full sum
has the model's amplitudes of every state already, so `observables_of_vector` gives its
observables from them with no further network evaluation (the sample route, equal to
rounding, evaluates ψ at every pair-exchanged state: 43 s against 0.07 s on the J1-J2 4×4).

Spins (S = σ/2, configurations ±1): ``S_i·S_j = x_i x_j/4 + ½ [x_i ≠ x_j] ψ(x^{ij})/ψ(x)``,
``x^{ij}`` with sites i and j exchanged. With the Marshall sign rule the wave function is
that of the rotated basis, and the exchange ratio takes ``−1`` when i and j sit on
different sublattices, which gives the physical correlations.
Structure factor ``S(q) = (1/N) Σ_ij e^{iq·(r_i − r_j)} ⟨S_i·S_j⟩`` on the momenta
``q = 2π (n_x/L_x, n_y/L_y)``.

Bosons: ``⟨b_i† b_j⟩``'s local value is ``√(n_i (n_j + 1)) ψ(x')/ψ(x)`` with ``x'`` = x
with one particle moved i → j (the state that ``b_i† b_j`` maps onto x).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vitqs.estimators import amplitude_ratios, chain_error, gather_rows, sample_mean, total_count
from vitqs.operators import Heisenberg


@dataclass(frozen=True)
class Estimate:
    """A sample estimate: ``mean`` and ``error`` (standard error of the mean), numpy arrays."""

    mean: np.ndarray
    error: np.ndarray


def momenta(lattice) -> np.ndarray:
    """Returns the lattice momenta ``(n_sites, ndim)``: ``q = 2π (n_x/L_x, n_y/L_y)``, row-major."""
    grids = [2 * np.pi * np.arange(n) / n for n in lattice.shape]
    mesh = np.meshgrid(*grids, indexing="xy")
    return np.stack([m.reshape(-1) for m in mesh], axis=1)


def _phases(lattice) -> np.ndarray:
    """Returns ``e^{iq·r_i} / √N`` ``(n_q, N)``."""
    return np.exp(1j * momenta(lattice) @ lattice.coords.T) / np.sqrt(lattice.n_sites)


def structure_factor(lattice, correlations: np.ndarray) -> np.ndarray:
    """Returns ``S(q) = (1/N) Σ_ij e^{iq·(r_i − r_j)} C_ij`` ``(n_q,)`` real, for `momenta`."""
    phases = _phases(lattice)
    return np.einsum("qi,ij,qj->q", phases, correlations, phases.conj()).real


# --------------------------------------------------------------- from samples
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


def spin_observables(hamiltonian, model, samples, *, chunk_size=None) -> dict[str, Estimate]:
    """Returns ``spin_correlations`` ``(N, N)`` and ``structure_factor`` ``(n_q,)`` estimates.

    Args:
        hamiltonian: a `Heisenberg` (lattice and sign rule).
        model: ``(B, N) -> log ψ (B,)``.
        samples: `Samples` of ``|ψ|²`` with ``log_psi``.
        chunk_size: samples whose exchanged configurations are evaluated at once.
    """
    lattice = hamiltonian.lattice
    sign = _pair_signs(lattice, hamiltonian.sign_rule)
    phases = torch.as_tensor(_phases(lattice), device=samples.x.device)

    def local_values(x, log_psi, chunk):
        corr = _spin_correlation_values(model, x, log_psi, sign, chunk)  # (B, N, N)
        s_q = torch.einsum("qi,bij,qj->bq", phases, corr.to(phases.dtype), phases.conj()).real
        return [corr, s_q]

    exact = samples.weights is not None
    corr, s_q = (_estimate(m, exact) for m in _chain_means(samples, local_values, chunk_size))
    return {"spin_correlations": corr, "structure_factor": s_q}


def _pair_signs(lattice, sign_rule: bool) -> np.ndarray:
    """Returns the exchange-ratio sign ``(N, N)``: −1 across sublattices under the sign rule."""
    sub = lattice.sublattice_sign
    return np.outer(sub, sub) if sign_rule else np.ones((lattice.n_sites,) * 2, dtype=np.int64)


def _spin_correlation_values(model, x, log_psi, sign, chunk_size) -> torch.Tensor:
    """Returns the local values of ``S_i·S_j`` ``(B, N, N)`` real."""
    n_sites = x.shape[1]
    i, j = _pairs(n_sites, x.device)
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


def condensate_estimators(
    hamiltonian, largest: Estimate, k0: Estimate, translation_invariant: bool
) -> dict[str, Estimate]:
    """Returns ``condensate_fraction`` and ``condensate_fraction_max_eigenvalue``.

    The condensate fraction is the largest eigenvalue of ``ρ_ij = ⟨b_i† b_j⟩`` over N. Of a
    sampled ρ that eigenvalue is biased upward (noise spreads the spectrum; the maximum of
    noisy eigenvalues lies above the true one). For a translation-invariant ψ with J > 0 the
    condensate occupies k = 0 and the fraction is ``ρ(k = 0)/N = Σ_ij ρ_ij / (L N)``, linear
    in ρ and so unbiased: that is ``condensate_fraction`` then; otherwise it is the largest
    eigenvalue, which is always reported beside it for comparison.
    """
    applies = translation_invariant and hamiltonian.lattice.pbc and hamiltonian.J > 0
    return {
        "condensate_fraction": k0 if applies else largest,
        "condensate_fraction_max_eigenvalue": largest,
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


def condensate_fraction(one_body_density_matrix: np.ndarray, n_particles: int) -> float:
    """Returns the largest eigenvalue of ``⟨b_i† b_j⟩`` divided by the particle number, NaN
    when the estimate is not finite."""
    rho = np.asarray(one_body_density_matrix)
    if not np.isfinite(rho).all():
        # amplitude ratios overflow when ψ has collapsed onto configurations it weighs e^700
        # times their neighbours: no estimate, but no reason to lose the run's results
        return float("nan")
    rho = (rho + rho.conj().T) / 2  # Hermitian part; the sample estimate is Hermitian on average
    return float(np.linalg.eigvalsh(rho)[-1] / n_particles)


# ------------------------------------------------------------ from a vector
def observables_of_vector(
    hamiltonian, vector: np.ndarray, translation_invariant: bool = False
) -> dict[str, Estimate]:
    """Returns the observables of `spin_observables` (a `Heisenberg`) or `boson_observables`
    (a `BoseHubbard`), with zero errors, of a state vector over the sector in ``all_states``
    order (the ED ground state, or a model's amplitudes under the full sum);
    ``translation_invariant`` as in `boson_observables`."""
    hilbert, lattice = hamiltonian.hilbert, hamiltonian.lattice
    if isinstance(hamiltonian, Heisenberg):
        corr = exact_spin_correlations(hilbert, lattice, vector, hamiltonian.sign_rule)
        values = {"spin_correlations": corr, "structure_factor": structure_factor(lattice, corr)}
    else:
        rho = exact_one_body_density_matrix(hilbert, vector)
        values = {
            "densities": exact_densities(hilbert, vector),
            "density_correlations": exact_density_correlations(hilbert, vector),
            "one_body_density_matrix": rho,
        }
    estimates = {name: Estimate(value, np.zeros(np.shape(value))) for name, value in values.items()}
    if isinstance(hamiltonian, Heisenberg):
        return estimates
    n = hilbert.n_particles
    largest = Estimate(np.asarray(condensate_fraction(rho, n)), np.asarray(0.0))
    k0 = Estimate(np.asarray(np.sum(rho).real / (hilbert.n_sites * n)), np.asarray(0.0))
    return estimates | condensate_estimators(hamiltonian, largest, k0, translation_invariant)


def _vector_and_norm(vector: np.ndarray) -> tuple[np.ndarray, float]:
    vector = np.asarray(vector)
    return vector, float(np.vdot(vector, vector).real)


def exact_spin_correlations(
    hilbert, lattice, vector: np.ndarray, sign_rule: bool = False
) -> np.ndarray:
    """Returns ``⟨S_i·S_j⟩`` ``(N, N)`` of a state vector over the sector (``all_states`` order).

    ``sign_rule``: the vector is in the Marshall-rotated basis (``Heisenberg(sign_rule=True)``).
    """
    vector, norm = _vector_and_norm(vector)
    prob = np.abs(vector) ** 2 / norm
    spins = hilbert.all_states().astype(np.float64)  # (D, N)
    corr = (spins.T * prob) @ spins / 4.0
    sign = _pair_signs(lattice, sign_rule)
    codes = hilbert.codes
    for i, j in zip(*np.triu_indices(lattice.n_sites, k=1), strict=True):
        # on state codes (one bit per site, up = 1): exchanging two opposite spins moves
        # one bit, so the partner's code is a shift of x's, ranked without building states
        up_i, up_j = _digit(hilbert, codes, i), _digit(hilbert, codes, j)
        rows = np.flatnonzero(up_i != up_j)
        step = up_j[rows] - up_i[rows]  # +1: j's up spin moves to i
        swapped = codes[rows] + (step << i) - (step << j)
        amp = np.vdot(vector[rows], vector[hilbert.code_index(swapped)]) / norm
        corr[i, j] += 0.5 * sign[i, j] * amp.real
        corr[j, i] = corr[i, j]
    np.fill_diagonal(corr, 0.75)
    return corr


def _digit(hilbert, codes: np.ndarray, site: int) -> np.ndarray:
    """Returns every code's digit at ``site`` (the occupation, or 1 for spin up), int64."""
    return (codes >> (hilbert.bits * site)) & ((1 << hilbert.bits) - 1)


def exact_densities(hilbert, vector: np.ndarray) -> np.ndarray:
    """Returns ``⟨n_i⟩`` ``(N,)`` of a state vector over a boson sector."""
    vector, norm = _vector_and_norm(vector)
    return (np.abs(vector) ** 2 / norm) @ hilbert.all_states().astype(np.float64)


def exact_density_correlations(hilbert, vector: np.ndarray) -> np.ndarray:
    """Returns ``⟨n_i n_j⟩`` ``(N, N)`` of a state vector over a boson sector."""
    vector, norm = _vector_and_norm(vector)
    states = hilbert.all_states().astype(np.float64)
    return (states.T * (np.abs(vector) ** 2 / norm)) @ states


def exact_one_body_density_matrix(hilbert, vector: np.ndarray) -> np.ndarray:
    """Returns ``⟨b_i† b_j⟩`` ``(N, N)`` complex of a state vector over a boson sector."""
    vector, norm = _vector_and_norm(vector)
    codes, bits = hilbert.codes, hilbert.bits
    n_sites = hilbert.n_sites
    rho = np.zeros((n_sites, n_sites), dtype=np.complex128)
    rho[np.diag_indices(n_sites)] = exact_densities(hilbert, vector)
    for i, j in zip(*np.triu_indices(n_sites, k=1), strict=True):
        # ⟨x| b_i† b_j |x'⟩ ≠ 0 for x' = x with one particle moved i -> j: on state codes
        # (the digits are the occupations) x' is x's code shifted, ranked without states
        n_i, n_j = _digit(hilbert, codes, i), _digit(hilbert, codes, j)
        rows = np.flatnonzero((n_i > 0) & (n_j < hilbert.n_max))
        moved = codes[rows] - (1 << (bits * i)) + (1 << (bits * j))
        element = np.sqrt(n_i[rows] * (n_j[rows] + 1))
        rho[i, j] = np.vdot(vector[rows], element * vector[hilbert.code_index(moved)]) / norm
        rho[j, i] = np.conj(rho[i, j])  # ⟨b_j† b_i⟩ = ⟨b_i† b_j⟩*: (b_i† b_j)† = b_j† b_i
    return rho
