"""scripts/netket_peer.py: netket's Hamiltonians are ours (the factor 4 written out), and the
netket ViT run returns finite numbers under the documented keys.

The spectra are compared in full on small sectors, which checks the conventions that matter:
S = σ/2 (netket's Heisenberg energies are 4× ours), the J1/J2 edge colors, the Marshall sign,
the sign of the boson hopping J (visible on an odd ring, where it cannot be gauged away) and
of the chemical potential μ.
"""

import numpy as np
import pytest

nk = pytest.importorskip("netket")
jax = pytest.importorskip("jax")

from vitqs.physics.exact import ground_state  # noqa: E402
from vitqs.physics.hilbert import Bosons  # noqa: E402
from vitqs.physics.lattice import Lattice  # noqa: E402
from vitqs.physics.operators import BoseHubbard, Heisenberg  # noqa: E402

pytestmark = pytest.mark.netket

SMALL_SECTOR = 200  # compare whole spectra up to this dimension


@pytest.fixture(scope="module")
def peer():
    import netket_peer as module  # scripts/ is on the tests' path (pyproject.toml)

    reason = module.netket_available()
    if reason is not None:
        pytest.skip(reason)
    return module


def _system(shape, pbc=True, **hamiltonian):
    return {"lattice": {"shape": list(shape), "pbc": pbc}, "hamiltonian": hamiltonian}


def _ours(system):
    ham = dict(system["hamiltonian"])
    kind = ham.pop("kind")
    lattice = Lattice(tuple(system["lattice"]["shape"]), pbc=system["lattice"]["pbc"])
    return (Heisenberg if kind == "heisenberg" else BoseHubbard)(lattice, **ham)


SYSTEMS = {
    "chain8": _system([8], kind="heisenberg", J1=1.0),
    # open chain: bipartite, so the Marshall sign applies; Sz = 1 checks total_sz's units
    "chain8_obc_j2_sign_rule_sz1": _system(
        [8], pbc=False, kind="heisenberg", J1=1.0, J2=0.3, sign_rule=True, total_sz=1
    ),
    "j1j2_3x4": _system([3, 4], kind="heisenberg", J1=1.0, J2=0.5),
    "bh_chain6": _system([6], kind="bose_hubbard", J=1.0, U=3.3, n_particles=6),
    # odd ring: the sign of J is not a gauge choice there; n_max < N truncates
    "bh_ring5_nmax3": _system([5], kind="bose_hubbard", J=0.7, U=3.3, n_particles=5, n_max=3),
}


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_netket_energies_times_energy_factor_are_ours(peer, name):
    system = SYSTEMS[name]
    hilbert, hamiltonian, graph, n_sites, factor = peer.build_system(system)
    ours = _ours(system)
    expected_factor = 0.25 if system["hamiltonian"]["kind"] == "heisenberg" else 1.0
    assert factor == expected_factor  # netket's Heisenberg uses σ = 2S: energies 4× ours
    assert n_sites == ours.n_sites and hilbert.n_states == ours.hilbert.dimension
    # numba operators compile once per class, jax ones once per system: keep the test fast
    hamiltonian = hamiltonian.to_numba_operator()
    e_netket = nk.exact.lanczos_ed(hamiltonian)[0] * factor
    assert e_netket == pytest.approx(ground_state(ours).energy, abs=1e-9)
    if hilbert.n_states <= SMALL_SECTOR:  # whole spectrum, where dense eigvalsh is cheap
        netket_spectrum = np.linalg.eigvalsh(hamiltonian.to_dense()) * factor
        np.testing.assert_allclose(netket_spectrum, np.linalg.eigvalsh(ours.to_dense()), atol=1e-10)


@pytest.mark.parametrize("shape", [(8,), (3, 4), (4, 4)])
def test_graph_colors_are_our_bond_orders_in_our_site_order(peer, shape):
    graph = peer.make_graph(_system(shape), max_neighbor_order=2)
    lattice = Lattice(shape)
    for color, order in ((0, 1), (1, 2)):
        edges = {tuple(sorted(e)) for e in graph.edges(filter_color=color)}
        assert edges == {tuple(b) for b in lattice.bonds(order).tolist()}
    # site x + Lx * y sits at netket position (y, x) (the last coordinate runs fastest)
    if len(shape) == 2:
        x, y = np.arange(lattice.n_sites) % shape[0], np.arange(lattice.n_sites) // shape[0]
        np.testing.assert_array_equal(graph.positions, np.stack([y, x], axis=1))


def test_translation_invariant_attention_index_is_circulant(peer):
    index = peer.relative_patch_index((3, 2))  # patch p = x + 3 y
    assert index.shape == (6, 6)
    assert (np.diag(index) == 0).all()
    assert index[0, 4] == 4 and index[4, 0] == (-1) % 3 + 3 * ((-1) % 2)  # r = (1, 1) and −r


def test_run_netket_vit_tiny_chain_returns_finite_numbers_above_the_ground_energy(peer):
    system = _system([8], kind="heisenberg", J1=1.0)
    exact = float(np.linalg.eigvalsh(_ours(system).to_dense())[0])
    result = peer.run_netket_vit(
        system,
        d_model=8,
        heads=2,
        layers=1,
        patch_size=2,
        n_samples=128,
        n_chains=16,
        n_discard_per_chain=2,
        n_iter=3,
        final_n_samples=128,  # the sampler's chain length, compiled once
        exact_energy=exact,
    )
    keys = {
        "n_params", "n_iter_done", "seconds_compile", "seconds_per_iter", "seconds_total",
        "energy_history", "energy", "energy_error", "variance", "v_score", "relative_error",
        "method_used", "sampler_used", "acceptance",
    }  # fmt: skip
    assert keys <= set(result)
    assert result["n_iter_done"] == len(result["energy_history"]) == 3
    assert result["method_used"] == ("minsr" if 2 * 128 < result["n_params"] else "sr")
    for key in ("seconds_per_iter", "seconds_total", "energy", "energy_error", "variance"):
        assert np.isfinite(result[key]), key
    assert np.isfinite(result["energy_history"]).all()
    assert 0 < result["acceptance"] <= 1
    # variational: the estimate may undershoot E0 only by its statistical error
    assert result["energy"] > exact - 5 * result["energy_error"] - 1e-9
    assert result["relative_error"] == pytest.approx((result["energy"] - exact) / abs(exact))


def test_enumerated_energy_of_a_full_sum_state_is_its_exact_expectation(peer):
    # netket's FullSumState computes ⟨H⟩ exactly: the independent path to our enumeration
    system = _system([8], kind="heisenberg", J1=1.0, sign_rule=True)
    exact = ground_state(_ours(system)).energy
    options = {"d_model": 8, "heads": 2, "layers": 1, "patch_size": 2, "n_iter": 3}
    result = peer.run_netket_vit(
        system, **options, full_sum=True, exact_energy=exact, enumerate_max_dim=70
    )
    assert result["enumerated_energy"] == pytest.approx(result["energy"], rel=1e-10)
    assert result["enumerated_relative_error"] == pytest.approx(result["relative_error"])
    assert result["enumerated_energy"] > exact
    smaller = peer.run_netket_vit(system, **options, full_sum=True, enumerate_max_dim=69)
    assert smaller["enumerated_energy"] is None and smaller["enumerated_relative_error"] is None


@pytest.mark.parametrize("n_max", [4, 2])
def test_fock_sector_listing_and_matrix_are_netkets_own(peer, n_max):
    # where netket can index the sector itself, our listing holds its states and H built
    # from get_conn on it is netket's to_sparse, whichever listing and index are used
    hilbert = nk.hilbert.Fock(n_max=n_max, N=5, n_particles=4)
    hamiltonian = nk.operator.BoseHubbard(hilbert, nk.graph.Chain(5), U=2.5, J=1.0, mu=0.3)
    sector = Bosons(5, 4, n_max)
    states = sector.all_states()
    assert sector.dimension == hilbert.n_states == len(states)
    netkets = np.asarray(hilbert.states_to_numbers(states))  # our order in netket's numbering
    np.testing.assert_array_equal(np.sort(netkets), np.arange(hilbert.n_states))
    expected = hamiltonian.to_sparse().toarray()
    ours = peer.sparse_on(hamiltonian, states, sector.state_index, chunk=7)  # several chunks
    np.testing.assert_array_equal(ours.toarray(), expected[np.ix_(netkets, netkets)])
    theirs = peer.sparse_on(
        hamiltonian, np.asarray(hilbert.all_states()), hilbert.states_to_numbers, chunk=7
    )
    np.testing.assert_array_equal(theirs.toarray(), expected)
    # the L = N = 12 benchmark sector (our ED's 1,352,078 states)
    assert Bosons(12, 12).dimension == 1_352_078


def test_enumerated_energy_on_a_sector_netket_cannot_index(peer):
    # like the L = N = 12 benchmark chain (no occupation cutoff), netket indexes this sector
    # through its 11^10 unconstrained states and so cannot list it; it has 92,378 states.
    # ⟨H⟩ must equal Σ|ψ|² E_loc over the listing, with E_loc taken from log ψ on the
    # connected states directly (no index lookup)
    hilbert = nk.hilbert.Fock(n_max=10, N=10, n_particles=10)
    assert not hilbert.is_indexable
    chain = nk.graph.Chain(10)
    hamiltonian = nk.operator.BoseHubbard(hilbert, chain, U=3.0, J=1.0)
    vstate = nk.vqs.MCState(
        nk.sampler.MetropolisExchange(hilbert, graph=chain),
        nk.models.Jastrow(param_dtype=float),
        n_samples=16,
        seed=1,
    )
    vstate.parameters = jax.tree_util.tree_map(lambda p: p - 0.05, vstate.parameters)
    states = Bosons(10, 10, 10).all_states()
    x_conn, mels = hamiltonian.get_conn_padded(states)
    log_psi = np.asarray(vstate.log_value(states))
    log_conn = np.asarray(vstate.log_value(x_conn.reshape(-1, 10))).reshape(mels.shape)
    e_loc = (mels * np.exp(log_conn - log_psi[:, None])).sum(axis=1)
    weight = np.exp(2 * (log_psi - log_psi.max()).real)
    expected = float((weight * e_loc).sum().real / weight.sum())
    assert len(states) == 92_378
    energy = peer.enumerated_energy(vstate, hamiltonian, 1.0, 92_378)
    assert energy == pytest.approx(expected, rel=1e-12)
    assert peer.enumerated_energy(vstate, hamiltonian, 1.0, 92_377) is None


def test_the_peer_refuses_lattices_it_would_build_as_squares(peer):
    system = {"lattice": {"kind": "kagome", "shape": [2, 2]}, "hamiltonian": {"kind": "heisenberg"}}
    with pytest.raises(ValueError, match="lattice.kind=kagome"):
        peer.lattice_extent(system)


@pytest.mark.parametrize("name", ["heisenberg_chain16", "heisenberg_4x4", "bose_hubbard_chain12"])
def test_the_peer_builds_the_system_of_a_resolved_bench_config(peer, name):
    # `bench_step.py --with-netket` hands over `Config.to_dict()`, where every unset option
    # (a ladder's J_leg, J_rung) is present as None
    from pathlib import Path

    from vitqs.build import build_hamiltonian
    from vitqs.config import load

    config = load(Path(__file__).parents[1] / "configs" / "bench" / f"{name}.yaml", [])
    resolved = config.to_dict()
    system = {"lattice": resolved["lattice"], "hamiltonian": resolved["hamiltonian"]}
    hilbert, _, _, n_sites, _ = peer.build_system(system)
    ours = build_hamiltonian(config)
    assert n_sites == ours.n_sites == hilbert.size
    if config.hamiltonian.kind == "heisenberg":  # netket cannot index the 12-boson sector
        assert hilbert.n_states == ours.hilbert.dimension


def test_the_peer_refuses_ladder_couplings(peer):
    system = _system([8], kind="heisenberg", J1=1.0, J_leg=1.0)
    with pytest.raises(ValueError, match="hamiltonian.J_leg=1.0"):
        peer.build_system(system)
