"""A ViT trained on one lattice, carried to a larger (or smaller) lattice of the same kind.

With translation-invariant attention (`attention._RelativeTable`) every parameter of the ViT
but one is independent of the lattice size: the patch embedding, the encoder blocks' linear
maps and norms, the head. The exception is the table over patch displacements, one entry per
displacement of the periodic patch lattice. `extend_relative_table` maps it to the new patch
lattice: each displacement of the old lattice goes to its shortest image on the new one, and
a displacement half-way round an even old extent (``+P/2`` and ``−P/2`` are the same there,
not on a larger lattice) is shared equally between both images; the new displacements get 0.
Each row of the attention matrix then sums to the same total, so a configuration that is
periodic with the old lattice (a tiling of an old configuration; on 4×4 → 6×6, any
configuration periodic with the patch) gives every patch the same vectors as on the old
lattice. The head sums the patch vectors before its LayerNorm, which is scale-invariant up to
its ``eps`` (1e-5): log ψ agrees to 1e-7-1e-6 relative there (exactly with ``eps = 0``).

A warm start from a trained small lattice is how VMC reaches lattices beyond ED: the large
run begins from a state that already holds the short-range correlations.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vitqs.models.patching import PatchGrid


def extend_relative_table(table: torch.Tensor, source: PatchGrid, target: PatchGrid):
    """Returns ``table`` ``(heads, source.n_patches)`` over the displacements of ``source``
    as a table ``(heads, target.n_patches)`` over those of ``target`` (module docstring)."""
    extended = table.new_zeros((table.shape[0], target.n_patches))
    (sx, sy), (tx, ty) = source.grid_extent, target.grid_extent
    for index in range(source.n_patches):
        images = [
            dx % tx + tx * (dy % ty)
            for dx in _images(index % sx, sx)
            for dy in _images(index // sx, sy)
        ]
        for image in images:
            extended[:, image] += table[:, index] / len(images)
    return extended


def _images(d: int, extent: int) -> list[int]:
    """Returns the shortest signed representatives of displacement ``d`` on a ring of
    ``extent``: one, or two (``±extent/2``) half-way round an even ring."""
    if 2 * d == extent:
        return [d, -d]
    return [d if 2 * d < extent else d - extent]


def transfer_state(state: dict, model: nn.Module, source: PatchGrid) -> dict:
    """Returns a ViT's ``state`` (``state_dict``) trained on the patch lattice ``source``,
    fitted to ``model`` (a `ViT`, bare) on its own patch lattice: relative tables extended,
    every other entry as it is.

    Raises:
        ValueError: when ``model`` has parameters tied to lattice positions (attention
            weights per pair of patches: ``translation_invariant: false``; a Jastrow factor,
            whose pair classes are the lattice's), or patches of another shape.
    """
    grid = getattr(model, "grid", None)
    if grid is None or getattr(model, "translation_period", None) is None:
        raise ValueError(
            "only a ViT with model.translation_invariant=true carries over to another lattice "
            "size (its weights depend on patch displacements, not positions)"
        )
    if getattr(model, "jastrow", None) is not None:
        raise ValueError(
            "model.jastrow=true does not carry over to another lattice size (its pair "
            "classes are the lattice's); start without it"
        )
    if grid.patch_extent != source.patch_extent:
        raise ValueError(
            f"the patches differ ({list(source.patch_extent)} there, "
            f"{list(grid.patch_extent)} here): model.patch_size must be the same"
        )
    tables = {name for name, _ in model.named_parameters() if name.endswith("relative.table")}
    out = dict(state)
    for name in tables:
        if name in out:
            out[name] = extend_relative_table(torch.as_tensor(out[name]), source, grid)
    return out


def grid_of(lattice_shape, patch_size) -> PatchGrid:
    """Returns the patch lattice of a stored run's ``lattice.shape`` and ``model.patch_size``."""
    sizes = patch_size if np.ndim(patch_size) == 0 else tuple(patch_size)
    return PatchGrid(tuple(lattice_shape), sizes)
