"""Correlations and densities: samples vs exact vectors, sum rules, energies from correlations."""

import numpy as np
import pytest
import torch
from helpers import ComplexRBM, LookupTable, exact_ground_state, model_vector

from vitqs.models.symmetrize import Symmetrized
from vitqs.physics.lattice import Lattice
from vitqs.physics.observables import (
    condensate_fraction,
    exact_densities,
    exact_density_correlations,
    exact_one_body_density_matrix,
    exact_spin_correlations,
    momenta,
    observables_of_vector,
    structure_factor,
)
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.observables import boson_observables, first_of_each_chain, spin_observables
from vitqs.vmc.sampler import MetropolisSampler

SPIN_CASES = {
    "chain": lambda: Heisenberg(Lattice((6,))),
    "chain_sign_rule": lambda: Heisenberg(Lattice((6,)), sign_rule=True),
    "square_j1j2": lambda: Heisenberg(Lattice((4, 2)), J2=0.5),
}


def _spin_energy(hamiltonian, corr):
    lattice = hamiltonian.lattice
    bonds1, energy = lattice.bonds(1), 0.0
    energy = hamiltonian.J1 * corr[bonds1[:, 0], bonds1[:, 1]].sum()
    if hamiltonian.J2:
        bonds2 = lattice.bonds(2)
        energy += hamiltonian.J2 * corr[bonds2[:, 0], bonds2[:, 1]].sum()
    return energy


@pytest.mark.parametrize("name", list(SPIN_CASES))
def test_ground_state_correlations_give_the_ground_state_energy(name):
    """E0 = J1 Σ_<ij> ⟨S_i·S_j⟩ + J2 Σ_<<ij>> ⟨S_i·S_j⟩; a singlet has S(q=0) = S_tot²/N = 0."""
    hamiltonian = SPIN_CASES[name]()
    energy, vector = exact_ground_state(hamiltonian)
    corr = exact_spin_correlations(
        hamiltonian.hilbert, hamiltonian.lattice, vector, sign_rule=hamiltonian.sign_rule
    )
    assert _spin_energy(hamiltonian, corr) == pytest.approx(energy, abs=1e-10)
    s_q = structure_factor(hamiltonian.lattice, corr)
    assert s_q[0] == pytest.approx(0.0, abs=1e-10)
    assert s_q.sum() == pytest.approx(0.75 * hamiltonian.n_sites)  # Σ_q S(q) = Σ_i S_i² = 3N/4


def test_sign_rule_correlations_are_those_of_the_physical_state():
    plain, rotated = Heisenberg(Lattice((6,))), Heisenberg(Lattice((6,)), sign_rule=True)
    corr_plain = exact_spin_correlations(plain.hilbert, plain.lattice, exact_ground_state(plain)[1])
    corr_rotated = exact_spin_correlations(
        rotated.hilbert, rotated.lattice, exact_ground_state(rotated)[1], sign_rule=True
    )
    np.testing.assert_allclose(corr_rotated, corr_plain, atol=1e-10)


@pytest.mark.parametrize("name", list(SPIN_CASES))
def test_spin_observables_under_the_exact_sampler_are_exact(name):
    hamiltonian = SPIN_CASES[name]()
    model = ComplexRBM(hamiltonian.n_sites, seed=4, scale=0.4)
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    result = spin_observables(hamiltonian, model, samples, chunk_size=7)
    vector = model_vector(model, hamiltonian.hilbert)
    corr = exact_spin_correlations(
        hamiltonian.hilbert, hamiltonian.lattice, vector, sign_rule=hamiltonian.sign_rule
    )
    np.testing.assert_allclose(result["spin_correlations"].mean, corr, atol=1e-12)
    np.testing.assert_allclose(
        result["structure_factor"].mean, structure_factor(hamiltonian.lattice, corr), atol=1e-12
    )
    assert np.all(result["spin_correlations"].error == 0)


@pytest.mark.parametrize(
    "hamiltonian",
    [
        Heisenberg(Lattice((8,)), sign_rule=True),
        Heisenberg(Lattice((2, 2), kind="honeycomb"), J2=0.3),
        Heisenberg(Lattice((2, 2), kind="kagome")),
    ],
    ids=["chain", "honeycomb", "kagome"],
)
def test_translation_invariant_correlations_from_the_first_cell_are_exact(hamiltonian):
    """The first cell's rows spread by translation give every pair's ⟨S_i·S_j⟩ of a
    translation-averaged ψ: equal to the exact sums (and to the all-pairs route)."""
    lattice = hamiltonian.lattice
    model = Symmetrized(ComplexRBM(hamiltonian.n_sites, seed=3, scale=0.4), lattice.translations)
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    by_orbit = spin_observables(hamiltonian, model, samples, translation_invariant=True)
    every_pair = spin_observables(hamiltonian, model, samples)
    corr = exact_spin_correlations(
        hamiltonian.hilbert,
        lattice,
        model_vector(model, hamiltonian.hilbert),
        hamiltonian.sign_rule,
    )
    np.testing.assert_allclose(by_orbit["spin_correlations"].mean, corr, atol=1e-12)
    np.testing.assert_allclose(every_pair["spin_correlations"].mean, corr, atol=1e-12)
    np.testing.assert_allclose(
        by_orbit["structure_factor"].mean, structure_factor(lattice, corr), atol=1e-12
    )


@pytest.mark.usefixtures("single_thread")
def test_spin_observables_from_samples_agree_within_error_bars():
    hamiltonian = Heisenberg(Lattice((6,)), sign_rule=True)
    model = ComplexRBM(6, seed=4, scale=0.4)
    sampler = MetropolisSampler(hamiltonian, n_samples=4096, n_chains=64, n_discard=10, seed=3)
    result = spin_observables(hamiltonian, model, sampler.sample(model))
    corr = exact_spin_correlations(
        hamiltonian.hilbert, hamiltonian.lattice, model_vector(model, hamiltonian.hilbert), True
    )
    for key, exact in (("spin_correlations", corr), ("structure_factor", None)):
        estimate = result[key]
        exact = structure_factor(hamiltonian.lattice, corr) if exact is None else exact
        off = ~np.isclose(estimate.error, 0)  # the diagonal S_i·S_i = 3/4 has no error
        z = np.abs(estimate.mean - exact)[off] / estimate.error[off]
        # entries are correlated with each other, so only the largest deviation is tested
        assert z.max() < 4.5, f"{key}: {z.max():.2f} error bars off"


def test_observables_from_the_first_samples_of_each_chain_keep_honest_error_bars():
    hamiltonian = Heisenberg(Lattice((6,)), sign_rule=True)
    model = ComplexRBM(6, seed=4, scale=0.4)
    sampler = MetropolisSampler(hamiltonian, n_samples=4096, n_chains=64, n_discard=10, seed=3)
    samples = sampler.sample(model)
    first = first_of_each_chain(samples, 1000)  # ⌈1000 / 64⌉ = 16 of each chain's 64
    assert first.x.shape == (64, 16, 6)
    assert torch.equal(first.x, samples.x[:, :16])
    assert torch.equal(first.log_psi, samples.log_psi[:, :16])
    for n_samples in (None, 4096, 10**6):
        assert first_of_each_chain(samples, n_samples) is samples
    exact_states = ExactSampler(hamiltonian.hilbert).sample(model)
    assert first_of_each_chain(exact_states, 10) is exact_states  # weights: a sum, not samples

    corr = exact_spin_correlations(
        hamiltonian.hilbert, hamiltonian.lattice, model_vector(model, hamiltonian.hilbert), True
    )
    full = spin_observables(hamiltonian, model, samples)["spin_correlations"]
    part = spin_observables(hamiltonian, model, first)["spin_correlations"]
    off = ~np.isclose(full.error, 0)
    assert np.abs(part.mean - corr)[off].max() / part.error[off].max() < 4.5
    # 4x fewer samples: error bars wider, at most ~2x (less where a chain's neighbouring
    # samples are correlated: the prefix then loses less than 4x of its information)
    ratio = np.median(part.error[off] / full.error[off])
    assert 1.2 < ratio < 2.6, ratio


def test_momenta_cover_the_brillouin_zone():
    q = momenta(Lattice((4, 2)))
    assert q.shape == (8, 2)
    assert {tuple(np.round(row / (2 * np.pi), 3)) for row in q} == {
        (nx / 4, ny / 2) for nx in range(4) for ny in range(2)
    }


BOSON_CASES = {
    "chain": lambda: BoseHubbard(Lattice((4,)), U=3.0, n_particles=4),
    "cutoff_square": lambda: BoseHubbard(Lattice((2, 2)), U=2.0, mu=0.3, n_particles=5, n_max=2),
}


@pytest.mark.parametrize("name", list(BOSON_CASES))
def test_ground_state_densities_give_the_ground_state_energy(name):
    """E0 = −J Σ_<ij> (ρ_ij + ρ_ji) + (U/2) Σ_i (⟨n_i²⟩ − ⟨n_i⟩) − μ N."""
    hamiltonian = BOSON_CASES[name]()
    hilbert = hamiltonian.hilbert
    energy, vector = exact_ground_state(hamiltonian)
    rho = exact_one_body_density_matrix(hilbert, vector)
    nn = exact_density_correlations(hilbert, vector)
    n = exact_densities(hilbert, vector)
    bonds = hamiltonian.lattice.bonds(1)
    kinetic = -hamiltonian.J * (rho[bonds[:, 0], bonds[:, 1]] + rho[bonds[:, 1], bonds[:, 0]]).sum()
    interaction = hamiltonian.U / 2 * (np.diag(nn) - n).sum() - hamiltonian.mu * n.sum()
    assert (kinetic + interaction).real == pytest.approx(energy, abs=1e-10)
    np.testing.assert_allclose(np.diag(rho).real, n)
    assert n.sum() == pytest.approx(hilbert.n_particles)
    fraction = condensate_fraction(rho, hilbert.n_particles)
    assert 1 / hilbert.n_sites - 1e-12 <= fraction <= 1 + 1e-12


def test_condensate_fraction_of_an_overflowed_estimate_is_nan_not_an_error():
    # a collapsed ψ (chains stuck where ψ's neighbours are e^700 times smaller or larger)
    # gives inf ratios; the run must still finish and write its results
    rho = np.eye(3) * 2.0
    assert condensate_fraction(rho, 6) == pytest.approx(1 / 3)
    rho[0, 1] = np.inf
    assert np.isnan(condensate_fraction(rho, 6))


@pytest.mark.parametrize("name", list(BOSON_CASES))
def test_boson_observables_under_the_exact_sampler_are_exact(name):
    hamiltonian = BOSON_CASES[name]()
    hilbert = hamiltonian.hilbert
    model = ComplexRBM(hamiltonian.n_sites, seed=8, scale=0.3)
    result = boson_observables(hamiltonian, model, ExactSampler(hilbert).sample(model))
    vector = model_vector(model, hilbert)  # complex: checks ⟨b_i† b_j⟩ is not conjugated
    np.testing.assert_allclose(
        result["densities"].mean, exact_densities(hilbert, vector), atol=1e-12
    )
    np.testing.assert_allclose(
        result["density_correlations"].mean, exact_density_correlations(hilbert, vector), atol=1e-12
    )
    rho = exact_one_body_density_matrix(hilbert, vector)
    np.testing.assert_allclose(result["one_body_density_matrix"].mean, rho, atol=1e-12)
    assert float(result["condensate_fraction"].mean) == pytest.approx(
        condensate_fraction(rho, hilbert.n_particles)
    )


@pytest.mark.usefixtures("single_thread")
def test_boson_observables_from_samples_agree_within_error_bars():
    hamiltonian = BoseHubbard(Lattice((4,)), U=3.0, n_particles=4)
    hilbert = hamiltonian.hilbert
    energy, vector = exact_ground_state(hamiltonian)
    model = LookupTable.from_vector(hilbert, vector)
    sampler = MetropolisSampler(hamiltonian, n_samples=4096, n_chains=64, n_discard=10, seed=5)
    result = boson_observables(hamiltonian, model, sampler.sample(model))
    exact = {
        "densities": exact_densities(hilbert, vector),
        "density_correlations": exact_density_correlations(hilbert, vector),
        "one_body_density_matrix": exact_one_body_density_matrix(hilbert, vector),
    }
    exact["condensate_fraction"] = condensate_fraction(exact["one_body_density_matrix"], 4)
    for key, value in exact.items():
        estimate = result[key]
        z = np.abs(estimate.mean - value) / np.maximum(estimate.error, 1e-12)
        assert np.max(z) < 4.5, f"{key}: {np.max(z):.2f} error bars off"


@pytest.mark.parametrize(
    "kind, name", [("spins", n) for n in SPIN_CASES] + [("bosons", n) for n in BOSON_CASES]
)
def test_observables_of_a_vector_are_those_of_the_full_sum_samples(kind, name):
    # the run's full-sum route: the model's amplitudes over the sector, no network calls
    cases, observables = {
        "spins": (SPIN_CASES, spin_observables),
        "bosons": (BOSON_CASES, boson_observables),
    }[kind]
    hamiltonian = cases[name]()
    model = ComplexRBM(hamiltonian.n_sites, seed=9, scale=0.3)
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    from_samples = observables(hamiltonian, model, samples)
    log_psi = samples.log_psi.reshape(-1).numpy()
    from_vector = observables_of_vector(hamiltonian, np.exp(log_psi - log_psi.real.max()))
    assert set(from_vector) == set(from_samples)
    for key, estimate in from_vector.items():
        np.testing.assert_allclose(estimate.mean, from_samples[key].mean, atol=1e-12, err_msg=key)
        assert not np.any(estimate.error)


@pytest.mark.parametrize(
    "hamiltonian",
    [
        BoseHubbard(Lattice((6,)), U=3.0, n_particles=6),
        BoseHubbard(Lattice((3, 3)), U=16.7, n_particles=9, n_max=3),
    ],
    ids=["chain6", "square3x3"],
)
def test_rho_at_k0_is_the_largest_eigenvalue_of_a_translation_invariant_ground_state(hamiltonian):
    _, ground = exact_ground_state(hamiltonian)
    measured = observables_of_vector(hamiltonian, ground, translation_invariant=True)
    largest = measured["condensate_fraction_max_eigenvalue"].mean
    assert float(measured["condensate_fraction"].mean) == pytest.approx(float(largest), abs=1e-10)
    # without the invariance (a model's vector need not have it) the eigenvalue is reported
    plain = observables_of_vector(hamiltonian, ground)
    assert plain["condensate_fraction"] is plain["condensate_fraction_max_eigenvalue"]


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
def test_the_k0_condensate_fraction_is_unbiased_where_the_largest_eigenvalue_is_not():
    # deep in the Mott phase the eigenvalues of ρ lie close together: those of a noisy ρ
    # spread, and the largest one sits above the truth; ρ(k = 0)/N is linear in ρ
    hamiltonian = BoseHubbard(Lattice((6,)), U=20.0, n_particles=6)
    _, ground = exact_ground_state(hamiltonian)
    truth = float(observables_of_vector(hamiltonian, ground, True)["condensate_fraction"].mean)
    model = LookupTable.from_vector(hamiltonian.hilbert, np.abs(ground))
    k0, largest = [], []
    for seed in range(200):
        sampler = MetropolisSampler(hamiltonian, n_samples=64, n_chains=16, n_discard=60, seed=seed)
        measured = boson_observables(
            hamiltonian, model, sampler.sample(model), translation_invariant=True
        )
        k0.append(float(measured["condensate_fraction"].mean))
        largest.append(float(measured["condensate_fraction_max_eigenvalue"].mean))

    def bias_in_standard_errors(values):
        return (np.mean(values) - truth) / (np.std(values, ddof=1) / np.sqrt(len(values)))

    # measured: k0 −0.3, largest eigenvalue +5.3 standard errors (200 runs of 64 samples)
    assert abs(bias_in_standard_errors(k0)) < 3
    assert bias_in_standard_errors(largest) > 3
