"""Vision-Transformer wave function: patches → embedding → encoder blocks → complex log-cosh head.

Architecture of Viteritti, Rende & Becca, PRL 130, 236401 (2023) and Rende et al.,
Commun. Phys. 7, 260 (2024): factored attention, and an optional Jastrow factor.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from vitqs.config import EMBEDDINGS, ModelConfig
from vitqs.models._checks import check_choice, check_heads_divide, check_positive_int
from vitqs.models.attention import FactoredAttention
from vitqs.models.jastrow import Jastrow
from vitqs.models.patching import PatchGrid

# The std of the head's complex output weights at the start. Why 0.1: at S^z = 0 the uniform
# state is the fully polarised multiplet's member, an exact eigenstate of any SU(2)-symmetric
# H, where the energy gradient vanishes. At 1e-2 the log-derivatives (~std², ~1e-4) sink below
# SR's diagonal shift and a J1-J2 run without sign rule sat at E/N = +0.75 for ~16 steps; 1e-1
# leaves at once (0.3 and 1.0 start too rough).
HEAD_INIT_STD = 0.1
# Forward passes on CPU without gradients (sampling, local energies, full sums) go in batches
# whose largest activation is ~2 MiB. Larger ones leave the caches and are allocated fresh
# (page faults) at every pass: per configuration, a 64-site chain's float64 forward cost
# 49-61 µs at 64-256 configurations and 101-122 µs at 1,024-4,096, a 6x6's 17-18 µs at
# 128-512 and 29-31 µs at 2,048-4,096 (one core, results/history/performance_notes.md).
ACTIVATION_BYTES = 2 * 2**20
MIN_ROWS_PER_PASS = 64


def log_cosh_parts(a: torch.Tensor, b: torch.Tensor | None = None):
    """Returns ``(Re, Im)`` of ``log cosh(a + ib)`` in real arithmetic, stable for large ``|a|``;
    ``Im`` is None when ``b`` is None (real argument).

    The modulus, by evenness at ``|a|`` and with ``u = exp(−2|a|) ≤ 1`` (``log cosh z = z +
    log(1 + u e^{−2ib}) − log 2``): ``Re = |a| + ½ log1p(u (2 cos 2b + u)) − log 2``. The
    phase of ``cosh z = cosh a cos b + i sinh a sin b``: ``Im = atan2(tanh a sin b, cos b)``,
    in ``(−π, π]`` (a phase: only its value modulo 2π enters ψ). No complex operator: a
    forward pass of real ops only, which ``torch.compile`` fuses and which runs several times
    faster than complex ``exp``/``log1p`` on CPU; 15 ops, where the phase as ``b +
    atan2(−u sin 2b, 1 + u cos 2b)`` after moving to ``a ≥ 0`` took 23, about a fifth of the
    chains' forward pass on 16 rows (results/history/performance_notes.md, 2026-12-08).
    """
    magnitude = a.abs()
    u = torch.exp(-2 * magnitude)
    if b is None:
        return magnitude + torch.log1p(u) - math.log(2.0), None
    cos_2b = torch.cos(2 * b)
    real = torch.add(magnitude, torch.log1p(u * torch.add(u, cos_2b, alpha=2)), alpha=0.5)
    imag = torch.atan2(torch.tanh(a) * torch.sin(b), torch.cos(b))
    return real - math.log(2.0), imag


def log_cosh(z: torch.Tensor) -> torch.Tensor:
    """Returns ``log cosh z`` elementwise for complex (or real) ``z``, stable for large ``|Re z|``
    (`log_cosh_parts`): finite far beyond where ``cosh`` overflows, and equal to the naive
    ``log(cosh(z))`` elsewhere (its imaginary part up to multiples of 2π)."""
    if not z.is_complex():
        return log_cosh_parts(z)[0]
    return torch.complex(*log_cosh_parts(z.real, z.imag))


class PatchEmbedding(nn.Module):
    """Returns patch vectors ``(batch, patch, d_model)`` from patches ``(batch, patch, site)``.

    ``linear``: the site values of a patch go through a Linear map. ``onehot``: each site value
    is one-hot encoded over ``local_states`` first (natural for boson occupations, where the
    value is a label more than a magnitude), then concatenated over the patch.
    """

    def __init__(self, patch_len: int, d_model: int, embedding: str, local_states: tuple):
        super().__init__()
        self.onehot = embedding == "onehot"
        n_inputs = patch_len * len(local_states) if self.onehot else patch_len
        states = torch.as_tensor(local_states, dtype=torch.float64)
        self.register_buffer("local_states", states, persistent=False)
        self.linear = nn.Linear(n_inputs, d_model)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        if self.onehot:
            onehot = (patches[..., None] == self.local_states).to(patches.dtype)
            patches = onehot.flatten(-2)  # (batch, patch, site · state)
        return self.linear(patches)


class EncoderBlock(nn.Module):
    """Returns ``y + MLP(LN(y))`` with ``y = x + Attention(LN(x))``: a pre-LayerNorm block.

    The MLP is ``Linear(d, 4d) → GELU → Linear(4d, d)``.
    """

    def __init__(self, attention: nn.Module, d_model: int):
        super().__init__()
        self.norm_attention = nn.LayerNorm(d_model)
        self.attention = attention
        self.norm_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm_attention(x))
        if torch.is_grad_enabled():
            return x + self.mlp(self.norm_mlp(x))
        return x + self._mlp_without_grad(self.norm_mlp(x))

    def _mlp_without_grad(self, x: torch.Tensor) -> torch.Tensor:
        """``self.mlp(x)`` for sampling and local energies, with its hidden layer (4d wide, the
        largest tensor of a forward pass) written once and updated in place: the bias added
        after the product, not copied into its output first as ``addmm`` does, and the exact
        GELU of `exact_gelu`. Same function, to rounding."""
        expand, _, contract = self.mlp
        hidden = torch.matmul(x, expand.weight.T).add_(expand.bias)
        return contract(exact_gelu(hidden))


def exact_gelu(x: torch.Tensor) -> torch.Tensor:
    """Returns the exact ``GELU(x) = x (1 + erf(x/√2)) / 2`` of ``F.gelu``, without autograd.

    ``F.gelu`` runs its float64 erf unvectorised on CPU (18 ms for 2 M elements against 3.7 ms
    for ``torch.erf``); there the formula is spelled out, ATen's own, in place on one new
    tensor (10 ms). Its float32 kernel is vectorised and kept."""
    if x.dtype != torch.float64 or x.device.type != "cpu":
        return F.gelu(x)
    erf = torch.mul(x, 1 / math.sqrt(2.0)).erf_()
    return erf.add_(1.0).mul_(x).mul_(0.5)


class LogCoshHead(nn.Module):
    """Returns complex ``log ψ = Σ_α log cosh(b_α + w_α · z)`` ``(B,)``, ``z = LN(Σ_patches x)``.

    The output head of Viteritti, Rende & Becca (2023) / Rende et al. (2024): the patch vectors
    are summed (translation invariant on the patch lattice), normalised, and mapped to a complex
    number through a layer of log-cosh units. ``w = w_re + i w_im`` and ``b = b_re + i b_im`` are
    held as four real parameters. Init: ``w ~ N(0, σ²)`` with ``σ = HEAD_INIT_STD``, ``b = 0``,
    so ``log ψ ≈ Σ_α (w_α·z)²/2 = O(n_hidden · d_model · σ²)``: ψ starts close to uniform.

    With ``positive`` only ``w_re`` and ``b_re`` exist: ``log ψ`` is real (its imaginary part
    exactly zero), ``ψ > 0``, for the positive ground state of a stoquastic ``H``.
    """

    def __init__(
        self, d_model: int, n_hidden: int, init_std: float = HEAD_INIT_STD, positive=False
    ):
        super().__init__()
        self.positive = bool(positive)
        self.norm = nn.LayerNorm(d_model)
        self.weight_re = nn.Parameter(init_std * torch.randn(n_hidden, d_model))
        self.bias_re = nn.Parameter(torch.zeros(n_hidden))
        if not self.positive:
            self.weight_im = nn.Parameter(init_std * torch.randn(n_hidden, d_model))
            self.bias_im = nn.Parameter(torch.zeros(n_hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real, imag = self.parts(x)
        return torch.complex(real, torch.zeros_like(real) if imag is None else imag)

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns ``(Re, Im)`` of ``log ψ`` ``(B,)`` each in real arithmetic; ``Im`` is None
        for a positive head."""
        z = self.norm(x.sum(dim=1))  # (batch, d)
        theta_re = F.linear(z, self.weight_re, self.bias_re)  # (batch, hidden)
        if self.positive:
            return log_cosh_parts(theta_re)[0].sum(dim=-1), None
        theta_im = F.linear(z, self.weight_im, self.bias_im)
        real, imag = log_cosh_parts(theta_re, theta_im)
        return real.sum(dim=-1), imag.sum(dim=-1)


class ViT(nn.Module):
    """Returns the complex ``log ψ(x)`` ``(B,)`` of configurations ``x`` ``(B, n_sites)``.

    ``x`` holds spins ``±1`` or occupations ``0..n_max`` as floats, sites row-major. Output is
    complex128 for float64 parameters, complex64 for float32; all parameters are real. Each
    sample is processed on its own (LayerNorm only, no batch statistics).

    Pipeline: patches of ``patch_size`` sites (see ``PatchGrid``) → ``PatchEmbedding`` →
    ``layers`` ``EncoderBlock`` s of factored attention (`attention.FactoredAttention`) →
    ``LogCoshHead`` with ``d_model`` hidden units → ``+ log J(x)`` if ``jastrow`` (with an
    on-site table over ``local_states`` for occupations). With ``translation_invariant`` the
    whole network is invariant under translations of the lattice by whole patches; symmetrize
    for the remaining ones.

    Args:
        lattice_shape: ``(L,)`` or ``(Lx, Ly)`` unit cells.
        patch_size: ``b`` along every axis, or one size per axis (x first); must divide the
            lattice extent.
        d_model: width of the patch vectors.
        heads: attention heads; must divide ``d_model``.
        layers: number of encoder blocks.
        translation_invariant: relative-position attention on the periodic patch lattice.
        embedding: "linear" or "onehot" (over ``local_states``).
        local_states: the values a site can take, for the one-hot embedding.
        jastrow: add the log of a two-body ``Jastrow`` factor.
        pbc: boundary conditions of the Jastrow factor's displacements (one bool, or one
            per axis).
        n_basis: sites per unit cell; a patch holds all sites of its cells.
        head_init_std: std of the head's complex output weights at initialisation.
        positive: a real head, ``ψ(x) > 0`` (see ``LogCoshHead``); the Jastrow factor is real
            already. ``log_derivatives`` then skips the imaginary part.
        sign_sites: bool per site or None; ψ gains a fixed factor −1 per up spin on a marked
            site (``model.sign_prior``), a sign structure the network learns relative to.
    """

    def __init__(
        self,
        lattice_shape: tuple[int, ...],
        patch_size: int | tuple[int, ...] = ModelConfig.patch_size,
        d_model: int = ModelConfig.d_model,
        heads: int = ModelConfig.heads,
        layers: int = ModelConfig.layers,
        translation_invariant: bool = ModelConfig.translation_invariant,
        embedding: str = ModelConfig.embedding,
        local_states: tuple = (-1, 1),
        jastrow: bool = ModelConfig.jastrow,
        pbc: bool = True,
        head_init_std: float = HEAD_INIT_STD,
        positive: bool = ModelConfig.positive,
        n_basis: int = 1,
        sign_sites=None,
    ):
        super().__init__()
        self.positive = bool(positive)
        check_choice("embedding", embedding, EMBEDDINGS)
        d_model = check_positive_int("d_model", d_model)
        heads = check_positive_int("heads", heads)
        check_heads_divide(d_model, heads)
        if isinstance(layers, bool) or int(layers) != layers or layers < 0:
            raise ValueError(f"model.layers={layers!r} must be a non-negative integer")
        self.grid = PatchGrid(lattice_shape, patch_size, n_basis)
        # shifts (x, y) that leave log ψ unchanged on a periodic lattice (all multiples of it)
        self.translation_period = self.grid.patch_extent if translation_invariant else None
        self.embed = PatchEmbedding(self.grid.patch_len, d_model, embedding, tuple(local_states))
        self.blocks = nn.ModuleList(
            EncoderBlock(
                FactoredAttention(self.grid, d_model, heads, translation_invariant), d_model
            )
            for _ in range(int(layers))
        )
        if not head_init_std > 0:
            raise ValueError(f"head_init_std={head_init_std!r} must be > 0")
        self.head = LogCoshHead(
            d_model, n_hidden=d_model, init_std=float(head_init_std), positive=self.positive
        )
        # numbers in a configuration's largest activation, the MLP's hidden layer
        # (`_rows_per_pass`)
        self._activation_width = self.grid.n_patches * 4 * d_model
        self.jastrow = None
        if jastrow:
            # occupations (more than two values): a free on-site table u(n), see ``Jastrow``;
            # two-valued sites keep g x², since any Σ_i u(x_i) is then fixed by N or S^z
            table = tuple(local_states) if len(local_states) > 2 else None
            self.jastrow = Jastrow(lattice_shape, pbc, local_states=table, n_basis=n_basis)
        if sign_sites is not None:
            if self.positive:
                raise ValueError("model.sign_prior needs a complex head: set model.positive=false")
            sign_sites = torch.as_tensor(sign_sites, dtype=torch.float64)
        self.register_buffer("sign_sites", sign_sites, persistent=False)
        # the single pass without gradients under torch.compile (`compiled.compile_passes`,
        # sampler.compile): ``x -> log ψ``, or None for the eager `_log_psi`
        self.compiled = None
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.head.weight_re.dtype)
        if torch.is_grad_enabled():
            return self._log_psi(x)
        single_pass = self._log_psi if self.compiled is None else self.compiled
        if x.device.type != "cpu":
            return single_pass(x)
        rows = self._rows_per_pass(x)
        if x.shape[0] <= rows:
            return single_pass(x)
        return torch.cat([single_pass(part) for part in x.split(rows)])

    def _rows_per_pass(self, x: torch.Tensor) -> int:
        """Configurations per forward pass without gradients on CPU: as many as keep the
        largest activation (the MLP's hidden layer) near
        ``ACTIVATION_BYTES``. A GPU takes the whole batch."""
        row_bytes = self._activation_width * x.element_size()
        return max(MIN_ROWS_PER_PASS, ACTIVATION_BYTES // row_bytes)

    def _log_psi(self, x: torch.Tensor) -> torch.Tensor:
        # the head and the Jastrow factor are called as modules: `row_gradients` records
        # their outputs through forward hooks
        log_psi = self.head(self._trunk(x))
        if self.jastrow is not None:
            log_psi = log_psi + self.jastrow(x)
        if self.sign_sites is not None:
            log_psi = torch.complex(log_psi.real, log_psi.imag + self._sign_phase(x))
        return log_psi

    has_parts = True  # `log_psi_parts` in real arithmetic (compiled sweeps, `Symmetrized`)

    def log_psi_parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(Re, Im)`` of `_log_psi` ``(B,)`` each, in real arithmetic only (what
        ``torch.compile`` fuses, `compiled.py`)."""
        real, imag = self.head.parts(self._trunk(x))
        if imag is None:
            imag = torch.zeros_like(real)
        if self.jastrow is not None:
            real = real + self.jastrow.log_amplitude(x)
        if self.sign_sites is not None:
            imag = imag + self._sign_phase(x)
        return real, imag

    def _trunk(self, x: torch.Tensor) -> torch.Tensor:
        """Returns the patch vectors ``(batch, patch, d_model)`` after the encoder blocks."""
        h = self.embed(self.grid.split(x))
        for block in self.blocks:
            h = block(h)
        return h

    def _sign_phase(self, x: torch.Tensor) -> torch.Tensor:
        """Returns the sign prior's phase ``(B,)``: π per up spin on a marked site (mod 2π)."""
        ups = torch.matmul((x > 0).to(x.dtype), self.sign_sites)
        return math.pi * ups.remainder(2.0)
