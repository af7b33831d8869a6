"""Lattices with a basis against NetKet's: the same sites, the same bonds of orders 1 and 2,
and symmetries that are symmetries."""

import numpy as np
import pytest

from vitqs.config import SITES_PER_CELL
from vitqs.physics.lattice import Lattice

nk = pytest.importorskip("netket")


def _ours_of_netket(lattice, graph):
    """Returns our site index of each of NetKet's sites, matched by position."""
    ours = {tuple(np.round(p, 6)): i for i, p in enumerate(lattice.positions)}
    return np.array([ours[tuple(np.round(p, 6))] for p in np.asarray(graph.positions)])


def _edge_set(pairs):
    return {tuple(sorted(map(int, e))) for e in pairs}


CASES = [
    ("chain", (8,), True),
    ("chain", (7,), False),
    ("square", (4, 4), True),
    ("square", (5, 3), False),
    ("triangular", (4, 4), True),
    ("triangular", (6, 3), True),
    ("triangular", (3, 3), False),
    ("honeycomb", (3, 3), True),
    ("honeycomb", (2, 3), True),
    ("honeycomb", (3, 2), False),
    ("kagome", (2, 2), True),
    ("kagome", (2, 3), True),
    ("kagome", (3, 3), False),
    ("ladder", (10, 2), True),
    ("ladder", (6, 3), False),
]


@pytest.mark.parametrize("kind, shape, periodic", CASES)
def test_sites_and_bonds_are_netkets(kind, shape, periodic):
    from lattice_ed_crosscheck import netket_graph

    lattice = Lattice(shape, periodic, kind=kind)
    graph = netket_graph(lattice)
    assert graph.n_nodes == lattice.n_sites
    ours = _ours_of_netket(lattice, graph)
    assert sorted(ours.tolist()) == list(range(lattice.n_sites))  # a bijection of positions
    for order in (1, 2):
        theirs = _edge_set(ours[np.asarray(graph.edges(filter_color=order - 1))])
        assert _edge_set(lattice.bonds(order)) == theirs, f"order {order}"


@pytest.mark.parametrize("kind", ["honeycomb", "kagome", "triangular"])
def test_site_numbering_is_cell_major_then_basis(kind):
    lattice = Lattice((3, 2), True, kind=kind)
    nb = lattice.n_basis
    assert nb == SITES_PER_CELL.get(kind, 1)
    site = nb * (2 + 3 * 1) + (nb - 1)  # last basis site of cell (2, 1)
    assert lattice.coords[site].tolist() == [2, 1]
    expected = np.array([2, 1]) @ lattice.vectors + lattice.offsets[nb - 1]
    np.testing.assert_allclose(lattice.positions[site], expected)


@pytest.mark.parametrize("kind, shape, periodic", CASES)
def test_space_group_maps_bonds_onto_bonds(kind, shape, periodic):
    lattice = Lattice(shape, periodic, kind=kind)
    group = lattice.space_group()
    rows = {tuple(g) for g in group.tolist()}
    assert len(rows) == len(group)  # no element twice
    assert np.array_equal(group[0], np.arange(lattice.n_sites))
    for order in (1, 2):
        bonds = _edge_set(lattice.bonds(order))
        for perm in group:
            assert _edge_set(perm[np.array(sorted(bonds))]) == bonds
    # closed under composition
    for a in group[:: max(1, len(group) // 7)]:
        for b in group:
            assert tuple(a[b]) in rows


@pytest.mark.parametrize(
    "kind, shape, n_points",
    [
        ("triangular", (4, 4), 12),  # C6v about a site
        ("honeycomb", (3, 3), 12),  # C6v about a hexagon's centre
        ("kagome", (2, 2), 12),
        ("ladder", (10, 2), 4),  # the reflections along and across the legs
        ("triangular", (6, 4), 2),  # a torus that only keeps the inversion
        ("square", (4, 4), 8),
        ("chain", (8,), 2),
    ],
)
def test_point_groups_from_the_geometry(kind, shape, n_points):
    lattice = Lattice(shape, True, kind=kind)
    assert len(lattice.point_group()) == n_points
    assert len(lattice.space_group()) == n_points * len(lattice.translations)


def test_ladder_bonds_split_into_legs_and_rungs():
    lattice = Lattice((6, 2), True, kind="ladder")
    assert lattice.pbc == (True, False)  # one bool: along the legs
    legs, rungs = lattice.ladder_bonds()
    assert len(legs) == 12 and len(rungs) == 6
    assert np.all(lattice.coords[rungs[:, 0], 0] == lattice.coords[rungs[:, 1], 0])


@pytest.mark.parametrize(
    "kind, shape, bipartite",
    [("honeycomb", (3, 3), True), ("triangular", (4, 4), False), ("kagome", (2, 2), False)],
)
def test_sublattices_from_the_bonds(kind, shape, bipartite):
    lattice = Lattice(shape, True, kind=kind)
    assert lattice.is_bipartite() is bipartite
    if bipartite:
        sign, bonds = lattice.sublattice_sign, lattice.bonds(1)
        assert np.all(sign[bonds[:, 0]] == -sign[bonds[:, 1]])
        assert np.array_equal(sign, np.where(lattice.basis_index == 0, 1, -1))


@pytest.mark.parametrize(
    "kind, shape, message",
    [
        ("chain", (4, 4), "must have 1 entry"),
        ("kagome", (4,), "must have 2 entries"),
        ("hexagonal", (4, 4), "lattice.kind='hexagonal' is not one of"),
    ],
)
def test_bad_kinds_and_shapes_are_refused(kind, shape, message):
    with pytest.raises(ValueError, match=message):
        Lattice(shape, True, kind=kind)


# ---------------------------------------------------------------- ED against NetKet's own
@pytest.mark.netket
@pytest.mark.parametrize(
    "kind, shape, couplings",
    [
        ("triangular", (4, 3), {"J1": 1.0}),
        ("triangular", (3, 4), {"J1": 1.0, "J2": 0.125}),
        ("honeycomb", (3, 3), {"J1": 1.0, "J2": 0.2}),
        ("honeycomb", (2, 3), {"J1": 1.0}),
        ("kagome", (2, 2), {"J1": 1.0}),
        ("ladder", (5, 2), {"J1": 1.0}),
        ("ladder", (4, 2), {"J1": 1.0, "J_leg": 1.0, "J_rung": 0.5}),
        ("ladder", (4, 3), {"J1": 0.7, "J_rung": 1.3}),
    ],
)
def test_heisenberg_ground_energy_matches_netkets_lattice(kind, shape, couplings):
    from lattice_ed_crosscheck import netket_ground_energy

    from vitqs.physics import exact
    from vitqs.physics.operators import Heisenberg

    ham = Heisenberg(Lattice(shape, True, kind=kind), **couplings)
    ours = exact.ground_state(ham, use_cache=False).energy
    assert ours == pytest.approx(netket_ground_energy(ham), abs=1e-10)


@pytest.mark.netket
@pytest.mark.parametrize(
    "kind, shape, n_particles, U", [("triangular", (3, 2), 6, 10.0), ("honeycomb", (2, 2), 5, 4.0)]
)
def test_bose_hubbard_ground_energy_matches_netkets_lattice(kind, shape, n_particles, U):
    from lattice_ed_crosscheck import netket_ground_energy

    from vitqs.physics import exact
    from vitqs.physics.operators import BoseHubbard

    lattice = Lattice(shape, True, kind=kind)
    ham = BoseHubbard(lattice, J=1.0, U=U, n_particles=n_particles, n_max=n_particles)
    ours = exact.ground_state(ham, use_cache=False).energy
    assert ours == pytest.approx(netket_ground_energy(ham), abs=1e-10)


def test_ladder_couplings_only_on_a_ladder():
    from vitqs.physics.operators import Heisenberg

    with pytest.raises(ValueError, match="J_leg/J_rung couple a ladder"):
        Heisenberg(Lattice((4, 4), True), J_rung=0.5)


# ---------------------------------------------------------------- through the command line
@pytest.mark.parametrize(
    "lattice, hamiltonian",
    [
        ({"kind": "kagome", "shape": [2, 2]}, {"kind": "heisenberg", "J1": 1.0}),
        (
            {"kind": "ladder", "shape": [4, 2]},
            {"kind": "heisenberg", "J1": 1.0, "J_rung": 0.5, "sign_rule": True},
        ),
        (
            {"kind": "triangular", "shape": [3, 2]},
            {"kind": "bose_hubbard", "J": 1.0, "U": 4.0, "n_particles": 6},
        ),
    ],
    ids=["kagome", "ladder", "triangular_bosons"],
)
def test_a_run_on_each_kind_measures_against_its_ed(tmp_path, capsys, lattice, hamiltonian):
    from helpers import last_json, run_main, tiny_heisenberg, write_config

    from vitqs.build import build_hamiltonian
    from vitqs.config import load
    from vitqs.physics import exact

    data = tiny_heisenberg(tmp_path / "out", lattice=lattice)
    data["hamiltonian"] = hamiltonian
    data["model"].update(patch_size=1, symmetrize="space_group")
    data["final"].update(symmetrize="space_group")
    path = write_config(tmp_path / "lattice.yaml", data)
    code, out, err = run_main(capsys, "ed", path, "--json")
    assert code == 0, err
    summary = last_json(out)
    n_sites = Lattice(tuple(lattice["shape"]), True, kind=lattice["kind"]).n_sites
    assert summary["lattice"] == {
        "kind": lattice["kind"],
        "shape": lattice["shape"],
        "pbc": [True, False] if lattice["kind"] == "ladder" else [True, True],
        "n_sites": n_sites,
    }
    expected = exact.ground_state(build_hamiltonian(load(path)), use_cache=False).energy
    assert summary["energy"] == pytest.approx(expected, abs=1e-10)
    code, out, err = run_main(capsys, "run", path, "--json", "--quiet")
    assert code == 0, err
    result = last_json(out)
    assert result["exact_energy"] == pytest.approx(expected, abs=1e-10)
    assert (
        np.isfinite(result["energy"]) and result["energy"] >= expected - 6 * result["energy_error"]
    )
