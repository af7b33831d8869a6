"""The ViT, its patches and the Jastrow factor on lattices with a basis."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from vitqs.models.jastrow import pair_classes
from vitqs.models.patching import PatchGrid
from vitqs.models.symmetrize import symmetrize_space_group
from vitqs.models.vit import ViT
from vitqs.physics.lattice import Lattice

KINDS = [("honeycomb", (4, 2), 2), ("kagome", (2, 2), 1), ("triangular", (4, 4), 2)]


@pytest.mark.parametrize("kind, shape, patch", KINDS)
def test_a_patch_holds_every_site_of_its_cells(kind, shape, patch):
    lattice = Lattice(shape, True, kind=kind)
    grid = PatchGrid(lattice.shape, patch, lattice.n_basis)
    sites = torch.arange(lattice.n_sites, dtype=torch.float64)[None, :]
    patches = grid.split(sites)[0].long().numpy()  # (n_patches, patch_len) of site indices
    assert patches.shape == (grid.n_patches, patch**lattice.ndim * lattice.n_basis)
    assert sorted(patches.ravel().tolist()) == list(range(lattice.n_sites))
    for p, members in enumerate(patches):
        # every site of the patch lies in one of its cells; with each site in exactly one
        # patch, every cell's basis sites are in the same patch
        cells = lattice.coords[members] // patch
        px, py = p % grid.grid_extent[0], p // grid.grid_extent[0]
        assert np.all(cells == [px, py])


def _pair_orbits(lattice) -> int:
    """Returns the number of orbits of ordered pairs i ≠ j under translations and exchange."""
    seen, orbits = set(), 0
    for i, j in itertools.permutations(range(lattice.n_sites), 2):
        if (i, j) in seen:
            continue
        orbits += 1
        for t in lattice.translations:
            seen.update({(int(t[i]), int(t[j])), (int(t[j]), int(t[i]))})
    return orbits


@pytest.mark.parametrize(
    "kind, shape, pbc",
    [("honeycomb", (3, 2), True), ("kagome", (2, 3), True), ("triangular", (3, 4), True)],
)
def test_jastrow_classes_are_the_pair_orbits_of_the_translations(kind, shape, pbc):
    # (along an open axis the couplings still depend on the displacement only, as before)
    lattice = Lattice(shape, pbc, kind=kind)
    pair_class, n_classes = pair_classes(lattice.shape, lattice.pbc, lattice.n_basis)
    off = ~np.eye(lattice.n_sites, dtype=bool)
    for t in lattice.translations:  # one coupling per orbit: invariant under translations
        assert np.array_equal(pair_class[np.ix_(t, t)][off], pair_class[off])
    assert np.array_equal(pair_class, pair_class.T)
    assert n_classes == _pair_orbits(lattice)


@pytest.mark.parametrize("kind, shape, patch", KINDS + [("ladder", (6, 2), 2)])
def test_vit_is_invariant_under_whole_patch_shifts_and_its_average_under_the_space_group(
    kind, shape, patch
):
    lattice = Lattice(shape, True, kind=kind)
    model = ViT(
        lattice.shape, patch, 8, 2, 1, n_basis=lattice.n_basis, pbc=lattice.pbc, jastrow=True
    )
    torch.nn.init.normal_(model.jastrow.v, std=0.1)
    x = torch.as_tensor(np.random.default_rng(0).choice([-1.0, 1.0], (6, lattice.n_sites)))
    log_psi = model(x)
    shifts = lattice.translation_shifts
    by_patches = np.all(shifts % np.asarray(model.translation_period) == 0, axis=1)
    assert by_patches.sum() > 1
    for perm in lattice.translations[by_patches]:
        torch.testing.assert_close(model(x[:, perm]), log_psi, rtol=1e-12, atol=1e-12)
    averaged = symmetrize_space_group(model, lattice)
    reference = averaged(x)
    for g in lattice.space_group():
        image = averaged(x[:, g])
        torch.testing.assert_close(image.real, reference.real, rtol=1e-10, atol=1e-10)
    # the average is the explicit one over the space group
    group = torch.as_tensor(lattice.space_group())
    terms = model(x[:, group].reshape(-1, lattice.n_sites)).reshape(len(x), len(group))
    explicit = torch.logsumexp(terms, dim=1) - np.log(len(group))
    torch.testing.assert_close(reference.real, explicit.real, rtol=1e-10, atol=1e-10)
