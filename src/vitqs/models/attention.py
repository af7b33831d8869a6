"""Multi-head factored attention over patches: attention weights of the positions only.

The layer takes patch vectors ``(batch, patch, d_model)`` and returns the same shape; each head
works on its own ``d_head = d_model / heads`` slice, and an output projection mixes the heads.
With ``translation_invariant`` the position dependence is through the displacement
``r_i − r_j`` on the periodic patch lattice only, which makes the layer equivariant under
translations of the patch lattice. (Full softmax attention, ``softmax(QKᵀ/√d)V``, was removed
at issue 51: no shipped config chose it, and netket's ViT, the peer, is factored too.)
"""

from __future__ import annotations

import math

import torch
from einops import einsum
from torch import nn

from vitqs.models.cache import DerivedCache
from vitqs.models.patching import PatchGrid

# The factored layer is linear in its input. Below this width n_patches · d_model, one product
# with its (n·d)² matrix (`FactoredAttention.kernel`) beats the value projection, the per-head
# mixing over patches and the output projection with the two layout copies between them:
# on CPU for 12 sites in patches of 2 at d_model 16 (n·d = 96), 1.8-2.1x at batches of 330
# to 4096 and no slower at 64. Its n²d² multiply-adds per sample against 2nd² + n²d lose
# above it (1.8-2.7x slower on a 6x6 lattice in patches of 2 at d_model 72, n·d = 648).
# Only without gradients (sampling, local energies): per-sample log-derivatives through the
# matrix would form an (n·d)² outer product per sample (4x slower Jacobians on 16 sites).
FUSED_MAX_WIDTH = 256


class _RelativeTable(nn.Module):
    """A per-head table over patch displacements, read out as circulant ``(heads, n, n)``."""

    def __init__(self, grid: PatchGrid, table: torch.Tensor):
        super().__init__()
        self.table = nn.Parameter(table)  # (heads, n_patches): one entry per displacement
        self.register_buffer("index", torch.as_tensor(grid.relative_index()), persistent=False)

    def forward(self) -> torch.Tensor:
        return self.table[:, self.index]  # (heads, i, j) = table[heads, r_i − r_j]


class FactoredAttention(nn.Module):
    """Returns ``out_i = W_O Σ_j α^h_ij V^h x_j``: attention weights that depend on positions only.

    The weights ``α^h_ij`` are free parameters, not functions of the input (Viteritti, Rende &
    Becca, PRL 130, 236401 (2023); Rende et al., Commun. Phys. 7, 260 (2024)). With
    ``translation_invariant`` they are ``α^h(r_i − r_j)``, periodic on the patch lattice:
    ``heads · n_patches`` parameters instead of ``heads · n_patches²``.

    Initialisation: ``α ~ N(0, 1/n_patches)`` so that ``Σ_j α_ij v_j`` keeps the scale of ``v``.

    Args:
        grid: the patch lattice.
        d_model: width of the patch vectors.
        heads: number of heads; divides ``d_model``.
        translation_invariant: tie the weights to the relative patch position.
    """

    def __init__(self, grid: PatchGrid, d_model: int, heads: int, translation_invariant: bool):
        super().__init__()
        self.heads = heads
        n_patches = grid.n_patches
        self.to_value = nn.Linear(d_model, d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model)
        scale = 1.0 / math.sqrt(n_patches)
        if translation_invariant:
            self.relative = _RelativeTable(grid, scale * torch.randn(heads, n_patches))
            self.alpha = None
        else:
            self.relative = None
            self.alpha = nn.Parameter(scale * torch.randn(heads, n_patches, n_patches))
        self._fused = DerivedCache()  # (kernel, bias) of the fused form, between updates

    def attention_weights(self) -> torch.Tensor:
        """Returns ``α`` ``(heads, n_patches, n_patches)``; row ``i`` weighs the patches ``j``."""
        return self.alpha if self.relative is None else self.relative()

    def kernel(self) -> torch.Tensor:
        """Returns ``K`` ``(n·d, n·d)`` with ``out = K x + b_O`` on flattened patch vectors:
        ``K[(i, e), (j, c)] = Σ_h α^h_ij Σ_{k ∈ h} W_O[e, k] W_V[k, c]``; the layer is linear."""
        heads, d_model = self.heads, self.to_value.weight.shape[0]
        w_value = self.to_value.weight.view(heads, d_model // heads, d_model)  # (h, k, c)
        w_out = self.to_out.weight.view(d_model, heads, d_model // heads)  # (e, h, k)
        per_head = einsum(w_out, w_value, "e h k, h k c -> h e c")
        kernel = einsum(self.attention_weights(), per_head, "h i j, h e c -> i e j c")
        n_patches = kernel.shape[0]
        return kernel.reshape(n_patches * d_model, n_patches * d_model)

    def _fused_form(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``Kᵀ`` and the bias ``b_O`` repeated over patches, for ``out = x Kᵀ + b``."""
        n_patches = self.attention_weights().shape[-1]
        return self.kernel().T.contiguous(), self.to_out.bias.repeat(n_patches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n_patches, d_model = x.shape
        # under torch.compile the layers below fuse into a few loops and need no cache
        fuse = not (torch.is_grad_enabled() or torch.compiler.is_compiling())
        if fuse and n_patches * d_model <= FUSED_MAX_WIDTH:
            sources = (*self.parameters(),)
            kernel_t, bias = self._fused.get(sources, self._fused_form)
            out = torch.addmm(bias, x.reshape(batch, -1), kernel_t)
            return out.view(batch, n_patches, d_model)
        value = self.to_value(x).view(batch, n_patches, self.heads, d_model // self.heads)
        out = torch.einsum("hij,bjhk->bihk", self.attention_weights(), value)
        return self.to_out(out.reshape(batch, n_patches, d_model))
