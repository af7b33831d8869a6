"""Per-sample log-derivatives of a ViT, or of its symmetry averages, from one backward pass
per part of log ψ.

``vmap(jacrev)`` differentiates every sample on its own, each op of the forward and backward
pass going through the batching layer. Here the network runs once on the whole batch, as in
training any network, and one backward
pass of ``Σ_s Re log ψ(s)`` (and one of ``Σ_s Im log ψ(s)``) gives the gradient at the output
of every layer. Since each sample's log ψ depends on that sample alone, the gradient at a
layer's output, row by row, is the gradient of that row's own log ψ; and every parameter of
the ViT enters through an op whose gradient is a product of that output gradient ``g`` with
what the forward pass saw:

- a ``Linear`` layer ``y = a Wᵀ + b``: ``∂/∂W = Σ_t g_t ⊗ a_t``, ``∂/∂b = Σ_t g_t``;
- a ``LayerNorm`` ``y = γ x̂ + β``: ``∂/∂γ = Σ_t g_t x̂_t``, ``∂/∂β = Σ_t g_t``;
- the factored attention's weights ``out_i = Σ_j α_ij v_j``: ``∂/∂α_ij = g_i · v_j`` per head,
  summed over the displacements a translation-invariant table ties together;
- the log-cosh head's four weights and biases: ``g ⊗ z`` with ``g`` the gradient at its
  pre-activations, from the head's own function on the recorded ``z``;
- a Jastrow factor, linear in its couplings: forward-mode derivatives of the factor alone.

The sums run over a sample's tokens and, under a symmetry average (`Symmetrized`, which
passes a sample's copies to the network as consecutive rows), over its copies. The result is
exactly the Jacobian of ``vmap(jacrev)`` (equal to rounding, `tests/models/test_row_gradients.py`),
at the cost of one batched forward and two batched backward passes: 1.04-1.25x faster than
``vmap(jacrev)`` on one core (results/history/performance_notes.md), since that arithmetic,
not the batching layer, is most of the cost.

`row_log_derivatives` returns False for a model it does not cover (a bare Jastrow, any
parameter it does not recognise); the caller then differentiates sample by sample.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, jacfwd
from torch.nn import functional as F

from vitqs.models.attention import FactoredAttention
from vitqs.models.jastrow import Jastrow
from vitqs.models.symmetrize import Symmetrized
from vitqs.models.vit import LogCoshHead, ViT, log_cosh_parts


class _NotCovered(Exception):
    """The network ran in a way the recorded products do not describe (a layer called twice)."""


def covers(model: nn.Module) -> bool:
    """Returns whether `row_log_derivatives` computes every trainable parameter's column."""
    return _covered_plan(model) is not None


def _covered_plan(model: nn.Module) -> tuple[ViT, _Plan] | None:
    """Returns the bare ViT of ``model`` and its plan, or None where the plan misses a
    trainable parameter of ``model`` (or there is no ViT)."""
    vit = _bare_vit(model)
    if vit is None:
        return None
    plan = _plan(vit)
    if not all(id(p) in plan.handled for p in model.parameters() if p.requires_grad):
        return None
    return vit, plan


def _bare_vit(model: nn.Module) -> ViT | None:
    """Returns the ViT under any number of `Symmetrized` averages, or None for another model."""
    while isinstance(model, Symmetrized):
        model = model.model
    return model if isinstance(model, ViT) else None


@dataclass(frozen=True)
class _Plan:
    """What `row_log_derivatives` reads of a ViT: the layers to record, the factored
    attentions, and the ids of the parameters it differentiates."""

    recorded: tuple[nn.Module, ...]
    attentions: tuple[FactoredAttention, ...]
    handled: frozenset[int]
    parameters: tuple[int, ...]  # ids of all the ViT's parameters, to tell a stale plan


# one plan per network: working it out walks every module, a cost the 6-site test
# networks' Jacobian (~2 ms) would notice at every step
_PLANS: weakref.WeakKeyDictionary[ViT, _Plan] = weakref.WeakKeyDictionary()


def _plan(vit: ViT) -> _Plan:
    ids = tuple(id(p) for p in vit.parameters())
    plan = _PLANS.get(vit)
    if plan is None or plan.parameters != ids:
        plan = _PLANS[vit] = _make_plan(vit, ids)
    return plan


def _make_plan(vit: ViT, ids: tuple[int, ...]) -> _Plan:
    recorded, attentions, params = [], [], []
    for module in vit.modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm)):
            params += [p for p in (module.weight, module.bias) if p is not None]
        elif isinstance(module, FactoredAttention):
            attentions.append(module)
            params.append(_attention_parameter(module))
        elif isinstance(module, LogCoshHead):
            params += [module.weight_re, module.bias_re]
            if not module.positive:
                params += [module.weight_im, module.bias_im]
        elif isinstance(module, Jastrow):
            params += list(module.parameters())
        if isinstance(module, (nn.Linear, nn.LayerNorm, LogCoshHead, Jastrow)):
            recorded.append(module)
    handled = frozenset(id(p) for p in params)
    return _Plan(tuple(recorded), tuple(attentions), handled, ids)


class _Tape:
    """Records, during one forward pass, the input and output of every layer whose parameters
    `row_log_derivatives` differentiates (forward hooks on the bare ViT's modules)."""

    def __init__(self, modules):
        self.records: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
        self.handles = [module.register_forward_hook(self._record) for module in modules]

    def _record(self, module, inputs, output):
        if module in self.records:
            raise _NotCovered(f"{type(module).__name__} ran twice in one forward pass")
        self.records[module] = (inputs[0], output)

    def close(self):
        for handle in self.handles:
            handle.remove()


def row_log_derivatives(model: nn.Module, x: torch.Tensor, parts_out: torch.Tensor) -> bool:
    """Writes ``O_k(x) = ∂ log ψ(x)/∂θ_k`` into ``parts_out`` ``(N_s, P, parts)``: ``Re O`` and
    ``Im O`` side by side (``Re O`` alone for a ``positive`` model, whose log ψ is real), columns
    in `sr.parameter_vector` order. Returns False, having written nothing, where the model is
    not `covers`-ed.

    Args:
        model: a `ViT`, or `Symmetrized` averages of one.
        x: configurations ``(N_s, N)``.
        parts_out: ``(N_s, P, 2)`` (``(N_s, P, 1)`` for a positive model), e.g.
            ``torch.view_as_real`` of a complex ``(N_s, P)`` tensor.
    """
    covered = _covered_plan(model)
    if covered is None:
        return False
    vit, plan = covered
    n_samples = x.shape[0]
    positive = bool(getattr(model, "positive", False))
    stacked = not positive and _stacks_parts(model, x)
    tape = _Tape(plan.recorded)
    try:
        with torch.enable_grad():
            log_psi = model(torch.cat([x, x]) if stacked else x)
    except _NotCovered:
        return False
    finally:
        tape.close()
    records = tape.records
    if stacked:  # Re log ψ of the first copy of the batch, Im log ψ of the second
        objectives = [log_psi.real[:n_samples].sum() + log_psi.imag[n_samples:].sum()]
        targets = [parts_out]
    else:
        parts = [log_psi.real] if positive else [log_psi.real, log_psi.imag]
        objectives = [part.sum() for part in parts]
        targets = [parts_out[..., k : k + 1] for k in range(len(parts))]
    modules = list(records)
    outputs = [records[m][1] for m in modules]
    for k, (objective, target) in enumerate(zip(objectives, targets, strict=True)):
        grads = torch.autograd.grad(
            objective, outputs, retain_graph=k + 1 < len(objectives), allow_unused=True
        )
        at_output = {
            m: torch.zeros_like(out) if g is None else g
            for m, out, g in zip(modules, outputs, grads, strict=True)
        }
        with torch.no_grad():  # products of recorded tensors: no graph of their own
            n_rows = n_samples * target.shape[2]
            per_param = _per_sample(vit, plan, records, at_output, n_rows)
            _write_in_vector_order(model, per_param, target)
    return True


# Below this many sites in a batch (samples × symmetry copies × sites), Re and Im log ψ are
# differentiated in one backward pass over the batch written twice: where per-op cost, not
# arithmetic, is the time, one backward pass and one set of products cost less than two
# (the 6-site test config's Jacobian: 3.6 → 2.3 ms, 18 samples); at 256 samples of the
# 16-site chain the second forward pass's arithmetic cancels the gain (34 ms either way).
STACKED_PARTS_MAX_SITES = 2048


def _stacks_parts(model: nn.Module, x: torch.Tensor) -> bool:
    """Returns whether the batch is small enough to differentiate both parts at once."""
    copies = 1
    while isinstance(model, Symmetrized):
        copies *= model.translations.shape[0] * len(model.flip_sign)
        model = model.model
    return x.shape[0] * copies * x.shape[1] <= STACKED_PARTS_MAX_SITES


def _per_sample(vit: ViT, plan: _Plan, records, at_output, n_samples: int) -> dict:
    """Returns ``id(parameter) → (N_s, *shape)``: each parameter's gradient per sample."""
    grads: dict[int, torch.Tensor] = {}
    for module, (inp, _) in records.items():
        g = at_output[module]
        if isinstance(module, nn.Linear):
            a, g = _by_sample(inp, n_samples), _by_sample(g, n_samples)
            grads[id(module.weight)] = torch.bmm(g.transpose(1, 2), a)  # Σ_t g_t ⊗ a_t
            if module.bias is not None:
                grads[id(module.bias)] = g.sum(dim=1)
        elif isinstance(module, nn.LayerNorm):
            shape = module.normalized_shape
            normed = F.layer_norm(inp.detach(), shape, None, None, module.eps)
            normed, g = _by_sample(normed, n_samples), _by_sample(g, n_samples)
            if module.weight is not None:
                grads[id(module.weight)] = (g * normed).sum(dim=1)
            if module.bias is not None:
                grads[id(module.bias)] = g.sum(dim=1)
        elif isinstance(module, LogCoshHead):
            grads.update(_head(module, records[module.norm][1], g, n_samples))
        elif isinstance(module, Jastrow):
            grads.update(_jastrow(module, inp, g, n_samples))
    for module in plan.attentions:
        grads[id(_attention_parameter(module))] = _attention(module, records, at_output, n_samples)
    return grads


def _by_sample(t: torch.Tensor, n_samples: int) -> torch.Tensor:
    """``(R, ..., F)`` rows of ``N_s`` samples (each sample's copies consecutive) →
    ``(N_s, rows and tokens of a sample, F)``."""
    return t.reshape(n_samples, -1, t.shape[-1])


def _attention_parameter(module: FactoredAttention) -> nn.Parameter:
    return module.alpha if module.relative is None else module.relative.table


def _attention(module: FactoredAttention, records, at_output, n_samples: int) -> torch.Tensor:
    """``∂/∂α^h_ij = Σ_k g^h_ik v^h_jk`` per sample, where ``g`` is the gradient at the heads'
    mixed values (the output projection's input) and ``v`` the values; a translation-invariant
    table sums the entries of each displacement."""
    value = records[module.to_value][1]  # (R, n, d)
    g_mixed = at_output[module.to_out] @ module.to_out.weight.detach()  # (R, n, d)
    rows, n_patches, d_model = value.shape
    heads = module.heads
    shape = (n_samples, rows // n_samples, n_patches, heads, d_model // heads)
    d_alpha = torch.einsum(
        "bcihk,bcjhk->bhij", g_mixed.reshape(shape), value.detach().reshape(shape)
    )
    if module.relative is None:
        return d_alpha
    index = module.relative.index.reshape(-1)
    table = module.relative.table
    out = torch.zeros((n_samples, *table.shape), dtype=d_alpha.dtype, device=d_alpha.device)
    return out.index_add_(2, index, d_alpha.reshape(n_samples, heads, -1))


def _head(head: LogCoshHead, z: torch.Tensor, g_out: torch.Tensor, n_samples: int) -> dict:
    """The head's weights and biases per sample: the gradient at its pre-activations ``θ`` from
    the head's own function (`log_cosh_parts`) on the recorded ``z``, times ``z``."""
    z = z.detach()
    with torch.enable_grad():
        theta_re = F.linear(z, head.weight_re.detach(), head.bias_re.detach()).requires_grad_()
        if head.positive:
            real, _ = log_cosh_parts(theta_re)
            objective = (real.sum(dim=-1) * g_out.real).sum()
            (d_re,) = torch.autograd.grad(objective, [theta_re])
            pairs = [(head.weight_re, head.bias_re, d_re)]
        else:
            theta_im = F.linear(z, head.weight_im.detach(), head.bias_im.detach())
            theta_im.requires_grad_()
            real, imag = log_cosh_parts(theta_re, theta_im)
            objective = (real.sum(dim=-1) * g_out.real + imag.sum(dim=-1) * g_out.imag).sum()
            d_re, d_im = torch.autograd.grad(objective, [theta_re, theta_im])
            pairs = [(head.weight_re, head.bias_re, d_re), (head.weight_im, head.bias_im, d_im)]
    z = z.reshape(n_samples, -1, z.shape[-1])
    grads = {}
    for weight, bias, d_theta in pairs:
        d_theta = d_theta.reshape(n_samples, -1, d_theta.shape[-1])
        grads[id(weight)] = torch.bmm(d_theta.transpose(1, 2), z)
        grads[id(bias)] = d_theta.sum(dim=1)
    return grads


def _jastrow(jastrow: Jastrow, x: torch.Tensor, g_out: torch.Tensor, n_samples: int) -> dict:
    """The Jastrow factor's parameters per sample: its log is real and linear in them, so its
    row-wise derivatives come from forward mode (few parameters), times the gradient at its
    output."""
    params = {name: p.detach() for name, p in jastrow.named_parameters()}
    x = x.detach()

    def log_factor(params):
        return functional_call(jastrow, params, (x,)).real  # (R,)

    derivatives = jacfwd(log_factor)(params)  # name -> (R, *shape)
    weight = g_out.real
    grads = {}
    for name, p in jastrow.named_parameters():
        d = derivatives[name] * weight.reshape(-1, *([1] * p.dim()))
        grads[id(p)] = d.reshape(n_samples, -1, *p.shape).sum(dim=1)
    return grads


def _write_in_vector_order(model: nn.Module, per_param: dict, target: torch.Tensor) -> None:
    """Copies the per-sample gradients, rows ``(parts · N_s, ...)`` part by part, into
    ``target`` ``(N_s, P, parts)`` in `sr.parameter_vector` order."""
    n_samples, _, n_parts = target.shape
    column = 0
    for p in model.parameters():
        if p.requires_grad:
            block = per_param[id(p)].reshape(n_parts, n_samples, -1)  # (parts, N_s, width)
            width = block.shape[2]
            target[:, column : column + width].copy_(block.permute(1, 2, 0))
            column += width
