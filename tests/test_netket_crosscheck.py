"""Our Hamiltonians and ED against netket's, the factor 4 of the Pauli convention written out."""

import numpy as np
import pytest

from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg

nk = pytest.importorskip("netket")
pytestmark = pytest.mark.netket

PAULI_TO_SPIN = 0.25  # netket's Heisenberg uses σ·σ = 4 S·S


def _states_in_our_site_order(graph, states, shape):
    """Returns netket configurations with sites renumbered to ours, x + Lx * y."""
    positions = np.rint(np.asarray(graph.positions)).astype(int).reshape(graph.n_nodes, -1)
    ours = positions[:, 0] + (shape[0] * positions[:, 1] if len(shape) == 2 else 0)
    reordered = np.empty_like(states)
    reordered[:, ours] = states
    return reordered


def _netket_heisenberg(shape, pbc, J1, J2):
    graph = nk.graph.Grid(list(shape), pbc=pbc, max_neighbor_order=2 if J2 else 1)
    hilbert = nk.hilbert.Spin(0.5, N=graph.n_nodes, total_sz=0)
    couplings = [J1, J2] if J2 else J1
    signs = [False, False] if J2 else False
    return graph, nk.operator.Heisenberg(hilbert, graph, J=couplings, sign_rule=signs)


@pytest.mark.parametrize(
    "shape, pbc, J1, J2",
    [
        ((10,), True, 1.0, 0.0),
        ((4, 4), True, 1.0, 0.0),
        ((3, 4), False, 1.0, 0.0),
        ((12,), True, 1.0, 0.3),
        ((4, 4), True, 1.0, 0.5),
        ((3, 4), True, 0.8, 0.6),
    ],
)
def test_heisenberg_ground_energy_matches_netket(shape, pbc, J1, J2):
    ours = exact.ground_state(Heisenberg(Lattice(shape, pbc), J1, J2)).energy
    _, operator = _netket_heisenberg(shape, pbc, J1, J2)
    theirs = PAULI_TO_SPIN * nk.exact.lanczos_ed(operator)[0]
    assert ours == pytest.approx(theirs, abs=1e-8)


def test_heisenberg_matrix_matches_netket_element_by_element():
    ham = Heisenberg(Lattice((3, 2)), J1=1.0, J2=0.4)
    graph, theirs = _netket_heisenberg((3, 2), True, 1.0, 0.4)
    states = _states_in_our_site_order(graph, np.asarray(theirs.hilbert.all_states()), (3, 2))
    order = ham.hilbert.state_index(states)  # netket's basis -> ours
    ours = ham.to_dense()[np.ix_(order, order)]
    np.testing.assert_allclose(ours, PAULI_TO_SPIN * theirs.to_dense(), atol=1e-12)


@pytest.mark.parametrize(
    "shape, pbc, U, mu, n_particles, n_max",
    [
        ((8,), True, 3.3, 0.0, 8, None),
        ((6,), False, 2.0, 0.4, 5, 3),
        ((3, 3), True, 16.7, 0.0, 6, 3),  # the 3x3 Mott system, fewer bosons: fast in netket too
        ((2, 3), True, 5.0, -0.3, 8, 2),
    ],
)
def test_bose_hubbard_ground_energy_matches_netket(shape, pbc, U, mu, n_particles, n_max):
    ham = BoseHubbard(Lattice(shape, pbc), J=1.0, U=U, mu=mu, n_particles=n_particles, n_max=n_max)
    graph = nk.graph.Grid(list(shape), pbc=pbc)
    hilbert = nk.hilbert.Fock(n_max=ham.n_max, N=graph.n_nodes, n_particles=n_particles)
    theirs = nk.operator.BoseHubbard(hilbert, graph, U=U, J=1.0, mu=mu)
    ours = exact.ground_state(ham).energy
    assert ours == pytest.approx(nk.exact.lanczos_ed(theirs)[0], abs=1e-8)
    # the whole matrix, not only its lowest eigenvalue
    if ham.hilbert.dimension < 3000:
        states = _states_in_our_site_order(graph, np.asarray(hilbert.all_states()), shape)
        order = ham.hilbert.state_index(states)
        ours_dense = ham.to_dense()[np.ix_(order, order)]
        np.testing.assert_allclose(ours_dense, theirs.to_dense(), atol=1e-12)
