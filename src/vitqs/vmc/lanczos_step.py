"""One Lanczos step on a trained state: ``|ψ₁⟩ = (1 + αH)|ψ⟩`` with α minimising the energy.

The step's energy and variance follow from four moments of H in ψ, ``h_k = ⟨ψ|H^k|ψ⟩/⟨ψ|ψ⟩``:
in the basis {ψ, Hψ} the Hamiltonian is ``[[h1, h2], [h2, h3]]`` and the overlap
``[[1, h1], [h1, h2]]``, and ``E₁`` is the lowest root of their generalised eigenproblem,

    (h2 − h1²) E² + (h1 h2 − h3) E + (h1 h3 − h2²) = 0,

never above ``h1`` (Sorella, PRB 64, 024512 (2001); Hu et al., PRB 88, 060402 (2013) lower the
10×10 J1-J2 energy so). Its variance needs ``h4``. By Monte Carlo over samples of ``|ψ|²``
with ``E_L(x) = (Hψ)(x)/ψ(x)`` and ``L₂(x) = (H²ψ)(x)/ψ(x) = Σ_x' H_xx' ψ(x')/ψ(x) E_L(x')``:

    h1 = ⟨E_L⟩,  h2 = ⟨|E_L|²⟩,  h3 = ⟨Re(E_L* L₂)⟩,  h4 = ⟨|L₂|²⟩.

``L₂`` needs the local energies of every connected configuration, that is the connected
configurations of the connected configurations: ``max_conn²`` amplitudes per sample, evaluated
in chunks (each distinct configuration once). The error bars come from the chains: a
jackknife over them (each chain's samples are one block), for ``E₁`` as for ``h1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from vitqs.vmc.estimators import distinct_rows, evaluate_log_psi, local_energy

# connected configurations of the samples handled at once: their own local energies touch
# max_conn times as many
_CONNECTED_PER_CHUNK = 4096


@dataclass
class Moments:
    """``h_k = ⟨ψ|H^k|ψ⟩/⟨ψ|ψ⟩`` for k = 1..4."""

    h1: float
    h2: float
    h3: float
    h4: float

    @property
    def variance(self) -> float:
        return self.h2 - self.h1**2


@dataclass
class LanczosStep:
    """ψ and ψ₁ = (1 + αH)ψ, measured on the same samples.

    Attributes:
        energy, energy_error, variance: of ψ₁ (errors from the chains; 0 for a full sum).
        alpha: the α of ψ₁.
        energy_0, energy_0_error, variance_0: of ψ itself.
        extrapolated: the zero-variance extrapolation of the two, ``E₁ − σ₁² (E₀ − E₁) /
            (σ₀² − σ₁²)``, NaN where the variances do not fall.
        n_samples: samples (or states summed over).
    """

    energy: float
    energy_error: float
    variance: float
    alpha: float
    energy_0: float
    energy_0_error: float
    variance_0: float
    extrapolated: float
    n_samples: int


def step_of(m: Moments) -> tuple[float, float, float]:
    """Returns ``(E₁, σ₁², α)`` of the Lanczos step with moments ``m``; at an eigenstate
    (``h2 = h1²``) ψ₁ is ψ."""
    a, b, c = m.variance, m.h1 * m.h2 - m.h3, m.h1 * m.h3 - m.h2**2
    scale = max(1.0, m.h1**2)
    if a <= 1e-14 * scale:
        return m.h1, max(m.variance, 0.0), 0.0
    discriminant = max(b * b - 4 * a * c, 0.0)
    energy = (-b - math.sqrt(discriminant)) / (2 * a)  # the lower root (a > 0)
    denominator = m.h2 - energy * m.h1
    alpha = -(m.h1 - energy) / denominator if denominator != 0 else 0.0
    norm = 1 + 2 * alpha * m.h1 + alpha**2 * m.h2
    second = (m.h2 + 2 * alpha * m.h3 + alpha**2 * m.h4) / norm
    return energy, max(second - energy**2, 0.0), alpha


def second_local_energy(hamiltonian, model, x, log_psi, chunk_size=None):
    """Returns ``E_L(x)`` and ``L₂(x) = (H²ψ)(x)/ψ(x)`` ``(B,)`` each, complex, for
    configurations ``x`` ``(B, N)`` whose ``log ψ`` ``(B,)`` is known.

    A connected configuration where ψ vanishes (a symmetry projection cancels it) adds
    nothing, whatever its own local energy."""
    e_loc = local_energy(hamiltonian, model, x, log_psi, chunk_size)
    step = max(1, _CONNECTED_PER_CHUNK // hamiltonian.max_conn)
    parts = []
    for start in range(0, x.shape[0], step):
        x_chunk, log_chunk = x[start : start + step], log_psi[start : start + step]
        x_conn, elements = hamiltonian.get_conn_padded(x_chunk)  # (b, K, N), (b, K)
        rows = distinct_rows(x_conn.reshape(-1, x.shape[-1]))
        log_conn = evaluate_log_psi(model, rows.x, chunk_size)
        e_conn = torch.zeros_like(log_conn)
        present = torch.isfinite(log_conn.real)
        e_conn[present] = local_energy(
            hamiltonian, model, rows.x[present], log_conn[present], chunk_size
        ).to(e_conn.dtype)
        ratio = torch.exp(log_conn[rows.inverse].reshape(elements.shape) - log_chunk[:, None])
        terms = elements.to(ratio.dtype) * ratio * e_conn[rows.inverse].reshape(elements.shape)
        parts.append(terms.sum(dim=-1))
    return e_loc, torch.cat(parts)


def moments_of(e_loc: torch.Tensor, l2: torch.Tensor, weights=None) -> Moments:
    """Returns the `Moments` of ``E_L`` and ``L₂`` samples (weighted means with ``weights``,
    summing to 1: a full sum)."""
    e, l2 = e_loc.to(torch.complex128), l2.to(torch.complex128)
    values = torch.stack([e.real, e.abs() ** 2, (e.conj() * l2).real, l2.abs() ** 2])
    if weights is None:
        means = values.mean(dim=-1)
    else:
        means = (values * weights.to(torch.float64)).sum(dim=-1)
    return Moments(*(float(v) for v in means))


def lanczos_step(e_loc, l2, weights=None) -> LanczosStep:
    """Returns ψ's and ψ₁'s energies and variances from ``E_L`` and ``L₂`` of samples
    ``(n_chains, n_per_chain)`` (or of every state with ``weights``); Monte Carlo errors by
    a jackknife over the chains."""
    flat_weights = None if weights is None else weights.reshape(-1)
    whole = moments_of(e_loc.reshape(-1), l2.reshape(-1), flat_weights)
    energy, variance, alpha = step_of(whole)
    errors = {"h1": 0.0, "energy": 0.0}
    if weights is None and e_loc.ndim > 1 and e_loc.shape[0] > 1:
        errors = jackknife_errors(e_loc, l2)
    extrapolated = math.nan
    if whole.variance > variance:
        extrapolated = energy - variance * (whole.h1 - energy) / (whole.variance - variance)
    return LanczosStep(
        energy=energy,
        energy_error=errors["energy"],
        variance=variance,
        alpha=alpha,
        energy_0=whole.h1,
        energy_0_error=errors["h1"],
        variance_0=max(whole.variance, 0.0),
        extrapolated=extrapolated,
        n_samples=int(e_loc.numel()),
    )


def jackknife_errors(e_loc, l2) -> dict[str, float]:
    """Returns the jackknife errors over the chains (the rows of ``(n_chains, n_per_chain)``
    samples, each chain one block) of ``h1``..``h4`` and of the step's ``E₁``."""
    n, count = e_loc.shape[0], e_loc.shape[1]
    e, l2 = e_loc.to(torch.complex128), l2.to(torch.complex128)
    values = torch.stack([e.real, e.abs() ** 2, (e.conj() * l2).real, l2.abs() ** 2], dim=-1)
    sums = values.sum(dim=1)  # (n, 4): each chain's sums
    total = sums.sum(dim=0)
    estimates = []
    for left_out in range(n):
        moments = Moments(*(float(v) for v in (total - sums[left_out]) / ((n - 1) * count)))
        estimates.append([moments.h1, moments.h2, moments.h3, moments.h4, step_of(moments)[0]])
    estimates = np.array(estimates)  # (n, 5)
    spread = np.sqrt((n - 1) / n * ((estimates - estimates.mean(axis=0)) ** 2).sum(axis=0))
    return dict(zip(("h1", "h2", "h3", "h4", "energy"), map(float, spread), strict=True))


def full_sum_moments(hamiltonian, model, chunk_size=None) -> Moments:
    """Returns the `Moments` summed over every state of the sector, from the normalised
    vector ``v`` of ψ and ``w₁ = Hv``, ``w₂ = Hw₁``: ``h1 = ⟨v|w₁⟩``, ``h2 = ⟨w₁|w₁⟩``,
    ``h3 = ⟨w₁|w₂⟩``, ``h4 = ⟨w₂|w₂⟩`` — exact, for the tests and small sectors."""
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    device = next(model.parameters()).device
    with torch.no_grad():
        log_psi = evaluate_log_psi(model, x.to(device), chunk_size).cpu().to(torch.complex128)
    log_psi = log_psi.numpy()
    vector = np.exp(log_psi - log_psi.real.max())
    vector /= np.linalg.norm(vector)
    matrix = hamiltonian.to_sparse()
    w1 = matrix @ vector
    w2 = matrix @ w1
    return Moments(
        float(np.vdot(vector, w1).real),
        float(np.vdot(w1, w1).real),
        float(np.vdot(w1, w2).real),
        float(np.vdot(w2, w2).real),
    )
