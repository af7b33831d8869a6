"""The V-score as published: ``N Var(E) / (E − E∞)²`` with ``E∞ = Tr H / dim`` (Wu et al.,
Science 386, 296 (2024)), against dense traces and netket's ``VScore`` on the same state."""

import numpy as np
import pytest
import torch

from vitqs import results
from vitqs.physics.hilbert import Bosons, placements
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.estimators import statistics


@pytest.mark.parametrize(
    "shape, pbc, U, mu, n_particles, n_max",
    [
        ((12,), True, 10.0, 0.0, 12, None),  # the benchmark chain, at a smaller N below
        ((5,), True, 3.3, 0.2, 5, None),
        ((6,), False, 2.0, 0.4, 5, 3),
        ((3, 3), True, 16.7, 0.0, 9, 3),
        ((2, 3), True, 5.0, -0.3, 8, 2),
        ((4,), True, 1.0, 0.0, 0, None),  # no particles: E∞ = 0
    ],
)
def test_bose_hubbard_e_inf_is_the_dense_trace_over_the_sector(
    shape, pbc, U, mu, n_particles, n_max
):
    if shape == (12,):  # 1.35M states: the dense trace of the L = 8 chain stands in
        shape, n_particles = (8,), 8
    ham = BoseHubbard(Lattice(shape, pbc), J=1.0, U=U, mu=mu, n_particles=n_particles, n_max=n_max)
    diagonal = ham.to_sparse().diagonal()
    assert ham.infinite_temperature_energy() == pytest.approx(diagonal.mean(), rel=1e-12, abs=1e-12)


def test_pair_occupation_closed_form_equals_the_count():
    # without a cutoff, 2 N(N−1)/(L(L+1)); the same by counting placements with n_max = N
    for n_sites, n_particles in [(1, 3), (2, 2), (5, 7), (12, 12), (30, 45)]:
        free = Bosons(n_sites, n_particles).mean_pair_occupation()
        rest = placements(n_sites - 1, n_particles, n_particles)
        counted = sum(k * (k - 1) * rest[n_particles - k] for k in range(n_particles + 1))
        total = placements(n_sites, n_particles, n_particles)[n_particles]
        assert free == pytest.approx(counted / total, rel=1e-14)


def test_heisenberg_e_inf_is_the_trace_over_the_whole_spin_space():
    # the published convention (varbench's Einf = 0): Tr H over all 2^N states, the sum of
    # the traces of every S^z sector; one sector's trace alone is not zero
    for lattice, J2 in [(Lattice((6,)), 0.0), (Lattice((3, 2)), 0.4), (Lattice((3, 3)), 0.5)]:
        n = lattice.n_sites
        sectors = [Heisenberg(lattice, 1.0, J2, total_sz=(n - 2 * k) / 2) for k in range(n + 1)]
        trace = sum(ham.to_sparse().diagonal().sum() for ham in sectors)
        assert trace == pytest.approx(0.0, abs=1e-12)
        assert sectors[0].infinite_temperature_energy() == 0.0
        zero_sz = Heisenberg(lattice, 1.0, J2, total_sz=0 if n % 2 == 0 else 0.5)
        assert abs(zero_sz.to_sparse().diagonal().mean()) > 0.01  # why the convention matters


def test_v_score_measures_from_e_inf():
    assert results.v_score(-4.0, 0.32, 8, 0.0) == pytest.approx(8 * 0.32 / 16)
    assert results.v_score(-4.0, 0.32, 8, 6.0) == pytest.approx(8 * 0.32 / 100)
    assert np.isnan(results.v_score(6.0, 0.32, 8, 6.0))
    assert np.isnan(results.v_score(-4.0, 0.32, 8, float("nan")))


def test_relative_error_is_signed():
    assert results.relative_error(-10.01, -10.0) == pytest.approx(-1e-3)
    assert results.relative_error(-9.99, -10.0) == pytest.approx(1e-3)
    assert results.relative_error(1.01, 1.0) == pytest.approx(1e-2)


# ---- against netket's VScore on the same state --------------------------------------------------

nk = pytest.importorskip("netket")


def _our_v_score(ham, psi: np.ndarray) -> float:
    """Our estimator path on a full sum: local energies (Hψ)(x)/ψ(x) weighted by |ψ|²."""
    e_loc = (ham.to_sparse() @ psi) / psi
    weights = np.abs(psi) ** 2 / np.sum(np.abs(psi) ** 2)
    stats = statistics(torch.as_tensor(e_loc), torch.as_tensor(weights))
    return results.v_score(
        stats.mean.real, stats.variance, ham.n_sites, ham.infinite_temperature_energy()
    )


def _netket_v_score(operator, hilbert, psi_netket_order: np.ndarray, e_inf: float) -> float:
    model = nk.models.LogStateVector(hilbert)
    state = nk.vqs.FullSumState(hilbert, model)
    state.parameters = {"logstate": np.log(psi_netket_order.astype(np.complex128))}
    return float(state.expect(nk.observable.VScore(operator, trace_diagonal=e_inf)).mean)


def _random_state(rng, n: int) -> np.ndarray:
    # a state near nothing in particular: modulus and phase both vary
    return np.exp(0.3 * rng.normal(size=n) + 1j * rng.uniform(0, 2 * np.pi, size=n))


@pytest.mark.netket
def test_v_score_equals_netkets_for_bose_hubbard(rng):
    shape, U, mu, n_particles, n_max = (6,), 4.0, 0.3, 6, 3
    ham = BoseHubbard(Lattice(shape), J=1.0, U=U, mu=mu, n_particles=n_particles, n_max=n_max)
    graph = nk.graph.Chain(shape[0], pbc=True)
    hilbert = nk.hilbert.Fock(n_max=n_max, N=graph.n_nodes, n_particles=n_particles)
    operator = nk.operator.BoseHubbard(hilbert, graph, U=U, J=1.0, mu=mu)
    # netket's sites of a chain are ours; its basis order is mapped onto ours
    order = ham.hilbert.state_index(np.asarray(hilbert.all_states()))
    psi = _random_state(rng, ham.hilbert.dimension)
    e_inf = float(np.real(operator.to_dense().trace())) / hilbert.n_states  # netket's own trace
    theirs = _netket_v_score(operator, hilbert, psi[order], e_inf)
    assert e_inf == pytest.approx(ham.infinite_temperature_energy(), rel=1e-12)
    assert _our_v_score(ham, psi) == pytest.approx(theirs, rel=1e-9)
    # the old N Var/E² differs by (E − E∞)²/E²: the test tells the two apart
    e_loc = (ham.to_sparse() @ psi) / psi
    weights = np.abs(psi) ** 2 / np.sum(np.abs(psi) ** 2)
    energy = float(np.real(np.sum(weights * e_loc)))
    assert abs(1 - (energy - e_inf) ** 2 / energy**2) > 0.1


@pytest.mark.netket
def test_v_score_equals_netkets_for_heisenberg(rng):
    n = 8
    ham = Heisenberg(Lattice((n,)), J1=1.0, J2=0.3)
    graph = nk.graph.Chain(n, pbc=True, max_neighbor_order=2)
    hilbert = nk.hilbert.Spin(0.5, N=n, total_sz=0)
    operator = nk.operator.Heisenberg(hilbert, graph, J=[1.0, 0.3], sign_rule=[False, False])
    # E∞ over the whole spin space (netket's operator on the unconstrained space)
    whole = nk.hilbert.Spin(0.5, N=n)
    dense = nk.operator.Heisenberg(whole, graph, J=[1.0, 0.3], sign_rule=[False, False])
    e_inf = float(np.real(dense.to_dense().trace())) / whole.n_states
    assert e_inf == pytest.approx(0.0, abs=1e-12)
    order = ham.hilbert.state_index(np.asarray(hilbert.all_states()))
    psi = _random_state(rng, ham.hilbert.dimension)
    theirs = _netket_v_score(operator, hilbert, psi[order], 4 * e_inf)  # Pauli units: ×4
    assert _our_v_score(ham, psi) == pytest.approx(theirs, rel=1e-9)  # a ratio: units cancel
