"""Figures from results files: one run, a parameter sweep. The tables are ``vitqs.report``'s.

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas directly, so this module
never selects or changes the global pyplot backend of the program that imports it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from vitqs import files
from vitqs.results import RunRecord

ORDER_PARAMETERS = ("condensate_fraction", "structure_factor_peak")

_DPI = 120


def _new_axes(xlabel: str, ylabel: str, *, log_y: bool = False):
    """Returns (figure, axes) on an Agg canvas with labels and a light grid."""
    figure = Figure(figsize=(6.0, 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if log_y:
        axes.set_yscale("log")
    axes.grid(True, alpha=0.3, which="both")
    return figure, axes


def _save(figure: Figure, path: Path) -> Path:
    """Writes ``figure`` as a PNG at ``path``, whole or not at all and never through a
    link planted there (`files.write_atomic`)."""
    image = io.BytesIO()
    figure.savefig(image, dpi=_DPI, format="png")
    return files.write_atomic(path, image.getvalue())


def _positive(values: np.ndarray) -> np.ndarray:
    """Returns ``values`` with non-finite and non-positive entries set to NaN (log axes)."""
    values = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(values) & (values > 0), values, np.nan)


# ---- one run ---------------------------------------------------------------------------------


def plot_run(record: RunRecord, out_dir: str | Path) -> list[Path]:
    """Writes the figures of one run into ``out_dir`` and returns their paths.

    ``energy.png``: energy vs iteration with a ±1 error band and the exact energy when known.
    ``relative_error.png``: |E − E_exact|/|E_exact| on a log axis, only with an exact energy.
    ``variance.png``: Var(E) on a log axis. A figure with no finite point to draw is skipped,
    so a run with an empty history yields no files.
    """
    out_dir = Path(out_dir)
    files.refuse_link(out_dir)  # a folder of figures planted as a link to elsewhere
    out_dir.mkdir(parents=True, exist_ok=True)
    history = record.history_arrays()
    exact_energy = record.exact.get("energy") if record.exact else None
    paths = [
        _plot_energy(history, exact_energy, record.name, out_dir / "energy.png"),
        _plot_relative_error(history, exact_energy, record.name, out_dir / "relative_error.png"),
        _plot_variance(history, record.name, out_dir / "variance.png"),
    ]
    return [path for path in paths if path is not None]


def _plot_energy(history, exact_energy, title, path: Path) -> Path | None:
    step, energy, error = history["step"], history["energy"], history["energy_error"]
    if not np.isfinite(energy).any():
        return None
    figure, axes = _new_axes("iteration", "energy E")
    axes.plot(step, energy, lw=1.0, label="VMC")
    axes.fill_between(step, energy - error, energy + error, alpha=0.3, lw=0)
    if exact_energy is not None and math.isfinite(exact_energy):
        axes.axhline(exact_energy, color="k", ls="--", lw=1.0, label=f"exact {exact_energy:.6f}")
    axes.set_title(title)
    axes.legend()
    return _save(figure, path)


def _plot_relative_error(history, exact_energy, title, path: Path) -> Path | None:
    if exact_energy is None or not math.isfinite(exact_energy) or exact_energy == 0:
        return None
    rel = _positive(np.abs(history["energy"] - exact_energy) / abs(exact_energy))
    if not np.isfinite(rel).any():
        return None
    figure, axes = _new_axes("iteration", "|E − E_exact| / |E_exact|", log_y=True)
    axes.plot(history["step"], rel, lw=1.0)
    axes.set_title(title)
    return _save(figure, path)


def _plot_variance(history, title, path: Path) -> Path | None:
    variance = _positive(history["variance"])
    if not np.isfinite(variance).any():
        return None
    figure, axes = _new_axes("iteration", "Var(E)", log_y=True)
    axes.plot(history["step"], variance, lw=1.0)
    axes.set_title(title)
    return _save(figure, path)


# ---- parameter sweeps ------------------------------------------------------------------------


def plot_sweep(rows: Sequence[dict], parameter: str, out_dir: str | Path) -> list[Path]:
    """Writes sweep figures into ``out_dir`` and returns their paths.

    Args:
        rows: one dict per sweep point with ``parameter``, ``energy_per_site``,
            ``energy_error_per_site``, ``exact_energy_per_site`` (None when unknown),
            ``relative_error`` (None when unknown), and optionally order parameters
            ``condensate_fraction`` / ``structure_factor_peak`` (with ``<name>_error``, and
            ``exact_<name>`` from the exact ground state, drawn as crosses).
        parameter: the swept key, e.g. ``"J2"`` or ``"U"``; its values must be numbers.

    ``energy_per_site.png`` always; ``relative_error.png`` (log) when any is known;
    ``order_parameter.png`` when any order parameter is present. Raises ValueError when a row
    lacks ``parameter``.
    """
    missing = [i for i, row in enumerate(rows) if row.get(parameter) is None]
    if missing:
        raise ValueError(f"sweep rows {missing} have no value for the parameter {parameter!r}")
    rows = sorted(rows, key=lambda row: row[parameter])
    out_dir = Path(out_dir)
    files.refuse_link(out_dir)  # a folder of figures planted as a link to elsewhere
    out_dir.mkdir(parents=True, exist_ok=True)
    x = np.array([row[parameter] for row in rows], dtype=np.float64)
    paths = [
        _sweep_energy(rows, x, parameter, out_dir / "energy_per_site.png"),
        _sweep_relative_error(rows, x, parameter, out_dir / "relative_error.png"),
        _sweep_order_parameters(rows, x, parameter, out_dir / "order_parameter.png"),
    ]
    return [path for path in paths if path is not None]


def _column(rows: Sequence[dict], key: str) -> np.ndarray:
    """Returns ``row[key]`` for every row as float64, NaN where absent or None."""
    return np.array([math.nan if row.get(key) is None else row[key] for row in rows], float)


def _sweep_energy(rows, x, parameter, path: Path) -> Path:
    figure, axes = _new_axes(parameter, "energy per site E/N")
    axes.errorbar(
        x,
        _column(rows, "energy_per_site"),
        yerr=_column(rows, "energy_error_per_site"),
        marker="o",
        ms=4,
        capsize=3,
        label="VMC",
    )
    exact = _column(rows, "exact_energy_per_site")
    if np.isfinite(exact).any():
        axes.plot(x, exact, "kx", ms=7, label="exact")
    axes.legend()
    return _save(figure, path)


def _sweep_relative_error(rows, x, parameter, path: Path) -> Path | None:
    rel = _positive(np.abs(_column(rows, "relative_error")))  # signed in the rows
    if not np.isfinite(rel).any():
        return None
    figure, axes = _new_axes(parameter, "|E − E_exact| / |E_exact|", log_y=True)
    axes.plot(x, rel, marker="o", ms=4)
    return _save(figure, path)


def _sweep_order_parameters(rows, x, parameter, path: Path) -> Path | None:
    present = [name for name in ORDER_PARAMETERS if any(row.get(name) is not None for row in rows)]
    if not present:
        return None
    # one panel each: a condensate fraction lies in [0, 1], a structure-factor peak grows with N
    figure = Figure(figsize=(5.0 * len(present), 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, len(present), squeeze=False)[0]
    for axes, name in zip(panels, present, strict=True):
        axes.errorbar(
            x,
            _column(rows, name),
            yerr=_column(rows, f"{name}_error"),
            marker="o",
            capsize=3,
            label="VMC",
        )
        exact = _column(rows, f"exact_{name}")
        if np.isfinite(exact).any():
            axes.plot(x, exact, "kx", ms=7, label="exact")
            axes.legend()
        axes.set_xlabel(parameter)
        axes.set_ylabel(name)
        axes.grid(True, alpha=0.3)
    return _save(figure, path)


# ---- zero-variance extrapolation -------------------------------------------------------------


def plot_zero_variance(fit, path: str | Path) -> Path:
    """Draws the energies per site of one system's runs against their variance per site, the
    fitted line down to zero variance, its intercept ± error, and the reference energy when
    known (``fit``: an `extrapolation.ZeroVariance`)."""
    figure, axes = _new_axes("variance per site Var(E)/N", "energy per site E/N")
    axes.errorbar(fit.variance, fit.energy, yerr=fit.energy_error, fmt="o", ms=4, capsize=3)
    x = np.linspace(0.0, float(np.max(fit.variance)) * 1.05, 50)
    axes.plot(x, fit.intercept + fit.slope * x, "-", lw=1, label="linear fit")
    axes.errorbar(
        [0.0],
        [fit.intercept],
        yerr=[fit.intercept_error] if math.isfinite(fit.intercept_error) else None,
        fmt="s",
        ms=5,
        capsize=3,
        label=f"zero variance: {fit.intercept:.6f}",
    )
    if fit.reference is not None:
        axes.axhline(fit.reference, color="k", ls="--", lw=1, label=fit.reference_method)
    axes.set_title(fit.system, fontsize=8)
    axes.legend(fontsize=8)
    return _save(figure, Path(path))
