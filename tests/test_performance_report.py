"""``results/performance.md`` opens with tables rendered from the stored rows: the file in the
repository is what the rows give, and a row that ``bench_step.py --store`` writes lands in
the CPU table with the ratio it measured."""

import json
import subprocess
import sys
from pathlib import Path

import performance_report as report  # scripts/ is on the tests' path (pyproject.toml)
import pytest
from helpers import tiny_heisenberg, write_config

SCRIPTS = Path(report.__file__).resolve().parent


def test_the_committed_report_is_what_its_stored_rows_render():
    text = report.REPORT.read_text()
    assert report.render(text) == text, "run python scripts/performance_report.py"


def test_a_cpu_row_shows_both_steps_and_their_ratio(tmp_path):
    phases = {"sampling": 0.5, "local_energy": 0.05, "jacobian": 0.2, "solve": 0.9}
    row = {
        "label": "chain 16",
        "name": "heisenberg_chain16",
        "date": "2026-11-28",
        "cores": [0],
        "machine": "some CPU (2 cores)",
        "ours": {"n_samples": 1024, "n_params": 6128, "seconds": phases, "seconds_per_iter": 1.7},
        "netket": {"n_params": 6224, "seconds_per_iter": 2.9},
        "ratio": {"step": 1.7 / 2.9},
    }
    (tmp_path / "speed__chain16.json").write_text(json.dumps(row))
    text = report.render("# Performance\n", tmp_path)
    line = next(line for line in text.splitlines() if line.startswith("| chain 16 |"))
    assert "| 1.700 | 2.900 | **0.59** |" in line and "| 6,128 / 6,224 |" in line
    assert "(no stored rows)" in text  # the GPU block, with no check stored here


@pytest.mark.slow
def test_a_row_stored_by_bench_step_is_rendered(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    stored = tmp_path / "rows" / "speed__tiny.json"
    stored.parent.mkdir()
    command = [sys.executable, str(SCRIPTS / "bench_step.py"), str(config), "--n-iter", "2"]
    command += ["--store", str(stored), "--label", "tiny ring"]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    row = json.loads(stored.read_text())
    assert row["label"] == "tiny ring" and row["ours"]["seconds_per_iter"] > 0
    text = report.render("# Performance\n", stored.parent)
    line = next(line for line in text.splitlines() if line.startswith("| tiny ring |"))
    assert "not run" in line  # no netket asked: no ratio claimed
