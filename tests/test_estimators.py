"""Local energies against the dense Hamiltonian; statistics of correlated chains, and of
importance-weighted samples; V-score."""

import math

import numpy as np
import pytest
import torch
from helpers import ComplexRBM, LookupTable, exact_ground_state, model_vector, rayleigh_quotient

from vitqs.models.symmetrize import (
    final_symmetrized,
    symmetrize_space_group,
    symmetrize_translations,
)
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.estimators import (
    _orbit_codes,
    distinct_rows,
    evaluate_log_psi,
    importance_statistics,
    importance_weights,
    local_energy,
    model_symmetries,
    sample_mean,
    statistics,
)
from vitqs.vmc.exact_sampler import ExactSampler

HAMILTONIANS = {
    "heisenberg_chain": lambda: Heisenberg(Lattice((6,))),
    "heisenberg_j1j2_sign_rule": lambda: Heisenberg(Lattice((6,)), J2=0.4, sign_rule=True),
    "heisenberg_square_sz1": lambda: Heisenberg(Lattice((2, 4)), J2=0.5, total_sz=1.0),
    "bose_hubbard": lambda: BoseHubbard(Lattice((4,)), U=3.0, mu=0.5, n_particles=4),
    "bose_hubbard_cutoff": lambda: BoseHubbard(Lattice((2, 2)), U=2.0, n_particles=5, n_max=2),
}


@pytest.mark.parametrize("name", list(HAMILTONIANS))
def test_exact_mean_of_local_energies_is_the_rayleigh_quotient(name):
    hamiltonian = HAMILTONIANS[name]()
    model = ComplexRBM(hamiltonian.n_sites, seed=11, scale=0.3)
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    e_loc = local_energy(hamiltonian, model, samples.x, samples.log_psi)
    stats = statistics(e_loc, samples.weights)
    psi = model_vector(model, hamiltonian.hilbert)
    expected = rayleigh_quotient(hamiltonian, psi)
    assert stats.mean.real == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert abs(stats.mean.imag) < 1e-12
    assert stats.error_of_mean == 0.0


@pytest.mark.parametrize("name", list(HAMILTONIANS))
def test_exact_ground_state_has_zero_variance_local_energies(name):
    hamiltonian = HAMILTONIANS[name]()
    energy, vector = exact_ground_state(hamiltonian)
    model = LookupTable.from_vector(hamiltonian.hilbert, vector)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    e_loc = local_energy(hamiltonian, model, x)
    np.testing.assert_allclose(e_loc.numpy(), energy, atol=1e-9)


@pytest.mark.parametrize("name", list(HAMILTONIANS))
def test_full_sum_local_energies_from_the_sparse_matrix_equal_the_network_ones(name):
    # The exact sampler's (Hψ)/ψ reads the amplitudes of connected states off the sector
    # vector; the network path evaluates them again: both must give the same numbers.
    hamiltonian = HAMILTONIANS[name]()
    model = ComplexRBM(hamiltonian.n_sites, seed=5, scale=0.3)
    sampler = ExactSampler(hamiltonian.hilbert)
    samples = sampler.sample(model)
    from_matrix = sampler.sector_local_energy(hamiltonian, samples.log_psi)
    from_network = local_energy(hamiltonian, model, samples.x, samples.log_psi)
    assert from_matrix.shape == samples.log_psi.shape
    torch.testing.assert_close(from_matrix, from_network, rtol=1e-11, atol=1e-11)


def test_full_sum_local_energies_where_psi_vanishes_are_finite_and_weightless():
    # spin inversion odd (spin_flip -1) makes ψ = 0 exactly on states mapped onto themselves
    # up to a translation; those states must not turn the mean into NaN
    hamiltonian = Heisenberg(Lattice((6,)))
    psi = np.random.default_rng(3).normal(size=hamiltonian.hilbert.dimension)
    psi[:4] = 0.0
    with np.errstate(divide="ignore"):  # log 0 = -inf is the point
        model = LookupTable.from_vector(hamiltonian.hilbert, psi)
    sampler = ExactSampler(hamiltonian.hilbert)
    samples = sampler.sample(model)
    e_loc = sampler.sector_local_energy(hamiltonian, samples.log_psi)
    assert bool(torch.isfinite(e_loc).all())
    stats = statistics(e_loc, samples.weights)
    assert stats.mean.real == pytest.approx(rayleigh_quotient(hamiltonian, psi), rel=1e-12)


def test_chunked_local_energies_are_identical():
    hamiltonian = BoseHubbard(Lattice((4,)), n_particles=4)
    model = ComplexRBM(4, seed=2)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    whole = local_energy(hamiltonian, model, x)
    for chunk_size in (1, 7, 1000):
        torch.testing.assert_close(
            local_energy(hamiltonian, model, x, chunk_size=chunk_size), whole, rtol=1e-14, atol=0
        )


def test_known_log_psi_gives_the_same_local_energies_and_keeps_chain_shape():
    hamiltonian = Heisenberg(Lattice((6,)))
    model = ComplexRBM(6, seed=3)
    x = torch.as_tensor(hamiltonian.hilbert.all_states()[:18], dtype=torch.float64)
    x = x.reshape(3, 6, 6)  # (chains, per chain, sites)
    log_psi = evaluate_log_psi(model, x.reshape(-1, 6)).reshape(3, 6)
    with_cache = local_energy(hamiltonian, model, x, log_psi)
    assert with_cache.shape == (3, 6)
    torch.testing.assert_close(with_cache, local_energy(hamiltonian, model, x))


def test_local_energies_scale_with_the_couplings():
    """E_loc(2J) = 2 E_loc(J): H is linear in its couplings."""
    model = ComplexRBM(6, seed=5)
    x = torch.as_tensor(Heisenberg(Lattice((6,))).hilbert.all_states(), dtype=torch.float64)
    one = local_energy(Heisenberg(Lattice((6,)), J1=1.0, J2=0.3), model, x)
    two = local_energy(Heisenberg(Lattice((6,)), J1=2.0, J2=0.6), model, x)
    torch.testing.assert_close(two, 2 * one)


def test_sample_mean_plain_and_weighted():
    values = torch.tensor([[1.0, 2.0], [3.0, 5.0], [4.0, 8.0]], dtype=torch.float64)
    torch.testing.assert_close(sample_mean(values), values.mean(dim=0))
    weights = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    torch.testing.assert_close(sample_mean(values, weights), (weights[:, None] * values).sum(0))


def _ar1_chains(n_chains, n_per_chain, rho, seed):
    """Returns AR(1) chains ``x_t = ρ x_{t−1} + √(1−ρ²) η_t`` with unit stationary variance."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n_chains, n_per_chain, generator=gen, dtype=torch.float64)
    chains = torch.empty_like(noise)
    chains[:, 0] = noise[:, 0]
    for t in range(1, n_per_chain):
        chains[:, t] = rho * chains[:, t - 1] + np.sqrt(1 - rho**2) * noise[:, t]
    return chains


def test_statistics_of_independent_samples():
    gen = torch.Generator().manual_seed(0)
    values = 2.0 + 3.0 * torch.randn(32, 512, generator=gen, dtype=torch.float64)
    stats = statistics(values)
    assert stats.variance == pytest.approx(9.0, rel=0.05)
    assert stats.error_of_mean == pytest.approx(3.0 / np.sqrt(values.numel()), rel=0.3)
    assert abs(stats.mean.real - 2.0) < 4 * stats.error_of_mean
    assert stats.tau_corr < 0.2
    assert stats.r_hat == pytest.approx(1.0, abs=0.02)


def test_statistics_of_correlated_chains():
    """AR(1) with ρ: τ = Σ_{t≥1} ρ^t = ρ/(1−ρ); error of the mean √((1+2τ)/N)."""
    rho = 0.8
    chains = _ar1_chains(64, 1000, rho, seed=1)
    stats = statistics(chains)
    tau = rho / (1 - rho)
    assert stats.tau_corr == pytest.approx(tau, rel=0.15)
    assert stats.error_of_mean == pytest.approx(np.sqrt((1 + 2 * tau) / chains.numel()), rel=0.3)
    single = statistics(chains[0])  # one chain: error from τ
    assert single.error_of_mean == pytest.approx(np.sqrt((1 + 2 * tau) / 1000), rel=0.4)


def test_error_bars_cover_the_spread_of_repeated_means():
    means, errors = [], []
    for seed in range(40):
        stats = statistics(_ar1_chains(16, 200, 0.7, seed=100 + seed))
        means.append(stats.mean.real)
        errors.append(stats.error_of_mean)
    assert np.std(means) == pytest.approx(np.mean(errors), rel=0.3)


def test_importance_statistics_with_equal_weights_are_the_plain_ones():
    values = torch.as_tensor(_ar1_chains(16, 40, 0.5, seed=4))
    weights = torch.full(values.shape, 1.0 / values.numel(), dtype=torch.float64)
    plain, weighted = statistics(values), importance_statistics(values, weights)
    assert weighted.mean == pytest.approx(plain.mean, rel=1e-12)
    assert weighted.variance == pytest.approx(plain.variance, rel=1e-12)
    assert weighted.error_of_mean == pytest.approx(plain.error_of_mean, rel=1e-12)
    assert (weighted.tau_corr, weighted.r_hat) == (plain.tau_corr, plain.r_hat)


def test_importance_weights_are_normalised_and_do_not_overflow():
    log_r = torch.tensor([[1000.0, 999.0], [998.0, 1000.0]], dtype=torch.float64)
    weights = importance_weights(log_r)
    expected = torch.exp(log_r - 1000.0) / torch.exp(log_r - 1000.0).sum()
    torch.testing.assert_close(weights, expected, rtol=1e-14, atol=0)
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-15)


def _importance_draw(seed: int, n_chains: int = 64, n_per_chain: int = 8):
    """Samples of q ∝ p^(1/2) on 12 outcomes, for the target p ∝ 2^-k: values k, their
    normalised weights p/q, and the exact target mean and variance of k."""
    k = torch.arange(12, dtype=torch.float64)
    log_p = -k * math.log(2.0)
    q = torch.softmax(log_p / 2, dim=0)
    gen = torch.Generator().manual_seed(seed)
    picks = torch.multinomial(q, n_chains * n_per_chain, replacement=True, generator=gen)
    values = k[picks].reshape(n_chains, n_per_chain)
    weights = importance_weights((log_p / 2)[picks].reshape(n_chains, n_per_chain))
    p = torch.softmax(log_p, dim=0)
    mean = float((p * k).sum())
    return values, weights, mean, float((p * (k - mean) ** 2).sum())


@pytest.mark.parametrize("chains", [(64, 8), (1, 512)])
def test_importance_weighted_mean_and_error_bars_of_a_known_distribution(chains):
    """Samples of q, weighted by p/q: the mean and variance of p, and error bars that cover
    the spread of repeated estimates (the delta method of the self-normalised ratio), from
    chain sums or, for one chain, from the samples."""
    means, errors = [], []
    for seed in range(60):
        values, weights, exact_mean, exact_variance = _importance_draw(seed, *chains)
        stats = importance_statistics(values, weights)
        means.append(stats.mean.real)
        errors.append(stats.error_of_mean)
    assert abs(np.mean(means) - exact_mean) < 4 * np.std(means) / np.sqrt(len(means))
    assert np.std(means) == pytest.approx(np.mean(errors), rel=0.25)
    assert stats.variance == pytest.approx(exact_variance, rel=0.2)
    # the unweighted mean of the same samples is the mean of q, far outside those bars
    assert abs(float(values.mean()) - exact_mean) > 10 * stats.error_of_mean


def test_r_hat_flags_chains_that_disagree():
    gen = torch.Generator().manual_seed(2)
    values = torch.randn(8, 200, generator=gen, dtype=torch.float64)
    values[0] += 3.0  # one chain stuck elsewhere
    assert statistics(values).r_hat > 1.1


def test_complex_values_give_variance_of_the_modulus():
    gen = torch.Generator().manual_seed(3)
    values = torch.complex(
        torch.randn(8, 100, generator=gen, dtype=torch.float64),
        2 * torch.randn(8, 100, generator=gen, dtype=torch.float64),
    )
    stats = statistics(values)
    expected = ((values - values.mean()).abs() ** 2).mean()
    assert stats.variance == pytest.approx(float(expected))
    assert isinstance(stats.mean, complex)


def test_forward_passes_are_bounded_without_a_chunk_size(monkeypatch):
    # final measurements of symmetrized models once went through the network in one pass of
    # millions of rows; without a chunk size the batch per pass is bounded
    import vitqs.vmc.estimators as estimators

    monkeypatch.setattr(estimators, "DEFAULT_CHUNK_SIZE", 7)
    hamiltonian = Heisenberg(Lattice((6,)))
    model = ComplexRBM(6, seed=4)
    batches = []
    model.register_forward_hook(lambda module, args, out: batches.append(args[0].shape[0]))
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    bounded = local_energy(hamiltonian, model, x)
    assert max(batches) == 7
    whole = local_energy(hamiltonian, model, x, chunk_size=1000)
    torch.testing.assert_close(bounded, whole, rtol=1e-13, atol=1e-13)


def test_local_energies_are_chunked_by_connected_configurations_without_a_chunk_size(
    monkeypatch,
):
    # all 32,768 final samples of the J1-J2 6x6 at once grew the heap past 24 GB (freed
    # blocks kept between forward passes): without a chunk size the samples go in chunks
    # of at most DEFAULT_CONNECTED_PER_CHUNK connected configurations
    import vitqs.vmc.estimators as estimators

    hamiltonian = Heisenberg(Lattice((6,)))  # 7 connected configurations per sample
    monkeypatch.setattr(estimators, "DEFAULT_CONNECTED_PER_CHUNK", 3 * hamiltonian.max_conn)
    model = ComplexRBM(6, seed=4)
    chunks = []
    get_conn_padded = hamiltonian.get_conn_padded

    def counted(x):
        chunks.append(x.shape[0])
        return get_conn_padded(x)

    monkeypatch.setattr(hamiltonian, "get_conn_padded", counted)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)  # 20 states
    bounded = local_energy(hamiltonian, model, x)
    assert chunks == [3] * 6 + [2]
    chunks.clear()
    whole = local_energy(hamiltonian, model, x, chunk_size=len(x))
    assert chunks == [len(x)]
    torch.testing.assert_close(bounded, whole, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    ("low", "high", "n_sites"),
    [(-1, 1, 16), (0, 12, 12), (0, 99, 12)],  # spins, bosons, too wide for one int64 code
    ids=["spins", "bosons", "wide"],
)
def test_distinct_rows_rebuild_the_batch(low, high, n_sites):
    generator = torch.Generator().manual_seed(3)
    pool = torch.randint(low, high + 1, (9, n_sites), generator=generator).to(torch.float64)
    x = pool[torch.randint(0, 9, (200,), generator=generator)]  # (200, N), rows repeat
    rows = distinct_rows(x)
    assert rows.n_distinct == len(torch.unique(x, dim=0))
    assert torch.equal(rows.x[rows.inverse], x)
    assert torch.equal(rows.counts, torch.bincount(rows.inverse, minlength=rows.n_distinct))
    for k in range(rows.n_distinct):  # first: where each distinct row occurs first
        where = (x == rows.x[k]).all(dim=1).nonzero()[:, 0]
        assert int(rows.first[k]) == int(where[0])


@pytest.mark.parametrize("name", ["heisenberg_square_sz1", "bose_hubbard"])
def test_local_energies_of_repeated_configurations_equal_row_by_row_ones(name):
    # repeated rows are evaluated once and copied: each must equal its own evaluation
    hamiltonian = HAMILTONIANS[name]()
    model = ComplexRBM(hamiltonian.n_sites, seed=8, scale=0.3)
    states = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)[:5]
    x = states[torch.tensor([0, 3, 0, 1, 3, 3, 4, 0, 2, 1])].reshape(2, 5, -1)
    e_loc = local_energy(hamiltonian, model, x)
    assert e_loc.shape == (2, 5)
    rows = x.reshape(10, -1)
    one_by_one = torch.stack([local_energy(hamiltonian, model, row[None])[0] for row in rows])
    torch.testing.assert_close(e_loc.reshape(-1), one_by_one, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["heisenberg_chain", "bose_hubbard"])
def test_connected_configurations_shared_by_samples_are_evaluated_once(name):
    # every state of a small sector: each connected configuration is another state of the
    # sector, reached from several samples; the network sees each once, and the local
    # energies are those of the dense matrix
    hamiltonian = HAMILTONIANS[name]()
    model = ComplexRBM(hamiltonian.n_sites, seed=5, scale=0.3)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    rows = []
    hook = model.register_forward_hook(lambda module, args, out: rows.append(args[0]))
    e_loc = local_energy(hamiltonian, model, x)
    hook.remove()
    evaluated = torch.cat(rows)  # log ψ of the samples, then of their connected states
    assert len(torch.unique(evaluated[len(x) :], dim=0)) == len(evaluated) - len(x)
    x_conn, mels = hamiltonian.get_conn_padded(x)
    n_reached = int((mels[:, 1:] != 0).sum())
    assert len(evaluated) - len(x) < n_reached  # the duplicates were there to skip
    psi = torch.exp(evaluate_log_psi(model, x))
    H = torch.as_tensor(hamiltonian.to_sparse().toarray(), dtype=torch.complex128)
    torch.testing.assert_close(e_loc, (H @ psi) / psi, rtol=1e-11, atol=1e-11)


SYMMETRIZED = {
    # ψ averaged over the translations and projected on either spin-inversion sector
    "chain_8_translations_even": lambda: (Heisenberg(Lattice((8,)), J2=0.3), "translations", 1),
    "chain_8_translations_odd": lambda: (Heisenberg(Lattice((8,)), J2=0.3), "translations", -1),
    "square_4x4_translations_even": lambda: (
        Heisenberg(Lattice((4, 4)), J2=0.5),
        "translations",
        1,
    ),
    "chain_10_space_group_odd": lambda: (
        Heisenberg(Lattice((10,)), J2=0.2, sign_rule=True),
        "space_group",
        -1,
    ),
    "bose_hubbard_space_group": lambda: (
        BoseHubbard(Lattice((2, 3)), U=3.0, n_particles=6, n_max=3),
        "space_group",
        0,
    ),
    # at k = (π, π/2) (model.momentum): ψ(T_a x) = e^{ik·a} ψ(x); only the shifts of phase 1
    # are shared
    "square_4x4_momentum_odd": lambda: (
        Heisenberg(Lattice((4, 4)), J2=0.5),
        "translations",
        -1,
        [2, 1],
    ),
}


@pytest.mark.parametrize("name", list(SYMMETRIZED))
def test_connected_configurations_of_one_orbit_are_evaluated_once(name):
    # a ψ with ψ(g x) = ψ(x) and ψ(−x) = s ψ(x): one connected configuration of each orbit
    # goes through the network, the others take its value (times s per inversion); the local
    # energies stay those of the dense matrix, on every state of the sector
    hamiltonian, group, spin_flip, *momentum = SYMMETRIZED[name]()
    lattice = hamiltonian.lattice
    bare = ComplexRBM(hamiltonian.n_sites, seed=7, scale=0.3)
    model = symmetrize_translations(bare, lattice, momentum[0] if momentum else None)
    model = final_symmetrized(model, "none", lattice, spin_flip)
    if group == "space_group":
        model = symmetrize_space_group(model, lattice)
    symmetries = model_symmetries(model, hamiltonian)
    assert symmetries is not None and len(symmetries[0]) > 1 and symmetries[1] == spin_flip
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    psi = torch.exp(evaluate_log_psi(model, x))
    rows = []
    hook = model.register_forward_hook(lambda module, args, out: rows.append(args[0]))
    # one chunk of samples: orbits are shared within a chunk (12,870 states x 33 connected
    # configurations would be two chunks by default)
    e_loc = local_energy(hamiltonian, model, x, torch.log(psi), chunk_size=len(x))
    hook.remove()
    H = torch.as_tensor(hamiltonian.to_sparse().toarray(), dtype=torch.complex128)
    # an odd projection vanishes on states with −x = g x: no local energy there
    assert psi.abs().max() > 1e-3  # a sector the projection leaves states in
    nonzero = psi.abs() > 1e-8 * psi.abs().max()
    assert nonzero.sum() > len(psi) // 4
    torch.testing.assert_close(e_loc[nonzero], ((H @ psi) / psi)[nonzero], rtol=1e-10, atol=1e-10)
    # no two evaluated configurations lie on one orbit: their images never coincide
    evaluated = torch.cat(rows)
    group_perms = symmetries[0]
    images = evaluated[:, group_perms]  # (M, G, N)
    if spin_flip:
        images = torch.cat([images, -images], dim=1)
    first_image = {tuple(row.tolist()) for row in evaluated}
    for m, row_images in enumerate(images):
        others = {tuple(r.tolist()) for r in row_images} & first_image
        assert others == {tuple(evaluated[m].tolist())}, "two rows of one orbit evaluated"
    assert len(evaluated) < len(distinct_rows(x).x)  # fewer orbits than states reached


def test_a_model_with_no_symmetry_has_none_to_share():
    hamiltonian = Heisenberg(Lattice((6,)))
    assert model_symmetries(ComplexRBM(6, seed=1), hamiltonian) is None


@pytest.mark.parametrize("n_sites", [20, 60], ids=["float64 product", "int64 gather"])
@pytest.mark.parametrize("spin_flip", [0, 1])
def test_orbit_codes_are_the_smallest_image_codes(n_sites, spin_flip):
    # codes of every image g x (and −g x) written out with Python integers: the smallest one
    # per row and whether an inverted image gives it. 2^20 codes go through one float64
    # product, 2^60 (past float64's exact integers) through gathered int64 digits.
    generator = torch.Generator().manual_seed(3)
    group = torch.stack([torch.randperm(n_sites, generator=generator) for _ in range(7)])
    group[0] = torch.arange(n_sites)
    x = torch.where(torch.rand(50, n_sites, generator=generator) < 0.5, -1.0, 1.0)
    x[1] = -x[0]  # one orbit reached both ways
    codes, inverted = _orbit_codes(x, group, spin_flip)

    def code(row):
        return sum(int(s > 0) << n for n, s in enumerate(row))

    for m, row in enumerate(x.tolist()):
        images = [[row[i] for i in g] for g in group.tolist()]
        flipped = [[-s for s in image] for image in images] if spin_flip else []
        image_codes = [code(image) for image in images + flipped]
        smallest = min(image_codes)
        assert int(codes[m]) == smallest
        assert bool(inverted[m]) == (image_codes.index(smallest) >= len(images))
    assert (codes[0] == codes[1]) == bool(spin_flip)
