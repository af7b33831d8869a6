"""``vitqs bench accuracy``: the report is rendered from stored rows, prose around it is kept."""

import json

from vitqs.cli import main


def _row(engine, relative_error):
    return {
        "engine": engine,
        "system": "heisenberg_chain16",
        "model": "vit 2L d16 h4 p2 linear",
        "n_params": 6000,
        "n_samples": 1024,
        "estimator": "Monte Carlo",
        "n_iter": 10,
        "seconds": 12.0,
        "budget_seconds": 10.0,
        "energy": -7.1,
        "energy_error": 0.01,
        "exact_energy": -7.142296360624,
        "relative_error": relative_error,
        "v_score": 1e-3,
        "n_sites": 16 if engine == "vitqs" else None,
        "curve_seconds": [1.0, 2.0],
        "curve_relative_error": [0.1, relative_error],
    }


def test_report_only_renders_stored_rows_and_keeps_the_prose(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    row = {**_row("vitqs", 5.9e-3), "order": 0, "peers": [_row("netket", 1.2e-2)]}
    (rows / "accuracy__heisenberg_chain16.json").write_text(json.dumps(row))
    output = tmp_path / "accuracy.md"
    output.write_text("# Accuracy\n\nHand-written notes.\n")
    args = ["bench", "accuracy", "--report-only", "--rows-dir", str(rows), "--output", str(output)]
    assert main(args) == 0
    text = output.read_text()
    assert "Hand-written notes." in text
    table = text.split("<!-- begin accuracy-table -->")[1].split("<!-- end accuracy-table -->")[0]
    lines = [line for line in table.splitlines() if line.startswith("| heisenberg_chain16")]
    assert [line.split(" | ")[1] for line in lines] == ["vitqs", "netket"]  # peer right after
    assert "-0.4437500 ± 6.3e-04" in lines[0]  # per site: −7.1/16 ± 0.01/16
    assert "5.90e-03" in lines[0] and "1.20e-02" in lines[1]
    assert (tmp_path / "accuracy_vs_time.png").exists()
    assert main(args) == 0  # rendering again replaces the block instead of appending one
    assert output.read_text().count("<!-- begin accuracy-table -->") == 1
