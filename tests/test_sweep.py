"""``vitqs sweep``: tables and figures of a warm-started grid, and resuming without re-running
finished points."""

import csv
import shlex
import signal
import time

import pytest
import torch
import yaml
from helpers import (
    assert_one_line_error,
    last_json,
    run_files,
    run_main,
    tiny_bose_hubbard,
    vitqs_process,
    write_config,
)

from vitqs import results, sweep
from vitqs.build import build_hamiltonian
from vitqs.config import from_dict
from vitqs.physics import exact
from vitqs.physics.observables import condensate_fraction, exact_one_body_density_matrix
from vitqs.runner import run_config


def _write_sweep(tmp_path, **spec):
    write_config(tmp_path / "base.yaml", tiny_bose_hubbard(tmp_path / "out"))
    spec = {"base": "base.yaml", "name": "u_scan", "sweep": {"hamiltonian.U": [2.0, 6.0]}, **spec}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_sweep_writes_tables_figures_and_resumes(tmp_path, capsys, monkeypatch):
    warm = []

    def recording_run_config(config, **kwargs):
        warm.append(kwargs.get("initial_parameters"))
        return run_config(config, **kwargs)

    monkeypatch.setattr(sweep, "run_config", recording_run_config)
    path = _write_sweep(tmp_path, warm_start=True)
    code, out, err = run_main(capsys, "sweep", path, "--quiet", "--json")
    assert code == 0, err
    folder = tmp_path / "out" / "u_scan"
    first, second = folder / "U=2.0.h5", folder / "U=6.0.h5"
    # the second point started from the first point's final parameters
    assert warm[0] is None
    final_first = results.load_checkpoint(results.read_results(first))["model"]
    assert all(torch.equal(warm[1][k], v) for k, v in final_first.items())
    summary = last_json(out)
    assert summary["name"] == "u_scan"
    assert [point["U"] for point in summary["points"]] == [2.0, 6.0]
    for point, h5 in zip(summary["points"], (first, second), strict=True):
        record = results.read_results(h5)
        assert record.status == "finished"
        assert point["energy"] == record.final["energy"]
        assert point["exact_energy"] == record.exact["energy"]
        # the exact ground state's condensate fraction, recomputed here from ED, sits beside
        # the VMC one (the figure draws it as crosses)
        hamiltonian = build_hamiltonian(from_dict(yaml.safe_load(record.config_yaml)))
        ground = exact.ground_state(hamiltonian, return_vector=True, use_cache=False)
        rho = exact_one_body_density_matrix(hamiltonian.hilbert, ground.vector)
        fraction = condensate_fraction(rho, hamiltonian.hilbert.n_particles)
        assert point["exact_condensate_fraction"] == pytest.approx(fraction, rel=1e-10)
    # the condensate is depleted by the interaction
    first_point, second_point = summary["points"]
    assert first_point["exact_condensate_fraction"] > second_point["exact_condensate_fraction"]
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(row["U"]) for row in rows] == [2.0, 6.0]
    assert "| U |" in (folder / "summary.md").read_text()
    for figure in ("energy_per_site.png", "relative_error.png", "order_parameter.png"):
        assert (folder / figure).read_bytes()[:4] == b"\x89PNG"
        assert str(folder / figure) in out

    # interrupted after the first point: the second file is gone, the first is read back
    mtime = first.stat().st_mtime_ns
    second.unlink()
    code, out, err = run_main(capsys, "sweep", path, "--quiet", "--json")
    assert code == 0, err
    assert first.stat().st_mtime_ns == mtime
    assert results.read_results(second).status == "finished"
    assert len(last_json(out)["points"]) == 2

    # a second point left unfinished with a checkpoint is resumed, not started again
    record = results.read_results(second)
    record.status, record.final, record.observables = "interrupted", None, {}
    results.write_results(second, record)
    code, out, err = run_main(capsys, "sweep", path, "--quiet")
    assert code == 0, err
    assert first.stat().st_mtime_ns == mtime
    assert results.read_results(second).status == "finished"
    assert run_files(folder) == ["U=2.0.h5", "U=6.0.h5"]


@pytest.mark.slow
def test_a_changed_sweep_does_not_read_back_points_of_the_old_config(tmp_path, capsys):
    path = _write_sweep(tmp_path, sweep={"hamiltonian.U": [2.0]})
    assert run_main(capsys, "sweep", path, "--quiet")[0] == 0
    point = tmp_path / "out" / "u_scan" / "U=2.0.h5"
    mtime = point.stat().st_mtime_ns
    spec = yaml.safe_load(path.read_text())
    spec["set"] = {"hamiltonian.J": 0.5}  # the same file name, another hamiltonian
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, "hamiltonian.J", str(point))
    assert point.stat().st_mtime_ns == mtime  # the earlier run is kept


@pytest.mark.slow
def test_an_interrupted_sweep_names_the_command_that_resumes_it(tmp_path, capsys):
    path = _write_sweep(
        tmp_path, set={"optimizer.n_iter": 100, "output.checkpoint_every": 1}, warm_start=False
    )
    first = tmp_path / "out" / "u_scan" / "U=2.0.h5"
    process = vitqs_process("sweep", path, "--quiet")
    deadline = time.monotonic() + 120
    while not (first.exists() and results.read_results(first).checkpoint is not None):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in err
    hint = shlex.split(err.split("Resume with: ")[1])
    assert hint == ["vitqs", "sweep", str(path)]
    code, out, err = run_main(capsys, *hint[1:], "--quiet", "--json")
    assert code == 0, err
    assert [point["U"] for point in last_json(out)["points"]] == [2.0, 6.0]


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"sweeep": {"hamiltonian.U": [1]}}, "did you mean 'sweep'"),
        ({"sweep": {"hamiltonian.U": 3}}, "sweep.hamiltonian.U"),
        ({"sweep": {"hamiltonian.UU": [1, 2]}}, "hamiltonian.UU"),
        ({"sweep": {"hamiltonian.U": [1, "x"]}}, "hamiltonian.U"),
        ({"warm_start": "yes"}, "warm_start"),
        ({"base": "missing.yaml"}, "missing.yaml"),
        ({"set": [1]}, "set="),
        ({"set": {"optimizer.lr": -1}}, "optimizer.lr"),
    ],
)
def test_bad_sweep_files_exit_2_before_running(spec, key, tmp_path, capsys):
    path = _write_sweep(tmp_path, **spec)
    if "sweeep" in spec:
        data = yaml.safe_load(path.read_text())
        del data["sweep"]
        path.write_text(yaml.safe_dump(data))
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, key)
    assert run_files(tmp_path) == []


def test_warm_start_across_different_models_is_a_config_error(tmp_path, capsys):
    path = _write_sweep(tmp_path, warm_start=True, sweep={"model.d_model": [4, 8]})
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, "warm_start")
    assert run_files(tmp_path / "out" / "u_scan") == ["d_model=4.h5"]


def test_a_warm_started_sweep_of_raced_sign_priors_is_refused_before_it_runs(tmp_path, capsys):
    # the triangular lattice's recipe races the sign priors from random starts
    base = {
        "lattice": {"kind": "triangular", "shape": [4, 4]},
        "hamiltonian": {"kind": "heisenberg"},
    }
    write_config(tmp_path / "tri.yaml", {**base, "output": {"dir": str(tmp_path / "out")}})
    spec = {"base": "tri.yaml", "sweep": {"hamiltonian.J2": [0.0, 0.1]}, "warm_start": True}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, "model.sign_prior=search", "warm_start: false")
    assert not (tmp_path / "out").exists()  # refused before the first point ran


def test_a_warm_started_sweep_of_searched_sectors_is_refused_before_it_runs(tmp_path, capsys):
    # a frustrated ladder of 3 rungs: the recipe patches it one rung at a time and searches
    base = {"lattice": {"kind": "ladder", "shape": [3, 2]}, "hamiltonian": {"kind": "heisenberg"}}
    write_config(tmp_path / "ladder.yaml", {**base, "output": {"dir": str(tmp_path / "out")}})
    spec = {"base": "ladder.yaml", "sweep": {"hamiltonian.J2": [0.0, 0.2]}, "warm_start": True}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, "model.sector=search")
    assert "warm_start: false" in err
    assert not (tmp_path / "out").exists()  # refused before the first point ran
    spec["warm_start"] = False
    path.write_text(yaml.safe_dump(spec))
    assert len(sweep.point_configs(sweep.load_sweep(path))) == 2


def test_set_overrides_the_base_at_every_point_and_the_grid_wins(tmp_path):
    path = _write_sweep(
        tmp_path, set={"optimizer.n_iter": 7, "hamiltonian.U": 99.0, "final.n_samples": 64}
    )
    configs = sweep.point_configs(sweep.load_sweep(path))
    assert [config.hamiltonian.U for _, config in configs] == [2.0, 6.0]
    assert all(config.optimizer.n_iter == 7 for _, config in configs)
    assert all(config.final.n_samples == 64 for _, config in configs)


@pytest.mark.slow
def test_a_finished_point_is_read_back_only_while_nothing_it_computed_changed(tmp_path, capsys):
    path = _write_sweep(tmp_path, sweep={"hamiltonian.U": [2.0]})
    assert run_main(capsys, "sweep", path, "--quiet")[0] == 0
    point = tmp_path / "out" / "u_scan" / "U=2.0.h5"
    energies = [row["energy"] for row in results.read_results(point).history]

    def again(**overrides):
        spec = yaml.safe_load(path.read_text())
        spec["set"] = overrides
        path.write_text(yaml.safe_dump(spec))
        return run_main(capsys, "sweep", path, "--quiet")

    # where and how it runs: read back untouched, as is a budget that did not end it
    mtime = point.stat().st_mtime_ns
    assert again(device="cpu", threads=2, budget=1e4)[0] == 0
    assert point.stat().st_mtime_ns == mtime

    # another final measurement: measured again, the steps kept
    assert again(**{"final.n_samples": 256})[0] == 0
    record = results.read_results(point)
    assert record.final["n_samples"] == 256
    assert [row["energy"] for row in record.history] == energies

    # no exact reference any more: the point says so
    assert again(**{"final.n_samples": 256, "exact.enabled": False})[0] == 0
    assert results.read_results(point).exact is None

    # more steps: the point goes on from where it finished
    overrides = {"final.n_samples": 256, "exact.enabled": False, "optimizer.n_iter": 6}
    assert again(**overrides)[0] == 0
    record = results.read_results(point)
    assert [row["step"] for row in record.history] == list(range(6))
    assert [row["energy"] for row in record.history][:4] == energies

    # fewer steps or a smaller budget than it ran: its result is not this config's
    before = point.read_bytes()
    for smaller in ({"optimizer.n_iter": 3}, {"budget": 1e-3}):
        code, _, err = again(**{**overrides, **smaller})
        assert_one_line_error(code, err, str(point), next(iter(smaller)))
    assert point.read_bytes() == before


@pytest.mark.parametrize("damage", ["garbage", "newer format"])
def test_a_point_file_that_does_not_read_is_not_overwritten(damage, tmp_path, capsys):
    path = _write_sweep(tmp_path, sweep={"hamiltonian.U": [2.0]})
    point = tmp_path / "out" / "u_scan" / "U=2.0.h5"
    point.parent.mkdir(parents=True)
    if damage == "garbage":
        point.write_bytes(b"\x89HDF\r\n\x1a\n half a file")
    else:
        import h5py

        with h5py.File(point, "w") as f:
            f.attrs["format"] = results.FORMAT
            f.attrs["format_version"] = results.FORMAT_VERSION + 1
    before = point.read_bytes()
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, str(point), "does not overwrite")
    assert point.read_bytes() == before


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"name": "../escaped"}, "name='../escaped'"),
        ({"name": 7}, "must be a string"),
        ({"name": "two\nlines"}, "control characters"),
        ({"sweep": {"output.dir": ["a/b"]}}, "dir=a/b"),
        ({"sweep": {"hamiltonian.U": [1.0], "name": ["x" * 300]}}, "longer than"),
    ],
)
def test_sweep_and_point_names_stay_inside_the_output_folder(spec, key, tmp_path, capsys):
    path = _write_sweep(tmp_path, **spec)
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "sweep.yaml"]


def test_an_interrupted_replacement_of_a_point_resumes_from_its_checkpoint(
    tmp_path, capsys, monkeypatch
):
    # a point left unfinished before its first checkpoint is run again beside its file, in
    # .<point>.h5.pending; interrupted, that pending file holds the checkpoint "Resume with:
    # vitqs sweep" promised, which a re-run of the sweep once deleted to start from scratch
    path = _write_sweep(tmp_path, sweep={"hamiltonian.U": [2.0]})
    assert run_main(capsys, "sweep", path, "--quiet")[0] == 0
    point = tmp_path / "out" / "u_scan" / "U=2.0.h5"
    finished = results.read_results(point)
    interrupted = results.read_results(point)
    interrupted.status, interrupted.final, interrupted.observables = "interrupted", None, {}
    results.write_results(point.with_name(".U=2.0.h5.pending"), interrupted)
    unstarted = results.read_results(point)
    unstarted.status, unstarted.final, unstarted.observables = "running", None, {}
    unstarted.history, unstarted.checkpoint, unstarted.checkpoint_step = [], None, None
    results.write_results(point, unstarted)

    calls = []

    def recording_run_config(config, **kwargs):
        calls.append({k: kwargs.get(k) for k in ("resume", "overwrite")})
        return run_config(config, **kwargs)

    monkeypatch.setattr(sweep, "run_config", recording_run_config)
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert code == 0, err
    assert calls == [{"resume": True, "overwrite": None}]
    resumed = results.read_results(point)
    assert resumed.status == "finished" and resumed.history == finished.history
    assert run_files(point.parent) == ["U=2.0.h5"]  # the replacement landed


@pytest.mark.parametrize("first, then", [(False, True), (True, False)])
def test_a_change_of_warm_start_refuses_the_points_computed_the_other_way(
    first, then, tmp_path, capsys
):
    path = _write_sweep(tmp_path, warm_start=first)
    assert run_main(capsys, "sweep", path, "--quiet")[0] == 0
    second = tmp_path / "out" / "u_scan" / "U=6.0.h5"
    assert results.read_results(second).initial_state == ("previous point" if first else "seed")
    before = second.read_bytes()
    path = _write_sweep(tmp_path, warm_start=then)
    code, _, err = run_main(capsys, "sweep", path, "--quiet")
    assert_one_line_error(code, err, "U=6.0.h5", "warm_start")
    assert second.read_bytes() == before  # nothing written is lost
