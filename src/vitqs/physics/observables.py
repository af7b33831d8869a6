"""Observables of a state vector over a sector, and the lattice Fourier sums they share.

From a vector (``exact_*``, `observables_of_vector`): expectation values by direct sums
``Σ_x ψ*(x) A_{xx'} ψ(x') / Σ|ψ|²`` over the sector in ``all_states`` order: the ED ground
state, or a model's amplitudes under the full sum, which has every state's ψ already (the
sample route, equal to rounding, evaluates ψ at every pair-exchanged state: 43 s against
0.07 s on the J1-J2 4×4). The sampled estimators of the same quantities are in
`vitqs.vmc.observables`.

Spins (S = σ/2, configurations ±1): ``S_i·S_j = x_i x_j/4 + ½ [x_i ≠ x_j] ψ(x^{ij})/ψ(x)``,
``x^{ij}`` with sites i and j exchanged. With the Marshall sign rule the wave function is
that of the rotated basis, and the exchange ratio takes ``−1`` when i and j sit on
different sublattices, which gives the physical correlations.
Structure factor ``S(q) = (1/N) Σ_ij e^{iq·(r_i − r_j)} ⟨S_i·S_j⟩`` on the momenta
``q = 2π (n_x/L_x, n_y/L_y)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitqs.physics.operators import Heisenberg


@dataclass(frozen=True)
class Estimate:
    """A sample estimate: ``mean`` and ``error`` (standard error of the mean), numpy arrays."""

    mean: np.ndarray
    error: np.ndarray


def momenta(lattice) -> np.ndarray:
    """Returns the lattice momenta ``(n_cells, space_dim)``, row-major: on a chain or a square
    ``q = 2π (n_x/L_x, n_y/L_y)``, on a lattice with a basis those of its cell lattice
    (`Lattice.momenta`)."""
    return lattice.momenta()


def fourier_phases(lattice) -> np.ndarray:
    """Returns ``e^{iq·r_i} / √N`` ``(n_q, N)`` at the sites' real-space positions."""
    return np.exp(1j * momenta(lattice) @ lattice.positions.T) / np.sqrt(lattice.n_sites)


def structure_factor(lattice, correlations: np.ndarray) -> np.ndarray:
    """Returns ``S(q) = (1/N) Σ_ij e^{iq·(r_i − r_j)} C_ij`` ``(n_q,)`` real, for `momenta`."""
    phases = fourier_phases(lattice)
    return np.einsum("qi,ij,qj->q", phases, correlations, phases.conj()).real


def pair_signs(lattice, sign_rule: bool) -> np.ndarray:
    """Returns the exchange-ratio sign ``(N, N)``: −1 across sublattices under the sign rule."""
    sub = lattice.sublattice_sign
    return np.outer(sub, sub) if sign_rule else np.ones((lattice.n_sites,) * 2, dtype=np.int64)


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
    applies = translation_invariant and hamiltonian.lattice.periodic and hamiltonian.J > 0
    return {
        "condensate_fraction": k0 if applies else largest,
        "condensate_fraction_max_eigenvalue": largest,
    }


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
    sign = pair_signs(lattice, sign_rule)
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
