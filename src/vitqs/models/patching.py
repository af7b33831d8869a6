"""Cut a lattice configuration into patches, and the geometry of the patch lattice.

Sites are numbered cell by cell, row-major, then by basis index inside a cell: site ``b`` of
cell ``(x, y)`` is ``n_basis · (x + Lx · y) + b``, so the flat site axis reads ``(y x b)`` (on
a chain or a square ``n_basis = 1`` and site ``(x, y)`` is ``x + Lx * y``). A patch is a
``bx × by`` block of cells with all their basis sites (``by = 1`` on a chain); patches are
numbered row-major on the patch lattice of extent ``(Px, Py) = (Lx / bx, Ly / by)``, patch
``(px, py)`` being ``px + Px * py``, and the sites inside a patch are listed in the same
order, ``(by bx b)``.
"""

from __future__ import annotations

import numpy as np

from vitqs.models._checks import check_positive_int


def lattice_extent(shape: tuple[int, ...]) -> tuple[int, int]:
    """Returns ``(Lx, Ly)`` of a lattice shape, ``Ly = 1`` for a chain."""
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (1, 2):
        raise ValueError(f"lattice.shape={list(shape)} must have 1 (chain) or 2 (square) entries")
    return (shape[0], shape[1] if len(shape) == 2 else 1)


class PatchGrid:
    """The patch lattice of a chain or square lattice.

    Args:
        lattice_shape: ``(L,)`` or ``(Lx, Ly)`` unit cells.
        patch_size: ``b`` (the same along every axis) or one size per lattice axis, x first,
            in cells. Each size must divide the lattice extent along its axis.
        n_basis: sites per unit cell.
    """

    def __init__(
        self,
        lattice_shape: tuple[int, ...],
        patch_size: int | tuple[int, ...],
        n_basis: int = 1,
    ):
        lx, ly = lattice_extent(lattice_shape)
        ndim = len(lattice_shape)
        sizes = (patch_size,) * ndim if np.ndim(patch_size) == 0 else tuple(patch_size)
        if len(sizes) != ndim:
            raise ValueError(
                f"model.patch_size={_show(patch_size)} must be an int or a list of {ndim} ints, "
                f"one per axis of lattice.shape={list(lattice_shape)}"
            )
        sizes = tuple(check_positive_int("patch_size", b) for b in sizes)
        if any(length % b for length, b in zip(lattice_shape, sizes, strict=True)):
            raise ValueError(
                f"model.patch_size={_show(patch_size)} must divide "
                f"lattice.shape={list(lattice_shape)}"
            )
        bx, by = sizes[0], sizes[1] if ndim == 2 else 1
        self.lattice_extent = (lx, ly)
        self.patch_extent = (bx, by)
        self.grid_extent = (lx // bx, ly // by)
        self.n_basis = check_positive_int("n_basis", n_basis)

    @property
    def n_patches(self) -> int:
        return self.grid_extent[0] * self.grid_extent[1]

    @property
    def patch_len(self) -> int:
        """Returns the number of sites in one patch."""
        return self.patch_extent[0] * self.patch_extent[1] * self.n_basis

    def split(self, x):
        """Returns patches ``(batch, n_patches, patch_len)`` of ``x`` ``(batch, n_sites)``."""
        (bx, by), (px, py) = self.patch_extent, self.grid_extent
        row = bx * self.n_basis  # the sites of one patch's row of cells are consecutive
        if by == 1:  # a chain, or patches one row high: consecutive sites, a view
            return x.reshape(x.shape[0], px * py, row)
        blocks = x.reshape(x.shape[0], py, by, px, row).transpose(2, 3)  # (batch, py, px, by, row)
        return blocks.reshape(x.shape[0], py * px, by * row)

    def patch_coords(self) -> np.ndarray:
        """Returns the coordinates ``(n_patches, 2)`` of each patch on the patch lattice."""
        px, _ = self.grid_extent
        patch = np.arange(self.n_patches)
        return np.stack([patch % px, patch // px], axis=1)

    def relative_index(self) -> np.ndarray:
        """Returns ``(n_patches, n_patches)`` int64: displacement ``r_i − r_j`` as a patch index.

        The displacement is taken periodically on the patch lattice and numbered like a patch,
        ``dx + Px * dy``, so a parameter table over displacements ``(n_patches,)`` indexed by this
        gives a matrix that is circulant on the patch lattice.
        """
        px, py = self.grid_extent
        coords = self.patch_coords()
        delta = coords[:, None, :] - coords[None, :, :]  # (i, j, axis)
        return ((delta[..., 0] % px) + px * (delta[..., 1] % py)).astype(np.int64)


def _show(patch_size) -> str:
    return str(list(patch_size)) if np.ndim(patch_size) else str(patch_size)
