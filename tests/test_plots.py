"""Figures and tables: real PNG files that read back, a report over a folder, sweeps."""

import h5py
import matplotlib.image
import numpy as np
import pytest
from test_results import make_record

from vitqs.plots import plot_run, plot_sweep
from vitqs.report import markdown_table, report
from vitqs.results import ResultsError, write_results

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    assert path.is_file() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) > 100


def test_plot_run_with_exact_writes_three_figures(tmp_path):
    paths = plot_run(make_record(20), tmp_path / "figs")
    assert [p.name for p in paths] == ["energy.png", "relative_error.png", "variance.png"]
    for path in paths:
        assert_png(path)


def test_plot_run_without_exact_skips_relative_error(tmp_path):
    paths = plot_run(make_record(20, finished=False, exact=False), tmp_path)
    assert [p.name for p in paths] == ["energy.png", "variance.png"]
    for path in paths:
        assert_png(path)


def test_plot_run_with_empty_history_writes_nothing(tmp_path):
    assert plot_run(make_record(0, finished=False), tmp_path) == []


def test_report_on_a_folder_with_two_runs_and_a_foreign_file(tmp_path):
    write_results(tmp_path / "a.h5", make_record(10))
    second = make_record(6, finished=False, exact=False)
    second.name = "b"
    write_results(tmp_path / "nested" / "b.h5", second)
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = np.zeros(2)

    table, pngs = report(tmp_path)

    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(lines) == 2 + 3  # header, rule, one row per file
    assert "unreadable: is not a vitqs results file" in table
    assert any("| chain8 | finished |" in line for line in lines)
    # it says running, and no process writes it: its writer died
    assert any("| b | stopped |" in line for line in lines)
    assert (tmp_path / "a" / "energy.png") in pngs
    assert (tmp_path / "nested" / "b" / "variance.png") in pngs
    for path in pngs:
        assert_png(path)


def test_report_on_a_single_file_and_a_missing_path(tmp_path):
    path = write_results(tmp_path / "run.h5", make_record(5))
    table, pngs = report(path)
    assert len([line for line in table.splitlines() if line.startswith("| ")]) == 3
    assert "- chain8: a note on the numbers" in table  # the final measurement's note
    assert {p.parent for p in pngs} == {tmp_path / "run"}
    with pytest.raises(ResultsError, match="no such"):
        report(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="no results files"):
        report(tmp_path / "empty")


def sweep_rows():
    rows = []
    for j2, exact in ((0.0, -0.4564), (0.5, -0.3750), (0.3, None)):
        energy = (exact or -0.40) + 1e-3
        rows.append(
            {
                "J2": j2,
                "energy_per_site": energy,
                "energy_error_per_site": 2e-4,
                "exact_energy_per_site": exact,
                "relative_error": None if exact is None else abs(1e-3 / exact),
                "structure_factor_peak": 1.0 - j2,
                "exact_structure_factor_peak": None if exact is None else 1.01 - j2,
            }
        )
    return rows


def test_plot_sweep_writes_its_figures(tmp_path):
    paths = plot_sweep(sweep_rows(), "J2", tmp_path)
    names = [p.name for p in paths]
    assert names == ["energy_per_site.png", "relative_error.png", "order_parameter.png"]
    for path in paths:
        assert_png(path)


def test_plot_sweep_without_exact_or_order_parameters(tmp_path):
    rows = [
        {"U": u, "energy_per_site": -1.0 / u, "energy_error_per_site": 1e-3}
        for u in (1.0, 2.0, 4.0)
    ]
    paths = plot_sweep(rows, "U", tmp_path)
    assert [p.name for p in paths] == ["energy_per_site.png"]
    with pytest.raises(ValueError, match="'J'"):
        plot_sweep(rows, "J", tmp_path)


def test_markdown_table_keeps_the_digits_of_energies_and_parameters():
    """A relative error of 1e-6 must be readable off the energies; U = 3.3 stays 3.3."""
    row = {
        "U": 3.3,
        "energy_per_site": -1.0533765671,
        "energy_error_per_site": 4.27e-05,
        "relative_error": 1.78e-05,
        "condensate_fraction": 0.7583,
        "seconds": 325.26,
    }
    line = markdown_table([row], list(row)).splitlines()[2]
    assert line == "| 3.3 | -1.05337657 | 4.27e-05 | 1.78e-05 | 0.7583 | 325.3 |"


def test_figures_are_never_written_through_a_planted_link(tmp_path, capsys):
    from helpers import run_main

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    write_results(tmp_path / "runs" / "a.h5", make_record(10))
    (tmp_path / "runs" / "a").mkdir()
    (tmp_path / "runs" / "a" / "energy.png").symlink_to(victim)
    (tmp_path / "runs" / "b").symlink_to(tmp_path / "elsewhere")  # a folder of figures
    second = make_record(10)
    second.name = "b"
    write_results(tmp_path / "runs" / "b.h5", second)
    code, out, err = run_main(capsys, "report", tmp_path / "runs")
    assert code == 0, err
    assert victim.read_text() == "precious" and not (tmp_path / "elsewhere").exists()
    assert "- chain8: figures not written ('" in out and "symbolic link" in out
    assert "- b: figures not written" in out
