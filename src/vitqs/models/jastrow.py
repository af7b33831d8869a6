"""Two-body Jastrow factor with translation-invariant pair couplings."""

from __future__ import annotations

import numpy as np
import torch
from einops import einsum
from torch import nn

from vitqs.models.patching import lattice_extent


def pair_classes(lattice_shape: tuple[int, ...], pbc: bool) -> tuple[np.ndarray, int]:
    """Returns ``(pair_class, n_classes)``: the coupling index of every site pair.

    ``pair_class`` is ``(n_sites, n_sites)`` int64. Pairs ``(i, j)`` with the same displacement
    ``r_i − r_j`` up to sign share a class (``x_i x_j`` is symmetric, so ``v(r)`` and ``v(−r)``
    could not be told apart); displacements are wrapped onto the lattice when ``pbc`` and taken
    as plain vectors on an open lattice. The diagonal ``i = j`` gets the class ``n_classes``,
    which the on-site term ``g`` covers instead.

    Class counts: periodic ``(N + n_half − 2)/2`` with ``n_half = (1 + [Lx even])(1 + [Ly even])``
    the displacements equal to their own negative; open ``((2Lx − 1)(2Ly − 1) − 1)/2``.
    """
    lx, ly = lattice_extent(lattice_shape)
    site = np.arange(lx * ly)
    coords = np.stack([site % lx, site // lx], axis=1)
    delta = coords[:, None, :] - coords[None, :, :]  # (i, j, axis)
    code = _displacement_code(delta, lx, ly, pbc)
    code_of_negative = _displacement_code(-delta, lx, ly, pbc)
    canonical = np.maximum(code, code_of_negative)  # one representative of {r, −r}
    off_diagonal = ~np.eye(lx * ly, dtype=bool)
    classes, inverse = np.unique(canonical[off_diagonal], return_inverse=True)
    pair_class = np.full((lx * ly, lx * ly), len(classes), dtype=np.int64)
    pair_class[off_diagonal] = inverse.ravel()
    return pair_class, len(classes)


def _displacement_code(delta: np.ndarray, lx: int, ly: int, pbc: bool) -> np.ndarray:
    """Returns an integer that labels each displacement ``(..., 2)`` uniquely."""
    if pbc:
        return (delta[..., 0] % lx) + lx * (delta[..., 1] % ly)
    return (delta[..., 0] + lx - 1) + (2 * lx - 1) * (delta[..., 1] + ly - 1)


class Jastrow(nn.Module):
    """Returns ``log J(x) = Σ_{i≠j} v(r_i − r_j) x_i x_j + g Σ_i x_i²`` as a complex ``(B,)``.

    The couplings ``v`` are translation invariant and symmetric, ``v(r) = v(−r)`` (see
    ``pair_classes``); ``v`` and ``g`` are real and start at zero, so ``J = 1`` at
    initialisation and a model it multiplies starts unchanged. The result is real (imaginary part
    zero): enough for bosons and for spins whose sign is carried elsewhere. Used alone or as a
    factor on a ViT (Denis, Sinibaldi & Carleo, arXiv:2404.07869).

    Args:
        lattice_shape: ``(L,)`` or ``(Lx, Ly)``, sites row-major.
        pbc: wrap displacements periodically.
    """

    def __init__(self, lattice_shape: tuple[int, ...], pbc: bool = True):
        super().__init__()
        pair_class, n_classes = pair_classes(lattice_shape, pbc)
        self.register_buffer("pair_class", torch.as_tensor(pair_class), persistent=False)
        self.v = nn.Parameter(torch.zeros(n_classes, dtype=torch.float64))
        self.g = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def couplings(self) -> torch.Tensor:
        """Returns ``V_ij = v(r_i − r_j)`` ``(n_sites, n_sites)``, with zero diagonal."""
        v_with_diagonal = torch.cat([self.v, self.v.new_zeros(1)])
        return v_with_diagonal[self.pair_class]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.v.dtype)
        log_j = einsum(x, self.couplings(), x, "batch i, i j, batch j -> batch")
        log_j = log_j + self.g * (x * x).sum(dim=-1)
        return torch.complex(log_j, torch.zeros_like(log_j))
