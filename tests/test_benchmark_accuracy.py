"""``vitqs bench accuracy``: the report is rendered from stored rows, prose around it is kept;
a stored row gains the enumerated energy of its trained state, shown beside the Monte Carlo
relative error."""

import json
import re
from pathlib import Path

import benchmark_accuracy as bench  # scripts/ is on the tests' path (pyproject.toml)
import pytest
import yaml
from helpers import tiny_heisenberg

from vitqs import accuracy
from vitqs.cli import main
from vitqs.config import ConfigError
from vitqs.report import state_energy


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


def test_enumerated_energy_lands_in_the_row_and_the_table(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_heisenberg(tmp_path / "unused")))
    rows_dir = tmp_path / "rows"
    row = bench.run_vitqs(config, {}, "tiny", rows_dir)
    accuracy.store_row(rows_dir, "accuracy", "tiny", row)

    accuracy.enumerate_rows(rows_dir, "accuracy", max_dim=10_000, systems={"someone_else"})
    assert "enumerated_energy" not in json.loads((rows_dir / "accuracy__tiny.json").read_text())
    accuracy.enumerate_rows(rows_dir, "accuracy", max_dim=10_000)
    stored = json.loads((rows_dir / "accuracy__tiny.json").read_text())

    expected = state_energy(Path(row["results_file"]), max_dim=10_000)
    assert stored["enumerated_energy"] == pytest.approx(expected["enumerated"], rel=1e-12)
    assert stored["enumerated_relative_error"] >= 0  # variational: never below E_exact
    table = accuracy.render_table([stored], "system")
    header, _, cells = table.splitlines()
    column = header.split(" | ").index("rel. error, enumerated")
    assert cells.split(" | ")[column] == f"{stored['enumerated_relative_error']:+.2e}"


def test_kept_peers_come_back_marked_as_from_an_earlier_invocation(tmp_path):
    rows_dir = tmp_path / "rows"
    accuracy.store_row(
        rows_dir, "accuracy", "tiny", {**_row("vitqs", 1e-3), "peers": [_row("netket", 2e-2)]}
    )
    peers = bench._earlier_peers(rows_dir, "tiny")
    assert [p["engine"] for p in peers] == ["netket"]
    assert peers[0]["relative_error"] == 2e-2
    assert peers[0]["estimator"] == "Monte Carlo" + bench.EARLIER
    # a row kept twice is marked once
    accuracy.store_row(rows_dir, "accuracy", "tiny", {**_row("vitqs", 1e-3), "peers": peers})
    assert bench._earlier_peers(rows_dir, "tiny")[0]["estimator"].count(bench.EARLIER) == 1
    assert bench._earlier_peers(rows_dir, "nobody") is None


def test_thread_env_holds_blas_openmp_and_xla_to_the_count():
    one, two = bench.thread_env(1), bench.thread_env(2)
    assert one["OMP_NUM_THREADS"] == one["MKL_NUM_THREADS"] == "1"
    assert "multi_thread_eigen=false" in one["XLA_FLAGS"]
    assert two["OPENBLAS_NUM_THREADS"] == "2"
    assert "multi_thread_eigen=true intra_op_parallelism_threads=2" in two["XLA_FLAGS"]


def test_netket_only_refuses_the_modes_it_does_not_combine_with():
    for extra in ("--with-netket", "--keep-peers", "--ablation"):
        with pytest.raises(ConfigError, match="--netket-only"):
            bench.main(["--systems", "heisenberg_chain16", "--netket-only", extra])


@pytest.mark.netket
def test_netket_only_attaches_an_enumerated_peer_with_the_configs_threads(tmp_path, monkeypatch):
    pytest.importorskip("netket")
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    data = tiny_heisenberg(tmp_path / "unused", threads=2)
    (config_dir / "tiny.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(bench, "CONFIG_DIR", config_dir)
    rows_dir = tmp_path / "rows"
    overrides = {
        "threads": 1,
        "optimizer.average_from": 0.5,
        "optimizer.anneal": {"from": {"J1": 2.0}, "until": 0.25},
    }
    ours = bench.run_vitqs(config_dir / "tiny.yaml", overrides, "tiny", rows_dir)
    assert ours["threads"] == 1  # the override, not the config's 2
    assert ours["estimator"].endswith(
        ", H annealed from J1 = 2 over the first 25% of the run"
        ", parameters averaged over the last 50% of the run"
    )
    accuracy.store_row(rows_dir, "accuracy", "tiny", {**ours, "peer_failure": "an earlier one"})
    args = ["--systems", "tiny", "--netket-only", "--rows-dir", str(rows_dir)]
    assert bench.main([*args, "--output", str(tmp_path / "accuracy.md")]) == 0

    stored = json.loads((rows_dir / "accuracy__tiny.json").read_text())
    assert "peer_failure" not in stored
    assert stored["relative_error"] == ours["relative_error"]  # our row is not re-run
    (peer,) = stored["peers"]
    assert peer["engine"] == "netket" and peer["threads"] == 2
    # netket's trained state summed over the 20 states of the sector: variational
    assert peer["enumerated_energy"] >= ours["exact_energy"] - 1e-9
    assert peer["enumerated_relative_error"] == pytest.approx(
        (peer["enumerated_energy"] - ours["exact_energy"]) / abs(ours["exact_energy"])
    )
    table = (tmp_path / "accuracy.md").read_text()
    assert f"| {peer['enumerated_relative_error']:+.2e} |" in table


def test_a_row_read_back_from_a_gpu_run_without_ed_is_measured_against_the_reference(tmp_path):
    # a system without ED (exact off here) whose run was made elsewhere on a GPU: the row
    # comes from the results file, names the GPU, and measures against the reference past
    # ED, here the Bethe-ansatz energy of the 6-site ring, saying which
    from vitqs.physics.bethe import heisenberg_chain_energy
    from vitqs.results import read_results, write_results

    config = tmp_path / "tiny.yaml"
    data = tiny_heisenberg(tmp_path / "out")
    data["exact"] = {"enabled": False}
    config.write_text(yaml.safe_dump(data))
    assert main(["run", str(config), "--quiet"]) == 0
    results_file = tmp_path / "out" / "tiny.h5"
    record = read_results(results_file)
    record.versions["gpu"] = "Some GPU"
    write_results(results_file, record)
    bethe = heisenberg_chain_energy(6)

    row = accuracy.row_from_results("tiny", results_file)
    assert row["relative_error"] is None and row["exact_energy"] is None
    assert row["device"] == "Some GPU" and row["n_iter"] == 4
    expected = (record.final["energy"] - bethe) / abs(bethe)  # signed
    assert row["reference_relative_error"] == pytest.approx(expected, rel=1e-12)
    assert row["curve_relative_error"][-1] == pytest.approx(
        abs(record.history[-1]["energy"] - bethe) / abs(bethe), rel=1e-12
    )
    cells = accuracy.render_table([row], "system").splitlines()[2].split(" | ")
    assert "GPU: Some GPU" in cells
    assert f"{bethe / 6:.6f} (Bethe ansatz)" in cells
    assert f"{expected:+.2e} (vs Bethe ansatz)" in cells


def test_a_row_of_steps_on_another_power_of_psi_says_so(tmp_path):
    config = tmp_path / "tiny.yaml"
    data = tiny_heisenberg(tmp_path / "out")
    data["sampler"]["machine_pow"] = 1.25
    config.write_text(yaml.safe_dump(data))
    assert main(["run", str(config), "--quiet"]) == 0
    row = accuracy.row_from_results("tiny", tmp_path / "out" / "tiny.h5")
    assert row["estimator"].startswith("Monte Carlo (steps on samples of |ψ|^1.25, reweighted")
    line = accuracy.render_table([row], "system").splitlines()[2]
    cells = re.split(r"(?<!\\)\|", line)[1:-1]  # split on the unescaped pipes
    assert len(cells) == len(accuracy.HEADER)
    assert "(steps on samples of \\|ψ\\|^1.25" in line


def test_from_results_refuses_what_it_does_not_combine_with(tmp_path):
    with pytest.raises(ConfigError, match="one system"):
        bench.main(["--systems", "j1j2_4x4", "j1j2_6x6", "--from-results", str(tmp_path)])
    with pytest.raises(ConfigError, match="no file"):
        bench.main(["--systems", "j1j2_6x6", "--from-results", str(tmp_path / "none.h5")])


def test_an_unknown_system_is_a_one_line_error_listing_the_known_ones(capsys):
    code = main(["bench", "accuracy", "--systems", "nosuch"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "nosuch" in err and "heisenberg_4x4" in err


def test_bench_accuracy_help_names_the_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "accuracy", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: vitqs bench accuracy")


def test_a_goal_is_judged_on_the_monte_carlo_estimate_and_its_error_bar():
    exact = -10.0
    # |ΔE| + 2σ ≤ goal |E_exact|: 1e-5 + 2·2e-5 = 5e-5 relative
    assert accuracy.goal_met(exact - 1e-4, 2e-4, exact, goal=5e-5 + 1e-12)
    assert not accuracy.goal_met(exact - 1e-4, 2e-4, exact, goal=4.9e-5)
    # below the exact energy counts as far as above it
    assert accuracy.goal_met(exact + 1e-4, 2e-4, exact, 5e-5 + 1e-12) == accuracy.goal_met(
        exact - 1e-4, 2e-4, exact, 5e-5 + 1e-12
    )


def test_goals_table_marks_full_sums_and_judges_mc_rows_not_their_enumeration():
    exact = -7.142296360624
    # enumerated 5e-7 meets 1e-6, but the estimate ± its error does not
    mc = {
        **_row("vitqs", None),
        "energy": exact * (1 - 3.1e-6),
        "energy_error": 5.2e-6 * abs(exact),
        "enumerated_relative_error": 5e-7,
    }
    summed = {**mc, "system": "j1j2_4x4", "energy": exact, "energy_error": 0.0}
    summed["estimator"] = "full sum over 441 orbits of the 12,870 states"
    met = {**mc, "system": "heisenberg_4x4", "energy_error": 1e-7 * abs(exact)}
    table = accuracy.render_goals([mc, summed, met]).splitlines()
    cells = [line.split(" | ") for line in table[2:]]
    assert cells[0][0] == "| heisenberg_chain16" and cells[0][4] == "no"
    assert cells[0][2] == "+3.1e-06 ± 5.2e-06" and cells[0][3] == "1.4e-05"
    assert cells[1][4].startswith("does not count: full sum")
    # 3.1e-6 + 2e-7 ≤ 1e-5, on the one seed a stored row holds: not "met"
    assert cells[2][0] == "| heisenberg_4x4"
    assert cells[2][4] == "under the goal on 1 seed of the 3 needed"


def test_the_machine_line_comes_from_the_rows_not_from_the_latest_invocation():
    # rows are run at different times: re-rendering on another machine once wrote that
    # machine for every row
    xeon, epyc = "Xeon (2 cores)", "EPYC (2 cores)"
    rows = [
        {
            **_row("vitqs", 1e-3),
            "machine": xeon,
            "peers": [{**_row("netket", 1e-2), "machine": xeon}],
        },
        {**_row("vitqs", 1e-3), "system": "u10", "machine": epyc},
        {**_row("vitqs", 1e-3), "system": "gpu", "device": "H200"},  # named in the table
        {**_row("vitqs", 1e-3), "system": "old", "machine": xeon},
    ]
    assert (
        accuracy.render_machines(rows)
        == f"Machine: {xeon} for every CPU row but u10 (vitqs) on {epyc}."
    )
    assert accuracy.render_machines(rows[:1]) == f"Machine: {xeon} for every CPU row."


def _defaults_row(seed, energy, error, exact=-8.45792, seconds=1150.0):
    return {
        "system": "j1j2_4x4",
        "seed": seed,
        "estimator": "Monte Carlo",
        "budget_seconds": 1200.0,
        "seconds": seconds,
        "n_iter": 900,
        "final_samples": 2**20,
        "stopped_by": "n_samples",
        "energy": energy,
        "energy_error": error,
        "exact_energy": exact,
    }


def test_the_defaults_verdict_follows_from_every_seeds_numbers():
    exact = -8.45792
    close = exact * (1 - 2e-5)  # 2e-5 above; with 2σ = 2e-5: 4e-5 ≤ 1e-4
    far = exact * (1 - 9e-5)  # 9e-5 above; with 2σ: 1.1e-4 > 1e-4
    sigma = 1e-5 * abs(exact)
    rows = [_defaults_row(seed, close, sigma) for seed in (0, 1, 2)]
    table = accuracy.render_defaults(rows)
    assert "| j1j2_4x4 | 3 | 3 | **yes** |" in table
    missed = [*rows[:2], _defaults_row(2, far, sigma, seconds=1260.0)]
    table = accuracy.render_defaults(missed)
    assert "| j1j2_4x4 | 3 | 2 | no |" in table  # one seed missing the goal is a miss
    assert "1260 (over)" in table  # a run past its budget says so
    assert len([line for line in table.splitlines() if line.startswith("| j1j2_4x4 | 1e-04")]) == 3
    assert "not yet: 2 of 3 seeds run" in accuracy.render_defaults(rows[:2])
    # close enough, but the whole run took longer than its budget: not met
    late = [*rows[:2], _defaults_row(2, close, sigma, seconds=1201.0)]
    table = accuracy.render_defaults(late)
    assert "no: over its budget" in table and "| j1j2_4x4 | 3 | 2 | no |" in table


def test_the_readme_summary_of_the_defaults_takes_the_worst_seed():
    exact = -8.45792
    sigma = 1e-5 * abs(exact)
    rows = [
        _defaults_row(0, exact * (1 - 2e-5), sigma),  # margin 4e-5
        _defaults_row(1, exact * (1 - 9e-5), sigma, seconds=1190.0),  # margin 1.1e-4: missed
        _defaults_row(2, exact * (1 - 1e-6), sigma),  # margin 2.1e-5
    ]
    summary = accuracy.render_defaults_summary(rows)
    assert "| j1j2_4x4 | 1e-04 | 2 of 3 | 1.1e-04 | 1190 (1200) | no |" in summary
    met = [rows[0], rows[2], _defaults_row(3, exact * (1 - 2e-5), sigma)]
    assert "| 3 of 3 | 4.0e-05 | 1150 (1200) | **yes** |" in accuracy.render_defaults_summary(met)
    assert "not yet: 2 of 3 seeds run" in accuracy.render_defaults_summary(rows[:2])
    # a seed within the goal but over its budget is not met here either
    late = [rows[0], rows[2], _defaults_row(3, exact * (1 - 2e-5), sigma, seconds=1201.0)]
    assert "| 2 of 3 |" in accuracy.render_defaults_summary(late)


@pytest.mark.slow
def test_a_defaults_run_is_read_back_with_its_seed_and_recipe(tmp_path):
    # the defaults config of the 4x4, at a budget of seconds: the row keeps what the table shows
    rows_dir, output = tmp_path / "rows", tmp_path / "accuracy.md"
    rows_dir.mkdir()
    config = bench.DEFAULTS_DIR / "j1j2_4x4.yaml"
    argv = ["run", str(config), "--quiet", "--set", "budget=8", "--set", "seed=4"]
    argv += ["--set", "name=defaults_j1j2_4x4_s4", "--set", f"output.dir={tmp_path}"]
    argv += ["--set", "threads=1"]
    assert main(argv) == 0
    results_file = tmp_path / "defaults_j1j2_4x4_s4.h5"
    options = ["--rows-dir", str(rows_dir), "--output", str(output)]
    assert bench.main(["--defaults", str(results_file), *options]) == 0
    row = json.loads((rows_dir / "defaults__j1j2_4x4_s4.json").read_text())
    assert row["seed"] == 4 and row["budget_seconds"] == 8.0 and row["seconds"] > 0
    assert row["recipe"]["sections"] == ["model", "sampler", "optimizer", "final"]
    assert row["stopped_by"] == "budget" and row["final_samples"] > 0
    text = output.read_text()
    assert "<!-- begin defaults-table -->" in text and "not yet: 1 of 3 seeds run" in text
    with pytest.raises(ConfigError, match="not a run defaults_<system>_s<seed>"):
        accuracy.defaults_row(_renamed(results_file, tmp_path))


def _renamed(results_file, tmp_path):
    from vitqs.results import read_results, write_results

    record = read_results(results_file)
    record.name = "mine"
    path = tmp_path / "mine.h5"
    write_results(path, record)
    return path
