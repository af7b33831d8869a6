"""Zero-variance extrapolation of the energies of several runs on one system.

The energy variance of an eigenstate is zero, and for states close to the ground state the
energy rises linearly with the variance: ``E/N ≈ e₀ + c · Var(E)/N``. A set of runs on one
Hamiltonian (several sizes of network, budgets, seeds) therefore gives, from a straight-line
fit of the energy per site against the variance per site, an intercept ``e₀`` that estimates
the ground-state energy beyond any one of them (Becca & Sorella, *Quantum Monte Carlo
Approaches for Correlated Systems*, CUP 2017, ch. 6; used for neural-network states e.g. by
Kolodrubetz et al. and Chen & Heyl 2024). The fit is only as good as the linear regime: runs
far from the ground state bend the line, and the table says how far each point lies.

`zero_variance` groups finished runs by their Hamiltonian (lattice and hamiltonian sections
of the stored config) and fits each group of two or more runs, weighting each energy by its
error bar.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitqs import results
from vitqs.checkpoint import stored_config
from vitqs.errors import ConfigError
from vitqs.results import RunRecord

ZERO_VARIANCE_TITLE = (
    "Zero-variance extrapolation: E/N = e0 + slope · Var(E)/N over the finished runs of one "
    "system, weighted by their error bars"
)


@dataclass
class ZeroVariance:
    """A straight-line fit ``E/N = intercept + slope · Var(E)/N`` over runs on one system.

    Attributes:
        system: the Hamiltonian, as ``kind key=value ... on shape (pbc)``.
        names: the runs' names, in the order of the points.
        energy, energy_error, variance: per-site energies, their error bars and the
            variances per site ``Var(E)/N`` of the points ``(n,)``.
        intercept, intercept_error: the zero-variance energy per site and its error (from
            the fit's covariance, scaled by the reduced χ² when that exceeds 1).
        slope: ``d(E/N) / d(Var/N)``.
        reference, reference_method: the reference energy per site (ED, Bethe ansatz or
            published) of the runs, if they have one, and how it was obtained.
    """

    system: str
    names: list[str]
    energy: np.ndarray
    energy_error: np.ndarray
    variance: np.ndarray
    intercept: float
    intercept_error: float
    slope: float
    reference: float | None
    reference_method: str | None

    @property
    def relative_error(self) -> float | None:
        """Returns the signed ``(e₀ − e_ref)/|e_ref|`` of the intercept, None without one."""
        if self.reference is None:
            return None
        return results.relative_error(self.intercept, self.reference)


def fit_line(x: np.ndarray, y: np.ndarray, y_error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(intercept, slope)`` and their covariance ``(2, 2)`` of a weighted
    least-squares line ``y = a + b x`` through at least two points of distinct ``x``.

    Weights are ``1/σ²``; points without a usable error bar (σ ≤ 0 or NaN: a full sum) make
    the fit unweighted. The covariance is ``(Xᵀ W X)⁻¹``, scaled by ``χ²/dof`` when that is
    above 1 (the scatter exceeds the error bars) and, unweighted, by the residual variance;
    with two points (no degree of freedom left) it is the propagated error bars, or NaN.
    """
    x, y, sigma = (np.asarray(v, dtype=np.float64) for v in (x, y, y_error))
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("a line needs at least two points of distinct variance")
    weighted = bool(np.all(np.isfinite(sigma) & (sigma > 0)))
    weights = 1.0 / sigma**2 if weighted else np.ones_like(x)
    design = np.stack([np.ones_like(x), x], axis=1)
    normal = design.T @ (weights[:, None] * design)
    coefficients = np.linalg.solve(normal, design.T @ (weights * y))
    covariance = np.linalg.inv(normal)
    dof = len(x) - 2
    residual = y - design @ coefficients
    chi2 = float(np.sum(weights * residual**2))
    if dof > 0:
        scale = chi2 / dof
        covariance *= max(1.0, scale) if weighted else scale
    elif not weighted:
        covariance *= math.nan
    return coefficients, covariance


# Stages of one run's extrapolation: its last half of steps (at the target Hamiltonian) cut
# into four runs of consecutive steps, each a point (mean energy, mean variance).
N_STAGES = 4
LATE_FRACTION = 0.5


def stage_extrapolation(energy, variance, anneal_fraction=None) -> tuple[float, float]:
    """Returns the zero-variance energy of one run and its error, from its own steps: the
    last half of the steps on the target Hamiltonian (``anneal_fraction`` 1, or all) in
    `N_STAGES` stages of consecutive steps, each a point (mean energy ± its standard error,
    mean variance), fitted by `fit_line`. The stages' states are not converged ones: the
    error says how far the line is determined. (NaN, NaN) with fewer than two steps a stage
    or stages of one variance."""
    energy, variance = np.asarray(energy, dtype=float), np.asarray(variance, dtype=float)
    if anneal_fraction is not None:
        target = np.asarray(anneal_fraction, dtype=float)
        on_target = np.isnan(target) | (target >= 1.0)
        energy, variance = energy[on_target], variance[on_target]
    late = slice(int(len(energy) * (1 - LATE_FRACTION)), None)
    energy, variance = energy[late], variance[late]
    finite = np.isfinite(energy) & np.isfinite(variance)
    energy, variance = energy[finite], variance[finite]
    if len(energy) < 2 * N_STAGES:
        return math.nan, math.nan
    stages = np.array_split(np.arange(len(energy)), N_STAGES)
    x = np.array([variance[s].mean() for s in stages])
    y = np.array([energy[s].mean() for s in stages])
    sigma = np.array([energy[s].std(ddof=1) / math.sqrt(len(s)) for s in stages])
    try:
        coefficients, covariance = fit_line(x, y, sigma)
    except (ValueError, np.linalg.LinAlgError):
        return math.nan, math.nan
    return float(coefficients[0]), float(math.sqrt(max(covariance[0, 0], 0.0)))


def zero_variance(records: Sequence[RunRecord]) -> list[ZeroVariance]:
    """Returns one fit per system that two or more finished runs of ``records`` share, in
    the order the systems first appear. Runs without a final energy, error or a finite
    variance are left out."""
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        final = record.final or {}
        values = [final.get(key) for key in ("energy", "energy_error", "variance")]
        if record.status != "finished" or not all(_finite(v) for v in values):
            continue
        key = _system_key(record)
        if key is not None:
            groups.setdefault(key, []).append(record)
    fits = []
    for key, group in groups.items():
        variance = np.array([r.final["variance"] / r.n_sites for r in group])
        if len(group) < 2 or np.ptp(variance) == 0:
            continue
        energy = np.array([r.final["energy"] / r.n_sites for r in group])
        error = np.array([r.final["energy_error"] / r.n_sites for r in group])
        (intercept, slope), covariance = fit_line(variance, energy, error)
        exact = group[0].exact
        fits.append(
            ZeroVariance(
                system=key,
                names=[r.name for r in group],
                energy=energy,
                energy_error=error,
                variance=variance,
                intercept=float(intercept),
                intercept_error=float(math.sqrt(covariance[0, 0])),
                slope=float(slope),
                reference=exact["energy"] / group[0].n_sites if exact else None,
                reference_method=results.reference_of(group[0]),
            )
        )
    return fits


def table(fits: Sequence[ZeroVariance]) -> str:
    """Returns the markdown table of the fits: one row per system."""
    lines = [
        "| system | runs | lowest E/N ± σ | zero-variance E/N ± σ | slope | reference E/N "
        "| relative error of the intercept |",
        "|---|---|---|---|---|---|---|",
    ]
    for fit in fits:
        lowest = int(np.argmin(fit.energy))
        reference = "" if fit.reference is None else f"{fit.reference:.8f} ({fit.reference_method})"
        relative = "" if fit.relative_error is None else f"{fit.relative_error:+.2e}"
        cells = [
            fit.system,
            str(len(fit.names)),
            f"{fit.energy[lowest]:.8f} ± {fit.energy_error[lowest]:.1e}",
            f"{fit.intercept:.8f} ± {fit.intercept_error:.1e}",
            f"{fit.slope:.4g}",
            reference,
            relative,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def _system_key(record: RunRecord) -> str | None:
    """Returns the Hamiltonian of a run as text, the same for every run of one system."""
    try:
        config = stored_config(record)
        lattice, hamiltonian = dict(config["lattice"]), dict(config["hamiltonian"])
    except (ConfigError, KeyError, TypeError, ValueError):  # ConfigError: not valid YAML
        return None
    kind = hamiltonian.pop("kind", "?")
    hamiltonian.pop("sign_rule", None)  # a change of basis: the same spectrum
    couplings = " ".join(f"{k}={v}" for k, v in sorted(hamiltonian.items()))
    pbc = lattice.get("pbc", True)
    boundary = {True: "periodic", False: "open"}.get(pbc, f"pbc={pbc}")
    where = f"{lattice['kind']} " if lattice.get("kind") else ""
    return f"{kind} {couplings} on {where}{lattice.get('shape')} ({boundary})"


def write_zero_variance(records: Sequence[RunRecord], out_dir) -> tuple[str, list]:
    """Returns the markdown table of `zero_variance` over ``records`` ("" when no system has
    two runs) and the figures it wrote to ``out_dir`` (``zero_variance.png``, numbered when
    there are several systems)."""
    fits = zero_variance(records)
    if not fits:
        return "", []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = (
        ["zero_variance.png"]
        if len(fits) == 1
        else [f"zero_variance_{k + 1}.png" for k in range(len(fits))]
    )
    from vitqs.plots import plot_zero_variance  # matplotlib where figures are drawn only

    pngs = [plot_zero_variance(fit, out_dir / name) for fit, name in zip(fits, names, strict=True)]
    return table(fits), pngs
