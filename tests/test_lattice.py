"""Lattice geometry: bond counts, no duplicates, row-major order, translations."""

import numpy as np
import pytest

from vitqs.physics.lattice import Lattice


def _bond_set(bonds):
    return {tuple(b) for b in bonds.tolist()}


@pytest.mark.parametrize(
    "shape, pbc, n1, n2",
    [
        ((8,), True, 8, 8),
        ((8,), False, 7, 6),
        ((4, 4), True, 32, 32),
        ((4, 4), False, 24, 18),
        ((6, 4), True, 48, 48),
        ((3, 3), True, 18, 18),
    ],
)
def test_bond_counts(shape, pbc, n1, n2):
    lattice = Lattice(shape, pbc)
    assert len(lattice.bonds(1)) == n1
    assert len(lattice.bonds(2)) == n2


@pytest.mark.parametrize("shape", [(2,), (3,), (4,), (2, 2), (2, 4), (4, 2), (3, 3), (2, 3)])
def test_small_periodic_lattices_have_no_duplicate_or_self_bonds(shape):
    lattice = Lattice(shape, pbc=True)
    b1, b2 = lattice.bonds(1), lattice.bonds(2)
    for bonds in (b1, b2):
        assert np.all(bonds[:, 0] < bonds[:, 1])
        assert len(_bond_set(bonds)) == len(bonds)
    assert not _bond_set(b1) & _bond_set(b2)


def test_row_major_site_order_and_bond_vectors():
    lattice = Lattice((4, 3), pbc=False)
    assert lattice.coords[5].tolist() == [1, 1]  # site x + Lx*y
    assert (1, 2) in _bond_set(lattice.bonds(1))  # +x
    assert (1, 5) in _bond_set(lattice.bonds(1))  # +y
    assert (0, 5) in _bond_set(lattice.bonds(2))  # +x+y
    assert (1, 4) in _bond_set(lattice.bonds(2))  # +x-y from (0,1) to (1,0)
    assert (3, 4) not in _bond_set(lattice.bonds(1))  # no wrap with open boundaries


def test_bonds_join_sites_at_the_right_distance():
    lattice = Lattice((5, 4), pbc=True)
    lx, ly = lattice.extent
    for order, dist2 in ((1, 1), (2, 2)):
        d = lattice.coords[lattice.bonds(order)[:, 1]] - lattice.coords[lattice.bonds(order)[:, 0]]
        d = (d + np.array([lx, ly]) // 2) % np.array([lx, ly]) - np.array([lx, ly]) // 2
        assert np.all((d**2).sum(axis=1) == dist2)


@pytest.mark.parametrize("shape", [(6,), (4, 4), (3, 2)])
def test_translations_form_a_group_of_permutations(shape):
    lattice = Lattice(shape, pbc=True)
    table = lattice.translations
    assert table.shape == (lattice.n_sites, lattice.n_sites)
    assert np.array_equal(table[0], np.arange(lattice.n_sites))
    rows = {tuple(t) for t in table.tolist()}
    assert len(rows) == lattice.n_sites
    for a in table:
        assert sorted(a.tolist()) == list(range(lattice.n_sites))
        for b in table:
            assert tuple(a[b]) in rows  # closed under composition
    # translations map bonds onto bonds
    bonds = _bond_set(lattice.bonds(1))
    for perm in table:
        moved = {tuple(sorted((int(perm[i]), int(perm[j])))) for i, j in bonds}
        assert moved == bonds


def test_open_lattice_has_only_identity_translation():
    assert Lattice((4, 4), pbc=False).translations.shape == (1, 16)


@pytest.mark.parametrize(
    "shape, pbc, expected",
    [((4, 4), True, True), ((5,), True, False), ((5,), False, True), ((3, 4), True, False)],
)
def test_bipartite(shape, pbc, expected):
    assert Lattice(shape, pbc).is_bipartite() is expected


@pytest.mark.parametrize("shape", [(0,), (4, 0), (2, 2, 2), ()])
def test_bad_shapes_are_refused(shape):
    with pytest.raises(ValueError, match="lattice.shape"):
        Lattice(shape)
