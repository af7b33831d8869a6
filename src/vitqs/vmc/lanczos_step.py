"""One Lanczos step on a trained state: ``|ψ₁⟩ = (1 + αH)|ψ⟩`` with α minimising the energy.

ψ₁ is the lowest state of the space spanned by ``φ₀ = ψ`` and ``φ₁ = (H − E)ψ/σ`` (E near ψ's
energy, σ² near its variance): the lower root of ``H c = λ S c`` with the 2×2 overlaps
``S_ij = ⟨φ_i|φ_j⟩`` and ``H_ij = ⟨φ_i|H|φ_j⟩``, never above ψ's energy (Sorella, PRB 64,
024512 (2001); Hu et al., PRB 88, 060402 (2013) lower the 10×10 J1-J2 energy so). Its variance
needs ``Q_ij = ⟨Hφ_i|Hφ_j⟩`` too. The three matrices are one 4×4 Gram matrix of the vectors
``(φ₀, φ₁, Hφ₀, Hφ₁)``, whose amplitudes over ψ at a configuration x are

    (1, D, E_L, (L₂ − E E_L)/σ),   D = (E_L − E)/σ,

with ``E_L = (Hψ)(x)/ψ(x)`` and ``L₂ = (H²ψ)(x)/ψ(x) = Σ_x' H_xx' ψ(x')/ψ(x) E_L(x')``.

**The samples come from g² = |ψ|² (1 + |D|²)**, that is ``|φ₀|² + |φ₁|²`` (`GuidedState`),
and each sample's products carry the weight ``|ψ|²/g² = 1/(1 + |D|²)``. Samples of ``|ψ|²``
alone miss the configurations where ψ is small and (H − E)ψ is not, near a signed ψ's
nodes, where the estimators of ``⟨H³⟩`` and ``⟨H⁴⟩`` have tails whose variance grows without
bound as ψ → 0 at fixed (H − E)ψ: on J1-J2 4×4 states 5.5e-4 to 2.7e-3 from E₀, 16,384
samples of ``|ψ|²`` put the step's gain 1.4σ to 4.6σ (2.4×) from the summed one and the
variance 33-41 % low. Under ``g²`` every weighted amplitude of φ₀ and φ₁ is bounded: 4,096
samples of the same states, one at 6.5e-3 and a positive Heisenberg 4×4 state gave 14 of 15
gains within 1.9σ and one 2.8σ, each known to 4-7 %, and ψ's variance 0-28 % low
(results/accuracy.md). Where (H − E)ψ lives on a few
configurations the chains reach rarely (a state 1e-6 from E₀: one orbit of 16
configurations with |ψ|² 2e-8 holds 92 % of the variance), the chains of ``g²`` disagree,
and their split R̂ shows it.

``L₂`` needs the local energies of every connected configuration, that is the connected
configurations of the connected configurations: ``max_conn²`` amplitudes per sample, evaluated
in chunks (each distinct configuration once); the chains of ``g²`` need ``max_conn`` amplitudes
a proposal. The error bars come from the chains: a jackknife over them (each chain's samples
are one block), for ``E₁`` as for ``E``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg
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


def gram_of(m: Moments) -> np.ndarray:
    """Returns the exact 4×4 Gram matrix of ``(φ₀, φ₁, Hφ₀, Hφ₁)`` (module docstring) of ψ with
    `Moments` ``m``, with E = ``m.mean`` and σ² = ``m.c2``: ``d₁ = (H − E)ψ`` is orthogonal to
    ψ, ``Hψ = d₁ + Eψ``, ``Hd₁ = d₂ + E d₁`` and ``⟨ψ|d₂⟩ = c2``."""
    e, c2, c3, c4 = m.mean, m.c2, m.c3, m.c4
    sigma = math.sqrt(c2)
    overlap = [[1.0, 0.0], [0.0, 1.0]]
    hamiltonian = [[e, sigma], [sigma, e + c3 / c2]]
    square = [[e * e + c2, (c3 + 2 * e * c2) / sigma], [0.0, (c4 + 2 * e * c3 + e * e * c2) / c2]]
    square[1][0] = square[0][1]
    gram = np.zeros((4, 4))
    gram[:2, :2], gram[:2, 2:], gram[2:, 2:] = overlap, hamiltonian, square
    gram[2:, :2] = gram[:2, 2:].T
    return gram


def krylov_step(gram: np.ndarray, energy: float, variance: float) -> tuple[float, ...]:
    """Returns ``(E₀, σ₀², E₁, σ₁², α)`` of the Gram matrix ``gram`` of ``(φ₀, φ₁, Hφ₀, Hφ₁)``
    built with ``energy`` E and ``variance`` σ²: ψ's energy and variance, and those of the
    lowest state ψ₁ = (1 + αH)ψ of their space. H − E S is solved, not H: near an
    eigenstate the step is a difference 1e8 times smaller than the energies."""
    overlap = gram[:2, :2]
    # ⟨φ₁|H|ψ⟩ from E_L alone (⟨φ₁|Hφ₀⟩), not from L₂ (⟨φ₀|Hφ₁⟩, equal but noisier): with
    # the mean of the two, the gain of a Heisenberg 4×4 state came out 80× less sure
    off = gram[1, 2]
    hamiltonian = np.array([[gram[0, 2], off], [off, gram[1, 3]]])
    shifted = hamiltonian - energy * overlap  # H − E S
    e0 = energy + shifted[0, 0] / overlap[0, 0]
    values, vectors = scipy.linalg.eigh(shifted, overlap)
    c = vectors[:, 0]
    e1 = energy + float(values[0])
    var0 = _variance(gram, np.array([1.0, 0.0]), e0)
    var1 = _variance(gram, c, e1)
    sigma = math.sqrt(variance)
    base = c[0] - c[1] * energy / sigma  # ψ₁ ∝ c₀ψ + c₁(H − E)ψ/σ = base·ψ + (c₁/σ)Hψ
    alpha = (c[1] / sigma) / base if base != 0 else math.inf
    return float(e0), max(var0, 0.0), e1, max(var1, 0.0), float(alpha)


def _variance(gram: np.ndarray, c: np.ndarray, energy: float) -> float:
    """Returns the variance of the state ``Σ_j c_j φ_j`` about ``energy``: the mean square of
    ``Σ_j c_j (Hφ_j − energy φ_j)`` over its norm, a sum of squares of the samples' own
    amplitudes (never below 0), not ``⟨H²⟩ − E²`` (a difference of numbers 1e4 times larger,
    whose noise left a J1-J2 6×6 state's ψ₁ at a variance below 0)."""
    v = np.concatenate([-energy * c, c])  # the components on (φ₀, φ₁, Hφ₀, Hφ₁)
    return float(v @ gram @ v / (c @ gram[:2, :2] @ c))


def step_of(m: Moments) -> tuple[float, float, float]:
    """Returns ``(E₁, σ₁², α)`` of the Lanczos step of ψ with exact `Moments` ``m``.
    At an eigenstate (``c2`` = 0) ψ₁ is ψ."""
    if m.c2 <= 1e-300:
        return m.mean, max(m.c2, 0.0), 0.0
    return krylov_step(gram_of(m), m.mean, m.c2)[2:]


def second_local_energy(
    hamiltonian, model, x, log_psi, chunk_size=None, connected=None, progress=None
):
    """Returns ``E_L(x)`` and ``L₂(x) = (H²ψ)(x)/ψ(x)`` ``(B,)`` each, complex, for
    configurations ``x`` ``(B, N)`` whose ``log ψ`` ``(B,)`` is known.

    ``connected``: the network (``model`` in another dtype, `models.precision.NetworkCopy`)
    that evaluates the connected configurations and theirs, the ``max_conn²`` amplitudes a
    sample that make the cost; None: ``model``. ``E_L(x)`` always comes from ``model``.
    A connected configuration where ψ vanishes (a symmetry projection cancels it) adds
    nothing, whatever its own local energy. ``progress``: called with ``(done, B)`` after
    each chunk of samples."""
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
        if progress is not None:
            progress(start + len(x_chunk), x.shape[0])
    return e_loc, torch.cat(parts)


class GuidedState(torch.nn.Module):
    """The guiding function ``g = |ψ| (1 + |E_L − E|²/σ²)^½`` as a network of configurations
    (real ``log g``), for chains that sample ``g² = |φ₀|² + |φ₁|²`` (module docstring).

    Each call costs the local energies of its configurations (``max_conn`` amplitudes
    each), a chain's every proposal."""

    def __init__(self, hamiltonian, model, energy: float, variance: float, chunk_size=None):
        super().__init__()
        self.psi = model
        self.hamiltonian, self.chunk_size = hamiltonian, chunk_size
        self.energy, self.variance = float(energy), float(variance)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_psi = evaluate_log_psi(self.psi, x, self.chunk_size)
        e_loc = local_energy(self.hamiltonian, self.psi, x, log_psi, self.chunk_size)
        return log_psi.real.to(torch.float64) + 0.5 * torch.log1p(self.spread(e_loc))

    def spread(self, e_loc: torch.Tensor) -> torch.Tensor:
        """Returns ``|D|² = |E_L − E|²/σ²``: ``g²/|ψ|² − 1``."""
        return (e_loc.to(torch.complex128) - self.energy).abs() ** 2 / self.variance


def krylov_terms(e_loc, l2, energy: float, variance: float, rho=None) -> torch.Tensor:
    """Returns per sample the real ``(..., 4, 4)`` products ``w Re(z_i* z_j)``, ``z = (1, D,
    E_L, (L₂ − E E_L)/σ)`` (module docstring), whose mean is the Gram matrix of
    ``(φ₀, φ₁, Hφ₀, Hφ₁)`` up to a factor: ``w = 1/(1 + ρ)`` for samples of ``|ψ|² (1 + ρ)``
    (``rho``: `GuidedState.spread`), 1 for samples of ``|ψ|²``. Real parts: for a Hermitian H
    the exact matrices in this basis are real. A configuration where ψ vanishes (a symmetry
    projection cancels it, and (Hψ) with it) adds nothing."""
    e, l2 = e_loc.to(torch.complex128), l2.to(torch.complex128)
    sigma = math.sqrt(variance)
    z = torch.stack([torch.ones_like(e), (e - energy) / sigma, e, (l2 - energy * e) / sigma], -1)
    terms = (z.conj()[..., :, None] * z[..., None, :]).real
    if rho is not None:
        terms = terms / (1 + rho.to(torch.float64))[..., None, None]
    return torch.nan_to_num(terms, nan=0.0, posinf=0.0, neginf=0.0)


def sampled_step(terms: torch.Tensor, energy: float, variance: float) -> LanczosStep:
    """Returns the `LanczosStep` of samples' `krylov_terms` ``(n_chains, n_per_chain, 4, 4)``,
    with errors from a jackknife over the chains (each chain one block; 0 for one chain)."""
    sums = terms.sum(dim=1).to(torch.float64).cpu().numpy()  # (n, 4, 4): each chain's sums
    n, count = sums.shape[0], terms.shape[1]
    total = sums.sum(axis=0)
    e0, var0, e1, var1, alpha = krylov_step(total / (n * count), energy, variance)
    errors = (0.0, 0.0, 0.0)
    if n > 1:
        left_out = [krylov_step((total - s) / ((n - 1) * count), energy, variance) for s in sums]
        values = np.array([[r[0], r[2], r[2] - r[0]] for r in left_out])  # E₀, E₁, gain
        spread = ((values - values.mean(axis=0)) ** 2).sum(axis=0)
        errors = tuple(float(v) for v in np.sqrt((n - 1) / n * spread))
    return _step(e0, var0, e1, var1, alpha, n * count, errors)


def step_from(moments: Moments, n_states: int) -> LanczosStep:
    """Returns the exact `LanczosStep` of ψ with `Moments` summed over ``n_states`` states."""
    energy, variance, alpha = step_of(moments)
    return _step(moments.mean, moments.c2, energy, variance, alpha, n_states, (0.0, 0.0, 0.0))


def _step(e0, var0, e1, var1, alpha, n_samples, errors) -> LanczosStep:
    """Returns the `LanczosStep` of ψ's and ψ₁'s energies and variances, ``errors`` those of
    ``(E₀, E₁, E₁ − E₀)``."""
    extrapolated = math.nan
    if var0 > var1:  # zero-variance extrapolation of the two
        extrapolated = e1 - var1 * (e0 - e1) / (var0 - var1)
    return LanczosStep(
        energy=e1,
        energy_error=errors[1],
        variance=var1,
        alpha=alpha,
        energy_0=e0,
        energy_0_error=errors[0],
        variance_0=max(var0, 0.0),
        extrapolated=extrapolated,
        n_samples=n_samples,
        gain=e1 - e0,
        gain_error=errors[2],
    )


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
