"""Patches follow the row-major site order: patch (px, py) holds sites (x, y) of its block."""

import numpy as np
import pytest
import torch

from vitqs.models.patching import PatchGrid


@pytest.mark.parametrize(
    ("shape", "patch_size"), [((8,), 2), ((6,), 3), ((4, 4), 2), ((6, 4), (3, 2)), ((4, 6), [2, 3])]
)
def test_patches_hold_the_sites_of_their_block(shape, patch_size):
    grid = PatchGrid(shape, patch_size)
    lx, ly = grid.lattice_extent
    bx, by = grid.patch_extent
    site_index = torch.arange(lx * ly, dtype=torch.float64)[None, :]
    patches = grid.split(site_index)[0]  # (patch, site in patch)
    assert patches.shape == (grid.n_patches, bx * by)
    for patch, (px, py) in enumerate(grid.patch_coords()):
        expected = [(px * bx + ix) + lx * (py * by + iy) for iy in range(by) for ix in range(bx)]
        assert patches[patch].tolist() == expected


def test_relative_index_is_the_periodic_displacement():
    grid = PatchGrid((6, 4), 2)  # 3 × 2 patch lattice
    index = grid.relative_index()
    coords = grid.patch_coords()
    for i in range(grid.n_patches):
        for j in range(grid.n_patches):
            dx, dy = (coords[i] - coords[j]) % np.array([3, 2])
            assert index[i, j] == dx + 3 * dy


@pytest.mark.parametrize(
    ("shape", "patch_size", "message"),
    [
        ((4, 4), 3, r"model.patch_size=3 must divide lattice.shape=\[4, 4\]"),
        ((8,), 3, r"model.patch_size=3 must divide lattice.shape=\[8\]"),
        ((4, 4), [2, 3], r"model.patch_size=\[2, 3\] must divide"),
        ((4, 4), [2], r"one per axis"),
        ((4, 4), 0, r"model.patch_size=0 must be a positive integer"),
    ],
)
def test_bad_patch_size_is_a_clear_error(shape, patch_size, message):
    with pytest.raises(ValueError, match=message):
        PatchGrid(shape, patch_size)
