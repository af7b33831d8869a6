"""Zero-variance extrapolation: the weighted line fit, and the report and sweep that draw it."""

import math

import numpy as np
import pytest
import yaml
from helpers import run_main, tiny_bose_hubbard, tiny_heisenberg, write_config

from vitqs import results
from vitqs.config import from_dict
from vitqs.extrapolation import ZERO_VARIANCE_TITLE, fit_line, stage_extrapolation, zero_variance
from vitqs.runner import run_config


def test_points_on_a_line_give_its_intercept_and_slope():
    x = np.array([0.5, 0.2, 0.05, 0.01])
    y = -0.44 + 0.3 * x
    (intercept, slope), covariance = fit_line(x, y, np.full(4, 1e-4))
    assert intercept == pytest.approx(-0.44, abs=1e-14)
    assert slope == pytest.approx(0.3, abs=1e-13)
    # χ² = 0 < dof: the covariance stays that of the error bars, (XᵀWX)⁻¹
    design = np.stack([np.ones(4), x], axis=1)
    np.testing.assert_allclose(covariance, np.linalg.inv(design.T @ design / 1e-8), rtol=1e-12)


def test_weighted_fit_equals_numpy_polyfit():
    rng = np.random.default_rng(3)
    x = rng.uniform(0.01, 0.2, 7)
    sigma = rng.uniform(1e-4, 1e-3, 7)
    y = -0.5 + 0.8 * x + sigma * rng.standard_normal(7)
    (intercept, slope), _ = fit_line(x, y, sigma)
    slope_np, intercept_np = np.polyfit(x, y, 1, w=1 / sigma)
    assert (intercept, slope) == pytest.approx((intercept_np, slope_np), rel=1e-10)


def test_two_points_propagate_their_error_bars_into_the_intercept():
    (x1, x2), (s1, s2) = (0.1, 0.3), (2e-4, 5e-4)
    (intercept, _), covariance = fit_line(np.array([x1, x2]), np.array([-0.4, -0.3]), [s1, s2])
    # a = (y1 x2 − y2 x1)/(x2 − x1): var a = (x2² s1² + x1² s2²)/(x2 − x1)²
    assert intercept == pytest.approx((-0.4 * x2 + 0.3 * x1) / (x2 - x1), rel=1e-13)
    expected = (x2**2 * s1**2 + x1**2 * s2**2) / (x2 - x1) ** 2
    assert covariance[0, 0] == pytest.approx(expected, rel=1e-10)


def test_scatter_beyond_the_error_bars_widens_the_intercept_error():
    x = np.array([0.1, 0.2, 0.3, 0.4])
    y = np.array([0.0, 0.3, 0.1, 0.5])  # far off a line for error bars of 1e-3
    _, tight = fit_line(x, 0.2 + x, np.full(4, 1e-3))
    _, scattered = fit_line(x, y, np.full(4, 1e-3))
    assert scattered[0, 0] > 100 * tight[0, 0]


def test_a_line_needs_two_distinct_variances():
    with pytest.raises(ValueError, match="two points"):
        fit_line(np.array([0.1, 0.1]), np.array([1.0, 2.0]), np.array([1.0, 1.0]))


def _run(tmp_path, capsys, name, **sections):
    data = tiny_heisenberg(tmp_path / "runs", **sections)
    data["name"] = name
    code, _, err = run_main(capsys, "run", write_config(tmp_path / f"{name}.yaml", data), "--quiet")
    assert code == 0, err
    return results.read_results(tmp_path / "runs" / f"{name}.h5")


def test_report_of_runs_on_one_system_extrapolates_them(tmp_path, capsys):
    # three runs of the 6-site ring at different lengths (one in the sign-rule basis: the
    # same system), and a Bose-Hubbard run alone on its system
    records = [
        _run(tmp_path, capsys, "short", optimizer={"n_iter": 2}),
        _run(tmp_path, capsys, "long", optimizer={"n_iter": 12, "lr": 0.05}),
        _run(
            tmp_path,
            capsys,
            "rotated",
            optimizer={"n_iter": 6},
            hamiltonian={"kind": "heisenberg", "J1": 1.0, "sign_rule": False},
        ),
    ]
    bosons = tiny_bose_hubbard(tmp_path / "runs")
    code, _, err = run_main(capsys, "run", write_config(tmp_path / "bh.yaml", bosons), "--quiet")
    assert code == 0, err

    code, out, err = run_main(capsys, "report", tmp_path / "runs")
    assert code == 0, err
    assert ZERO_VARIANCE_TITLE in out
    rows = [line for line in out.splitlines() if line.startswith("| heisenberg")]
    assert len(rows) == 1  # one system with three runs; the bosons have one run only
    cells = [cell.strip() for cell in rows[0].split("|")[1:-1]]
    assert cells[1] == "3"
    # the intercept is the weighted fit of the three runs' final values, per site
    energy = np.array([r.final["energy"] / 6 for r in records])
    error = np.array([r.final["energy_error"] / 6 for r in records])
    variance = np.array([r.final["variance"] / 6 for r in records])
    (intercept, _), covariance = fit_line(variance, energy, error)
    assert cells[3] == f"{intercept:.8f} ± {math.sqrt(covariance[0, 0]):.1e}"
    assert cells[5].endswith("(exact diagonalization)")
    assert (tmp_path / "runs" / "zero_variance.png").stat().st_size > 0


def test_unfinished_runs_are_left_out(tmp_path, capsys):
    records = [
        _run(tmp_path, capsys, "a", optimizer={"n_iter": 2}),
        _run(tmp_path, capsys, "b", optimizer={"n_iter": 8}),
    ]
    assert len(zero_variance(records)) == 1
    records[1].status = "interrupted"
    assert zero_variance(records) == []


def test_sweep_over_the_budget_writes_the_extrapolation(tmp_path, capsys):
    base = write_config(tmp_path / "base.yaml", tiny_heisenberg(tmp_path / "out"))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "budget",
                "base": base.name,
                "set": {"output.dir": str(tmp_path / "out")},
                "sweep": {"optimizer.n_iter": [2, 6, 12]},
            }
        )
    )
    code, out, err = run_main(capsys, "sweep", sweep, "--quiet")
    assert code == 0, err
    table = (tmp_path / "out" / "budget" / "zero_variance.md").read_text()
    assert ZERO_VARIANCE_TITLE in table and "| heisenberg" in table
    assert (tmp_path / "out" / "budget" / "zero_variance.png").exists()


def test_one_runs_stages_extrapolate_to_the_line_they_lie_on():
    # 400 steps: energy rises with the variance, E = -8.45 + 0.3 Var, plus noise; the early
    # half (far from the line) and the annealed steps do not count
    rng = np.random.default_rng(0)
    variance = np.linspace(2.0, 0.1, 400)
    energy = -8.45 + 0.3 * variance + rng.normal(0.0, 0.002, 400)
    energy[:200] += 5.0  # the first half: not on the line
    anneal = np.ones(400)
    anneal[:50] = 0.5
    e0, error = stage_extrapolation(energy, variance, anneal)
    assert abs(e0 - (-8.45)) < 4 * error and error < 0.01
    # a stage needs two steps: too few steps give no number, as do stages of one variance
    assert all(map(math.isnan, stage_extrapolation(energy[:10], variance[:10])))
    assert all(map(math.isnan, stage_extrapolation(energy, np.ones(400))))


def test_a_run_reports_its_own_extrapolation(tmp_path):
    data = tiny_heisenberg(tmp_path / "out", optimizer={"n_iter": 40})
    summary = run_config(from_dict(data), progress=False)
    record = results.read_results(summary["results_file"])
    history = record.history_arrays()
    expected = stage_extrapolation(history["energy"], history["variance"])
    assert summary["extrapolated_energy"] == pytest.approx(expected[0])
    assert record.final["extrapolated_error"] == pytest.approx(expected[1])
