"""The ViT's single forward pass without gradients under ``torch.compile`` (``sampler.compile``).

Eager PyTorch pays per operator and per intermediate tensor. A 64-site chain's float32 pass
of 128 configurations (d_model 16, 2 layers) is ~30 kernels on 4,096 patch vectors of 16
numbers: LayerNorm over 16 numbers at a time, the factored attention's two layout copies per
layer, GELU on the widest tensor. Inductor fuses them into a few loops: 1.6x on that pass, and
the chains' sampling 1.2-1.7x faster from 12 to 64 sites (results/history/performance_notes.md). The
compiled pass takes the factored attention's unfused form: its cached matrix (`DerivedCache`)
is Python state that dynamo would guard on, recompiling at every parameter update. A float64
pass gains nothing (the 64-site one: 7.0 ms eager and compiled), and the first pass compiles
for 12-22 s; hence a switch, off by default.

Inductor writes no code for complex tensors: the compiled function returns log ψ's real and
imaginary parts (`ViT.log_psi_parts`) and the complex number is formed outside it. The batch
dimension is dynamic (the chains evaluate only their valid proposals, a different number at
each Metropolis step), every other shape static. Parameters are inputs of the compiled graph,
so in-place updates (an optimizer step, a `NetworkCopy` refresh) are seen at the next call.

`CompiledJacobian` below is the other compiled function here: a bare ViT's log-derivatives,
which a run whose chains are compiled takes for a complex log ψ (`vmc.driver.VMC`).
"""

from __future__ import annotations

import functools
import time
import warnings

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from vitqs.errors import first_line
from vitqs.models.vit import ViT

# batches of 0 or 1 configurations run eager: dynamo would specialise the batch size to them
# and compile the pass again for nothing
MIN_COMPILED_ROWS = 2


def _log_psi_parts(network: ViT, x: torch.Tensor):
    return network.log_psi_parts(x)


@functools.cache
def _compiled_parts():
    """One compiled function for every network: its graphs are cached per architecture and
    dtype, and network copies of the same architecture share them. Made at first use:
    ``torch.compile`` imports dynamo and inductor (~2 s)."""
    return torch.compile(_log_psi_parts, dynamic=False)


class CompiledPass:
    """Returns ``log ψ`` ``(B,)`` of a ViT's configurations through the compiled pass: the
    ViT's ``compiled`` single pass (see `compile_passes`).

    ``seconds`` is the wall time of the first call, where dynamo traces and inductor compiles
    (None before it): what the run pays before the compiled pass saves anything. If the
    compiler fails (no C++ compiler, an unsupported platform) a warning names the cause and
    this network's passes run eager from then on.
    """

    def __init__(self, network: ViT):
        self.network = network
        self.seconds: float | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        network = self.network
        if x.shape[0] < MIN_COMPILED_ROWS:
            return network._log_psi(x)
        torch._dynamo.mark_dynamic(x, 0)
        start = time.perf_counter()
        try:
            real, imag = _compiled_parts()(network, x)
        except Exception as err:  # the compiler's failure, whatever its kind: run eager
            network.compiled = None
            warnings.warn(
                f"sampler.compile: torch.compile failed ({first_line(err, 200)}); "
                "the forward passes of this network run eager",
                RuntimeWarning,
                stacklevel=2,
            )
            return network._log_psi(x)
        if self.seconds is None:
            self.seconds = time.perf_counter() - start
        return torch.complex(real, imag)

    def __deepcopy__(self, memo):  # a copy of the network compiles nothing of its own yet
        return None


def compile_seconds(network: torch.nn.Module) -> float:
    """Returns the seconds the first compiled passes of ``network``'s ViTs took (0 for none
    yet, or a network whose compiling failed)."""
    passes = [module.compiled for module in network.modules() if isinstance(module, ViT)]
    return sum(p.seconds or 0.0 for p in passes if p is not None)


def compile_passes(network: torch.nn.Module) -> list[CompiledPass]:
    """Gives every `ViT` in ``network`` (a bare ViT, or the one under a symmetry average) the
    compiled single pass for its forward passes without gradients; returns them. Raises
    ValueError when ``network`` holds no ViT."""
    passes = []
    for module in network.modules():
        if isinstance(module, ViT):
            if module.compiled is None:
                module.compiled = CompiledPass(module)
            passes.append(module.compiled)
    if not passes:
        raise ValueError(
            f"compiled chains compile a ViT's forward pass; {type(network).__name__} holds none"
        )
    return passes


# ---- the log-derivatives ------------------------------------------------------------------


class _LogPsiParts(nn.Module):
    """A ViT as ``x -> (B, 2)``: Re and Im log ψ (real arithmetic only: inductor writes no
    code for complex tensors)."""

    def __init__(self, vit: ViT):
        super().__init__()
        self.vit = vit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real, imag = self.vit.log_psi_parts(x.to(self.vit.head.weight_re.dtype))
        return torch.stack([real, imag], dim=1)


def _jacobian_rows(parts: _LogPsiParts, params, buffers, x: torch.Tensor) -> torch.Tensor:
    """Returns ``∂(Re, Im log ψ)/∂θ`` ``(B, P, 2)``, columns in parameter order."""

    def of_one(params, x_one):
        return functional_call(parts, (params, buffers), (x_one.unsqueeze(0),))[0]

    blocks = vmap(jacrev(of_one), in_dims=(None, 0))(params, x)  # name -> (B, parts, *shape)
    columns = [block.reshape(*block.shape[:2], -1) for block in blocks.values()]
    return torch.cat(columns, dim=2).transpose(1, 2)


@functools.cache
def _compiled_jacobian_rows():
    """One compiled function for every ViT; its graphs are cached per architecture, dtype
    and row count (the C++ wrapper, as the compiled chains')."""
    return torch.compile(_jacobian_rows, dynamic=False, options={"cpp_wrapper": True})


class CompiledJacobian:
    """The log-derivatives ``O_k(x)`` of a bare ViT of complex log ψ through one compiled
    graph of ``vmap(jacrev)``: per sample, as `vmc.sr.log_derivatives`' ``per_sample`` route,
    equal to rounding, without the ~2,800 operator calls a call of the eager routes makes on
    issue 51's small config. Against the eager ``rows`` route (medians, in one process):
    64 samples of the small config 1.6-1.8 against 4.2-5.2 ms (one thread); 1,024 samples
    of the 6x6 recipes' ViT 100-105 against 143-154 ms (two threads). Not for a positive
    ψ: there the rows route makes one backward pass, not two, and took 56 ms against 96 ms
    compiled on the Heisenberg 6x6's 1,024 samples.

    A call's configurations are padded to ``rows`` (repeats of the first), so that every
    call has one shape and the graph compiles once. ``seconds``: the wall time of the first
    call (tracing and compiling); ``failed``: the compiler failed once, and the caller then
    differentiates eager from then on.
    """

    def __init__(self, vit: ViT):
        if vit.positive:
            raise ValueError("a positive ViT's log-derivatives are real: the rows route's")
        self.parts = _LogPsiParts(vit)
        self.seconds: float | None = None
        self.failed = False

    def __call__(self, x: torch.Tensor, rows: int) -> torch.Tensor | None:
        """Returns ``(B, P, 2)`` float64 (Re and Im) for ``x`` ``(B, N)``, ``B ≤ rows``, or
        None if the compiler failed."""
        vit = self.parts.vit
        params = {f"vit.{n}": p.detach() for n, p in vit.named_parameters() if p.requires_grad}
        buffers = {f"vit.{n}": b for n, b in vit.named_buffers()}
        padded = torch.cat([x, x[:1].expand(rows - len(x), -1)]) if len(x) < rows else x
        start = time.perf_counter()
        try:
            jac = _compiled_jacobian_rows()(self.parts, params, buffers, padded)
        except Exception as err:  # the compiler's failure, whatever its kind: eager
            self.failed = True
            warnings.warn(
                f"compiled log-derivatives: torch.compile failed ({first_line(err, 200)}); "
                "they run eager",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        if self.seconds is None:
            self.seconds = time.perf_counter() - start
        return jac[: len(x)]
