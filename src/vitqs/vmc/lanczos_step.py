"""One Lanczos step on a trained state: ``|ψ₁⟩ = (1 + αH)|ψ⟩`` with α minimising the energy.

The step's energy and variance follow from ψ's energy ``E = ⟨H⟩`` and central moments
``c_k = ⟨(H − E)^k⟩`` (k = 2, 3, 4): in the orthonormal basis {ψ, (H − E)ψ/σ}, σ² = c2, the
Hamiltonian is ``E + [[0, σ], [σ, c3/σ²]]``, whose lower eigenvalue

    E₁ = E + t − √(t² + σ²),   t = c3/(2σ²),

is never above ``E`` (Sorella, PRB 64, 024512 (2001); Hu et al., PRB 88, 060402 (2013) lower the
10×10 J1-J2 energy so). Its variance needs ``c4``. By Monte Carlo over samples of ``|ψ|²``
with ``E_L(x) = (Hψ)(x)/ψ(x)`` and ``L₂(x) = (H²ψ)(x)/ψ(x) = Σ_x' H_xx' ψ(x')/ψ(x) E_L(x')``,
``D1 = E_L − E`` and ``D2 = L₂ − 2E E_L + E²``:

    c2 = ⟨|D1|²⟩,  c3 = ⟨Re(D1* D2)⟩,  c4 = ⟨|D2|²⟩.

``L₂`` needs the local energies of every connected configuration, that is the connected
configurations of the connected configurations: ``max_conn²`` amplitudes per sample, evaluated
in chunks (each distinct configuration once). The error bars come from the chains: a
jackknife over them (each chain's samples are one block), for ``E₁`` as for ``E``.
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
    """ψ's energy ``mean = ⟨H⟩`` and central moments ``c_k = ⟨(H − mean)^k⟩``, k = 2..4.

    Central moments, not ``⟨H^k⟩``: near an eigenstate ``⟨H²⟩ − ⟨H⟩²`` is a difference of
    numbers 1e8 times larger than itself (the J1-J2 4×4's trained state), and the step's
    energy from raw moments was off by its own size (2e-7 relative, below the ground state).
    """

    mean: float
    c2: float
    c3: float
    c4: float

    @property
    def variance(self) -> float:
        return self.c2


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
        gain, gain_error: ``E₁ − E₀`` and its error. Both come from the same samples, whose
            fluctuations they share: the difference is known far better than either energy
            (on a trained Heisenberg 6×6 state, 4,096 samples: 1.7e-3 each, the gain to
            6e-5), so a longer measurement of ψ alone plus the gain gives ψ₁'s energy.
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
    gain: float
    gain_error: float


def _central(shift: float, m1: float, m2: float, m3: float, m4: float) -> Moments:
    """Returns the `Moments` from moments ``m_k = ⟨(H − shift)^k⟩`` about a shift near the
    mean (then ``m1`` is small and the conversion loses nothing)."""
    c2 = m2 - m1**2
    c3 = m3 - 3 * m1 * m2 + 2 * m1**3
    c4 = m4 - 4 * m1 * m3 + 6 * m1**2 * m2 - 3 * m1**4
    return Moments(shift + m1, c2, c3, c4)


def step_of(m: Moments) -> tuple[float, float, float]:
    """Returns ``(E₁, σ₁², α)`` of the Lanczos step with moments ``m``.

    In the orthonormal basis ``{ψ, (H − E)ψ/σ}`` H is ``E + [[0, σ], [σ, c3/σ²]]``, so
    ``E₁ = E + t − √(t² + σ²)`` with ``t = c3/(2σ²)``; ``ψ₁ = ψ + (λ/σ²)(H − E)ψ`` with
    ``λ = E₁ − E``, which is ``(1 + αH)ψ`` up to a factor. At an eigenstate ψ₁ is ψ."""
    c2 = m.c2
    if c2 <= 1e-300:
        return m.mean, max(c2, 0.0), 0.0
    t = m.c3 / (2 * c2)
    root = math.sqrt(t * t + c2)
    shift = -c2 / (t + root) if t > 0 else t - root  # the stable form of t − root
    ratio = shift / c2  # ψ₁ = ψ + ratio · (H − E)ψ
    alpha = ratio / (1 - ratio * m.mean) if 1 - ratio * m.mean != 0 else math.inf
    r2 = ratio * ratio * c2  # |ratio (H − E)ψ|²
    second = (c2 + 2 * ratio * m.c3 + ratio * ratio * m.c4) / (1 + r2)
    return m.mean + shift, max(second - shift * shift, 0.0), alpha


def second_local_energy(hamiltonian, model, x, log_psi, chunk_size=None, connected=None):
    """Returns ``E_L(x)`` and ``L₂(x) = (H²ψ)(x)/ψ(x)`` ``(B,)`` each, complex, for
    configurations ``x`` ``(B, N)`` whose ``log ψ`` ``(B,)`` is known.

    ``connected``: the network (``model`` in another dtype, `models.precision.NetworkCopy`)
    that evaluates the connected configurations and theirs, the ``max_conn²`` amplitudes a
    sample that make the cost; None: ``model``. ``E_L(x)`` always comes from ``model``.
    A connected configuration where ψ vanishes (a symmetry projection cancels it) adds
    nothing, whatever its own local energy."""
    e_loc = local_energy(hamiltonian, model, x, log_psi, chunk_size)
    connected = model if connected is None else connected
    step = max(1, _CONNECTED_PER_CHUNK // hamiltonian.max_conn)
    parts = []
    for start in range(0, x.shape[0], step):
        x_chunk, log_chunk = x[start : start + step], log_psi[start : start + step]
        x_conn, elements = hamiltonian.get_conn_padded(x_chunk)  # (b, K, N), (b, K)
        rows = distinct_rows(x_conn.reshape(-1, x.shape[-1]))
        log_conn = evaluate_log_psi(connected, rows.x, chunk_size).to(log_chunk.dtype)
        e_conn = torch.zeros_like(log_conn)
        present = torch.isfinite(log_conn.real)
        e_conn[present] = local_energy(
            hamiltonian, connected, rows.x[present], log_conn[present], chunk_size
        ).to(e_conn.dtype)
        ratio = torch.exp(log_conn[rows.inverse].reshape(elements.shape) - log_chunk[:, None])
        terms = elements.to(ratio.dtype) * ratio * e_conn[rows.inverse].reshape(elements.shape)
        parts.append(terms.sum(dim=-1))
    return e_loc, torch.cat(parts)


def _powers(e_loc, l2, shift: float) -> torch.Tensor:
    """Returns per sample ``(H − s)ψ/ψ`` and ``(H − s)²ψ/ψ`` powers ``(4, ...)``:
    ``D1 = E_L − s`` and ``D2 = L₂ − 2s E_L + s²`` give ``Re D1``, ``|D1|²``,
    ``Re(D1* D2)``, ``|D2|²``."""
    e, l2 = e_loc.to(torch.complex128), l2.to(torch.complex128)
    d1 = e - shift
    d2 = l2 - 2 * shift * e + shift**2
    return torch.stack([d1.real, d1.abs() ** 2, (d1.conj() * d2).real, d2.abs() ** 2])


def moments_of(e_loc: torch.Tensor, l2: torch.Tensor, weights=None) -> Moments:
    """Returns the `Moments` of ``E_L`` and ``L₂`` samples (weighted means with ``weights``,
    summing to 1: a full sum)."""
    e = e_loc.reshape(-1).to(torch.complex128)
    w = None if weights is None else weights.reshape(-1).to(torch.float64)
    shift = float(e.real.mean() if w is None else (w * e.real).sum())
    values = _powers(e, l2.reshape(-1), shift)
    means = values.mean(dim=-1) if w is None else (values * w).sum(dim=-1)
    return _central(shift, *(float(v) for v in means))


def lanczos_step(e_loc, l2, weights=None) -> LanczosStep:
    """Returns ψ's and ψ₁'s energies and variances from ``E_L`` and ``L₂`` of samples
    ``(n_chains, n_per_chain)`` (or of every state with ``weights``); Monte Carlo errors by
    a jackknife over the chains."""
    flat_weights = None if weights is None else weights.reshape(-1)
    whole = moments_of(e_loc.reshape(-1), l2.reshape(-1), flat_weights)
    errors = None
    if weights is None and e_loc.ndim > 1 and e_loc.shape[0] > 1:
        errors = jackknife_errors(e_loc, l2)
    return step_from(whole, int(e_loc.numel()), errors)


def step_from(moments: Moments, n_samples: int, errors: dict | None = None) -> LanczosStep:
    """Returns the `LanczosStep` of ψ with ``moments`` (over ``n_samples`` samples or states),
    with the errors of `jackknife_errors` (None: 0, a full sum)."""
    energy, variance, alpha = step_of(moments)
    errors = errors or {"mean": 0.0, "energy": 0.0, "gain": 0.0}
    extrapolated = math.nan
    if moments.variance > variance:
        extrapolated = energy - variance * (moments.mean - energy) / (moments.variance - variance)
    return LanczosStep(
        energy=energy,
        energy_error=errors["energy"],
        variance=variance,
        alpha=alpha,
        energy_0=moments.mean,
        energy_0_error=errors["mean"],
        variance_0=max(moments.variance, 0.0),
        extrapolated=extrapolated,
        n_samples=n_samples,
        gain=energy - moments.mean,
        gain_error=errors["gain"],
    )


def jackknife_errors(e_loc, l2) -> dict[str, float]:
    """Returns the jackknife errors over the chains (the rows of ``(n_chains, n_per_chain)``
    samples, each chain one block) of the mean, ``c2``, ``c3``, ``c4``, the step's ``E₁`` and
    its gain ``E₁ − E₀``."""
    n, count = e_loc.shape[0], e_loc.shape[1]
    shift = float(e_loc.real.to(torch.float64).mean())
    sums = _powers(e_loc, l2, shift).sum(dim=-1).T  # (n, 4): each chain's sums
    total = sums.sum(dim=0)
    estimates = []
    for left_out in range(n):
        m = _central(shift, *(float(v) for v in (total - sums[left_out]) / ((n - 1) * count)))
        energy = step_of(m)[0]
        estimates.append([m.mean, m.c2, m.c3, m.c4, energy, energy - m.mean])
    estimates = np.array(estimates)  # (n, 6)
    spread = np.sqrt((n - 1) / n * ((estimates - estimates.mean(axis=0)) ** 2).sum(axis=0))
    names = ("mean", "c2", "c3", "c4", "energy", "gain")
    return dict(zip(names, map(float, spread), strict=True))


def full_sum_moments(hamiltonian, model, chunk_size=None) -> Moments:
    """Returns the `Moments` summed over every state of the sector, from the normalised
    vector ``v`` of ψ: ``E = ⟨v|Hv⟩``, ``d₁ = (H − E)v``, ``d₂ = (H − E)d₁``, ``c2 = |d₁|²``,
    ``c3 = ⟨d₁|d₂⟩``, ``c4 = |d₂|²`` — exact, for the tests and small sectors."""
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    device = next(model.parameters()).device
    with torch.no_grad():
        log_psi = evaluate_log_psi(model, x.to(device), chunk_size).cpu().to(torch.complex128)
    log_psi = log_psi.numpy()
    vector = np.exp(log_psi - log_psi.real.max())
    vector /= np.linalg.norm(vector)
    matrix = hamiltonian.to_sparse()
    energy = float(np.vdot(vector, matrix @ vector).real)
    d1 = matrix @ vector - energy * vector
    d2 = matrix @ d1 - energy * d1
    return Moments(
        energy,
        float(np.vdot(d1, d1).real),
        float(np.vdot(d1, d2).real),
        float(np.vdot(d2, d2).real),
    )
