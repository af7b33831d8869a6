"""Metropolis and exact samplers: stationary distribution, conservation laws, checkpoints."""

import math

import numpy as np
import pytest
import torch
from helpers import ComplexRBM, model_vector
from scipy.stats import chisquare

from vitqs.models.chains import ChainNetwork
from vitqs.models.symmetrize import Symmetrized
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.estimators import importance_weights, sample_statistics
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.sampler import MetropolisSampler
from vitqs.vmc.samples import Samples

# A histogram is rejected below this p-value; seeds are fixed, so the test is deterministic.
P_VALUE_THRESHOLD = 1e-3

# (Hamiltonian, rule, RBM weight scale): scales keep |ψ|² spread out (max ≈ 0.1-0.2), so
# that 30 thermalisation sweeps mix the chains; occupations up to 4 need a smaller scale.
CASES = {
    "exchange": (lambda: Heisenberg(Lattice((6,)), J2=0.5), "exchange", 0.25),
    "exchange_open": (lambda: Heisenberg(Lattice((6,), pbc=False)), "exchange", 0.25),
    "hop": (lambda: BoseHubbard(Lattice((4,)), n_particles=4), "hop", 0.15),
    "hop_cutoff": (lambda: BoseHubbard(Lattice((4,)), n_particles=4, n_max=2), "hop", 0.15),
}


@pytest.mark.slow
@pytest.mark.parametrize("sector_table", [False, True])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.usefixtures("single_thread")
def test_metropolis_histogram_matches_exact_distribution(case, sector_table):
    """Independent chains (one sample each, after thermalisation) follow |ψ|²/Σ|ψ|², with a
    forward pass per proposal step and walking the sector's table."""
    make_hamiltonian, rule, scale = CASES[case]
    hamiltonian = make_hamiltonian()
    hilbert = hamiltonian.hilbert
    model = ComplexRBM(hilbert.n_sites, n_hidden=4, scale=scale, seed=3)
    n_chains = 10000
    sampler = MetropolisSampler(
        hamiltonian, n_samples=n_chains, n_chains=n_chains, n_discard=30, seed=7,
        sector_table=sector_table,
    )  # fmt: skip
    samples = sampler.sample(model)
    counts = np.bincount(hilbert.state_index(samples.x[:, 0]), minlength=hilbert.dimension)
    probabilities = np.abs(model_vector(model, hilbert)) ** 2
    expected = n_chains * probabilities / probabilities.sum()
    assert chisquare(counts, expected).pvalue > P_VALUE_THRESHOLD
    assert 0.0 < samples.acceptance < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("case", ["exchange", "hop"])
@pytest.mark.usefixtures("single_thread")
def test_machine_pow_chains_sample_psi_to_that_power_and_carry_the_rest_as_weights(case):
    """With machine_pow p the histogram follows |ψ|^p/Σ|ψ|^p (and fails the |ψ|² test),
    and each sample's log importance is (2 − p) Re log ψ."""
    make_hamiltonian, rule, scale = CASES[case]
    hamiltonian = make_hamiltonian()
    hilbert = hamiltonian.hilbert
    model = ComplexRBM(hilbert.n_sites, n_hidden=4, scale=2 * scale, seed=3)
    n_chains = 10000
    sampler = MetropolisSampler(
        hamiltonian, n_samples=n_chains, n_chains=n_chains, n_discard=30, seed=7,
        machine_pow=1.0,
    )  # fmt: skip
    samples = sampler.sample(model)
    counts = np.bincount(hilbert.state_index(samples.x[:, 0]), minlength=hilbert.dimension)
    modulus = np.abs(model_vector(model, hilbert))
    assert chisquare(counts, n_chains * modulus / modulus.sum()).pvalue > P_VALUE_THRESHOLD
    squared = n_chains * modulus**2 / (modulus**2).sum()
    assert chisquare(counts, squared).pvalue < 1e-12
    torch.testing.assert_close(samples.log_importance, samples.log_psi.real, rtol=0, atol=0)


def test_of_psi_squared_is_a_plain_sampler_on_the_same_chains():
    hamiltonian = BoseHubbard(Lattice((5,)), n_particles=5)
    model = ComplexRBM(5, seed=2)
    tempered = MetropolisSampler(hamiltonian, n_samples=16, n_chains=16, machine_pow=1.5)
    assert tempered.sample(model).log_importance is not None
    plain = tempered.of_psi_squared()
    assert plain.machine_pow == 2.0 and tempered.machine_pow == 1.5
    torch.testing.assert_close(plain.state_dict()["chains"], tempered.state_dict()["chains"])
    assert plain.sample(model).log_importance is None
    assert plain.of_psi_squared() is plain


@pytest.mark.parametrize("case", list(CASES))
def test_chains_stay_in_the_sector(case):
    make_hamiltonian, rule, _ = CASES[case]
    hamiltonian = make_hamiltonian()
    model = ComplexRBM(hamiltonian.n_sites, seed=1)
    sampler = MetropolisSampler(hamiltonian, n_samples=64, n_chains=16, seed=0)
    assert sampler.rule.name == rule
    samples = sampler.sample(model)
    assert samples.x.shape == (16, 4, hamiltonian.n_sites)
    hamiltonian.hilbert.state_index(samples.x.reshape(-1, hamiltonian.n_sites))  # raises if not
    with torch.no_grad():
        torch.testing.assert_close(
            samples.log_psi, model(samples.x.reshape(-1, hamiltonian.n_sites)).reshape(16, 4)
        )


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
def test_chains_started_on_one_configuration_sample_the_exact_distribution():
    """Chains that share their configuration evaluate each distinct proposal once; the
    histogram after thermalisation is still |ψ|²/Σ|ψ|²."""
    hamiltonian = BoseHubbard(Lattice((4,)), n_particles=4)
    hilbert = hamiltonian.hilbert
    model = ComplexRBM(4, n_hidden=4, scale=0.15, seed=3)
    n_chains = 10000
    sampler = MetropolisSampler(
        hamiltonian, n_samples=n_chains, n_chains=n_chains, n_discard=30, sector_table=False
    )  # the table walk evaluates no proposal
    filling = torch.ones((n_chains, 4), dtype=torch.float64)  # every chain on |1111⟩
    sampler.load_state_dict(
        {"chains": filling, "generator": torch.Generator().manual_seed(7).get_state()}
    )
    samples = sampler.sample(model)
    counts = np.bincount(hilbert.state_index(samples.x[:, 0]), minlength=hilbert.dimension)
    probabilities = np.abs(model_vector(model, hilbert)) ** 2
    expected = n_chains * probabilities / probabilities.sum()
    assert chisquare(counts, expected).pvalue > P_VALUE_THRESHOLD


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
def test_float32_chains_of_a_float64_model_sample_the_exact_distribution():
    """Chains run on a float32 copy of the network; the histogram is still |ψ|²/Σ|ψ|² of
    the float64 model, and the samples' log ψ are the float64 model's."""
    hamiltonian = BoseHubbard(Lattice((4,)), n_particles=4)
    hilbert = hamiltonian.hilbert
    model = ComplexRBM(4, n_hidden=4, scale=0.15, seed=3)
    n_chains = 10000
    sampler = MetropolisSampler(
        hamiltonian, n_samples=n_chains, n_chains=n_chains, n_discard=30, seed=7,
        chains=ChainNetwork(torch.float32),
    )  # fmt: skip
    samples = sampler.sample(model)
    counts = np.bincount(hilbert.state_index(samples.x[:, 0]), minlength=hilbert.dimension)
    probabilities = np.abs(model_vector(model, hilbert)) ** 2
    expected = n_chains * probabilities / probabilities.sum()
    assert chisquare(counts, expected).pvalue > P_VALUE_THRESHOLD
    with torch.no_grad():
        exact = model(samples.x[:, 0])
    torch.testing.assert_close(samples.log_psi[:, 0], exact, rtol=0, atol=1e-12)


def test_float32_chain_network_follows_the_model_parameters():
    hamiltonian = BoseHubbard(Lattice((5,)), n_particles=5)
    model = ComplexRBM(5, seed=2, scale=0.3)
    chains = ChainNetwork(torch.float32)
    sampler = MetropolisSampler(hamiltonian, n_samples=32, n_chains=16, seed=1, chains=chains)
    samples = sampler.sample(model)
    assert samples.log_psi.dtype == torch.complex128
    x = samples.x.reshape(-1, 5)
    with torch.no_grad():
        model.w_re.add_(0.5)  # an optimiser step
        network = chains.evaluating(model)
        assert next(network.parameters()).dtype == torch.float32
        torch.testing.assert_close(network(x).to(torch.complex128), model(x), rtol=1e-5, atol=1e-5)
        again = sampler.sample(model)
        torch.testing.assert_close(
            again.log_psi.reshape(-1), model(again.x.reshape(-1, 5)), rtol=0, atol=1e-12
        )


@pytest.mark.parametrize("n_chains", [16, 48])  # below and above sampler.COMPACT_FROM
def test_distinct_proposals_get_the_log_psi_of_every_proposal(n_chains):
    # hop proposals on a 5-site chain holding 5 bosons, half of them the same filling; below
    # 32 chains every proposal is evaluated, from 32 on the valid ones: the same log ψ
    model = ComplexRBM(5, seed=2, scale=0.3)
    x = torch.tensor([[1, 1, 1, 1, 1], [2, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 5, 0, 0]] * 12)
    order = torch.randperm(n_chains, generator=torch.Generator().manual_seed(1))
    x_new = x.to(torch.float64)[order]
    valid = torch.arange(n_chains) % 3 != 0
    log_psi = torch.full((n_chains,), 0.5 + 0.25j, dtype=torch.complex128)
    plain = MetropolisSampler._log_psi_of_valid(model, x_new, valid, log_psi, distinct=False)
    distinct = MetropolisSampler._log_psi_of_valid(model, x_new, valid, log_psi, distinct=True)
    torch.testing.assert_close(distinct, plain, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(distinct[valid], model(x_new[valid]).to(torch.complex128))
    assert torch.equal(distinct[~valid], log_psi[~valid])


@pytest.mark.parametrize("dtype", [None, torch.float32])
def test_state_dict_resumes_the_same_chains(dtype):
    hamiltonian = Heisenberg(Lattice((6,)))
    model = ComplexRBM(6, seed=2)
    sampler = MetropolisSampler(
        hamiltonian, n_samples=32, n_chains=8, seed=5, chains=ChainNetwork(dtype)
    )
    sampler.sample(model)
    state = sampler.state_dict()
    first = sampler.sample(model).x
    model = ComplexRBM(6, seed=2)  # rebuilt, as on a resume
    restored = MetropolisSampler(
        hamiltonian, n_samples=32, n_chains=8, seed=99, chains=ChainNetwork(dtype)
    )
    restored.load_state_dict(state)
    assert torch.equal(restored.sample(model).x, first)


def test_chains_persist_between_calls():
    hamiltonian = Heisenberg(Lattice((6,)))
    model = ComplexRBM(6, seed=2)
    sampler = MetropolisSampler(hamiltonian, n_samples=8, n_chains=8, n_discard=0, seed=5)
    before = sampler.state_dict()  # empty until the first call
    assert before == {}
    sampler.sample(model)
    chains = sampler.state_dict()["chains"]
    again = sampler.sample(model, n_discard=0)
    assert not torch.equal(again.x[:, 0], chains) or again.acceptance == 0.0


def test_exact_sampler_weights_are_normalised_born_probabilities():
    hamiltonian = BoseHubbard(Lattice((4,)), n_particles=3)
    model = ComplexRBM(4, seed=4)
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    probabilities = np.abs(model_vector(model, hamiltonian.hilbert)) ** 2
    np.testing.assert_allclose(samples.weights[0].numpy(), probabilities / probabilities.sum())
    assert samples.x.shape == (1, hamiltonian.hilbert.dimension, 4)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"n_samples": 10, "n_chains": 4}, "n_samples"),
        ({"n_samples": 8, "n_chains": 0}, "n_chains"),
        ({"n_samples": 8, "n_chains": 4, "n_discard": -1}, "n_discard"),
        ({"n_samples": 8, "n_chains": 4, "machine_pow": 0.0}, "machine_pow"),
        ({"n_samples": 8, "n_chains": 4, "machine_pow": float("nan")}, "machine_pow"),
    ],
)
def test_bad_settings_raise_with_the_config_key(kwargs, key):
    with pytest.raises(ValueError, match=f"sampler.{key}"):
        MetropolisSampler(Heisenberg(Lattice((4,))), **kwargs)
    with pytest.raises(ValueError, match="sampler.dtype"):
        ChainNetwork(torch.float16)


def test_a_sweep_of_no_proposals_is_refused():
    # not a config key (a chain makes one proposal a site): an argument of the Python API
    with pytest.raises(ValueError, match="sweep_size=0 must be a positive integer"):
        MetropolisSampler(Heisenberg(Lattice((4,))), n_samples=8, n_chains=4, sweep_size=0)


def test_the_hamiltonian_chooses_the_move():
    """Spins exchange along every bond the Hamiltonian couples (J2's too), bosons hop both
    ways along the nearest-neighbour bonds."""
    chain = Lattice((6,))
    assert len(MetropolisSampler(Heisenberg(chain), n_samples=4, n_chains=4).rule.moves) == 6
    frustrated = MetropolisSampler(Heisenberg(chain, J2=0.5), n_samples=4, n_chains=4).rule
    assert (frustrated.name, frustrated.n_moves) == ("exchange", 12)
    hop = MetropolisSampler(BoseHubbard(chain, n_max=3), n_samples=4, n_chains=4).rule
    assert (hop.name, hop.n_moves, hop.n_max) == ("hop", 12, 3)
    assert {tuple(m) for m in hop.moves} == {tuple(m[::-1]) for m in hop.moves}


@pytest.mark.usefixtures("single_thread")
def test_started_chains_run_on_from_the_given_configurations_with_the_sampler_s_seed():
    hamiltonian = Heisenberg(Lattice((6,)), J1=1.0)
    model = ComplexRBM(6, n_hidden=4, scale=0.3, seed=2)
    given = torch.as_tensor(hamiltonian.hilbert.all_states()[[0, 5, 9]], dtype=torch.float64)
    started = MetropolisSampler(hamiltonian, n_samples=14, n_chains=7, n_discard=1, seed=4)
    started.start_chains(given)
    restored = MetropolisSampler(hamiltonian, n_samples=14, n_chains=7, n_discard=1, seed=4)
    cycled = given[[0, 1, 2, 0, 1, 2, 0]]
    restored.load_state_dict(
        {"chains": cycled, "generator": torch.Generator().manual_seed(4).get_state()}
    )
    torch.testing.assert_close(started.sample(model).x, restored.sample(model).x, rtol=0, atol=0)

    magnetised = torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, -1.0]])  # S^z = 1, not 0
    for wrong in (magnetised, given[:, :5]):
        with pytest.raises(ValueError, match="not states of this sector"):
            started.start_chains(wrong)


def test_bare_chains_weighted_to_the_symmetrized_distribution():
    """Chains on the bare network of a translation average, each sample weighted by
    |ψ_sym|²/|φ|²: the weighted histogram is |ψ_sym|²/Σ|ψ_sym|², and the samples' log ψ
    are the average's."""
    hamiltonian = Heisenberg(Lattice((6,)))
    hilbert = hamiltonian.hilbert
    # a bare network that is nowhere near zero where the average is not: the weights stay
    # bounded (a bare network that vanishes on part of the average's support is the case
    # bare chains cannot handle, see docs/config.md)
    bare = ComplexRBM(6, n_hidden=6, scale=0.15, seed=5)
    model = Symmetrized(bare, Lattice((6,)).translations[:3], spin_flip=1)
    n_chains = 8000
    sampler = MetropolisSampler(
        hamiltonian, n_samples=n_chains, n_chains=n_chains, n_discard=30, seed=11,
        chains=ChainNetwork(bare=True),
    )  # fmt: skip
    samples = sampler.sample(model)
    x = samples.x[:, 0]
    with torch.no_grad():
        torch.testing.assert_close(samples.log_psi[:, 0], model(x), rtol=0, atol=1e-12)
        expected_log_w = 2 * model(x).real - 2 * bare(x).real
    torch.testing.assert_close(samples.log_importance[:, 0], expected_log_w, rtol=0, atol=1e-12)
    # the chains drew |φ|²: their histogram is the bare network's
    counts = np.bincount(hilbert.state_index(x), minlength=hilbert.dimension)
    bare_p = np.abs(model_vector(bare, hilbert)) ** 2
    assert chisquare(counts, n_chains * bare_p / bare_p.sum()).pvalue > P_VALUE_THRESHOLD
    # weighted, they give the averaged network's |ψ_sym|²: compare expectation values of
    # the sector's indicator functions, within a few standard errors
    w = importance_weights(samples.log_importance).reshape(-1).numpy()
    sym_p = np.abs(model_vector(model, hilbert)) ** 2
    sym_p /= sym_p.sum()
    index = hilbert.state_index(x)
    weighted = np.bincount(index, weights=w, minlength=hilbert.dimension)
    # standard error of each weighted frequency: sqrt(Σ w² (1[x = s] − p_s)²)
    spread = np.sqrt(
        np.bincount(index, weights=w**2, minlength=hilbert.dimension) * (1 - sym_p) ** 2
        + (np.sum(w**2) - np.bincount(index, weights=w**2, minlength=hilbert.dimension)) * sym_p**2
    )
    assert np.all(np.abs(weighted - sym_p) <= 5 * spread + 1e-12)
    assert np.abs(weighted - sym_p).sum() > 0  # a Monte Carlo estimate, not the exact sum


def test_bare_chains_measure_the_symmetrized_energy_within_error_bars():
    hamiltonian = Heisenberg(Lattice((6,)))
    bare = ComplexRBM(6, n_hidden=6, scale=0.15, seed=2)
    model = Symmetrized(bare, Lattice((6,)).translations, spin_flip=1)
    sampler = MetropolisSampler(
        hamiltonian,
        n_samples=4096,
        n_chains=256,
        n_discard=20,
        seed=3,
        chains=ChainNetwork(bare=True),
    )
    samples = sampler.sample(model)
    e_loc = sampler.local_energy(hamiltonian, model, samples)
    stats = sample_statistics(e_loc, samples)
    vector = model_vector(model, hamiltonian.hilbert)
    exact = np.vdot(vector, hamiltonian.to_sparse() @ vector).real / np.vdot(vector, vector).real
    assert abs(stats.mean.real - exact) < 4 * stats.error_of_mean
    assert sampler.measuring().chains.bare is False  # the final energy samples |ψ|² itself


def test_a_bare_chain_sample_where_psi_vanishes_weighs_nothing():
    # chains on the bare network may stand on a state the projection cancels exactly
    # (ψ_sym = 0, log ψ = −∞: the kagome 2x3 at k = (π, 0), odd under its reflection, has 10
    # such states of 48,620): its weight is 0, its local energy 0, its row left out of S
    from vitqs.vmc.driver import _distinct_samples, _usable

    hamiltonian = Heisenberg(Lattice((6,)))
    bare = ComplexRBM(6, n_hidden=6, scale=0.15, seed=5)
    model = Symmetrized(bare, Lattice((6,)).translations[:3], spin_flip=1)
    sampler = MetropolisSampler(
        hamiltonian, n_samples=64, n_chains=8, seed=1, chains=ChainNetwork(bare=True)
    )
    samples = sampler.sample(model)
    before = sampler.local_energy(hamiltonian, model, samples)
    stats_before = sample_statistics(before, samples)
    vanishing = torch.zeros_like(samples.log_importance, dtype=torch.bool)
    vanishing[2, 3] = True
    log_psi = torch.where(vanishing, torch.full_like(samples.log_psi, -math.inf), samples.log_psi)
    log_importance = torch.where(vanishing, -math.inf, samples.log_importance)
    broken = Samples(samples.x, log_psi, None, samples.acceptance, log_importance)
    assert _usable(broken) and not _usable(Samples(samples.x, log_psi, None, 1.0, None))
    e_loc = sampler.local_energy(hamiltonian, model, broken)
    assert torch.isfinite(e_loc).all() and e_loc[2, 3] == 0
    torch.testing.assert_close(e_loc[~vanishing], before[~vanishing], rtol=0, atol=0)
    # the estimate is the weighted mean over the other samples
    stats = sample_statistics(e_loc, broken)
    weights = torch.exp(log_importance - log_importance.max())
    by_hand = (weights * e_loc).sum() / weights.sum()
    assert abs(stats.mean - complex(by_hand)) < 1e-12 and math.isfinite(stats.error_of_mean)
    assert stats.mean != stats_before.mean
    x, _, w = _distinct_samples(
        broken.x.reshape(-1, 6), e_loc.reshape(-1), importance_weights(log_importance).reshape(-1)
    )
    assert (w > 0).all() and abs(float(w.sum()) - 1) < 1e-12
    flat = broken.x.reshape(-1, 6)
    alone = int((flat == broken.x[2, 3]).all(dim=1).sum()) == 1  # no other sample there
    assert len(x) == len(torch.unique(flat, dim=0)) - alone
