"""The seed design, kept as a baseline: one attention layer and a ReLU, summed to a real log|ψ|."""

from __future__ import annotations

import torch
from torch import nn

from vitqs.config import ModelConfig
from vitqs.models._checks import check_heads_divide, check_positive_int
from vitqs.models.attention import FullAttention
from vitqs.models.patching import PatchGrid

# Std of the attention's output projection: small, so that log|ψ| starts near a constant.
OUT_INIT_STD = 1e-2


class SimpleViT(nn.Module):
    """Returns ``log ψ(x) = Σ_{patch, feature} ReLU(MHSA(W_E P(x)))`` as complex ``(B,)``.

    ``P(x)`` cuts ``x`` ``(B, n_sites)`` into patches (see ``PatchGrid``), ``W_E`` is a linear
    embedding and MHSA one layer of full softmax multi-head attention with an output projection.
    The log-amplitude is real (imaginary part zero), so this model cannot carry signs, and it has
    no position information: it is invariant under any permutation of the patches. A baseline,
    not a competitive ansatz. Init: the output projection ``~ N(0, OUT_INIT_STD²)``, bias zero.

    Args:
        lattice_shape: ``(L,)`` or ``(Lx, Ly)``.
        patch_size: ``b`` along every axis, or one size per axis; must divide the lattice.
        d_model: embedding width.
        heads: attention heads; must divide ``d_model``.
    """

    def __init__(
        self,
        lattice_shape: tuple[int, ...],
        patch_size: int | tuple[int, ...] = ModelConfig.patch_size,
        d_model: int = ModelConfig.d_model,
        heads: int = ModelConfig.heads,
        n_basis: int = 1,
    ):
        super().__init__()
        d_model = check_positive_int("d_model", d_model)
        heads = check_positive_int("heads", heads)
        check_heads_divide(d_model, heads)
        self.grid = PatchGrid(lattice_shape, patch_size, n_basis)
        self.embed = nn.Linear(self.grid.patch_len, d_model)
        self.attention = FullAttention(self.grid, d_model, heads, translation_invariant=False)
        nn.init.normal_(self.attention.to_out.weight, std=OUT_INIT_STD)
        nn.init.zeros_(self.attention.to_out.bias)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.embed.weight.dtype)
        h = torch.relu(self.attention(self.embed(self.grid.split(x))))  # (batch, patch, d_model)
        log_amplitude = h.sum(dim=(1, 2))
        return torch.complex(log_amplitude, torch.zeros_like(log_amplitude))
