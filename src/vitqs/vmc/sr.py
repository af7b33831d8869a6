"""Stochastic reconfiguration: log-derivatives and the SR and minSR solves.

Pure tensor functions except `log_derivatives` and the parameter-vector helpers, which
read a model. Parameters θ are real; ``log ψ`` is complex. With ``O_k(x) = ∂ log ψ(x)/∂θ_k``,
weights ``p(x)`` (``1/N_s`` for Monte Carlo samples, ``|ψ|²/Σ|ψ|²`` for the full sum),
``⟨·⟩ = Σ_x p(x) ·``, centred ``Ō = O − ⟨O⟩`` and ``ε = E_loc − ⟨E_loc⟩``:

    S = Re⟨Ō† Ō⟩,    F = Re⟨Ō† ε⟩,    δθ = −η (S + λ I)⁻¹ F.

The energy gradient with respect to real θ is ``∂E/∂θ = 2F``; SR absorbs the 2 into η
(``δθ = −η S⁻¹F`` is an imaginary-time step ``dτ = η``; plain gradient descent at rate η/2
follows ``−2F``). Adam (`optimizers`) is fed the true gradient ``2F``.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch.func import functional_call, jacrev, vmap

from vitqs.config import NATURAL_GRADIENTS
from vitqs.distributed import gather_rows, rank, reduce_sum, total_count, world_size
from vitqs.models import row_gradients
from vitqs.vmc.estimators import sample_mean


# ------------------------------------------------------------------ parameters
def trainable_parameters(model) -> dict[str, torch.Tensor]:
    """Returns the model's trainable parameters by name, in ``named_parameters`` order."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def parameter_vector(model) -> torch.Tensor:
    """Returns the trainable parameters flattened into one vector ``(P,)`` (a detached copy)."""
    return torch.cat([p.detach().reshape(-1) for p in trainable_parameters(model).values()]).clone()


@torch.no_grad()
def set_parameter_vector(model, vector: torch.Tensor):
    """Writes a vector ``(P,)`` (from `parameter_vector` order) into the trainable parameters."""
    start = 0
    for p in trainable_parameters(model).values():
        p.copy_(vector[start : start + p.numel()].reshape(p.shape).to(p.dtype))
        start += p.numel()


# ------------------------------------------------------------- log-derivatives
JACOBIAN_ROUTES = ("auto", "rows", "per_sample")


def log_derivatives(
    model, x: torch.Tensor, chunk_size: int | None = None, route: str = "auto", compiled=None
) -> torch.Tensor:
    """Returns ``O_k(x) = ∂ log ψ(x)/∂θ_k`` as complex128 ``(N_s, P)``, or float64 for a
    model with ``positive`` set (real ``log ψ``: its imaginary part is zero, not computed).

    Two exact routes, columns in `parameter_vector` order:

    - ``rows``: the network once on the batch, one backward pass per part of ``log ψ``, and
      each parameter's gradient per sample from what its layer saw
      (`models.row_gradients`): a ViT and its symmetry averages;
    - ``per_sample``: one ``jacrev`` per sample of the real and imaginary parts of ``log ψ``,
      vectorised over samples with ``vmap``: any ``vmap``-compatible model.

    ``auto`` takes ``rows`` where it covers the model, else ``per_sample``.

    Args:
        model: ``(B, N) -> log ψ (B,)`` with real parameters.
        x: configurations ``(N_s, N)``.
        chunk_size: samples per call; None for all at once.
        route: "auto", "rows" (an error for a model it does not cover) or "per_sample".
        compiled: a `models.compiled.CompiledJacobian` of ``model`` (a bare ViT of complex
            log ψ): each chunk goes through its graph, padded to ``chunk_size`` rows (one
            shape for every call); where its compiler failed, the route above. None: the
            route above.
    """
    if route not in JACOBIAN_ROUTES:
        raise ValueError(f"route={route!r} is not one of {list(JACOBIAN_ROUTES)}")
    if compiled is not None and not compiled.failed:
        jac = _compiled_log_derivatives(compiled, x, chunk_size or x.shape[0])
        if jac is not None:
            return jac
    by_rows = route != "per_sample" and row_gradients.covers(model)
    if route == "rows" and not by_rows:
        raise ValueError(f"the rows route does not cover {type(model).__name__}")
    params = {name: p.detach() for name, p in trainable_parameters(model).items()}
    buffers = dict(model.named_buffers())
    positive = bool(getattr(model, "positive", False))

    def log_psi_parts(params, x_one):  # (N,) -> (2,): Re and Im of log ψ; (1,) if positive
        out = functional_call(model, (params, buffers), (x_one.unsqueeze(0),))[0]
        if positive:
            return out.real.unsqueeze(0)
        imag = out.imag if out.is_complex() else torch.zeros_like(out)
        return torch.stack([out.real, imag])

    jacobian = vmap(jacrev(log_psi_parts), in_dims=(None, 0))
    step = x.shape[0] if chunk_size is None else chunk_size
    n_params = sum(p.numel() for p in params.values())
    dtype = torch.float64 if positive else torch.complex128
    out = torch.empty((x.shape[0], n_params), dtype=dtype, device=x.device)
    # (N_s, P, parts): Re (and Im) side by side; each block is copied in once
    parts = out[..., None] if positive else torch.view_as_real(out)
    for start in range(0, x.shape[0], step):
        chunk = x[start : start + step]
        rows_out = parts[start : start + len(chunk)]
        if by_rows and row_gradients.row_log_derivatives(model, chunk, rows_out):
            continue
        jac = jacobian(params, chunk)  # name -> (B, parts, *shape)
        column = 0
        for j in jac.values():
            block = rearrange(j, "batch part ... -> batch (...) part")  # (B, n, parts)
            rows = parts[start : start + block.shape[0], column : column + block.shape[1]]
            rows.copy_(block)
            column += block.shape[1]
    return out


def _compiled_log_derivatives(compiled, x: torch.Tensor, step: int) -> torch.Tensor | None:
    """Returns `log_derivatives` through ``compiled`` in chunks of ``step`` rows (the last
    one padded), or None if its compiler failed."""
    blocks = []
    for start in range(0, x.shape[0], step):
        block = compiled(x[start : start + step], step)  # (B, P, 2)
        if block is None:
            return None
        blocks.append(block)
    return torch.view_as_complex(torch.cat(blocks).contiguous())


# ------------------------------------------------------------------ SR solves
_VOID_WEIGHT = 1e-30  # exact weights below this are rounding residues of ψ = 0


def _weights_or_uniform(n_samples: int, weights, device) -> torch.Tensor:
    if weights is not None:
        return weights.reshape(-1).to(torch.float64)
    count = reduce_sum(torch.tensor(float(n_samples), dtype=torch.float64, device=device))
    return torch.full((n_samples,), 1.0, dtype=torch.float64, device=device) / count


def _scaled_centred(jac, e_loc, weights):
    """Returns ``X = [Re Ō; Im Ō] √p`` ``(2N_s, P)`` and ``e = [Re ε; Im ε] √p`` ``(2N_s,)``.

    For real log-derivatives (a positive ψ) the ``Im Ō`` rows are zero and are left out:
    ``X = Ō √p`` ``(N_s, P)``, ``e = Re ε √p``. S, F and both solves are unchanged (a zero
    row of X adds nothing to ``XᵀX`` or ``Xᵀe``, and ``Xᵀ(XXᵀ + λ)⁻¹e`` never reads the
    matching entry of e), at a quarter of the minSR kernel's cost.
    """
    n_samples = jac.shape[0]
    e_loc = e_loc.reshape(-1).to(torch.complex128)
    p = _weights_or_uniform(n_samples, weights, jac.device)
    flat_w = None if weights is None else p
    if weights is not None:
        # Where the symmetry makes ψ = 0 (an odd spin-inversion projection on a state that a
        # translation maps to its inverse), rounding leaves |ψ|² ~ 1e-36 or 0 and
        # log-derivatives that are not finite. Such a state weighs nothing: drop its row.
        # (only the rows of negligible weight are scanned: this runs on every full-sum step)
        tiny = torch.nonzero(p < _VOID_WEIGHT).reshape(-1)
        void = tiny[~torch.isfinite(jac[tiny]).all(dim=1)]
        if len(void):
            jac = jac.clone()
            jac[void] = 0
    parts = [jac.real, jac.imag] if jac.is_complex() else [jac]
    sqrt_p = p.sqrt()[:, None]
    # real arithmetic written straight into X: no complex temporaries of the (N_s, P) size
    X = torch.empty((len(parts) * n_samples, jac.shape[1]), dtype=torch.float64, device=jac.device)
    for k, part in enumerate(parts):
        part = part.to(torch.float64)
        rows = X[k * n_samples : (k + 1) * n_samples]
        torch.sub(part, sample_mean(part, flat_w), out=rows)
        rows.mul_(sqrt_p)
    eps = (e_loc - sample_mean(e_loc, flat_w)) * sqrt_p[:, 0]  # (N_s,)
    e = torch.cat([eps.real, eps.imag][: len(parts)])
    return X, e


def gram(X: torch.Tensor, *, rows: bool) -> torch.Tensor:
    """Returns ``X Xᵀ`` (``rows=True``, ``(R, R)``) or ``Xᵀ X`` (``(P, P)``) of ``X`` ``(R, P)``.

    Symmetric by construction: the upper triangle of `_gram_upper`, mirrored.
    """
    upper = _gram_upper(X, rows=rows)
    return upper.triu() + upper.triu(1).T


def _gram_upper(
    X: torch.Tensor, *, rows: bool, n_blocks: int = 8, row_range: tuple[int, int] | None = None
) -> torch.Tensor:
    """Returns a matrix whose upper triangle is that of ``X Xᵀ`` (or ``Xᵀ X``); finite below.

    A symmetric rank-k product by blocks: block row ``i`` of the result is ``A_i Aᵀ_{≥i}``
    for ``n_blocks`` strips ``A_i`` of ``A = X`` (or ``Xᵀ``), so ``(n_blocks + 1) / 2n_blocks``
    of the multiply-adds of a full product (56 % for 8 blocks; BLAS ``syrk`` would be 50 %
    but torch does not expose it). Each strip is one torch matmul: any device, torch's own
    thread count, no copies (strips of ``Xᵀ`` are strided views). With ``row_range =
    (first, last)`` only those rows of the result ``(last − first, n)`` are computed.
    """
    A = X if rows else X.T  # (n, k): the result is A Aᵀ
    n = A.shape[0]
    first, last = (0, n) if row_range is None else row_range
    out = torch.zeros((last - first, n), dtype=X.dtype, device=X.device)
    edges = [first + (last - first) * i // n_blocks for i in range(n_blocks + 1)]
    for start, stop in zip(edges[:-1], edges[1:], strict=True):
        if stop > start:
            torch.mm(A[start:stop], A[start:].T, out=out[start - first : stop - first, start:])
    return out


def force(jac, e_loc, weights=None) -> torch.Tensor:
    """Returns ``F = Re⟨Ō† ε⟩`` ``(P,)`` float64; the energy gradient is ``2F``."""
    X, e = _scaled_centred(jac, e_loc, weights)
    return reduce_sum(X.T @ e)


def natural_gradient(
    jac: torch.Tensor,
    e_loc: torch.Tensor,
    *,
    diag_shift: float,
    weights: torch.Tensor | None = None,
    method: str = "auto",
    momentum: float = 0.0,
    previous: torch.Tensor | None = None,
) -> torch.Tensor:
    """Returns ``g = (S + λI)⁻¹ F`` ``(P,)`` float64; apply ``θ ← θ − η g``.

    With ``momentum`` μ > 0 and the ``previous`` step's direction ``g₋`` this is SPRING
    (Goldshlager, Abrahamsen & Lin, J. Comput. Phys. 2024): ``g`` minimises
    ``|X g − e|² + λ |g − μ g₋|²`` instead of ``|X g − e|² + λ |g|²``, i.e.
    ``g = (S + λI)⁻¹ (F + λ μ g₋)`` = ``μ g₋ + Xᵀ (XXᵀ + λ)⁻¹ (e − μ X g₋)``: the part of the
    last direction the new samples do not determine is kept instead of shrunk to zero, which
    averages the sampling noise of the directions the samples barely see over steps.

    Two identical forms (push-through identity ``(XᵀX + λ)⁻¹Xᵀ = Xᵀ(XXᵀ + λ)⁻¹``), with
    ``X = [Re Ō; Im Ō] √p`` ``(2N_s, P)`` and ``e = [Re ε; Im ε] √p`` so that ``S = XᵀX`` and
    ``F = Xᵀe`` (``√p = 1/√N_s`` for Monte Carlo samples):

    - ``sr``: ``g = (XᵀX + λI_P)⁻¹ Xᵀe``, a ``P × P`` solve;
    - ``minsr`` (kernel / NTK form; Chen & Heyl, Nat. Phys. 2024; Rende et al., Commun.
      Phys. 2024): ``g = Xᵀ (XXᵀ + λI_{2N_s})⁻¹ e``, a ``2N_s × 2N_s`` solve;
    - ``auto``: the smaller of the two.

    Solved to float64 accuracy: from `MIXED_SOLVE_FROM` rows of the Gram matrix on, a
    Cholesky factor of the float32 Gram matrix refined with float64 residuals (`solve_gram`);
    below it, and where the refinement does not converge, the float64 Gram matrix by
    Cholesky, falling back to an eigendecomposition pseudo-inverse when the shifted matrix is
    not numerically positive definite (e.g. ``λ = 0``). Multi-rank solves use the float64
    Gram matrix.

    Across ``torch.distributed`` ranks (each holding its own samples), ``sr`` sums ``S`` and
    ``F`` over ranks, and ``minsr`` builds the kernel from every rank's rows of ``X`` (each
    rank computing an equal-work strip of its upper triangle); both give every rank the
    update of all samples.

    Args:
        jac: log-derivatives ``(N_s, P)`` complex.
        e_loc: local energies ``(N_s,)`` complex.
        diag_shift: λ ≥ 0.
        weights: ``(N_s,)`` exact weights summing to 1, or None for ``1/N_s``.
        method: ``auto`` | ``sr`` | ``minsr``.
    """
    method = chosen_solve(method, jac)
    X, e = _scaled_centred(jac, e_loc, weights)
    anchor = None if previous is None or momentum == 0 else momentum * previous.to(X)
    if method == "sr":
        F = reduce_sum(X.T @ e)
        F = F if anchor is None else F + diag_shift * anchor
        if world_size() == 1:
            return _solve(X, F, diag_shift, rows=False)
        return solve_shifted(reduce_sum(_gram_upper(X, rows=False)), F, diag_shift)
    if anchor is not None:
        e = e - X @ anchor  # each rank its own rows
    if world_size() == 1:
        g = X.T @ _solve(X, e, diag_shift, rows=True)
    else:
        g = _distributed_minsr(X, e, diag_shift)
    return g if anchor is None else g + anchor


# Mixed-precision solve: the Gram matrix, the O(N_s² P) (minSR) or O(N_s P²) (SR) part of a
# step, in float32 (twice the multiply-adds per second of float64 on a CPU's vector units),
# then iterative refinement whose residuals use X itself in float64: a few matrix-vector
# products of O(N_s P) each bring the solution to the float64 solve's own accuracy.
_REFINED = 1e-12  # |δ| / |y| at which the refinement stops
_STALLED = 1e-9  # a refinement that stops shrinking above this falls back to float64
_REFINE_STEPS = 30


# The Gram matrix's side (2 N_s rows for minSR, P for SR) from which the float32 product and
# its refinement beat the float64 product: their own calls (the float32 copy of X, a
# factor-solve and two products a refinement step, a sync to test it) cost more than half a
# small product saves. Measured on one and two threads (float32 over float64 solve time, X
# of 460-6,000 columns): 1.5-2.1x at 64-128 rows, 1.1-1.4x at 256, 0.95-1.14x at 384,
# 0.76-0.94x at 512, 0.69-0.82x at 768-2,048 (results/history/performance_notes.md,
# 2026-12-08).
MIXED_SOLVE_FROM = 512


def _solve(X: torch.Tensor, b: torch.Tensor, diag_shift: float, *, rows: bool) -> torch.Tensor:
    """Returns ``(A + λI)⁻¹ b`` for ``A = X Xᵀ`` (``rows=True``) or ``Xᵀ X``: `solve_gram` from
    `MIXED_SOLVE_FROM` rows of ``A`` on, the float64 Gram matrix below."""
    if (X.shape[0] if rows else X.shape[1]) >= MIXED_SOLVE_FROM:
        return solve_gram(X, b, diag_shift, rows=rows)
    return solve_shifted(_gram_upper(X, rows=rows), b, diag_shift)


def solve_gram(X: torch.Tensor, b: torch.Tensor, diag_shift: float, *, rows: bool) -> torch.Tensor:
    """Returns ``(A + λI)⁻¹ b`` for ``A = X Xᵀ`` (``rows=True``) or ``Xᵀ X``, float64.

    The factorisation is of the float32 Gram matrix; the float64 residual ``b − (A + λ) y``
    (computed as ``X (Xᵀ y)``, never forming ``A`` in float64) is solved again with it until
    the correction is below ``1e-12 |y|``. Where that does not converge — ``λ`` so small
    against ``A`` that float32 cannot resolve it (condition ≳ 1e7), or a float32 Gram matrix
    that is not positive definite — the float64 Gram matrix is solved as before
    (`solve_shifted`), so the result is always the float64 one to its own rounding.
    """
    b = b.to(torch.float64)
    low = _gram_upper(X.to(torch.float32), rows=rows)
    low.diagonal().add_(diag_shift)
    factor, info = torch.linalg.cholesky_ex(low, upper=True)
    finite = bool(torch.isfinite(low.diagonal()).all() and torch.isfinite(b).all())
    if finite and int(info) == 0:
        y = _refined(X, b, diag_shift, factor, rows)
        if y is not None:
            return y
    return solve_shifted(_gram_upper(X, rows=rows), b, diag_shift)


def _refined(X, b, diag_shift, factor, rows) -> torch.Tensor | None:
    """Returns the refined solution, or None when the refinement does not converge."""

    def shifted_gram_times(y):  # (A + λ) y in float64
        return (X @ (X.T @ y) if rows else X.T @ (X @ y)) + diag_shift * y

    y, residual, last = torch.zeros_like(b), b, math.inf
    for _ in range(_REFINE_STEPS):
        step = torch.cholesky_solve(residual.to(factor)[:, None], factor, upper=True)[:, 0]
        y = y + step.to(torch.float64)
        change = float(step.norm()) / max(float(y.norm()), 1e-300)
        if change <= _REFINED:
            return y
        if change > 0.5 * last:  # no longer shrinking: converged to rounding, or diverging
            return y if change <= _STALLED else None
        last = change
        residual = b - shifted_gram_times(y)
    return None


def chosen_solve(method: str, jac: torch.Tensor) -> str:
    """Returns the solve `natural_gradient` runs for ``method`` (one of
    `config.NATURAL_GRADIENTS`) on log-derivatives ``jac`` ``(N_s, P)``: ``auto`` takes
    ``minsr`` when ``X`` has fewer rows than parameters (``2 N_s`` rows over all ranks, ``N_s``
    for the real log-derivatives of a positive ψ, distinct samples counted once)."""
    if method not in NATURAL_GRADIENTS:
        raise ValueError(
            f"method={method!r} is not a natural gradient; choose one of: "
            f"{' | '.join(NATURAL_GRADIENTS)}"
        )
    if method != "auto":
        return method
    n_rows = (2 if jac.is_complex() else 1) * jac.shape[0]
    # every rank must take the same branch
    return "minsr" if total_count(n_rows, jac.device) < jac.shape[1] else "sr"


def _distributed_minsr(X: torch.Tensor, e: torch.Tensor, diag_shift: float) -> torch.Tensor:
    """Returns ``Xᵀ (XXᵀ + λ)⁻¹ e`` for rows of ``X`` and ``e`` spread over ranks.

    The kernel couples every pair of samples, so every rank gathers all rows; each then
    computes one strip of the kernel's upper triangle, the strips holding equal numbers of
    multiply-adds (`_strip_edges`), and every rank solves the gathered kernel.
    """
    X_all, e_all = gather_rows(X), gather_rows(e)  # (N, P), (N,)
    n_rows = X_all.shape[0]
    strip = _strip_edges(n_rows, world_size())[rank() : rank() + 2]
    upper = _gram_upper(X_all, rows=True, row_range=tuple(strip))  # this rank's rows
    kernel = gather_rows(upper)  # (N, N): its upper triangle, all solve_shifted reads
    return X_all.T @ solve_shifted(kernel, e_all, diag_shift)


def _strip_edges(n_rows: int, n_strips: int) -> list[int]:
    """Returns row edges of ``K = n_strips`` strips of an ``n × n`` upper triangle holding
    equal areas: the rows above row ``a`` hold ``n² (1 − (1 − a/n)²)/2`` of its entries, a
    fraction ``i/K`` of them at ``a = n (1 − √(1 − i/K))``."""
    edges = [round(n_rows * (1 - math.sqrt(1 - i / n_strips))) for i in range(n_strips)]
    return [*edges, n_rows]


def solve_shifted(A: torch.Tensor, b: torch.Tensor, diag_shift: float) -> torch.Tensor:
    """Returns ``(A + λI)⁻¹ b`` for symmetric positive semi-definite ``A``, in float64.

    Only the upper triangle of ``A`` is read (what BLAS ``syrk`` fills). A system with a
    non-finite entry, or one ``eigh`` cannot diagonalize, has a NaN solution: the VMC loop's
    guard then retries the step, where a raised LinAlgError would end the run.
    """
    shifted = A.to(torch.float64, copy=True)
    b = b.to(torch.float64)
    # a NaN or inf in a log-derivative reaches its diagonal entry Σ|O_k|² (and the lower
    # triangle need not be set): the diagonal and b tell, without a P×P mask
    if not bool(torch.isfinite(shifted.diagonal()).all() and torch.isfinite(b).all()):
        return torch.full_like(b, math.nan)
    shifted.diagonal().add_(diag_shift)
    factor, info = torch.linalg.cholesky_ex(shifted, upper=True)
    if int(info) == 0:
        return torch.cholesky_solve(b[:, None], factor, upper=True)[:, 0]
    try:
        evals, evecs = torch.linalg.eigh(shifted, UPLO="U")
    except torch.linalg.LinAlgError:  # eigh did not converge
        return torch.full_like(b, math.nan)
    cutoff = evals.abs().max() * shifted.shape[0] * torch.finfo(torch.float64).eps
    inverse = torch.where(evals.abs() > cutoff, 1 / evals, torch.zeros_like(evals))
    return evecs @ (inverse * (evecs.T @ b))


def energy_gradient(jac, e_loc, weights=None) -> torch.Tensor:
    """Returns ``∂E/∂θ = 2F`` ``(P,)`` float64, the gradient a plain optimizer follows."""
    return 2 * force(jac, e_loc, weights)
