"""Exact ground-state energy of the periodic spin-1/2 Heisenberg chain from the Bethe ansatz.

The Hamiltonian is ``H = J Σ_i S_i·S_{i+1}`` on a ring of ``L`` sites (S = σ/2, site ``L`` is
site 0), the convention of ``operators.Heisenberg`` with ``J1 = J``. For ``J > 0`` and even
``L`` the ground state is the singlet with ``M = L/2`` flipped spins (magnons), whose
rapidities ``λ_1 < … < λ_M`` solve the Bethe equations (Bethe, Z. Phys. 71, 205 (1931); in the
form of Karbach & Müller, Computers in Physics 11, 36 (1997))::

    L · 2 arctan(2 λ_j) = 2π I_j + Σ_k 2 arctan(λ_j − λ_k),      j = 1 … M,

with the quantum numbers ``I_j = −(M−1)/2, …, (M−1)/2`` (integers for odd M, half-odd
integers for even M). Each magnon lowers the energy from the ferromagnetic ``J L/4`` by
``J (1 − cos k_j) = 2J / (4 λ_j² + 1)``, where ``cot(k_j/2) = 2 λ_j``, so::

    E = J · (L/4 − Σ_j 2 / (4 λ_j² + 1))        (total energy, not per site).

The equations are solved by Newton's method with the analytic Jacobian, started from the
rapidities that the L → ∞ root density ``σ(λ) = 1 / (2 cosh πλ)`` assigns to each ``I_j``;
L = 1000 takes four Newton steps and a few hundredths of a second.

As L → ∞ the energy per site tends to Hulthén's ``e_∞ = 1/4 − ln 2 = −0.4431471805599453``
(times J), from below: ``E/L − e_∞ ≈ −π² / (12 L²)``, the conformal correction
``−π v c / (6 L²)`` with spin-wave velocity ``v = π J / 2`` and central charge ``c = 1``, times
a factor that tends to 1 like ``1 + O(1/ln³ L)`` (Affleck, Gepner, Schulz & Ziman, J. Phys. A 22,
511 (1989)). This module gives ``L² (E/L − e_∞) / J = −0.8475`` at L = 8, ``−0.8244`` at
L = 64, ``−0.82310`` at L = 500 and ``−0.82294`` at L = 1000, against ``−π²/12 = −0.82247``.

L = 2 is the one length where the formula and ``Lattice((2,))`` differ: the ring of two sites
has the bond (0, 1) twice, which the formula counts (E = −3J/2) and the lattice keeps once
(E = −3J/4).
"""

from __future__ import annotations

import math

import numpy as np

E_INFINITY_PER_SITE = 0.25 - math.log(2.0)  # Hulthén (1938): −0.4431471805599453, times J

_MAX_NEWTON_STEPS = 50
# Newton converges quadratically (error after a step of size s ≈ s², seen up to L = 2000), so
# after a step below 1e-10 the error is at round-off; demanding a step of a few ulps instead
# would never end: the residual's round-off (~eps·L) sets a floor of ~1e-13 under the steps
_STEP_TOLERANCE = 1e-10


def ground_state_quantum_numbers(n_sites: int) -> np.ndarray:
    """Returns the Bethe quantum numbers ``I_j = −(M−1)/2 … (M−1)/2`` of the ground state,
    ``(M,)`` float64 with ``M = n_sites / 2``, in increasing order."""
    _check_length(n_sites)
    n_magnons = n_sites // 2
    return np.arange(n_magnons, dtype=np.float64) - (n_magnons - 1) / 2


def bethe_residual(rapidities: np.ndarray, quantum_numbers: np.ndarray, n_sites: int):
    """Returns ``F`` ``(M,)`` and its Jacobian ``∂F_j/∂λ_k`` ``(M, M)`` of the Bethe equations
    ``F_j = L·2 arctan(2λ_j) − Σ_k 2 arctan(λ_j − λ_k) − 2π I_j``, zero at a solution."""
    diff = rapidities[:, None] - rapidities[None, :]  # (M, M): λ_j − λ_k
    scattering_slope = 2.0 / (1.0 + diff**2)  # (M, M): d/dx 2 arctan(x) at x = λ_j − λ_k
    residual = (
        n_sites * 2.0 * np.arctan(2.0 * rapidities)
        - 2.0 * np.arctan(diff).sum(axis=1)
        - 2.0 * np.pi * quantum_numbers
    )
    # ∂F_j/∂λ_k = Θ'(λ_j − λ_k) for k ≠ j; the diagonal also carries L θ'(λ_j) − Σ_k Θ'
    jacobian = scattering_slope.copy()
    np.fill_diagonal(
        jacobian,
        n_sites * 4.0 / (1.0 + 4.0 * rapidities**2) - scattering_slope.sum(axis=1) + 2.0,
    )
    return residual, jacobian


def bethe_rapidities(n_sites: int) -> np.ndarray:
    """Returns the ground-state rapidities ``λ_j`` ``(M,)``, M = n_sites / 2, increasing and
    odd (``λ_{M+1−j} = −λ_j``), solved to machine precision by Newton's method.

    Args:
        n_sites: the chain length L, even and at least 2.

    Raises:
        ValueError: for odd or too small ``n_sites``.
        RuntimeError: if Newton's method does not converge (not seen for any L tried).
    """
    quantum_numbers = ground_state_quantum_numbers(n_sites)
    # the L → ∞ counting function I/L = arctan(sinh πλ) / 2π, inverted: the outer rapidities
    # grow like ln(L)/π, which tan(π I/L)/2 of free magnons would miss for large L
    rapidities = np.arcsinh(np.tan(2.0 * np.pi * quantum_numbers / n_sites)) / np.pi
    for _ in range(_MAX_NEWTON_STEPS):
        residual, jacobian = bethe_residual(rapidities, quantum_numbers, n_sites)
        step = np.linalg.solve(jacobian, residual)
        rapidities = rapidities - step
        scale = max(1.0, float(np.abs(rapidities).max()))
        if np.abs(step).max() <= _STEP_TOLERANCE * scale:
            break
    else:
        raise RuntimeError(
            f"Bethe equations for n_sites={n_sites}: Newton's method did not converge in "
            f"{_MAX_NEWTON_STEPS} steps (last step {np.abs(step).max():.3g})"
        )
    # the solution is odd; averaging with its mirror removes the last ulp of asymmetry
    return 0.5 * (rapidities - rapidities[::-1])


def heisenberg_chain_energy(n_sites: int, J: float = 1.0) -> float:
    """Returns the exact ground-state energy, TOTAL (not per site), of the periodic spin-1/2
    chain ``H = J Σ_i S_i·S_{i+1}``, S = σ/2, from the Bethe ansatz:
    ``E = J (L/4 − Σ_j 2 / (4 λ_j² + 1))`` with the rapidities of ``bethe_rapidities``.

    It is the ground-state energy for ``J > 0``; for ``J < 0`` it is ``J`` times the
    antiferromagnet's, which is the highest level of the ferromagnet, not its ground state.

    Args:
        n_sites: the chain length L, even and at least 2 (L = 2 counts the doubled bond twice;
            see the module docstring).
        J: the exchange coupling (``J1`` of ``operators.Heisenberg``).

    Raises:
        ValueError: for odd or too small ``n_sites``.
    """
    rapidities = bethe_rapidities(n_sites)
    magnon_energy = 2.0 / (4.0 * rapidities**2 + 1.0)  # (M,): 1 − cos k_j
    return float(J * (n_sites / 4.0 - magnon_energy.sum()))


def _check_length(n_sites: int) -> None:
    if isinstance(n_sites, bool) or int(n_sites) != n_sites:
        raise ValueError(f"n_sites={n_sites!r} must be an even integer >= 2")
    if n_sites < 2 or n_sites % 2 != 0:
        raise ValueError(
            f"n_sites={n_sites} is not allowed: the Bethe-ansatz ground state here needs an "
            "even chain length >= 2 (a singlet with n_sites/2 magnons)"
        )
