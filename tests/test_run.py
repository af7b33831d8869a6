"""``vitqs run``: the results file layout, refusing to overwrite, resuming after SIGKILL and
SIGINT to the same energies, and clear errors on truncated or foreign files."""

import contextlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch
import yaml
from helpers import (
    assert_one_line_error,
    last_json,
    model_energy,
    model_vector,
    random_spins,
    rayleigh_quotient,
    run_files,
    run_main,
    tiny_bose_hubbard,
    tiny_heisenberg,
    vitqs_process,
    write_config,
)

from vitqs import results
from vitqs.config import MOST_FINAL_SAMPLES, OPTIMISATION_SHARE, from_dict, upgrade_stored
from vitqs.results import EXACT_FIELDS, FINAL_FIELDS, HISTORY_FIELDS
from vitqs.runner import run_config

SUMMARY_KEYS = {
    "name",
    "energy",
    "energy_error",
    "variance",
    "v_score",
    "exact_energy",
    "reference",
    "relative_error",
    "n_params",
    "n_iter",
    "seconds",
    "seconds_per_iter",
    "note",
    "final_samples",
    "stopped_by",
    "extrapolated_energy",
    "extrapolated_error",
    "results_file",
}


@pytest.mark.parametrize("make", [tiny_heisenberg, tiny_bose_hubbard])
def test_run_writes_the_documented_layout(make, tmp_path, capsys):
    data = make(tmp_path / "out")
    path = write_config(tmp_path / "tiny.yaml", data)
    code, out, err = run_main(capsys, "run", path, "--json", "--quiet")
    assert code == 0, err
    summary = last_json(out)
    assert set(summary) == SUMMARY_KEYS
    n_iter = data["optimizer"]["n_iter"]
    assert summary["n_iter"] == n_iter
    # signed: an estimate below the exact energy reads negative
    assert summary["relative_error"] == pytest.approx(
        (summary["energy"] - summary["exact_energy"]) / abs(summary["exact_energy"])
    )
    h5 = tmp_path / "out" / f"{data['name']}.h5"
    assert summary["results_file"] == str(h5)
    with h5py.File(h5, "r") as f:
        attrs = f.attrs
        assert attrs["format"] == "vitqs-results" and attrs["status"] == "finished"
        assert attrs["seed"] == data["seed"]
        embedded = from_dict(yaml.safe_load(attrs["config_yaml"]))
        assert embedded.hamiltonian.kind == data["hamiltonian"]["kind"]
        assert "torch" in json.loads(attrs["versions_json"])
        assert "S = sigma/2" in attrs["conventions"]
        assert set(f["history"]) == set(HISTORY_FIELDS)
        for name in HISTORY_FIELDS:
            assert f["history"][name].shape == (n_iter,)
        np.testing.assert_array_equal(f["history/step"][()], np.arange(n_iter))
        assert set(EXACT_FIELDS) <= set(f["exact"].attrs)
        assert f["exact"].attrs["energy"] == summary["exact_energy"]
        # note: only where the numbers need one (a zero variance that is an eigenstate's)
        assert set(FINAL_FIELDS) - {"note"} <= set(f["final"].attrs)
        assert 0 < f["final"].attrs["acceptance"] < 1
        assert f["final"].attrs["energy"] == summary["energy"]
        assert len(f["final/observables"]) > 0
        assert f["checkpoint"].attrs["step"] == n_iter


def test_second_run_refuses_and_leaves_the_file(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    before, mtime = h5.read_bytes(), h5.stat().st_mtime_ns
    code, _, err = run_main(capsys, "run", path, "--quiet")
    assert_one_line_error(code, err, "--overwrite")
    assert h5.read_bytes() == before and h5.stat().st_mtime_ns == mtime


def _checkpoint_step(h5) -> int:
    try:
        with h5py.File(h5, "r") as f:
            return int(f["checkpoint"].attrs["step"]) if "checkpoint" in f else 0
    except (OSError, KeyError):  # not written yet
        return 0


def _wait_for_checkpoint(process, h5, timeout=120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step = _checkpoint_step(h5)
        if step >= 1:
            return step
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.02)
    process.kill()
    raise AssertionError("no checkpoint appeared")


@contextlib.contextmanager
def _lock_held(h5):
    """Holds the results file's lock in another process, as a live run does."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(h5.with_name(f".{h5.name}.lock")),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def _history(h5) -> dict:
    with h5py.File(h5, "r") as f:
        return {name: f["history"][name][()] for name in ("step", "energy")}


N_ITER = 20  # long enough that a signal after the first checkpoint lands mid-run
RESUME_SECTIONS = {"optimizer": {"n_iter": N_ITER}, "output": {"checkpoint_every": 3}}


@pytest.mark.slow
def test_resume_after_sigkill_gives_the_same_run(tmp_path, capsys):
    straight = tiny_heisenberg(tmp_path / "straight", **RESUME_SECTIONS)
    expected = run_config(from_dict(straight), progress=False)

    data = tiny_heisenberg(tmp_path / "killed", **RESUME_SECTIONS)
    path = write_config(tmp_path / "tiny.yaml", data)
    h5 = tmp_path / "killed" / "tiny.h5"
    process = vitqs_process("run", path, "--quiet")
    step = _wait_for_checkpoint(process, h5)
    process.kill()  # SIGKILL: no handler runs
    process.wait()
    if step == N_ITER and process.returncode == 0:
        pytest.skip("the run finished before it could be killed")
    assert len(_history(h5)["step"]) >= step

    # the file says running, but no process holds it: the report says so, and how to go on
    assert results.read_results(h5).status == "running"
    code, out, err = run_main(capsys, "report", h5.parent)
    assert code == 0, err
    assert "| tiny | stopped |" in out and "--resume" in out
    with _lock_held(h5):  # a live writer: running it is
        assert "| tiny | running |" in run_main(capsys, "report", h5.parent)[1]
    stale = h5.with_name(".tiny.h5.x1y2z3.tmp")  # what a kill mid-write leaves
    stale.write_bytes(b"\x89HDF half a file")

    code, out, err = run_main(capsys, "run", path, "--resume", "--quiet", "--json")
    assert code == 0, err
    assert run_files(h5.parent) == ["tiny.h5"]  # the stale temporary file is gone
    assert not h5.with_name(".tiny.h5.lock").exists()
    history = _history(h5)
    np.testing.assert_array_equal(history["step"], np.arange(N_ITER))  # each step exactly once
    np.testing.assert_array_equal(history["energy"], _history(expected["results_file"])["energy"])
    assert last_json(out)["energy"] == pytest.approx(expected["energy"], abs=1e-12)


@pytest.mark.slow
def test_sigint_checkpoints_then_resume_completes(tmp_path, capsys):
    data = tiny_heisenberg(tmp_path / "out", **RESUME_SECTIONS)
    path = write_config(tmp_path / "tiny.yaml", data)
    h5 = tmp_path / "out" / "tiny.h5"
    override = ("--set", "optimizer.diag_shift=0.002")  # a resume must repeat it
    process = vitqs_process("run", path, *override, "--quiet")
    _wait_for_checkpoint(process, h5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode != 0
    assert "Traceback" not in err
    record = results.read_results(h5)
    assert record.status == "interrupted"
    assert record.checkpoint_step == len(record.history) >= 1

    # the printed command, overrides included, is the one that resumes
    hint = shlex.split(err.split("Resume with: ")[1])
    assert hint == ["vitqs", "run", str(path), *override, "--resume"]
    code, out, err = run_main(capsys, *hint[1:], "--quiet", "--json")
    assert code == 0, err
    assert last_json(out)["n_iter"] == N_ITER
    np.testing.assert_array_equal(_history(h5)["step"], np.arange(N_ITER))
    assert results.read_results(h5).status == "finished"


def test_resume_refuses_a_changed_hamiltonian_and_continues_a_raised_n_iter(tmp_path, capsys):
    data = tiny_bose_hubbard(tmp_path / "out")
    path = write_config(tmp_path / "tiny.yaml", data)
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny_bh.h5"
    before = h5.read_bytes()

    code, _, err = run_main(capsys, "run", path, "--resume", "--set", "hamiltonian.U=5")
    assert_one_line_error(code, err, "hamiltonian.U")
    code, _, err = run_main(capsys, "run", path, "--resume")
    assert_one_line_error(code, err, "optimizer.n_iter")  # finished: nothing to continue
    assert h5.read_bytes() == before

    # the precisions of the network copies change rounding, not the state: a resume may
    code, out, err = run_main(
        capsys,
        *("run", path, "--resume", "--quiet", "--json", "--set", "optimizer.n_iter=6"),
        *("--set", "sampler.dtype=float64", "--set", "sampler.local_energy_dtype=float32"),
        *("--set", "final.symmetrize=translations"),  # the final average: after the steps
        *("--set", "sampler.chunk_size=8"),  # memory only
    )
    assert code == 0, err
    assert last_json(out)["n_iter"] == 6
    history = _history(h5)
    np.testing.assert_array_equal(history["step"], np.arange(6))
    record = results.read_results(h5)
    assert record.status == "finished" and record.checkpoint_step == 6


def test_a_resume_settles_changed_exact_settings_before_its_steps(tmp_path, capsys):
    """exact.* may change on a resume: an impossible ED is refused before any step (the file
    untouched), and ED switched off leaves a finished run without exact values."""
    path = write_config(tmp_path / "tiny.yaml", tiny_bose_hubbard(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny_bh.h5"
    before = h5.read_bytes()
    more = ("--resume", "--quiet", "--set", "optimizer.n_iter=6")
    code, _, err = run_main(
        capsys, "run", path, *more, "--set", "exact.enabled=true", "--set", "exact.max_dim=10"
    )
    assert_one_line_error(code, err, "exact.max_dim=10")
    assert h5.read_bytes() == before

    code, _, err = run_main(capsys, "run", path, *more, "--set", "exact.enabled=false")
    assert code == 0, err
    record = results.read_results(h5)
    assert record.status == "finished" and len(record.history) == 6
    assert record.exact is None and np.isnan(record.final["relative_error"])
    assert not any(name.startswith("exact_") for name in record.observables)


def test_a_resume_starts_from_its_checkpoint_whatever_model_init_from_says(tmp_path, capsys):
    data = tiny_bose_hubbard(tmp_path / "out")
    path = write_config(tmp_path / "tiny.yaml", data)
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny_bh.h5"
    other = tmp_path / "other.h5"
    other.write_bytes(h5.read_bytes())
    code, _, err = run_main(
        capsys,
        *("run", path, "--resume", "--quiet", "--set", "optimizer.n_iter=6"),
        *("--set", f"model.init_from={other}"),
    )
    assert code == 0, err
    assert len(results.read_results(h5).history) == 6


def test_an_output_dir_that_cannot_be_a_folder_is_a_one_line_error(tmp_path, capsys):
    taken = tmp_path / "a_file"
    taken.write_text("keep me")
    for output_dir in (taken, taken / "below"):
        path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(output_dir))
        code, _, err = run_main(capsys, "run", path)
        assert_one_line_error(code, err, "output.dir", str(output_dir), "not a folder")
    assert taken.read_text() == "keep me"
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(locked / "out"))
        code, _, err = run_main(capsys, "run", path)
        assert_one_line_error(code, err, "output.dir", "not writable")


@pytest.mark.slow
def test_a_run_in_progress_is_not_written_over_by_a_second_process(tmp_path, capsys):
    data = tiny_heisenberg(tmp_path / "out", **RESUME_SECTIONS)
    data["optimizer"]["n_iter"] = 10_000  # still running when the others try
    path = write_config(tmp_path / "tiny.yaml", data)
    h5 = tmp_path / "out" / "tiny.h5"
    process = vitqs_process("run", path, "--quiet")
    try:
        _wait_for_checkpoint(process, h5)
        for flag in ("--resume", "--overwrite"):  # a budget: unguarded, they would end
            budget = ("--set", "budget=3")
            code, _, err = run_main(capsys, "run", path, flag, *budget, "--quiet")
            assert_one_line_error(code, err, str(h5), "another vitqs process")
        assert process.poll() is None  # the first run goes on
    finally:
        process.kill()  # SIGKILL: no clean-up, yet the kernel drops the lock
        process.communicate(timeout=60)
    data["optimizer"]["n_iter"] = _checkpoint_step(h5) + 2
    write_config(path, data)
    code, _, err = run_main(capsys, "run", path, "--resume", "--quiet")
    assert code == 0, err
    assert results.read_results(h5).status == "finished"
    assert os.listdir(tmp_path / "out") == ["tiny.h5"]  # the lock file goes with a clean end


def test_resume_without_a_file_is_an_error(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    code, _, err = run_main(capsys, "run", path, "--resume")
    assert_one_line_error(code, err, "tiny.h5")


def test_truncated_and_foreign_files_are_one_line_errors(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    content = h5.read_bytes()
    h5.write_bytes(content[: len(content) // 2])
    for argv in (("run", path, "--resume", "--set", "optimizer.n_iter=8"), ("report", h5)):
        code, _, err = run_main(capsys, *argv)
        assert_one_line_error(code, err, "tiny.h5")

    with h5py.File(h5, "w") as f:  # a foreign HDF5 file under the run's name
        f.attrs["format"] = "something-else"
        f["data"] = np.zeros(3)
    for argv in (("run", path, "--resume", "--set", "optimizer.n_iter=8"), ("report", h5)):
        code, _, err = run_main(capsys, *argv)
        assert_one_line_error(code, err, "not a vitqs results file")
    assert os.listdir(tmp_path / "out") == ["tiny.h5"]


def test_report_writes_figures_and_a_table(tmp_path, capsys):
    for name in ("first", "second"):
        data = tiny_heisenberg(tmp_path / "out")
        data["name"] = name
        config = write_config(tmp_path / f"{name}.yaml", data)
        assert run_main(capsys, "run", config, "--quiet")[0] == 0
    code, out, err = run_main(capsys, "report", tmp_path / "out")
    assert code == 0, err
    assert "| name |" in out and "| first |" in out and "| second |" in out
    for name in ("first", "second"):
        for figure in ("energy.png", "relative_error.png", "variance.png"):
            png = tmp_path / "out" / name / figure
            assert png.read_bytes()[:4] == b"\x89PNG"
            assert str(png) in out


def test_a_budget_spent_in_setting_up_measures_the_initial_state(tmp_path):
    # the budget is the whole run's: spent before the first step, no step is made, and the
    # final measurement draws one batch, saying the budget ended it
    data = tiny_heisenberg(tmp_path / "out", optimizer={"n_iter": 50}, budget=1e-6)
    summary = run_config(from_dict(data), progress=False)
    assert summary["n_iter"] == 0 and summary["stopped_by"] == "budget"
    record = results.read_results(summary["results_file"])
    assert record.status == "finished" and record.final["energy"] == summary["energy"]
    assert record.final["n_samples"] == data["sampler"]["n_samples"]


@pytest.mark.usefixtures("single_thread")
def test_the_budget_is_the_whole_run(tmp_path):
    # steps until 85 % of it, then final samples until it ends (the most final.n_samples
    # allows is far more than the time holds): the whole run within 5 % of its budget, and
    # short of it by no more than what the observables' share may leave unused
    budget = 12.0
    data = tiny_heisenberg(tmp_path / "out", budget=budget)
    del data["optimizer"]["n_iter"], data["final"]["n_samples"]
    summary = run_config(from_dict(data), progress=False)
    record = results.read_results(summary["results_file"])
    assert 0.9 * budget <= summary["seconds"] <= 1.05 * budget, summary["seconds"]
    assert record.final["seconds"] == summary["seconds"]
    assert summary["stopped_by"] == "budget" and summary["final_samples"] < MOST_FINAL_SAMPLES
    assert summary["n_iter"] > 10  # no n_iter: the budget ends the steps


def test_a_target_error_ends_the_final_measurement(tmp_path):
    # a loose target is met after the first batches: far fewer samples than the most
    data = tiny_heisenberg(tmp_path / "out", optimizer={"n_iter": 3})
    data["final"] = {"target_error": 0.05, "n_samples": 65536}
    summary = run_config(from_dict(data), progress=False)
    assert summary["stopped_by"] == "target_error"
    assert summary["final_samples"] < 65536
    assert summary["energy_error"] <= 0.05 * abs(summary["energy"])
    # the first half of every chain was discarded: the kept samples are the later batches
    record = results.read_results(summary["results_file"])
    assert record.final["n_discard"] >= data["sampler"].get("n_discard", 16)


def test_a_run_resumed_after_its_budget_is_measured_again_without_another_step(tmp_path):
    # re-measuring a finished run (e.g. with more final samples) measures the state it ended
    # in: the parameters of the file, not those of one more step
    data = tiny_heisenberg(tmp_path / "out", optimizer={"n_iter": 50}, budget=1e-6)
    first = run_config(from_dict(data), progress=False)
    before = results.read_results(first["results_file"])
    data["final"]["n_samples"] = 256
    again = run_config(from_dict(data), resume=True, progress=False)
    after = results.read_results(again["results_file"])
    assert again["n_iter"] == first["n_iter"] == 0
    # the budget spent: one batch, from chains that went on
    assert after.final["n_samples"] == 64 and after.final["energy"] != before.final["energy"]
    assert len(after.history) == len(before.history) == 0


def test_budget_must_be_positive_or_null(tmp_path):
    from vitqs.config import ConfigError

    for bad in (0, -1, 1e300):
        with pytest.raises(ConfigError, match="budget"):
            from_dict(tiny_heisenberg(tmp_path, budget=bad))
    assert from_dict(tiny_heisenberg(tmp_path)).budget is None


def test_the_old_optimisation_budget_names_the_whole_runs(tmp_path):
    from vitqs.config import ConfigError

    with pytest.raises(ConfigError, match=r"optimizer.max_seconds=1200: .* budget: <seconds>"):
        from_dict(tiny_heisenberg(tmp_path, optimizer={"max_seconds": 1200}))
    # null meant no budget, and still does; a stored one keeps its steps' seconds
    assert from_dict(tiny_heisenberg(tmp_path, optimizer={"max_seconds": None})).budget is None
    stored = upgrade_stored({"optimizer": {"max_seconds": 850.0}})
    assert stored == {"optimizer": {}, "budget": pytest.approx(850.0 / OPTIMISATION_SHARE)}


def test_a_stored_anneal_of_two_keys_reads_as_the_one_value(tmp_path):
    # results files written before the anneal became one value store anneal_from and
    # anneal_until; they resume and report with the same path
    old = {"anneal_from": {"U": 1.0}, "anneal_until": 0.5, "n_iter": 6}
    stored = upgrade_stored({"optimizer": old})
    assert stored["optimizer"] == {"anneal": {"from": {"U": 1.0}, "until": 0.5}, "n_iter": 6}
    config = from_dict({**tiny_bose_hubbard(tmp_path), **stored})
    assert config.optimizer.anneal == {"from": {"U": 1.0}, "until": 0.5}
    assert upgrade_stored({"optimizer": {"anneal_from": None, "anneal_until": None}}) == {
        "optimizer": {"anneal": None}
    }


def test_a_stored_sector_of_separate_keys_reads_as_the_one_value(tmp_path):
    # results files written before the sector became one value store model.momentum,
    # point_characters, spin_flip and sector: given | search
    old = {"sector": "given", "momentum": [3], "point_characters": None, "spin_flip": -1}
    model = upgrade_stored({"model": old})["model"]
    assert model == {"sector": {"momentum": [3], "spin_flip": -1}}
    plain = {"sector": "given", "momentum": None, "point_characters": None, "spin_flip": 0}
    assert upgrade_stored({"model": plain})["model"] == {"sector": None}
    searched = {"sector": "search", "momentum": None, "point_characters": None, "spin_flip": 0}
    assert upgrade_stored({"model": searched})["model"] == {"sector": "search"}
    data = tiny_heisenberg(tmp_path, model={"symmetrize": "translations", **model})
    data["hamiltonian"]["sign_rule"] = False
    config = from_dict(data)
    assert (config.model.momentum, config.model.spin_flip) == ([3], -1)
    assert config.model.point_characters is None and not config.model.searches_sector


@pytest.mark.parametrize("symmetrize", ["translations", "space_group"])
def test_final_energy_of_the_average_is_itsmodel_energy(tmp_path, symmetrize):
    # full sum: the final energy must be exactly <ψ_G|H|ψ_G>/<ψ_G|ψ_G> of the trained ViT
    # averaged over all 8 translations (and the 8 reflections), rebuilt here from the
    # checkpoint, independently of the cosets the code averages over
    from vitqs.build import build_hamiltonian, build_network
    from vitqs.models import Symmetrized
    from vitqs.physics.lattice import Lattice
    from vitqs.physics.observables import exact_spin_correlations

    data = tiny_heisenberg(
        tmp_path / "out",
        lattice={"shape": [8], "pbc": True},
        sampler={"kind": "full_sum"},
        final={"symmetrize": symmetrize},
    )
    config = from_dict(data)
    summary = run_config(config, progress=False)
    record = results.read_results(summary["results_file"])
    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    model.load_state_dict(results.load_checkpoint(record)["model"])
    lattice = Lattice((8,), pbc=True)
    group = lattice.translations if symmetrize == "translations" else lattice.space_group()
    assert len(group) == (8 if symmetrize == "translations" else 16)
    psi = model_vector(Symmetrized(model, group), hamiltonian.hilbert)
    energy = rayleigh_quotient(hamiltonian, psi)
    assert summary["energy"] == pytest.approx(energy, rel=1e-10)
    assert summary["energy"] >= summary["exact_energy"] - 1e-10
    # and the observables are those of the same vector (the run sums over its amplitudes)
    corr = exact_spin_correlations(hamiltonian.hilbert, lattice, psi, hamiltonian.sign_rule)
    np.testing.assert_allclose(record.observables["spin_correlations"], corr, atol=1e-12)
    assert not record.observables["spin_correlations_error"].any()


def test_final_state_is_the_mean_of_the_late_iterates(tmp_path):
    # full sum: the final energy must be the Rayleigh quotient of the averaged parameters
    from vitqs.build import build_hamiltonian, build_network
    from vitqs.vmc.sr import set_parameter_vector

    data = tiny_heisenberg(
        tmp_path / "out",
        sampler={"kind": "full_sum"},
        optimizer={"n_iter": 6, "average_from": 0.5},
    )
    config = from_dict(data)
    summary = run_config(config, progress=False)
    state = results.load_checkpoint(results.read_results(summary["results_file"]))
    mean, count = state["vmc"]["average"]
    assert count == 3
    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    set_parameter_vector(model, mean)
    torch.testing.assert_close(model.state_dict(), state["model"], rtol=0, atol=0)
    energy = model_energy(model, hamiltonian)
    assert summary["energy"] == pytest.approx(energy, rel=1e-10)


def test_a_run_on_samples_of_a_lower_power_measures_the_final_energy_on_psi_squared(tmp_path):
    # steps on |ψ|^1 samples; the final energy must still estimate <ψ|H|ψ>/<ψ|ψ> of the
    # final state (rebuilt here from the checkpoint and summed over the sector), which the
    # same samples unweighted would miss by far (test_vmc)
    from vitqs.build import build_hamiltonian, build_network

    data = tiny_bose_hubbard(
        tmp_path / "out",
        hamiltonian={"U": 8.0},
        sampler={"machine_pow": 1.0},
        optimizer={"n_iter": 5},
        final={"n_samples": 4096},
    )
    config = from_dict(data)
    summary = run_config(config, progress=False)
    record = results.read_results(summary["results_file"])
    assert all(np.isfinite(row["energy"]) for row in record.history)
    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    model.load_state_dict(results.load_checkpoint(record)["model"])
    energy = model_energy(model, hamiltonian)
    assert abs(summary["energy"] - energy) < 4.5 * summary["energy_error"]


def test_annealed_run_starts_on_the_first_hamiltonian_and_ends_on_the_config_s(tmp_path):
    # full sum, U annealed 1 -> 4 over half of 6 steps: step 0's energy is the Rayleigh
    # quotient of the initial ViT under H(U = 1), built here independently; the steps after
    # the anneal's until, and the final energy, are those of H(U = 4)
    from vitqs.build import Anneal, build_hamiltonian, build_vmc
    from vitqs.physics.operators import BoseHubbard

    data = tiny_bose_hubbard(
        tmp_path / "out",
        sampler={"kind": "full_sum"},
        optimizer={"n_iter": 6, "anneal": {"from": {"U": 1.0}, "until": 0.5}},
    )
    config = from_dict(data)
    initial = build_vmc(config).model
    summary = run_config(config, progress=False)
    record = results.read_results(summary["results_file"])
    assert [row["anneal_fraction"] for row in record.history] == pytest.approx(
        [0, 1 / 3, 2 / 3, 1, 1, 1]
    )

    target = build_hamiltonian(config)
    start = BoseHubbard(target.lattice, J=1.0, U=1.0, n_particles=4)
    energy = rayleigh_quotient(start, model_vector(initial, target.hilbert))
    assert record.history[0]["energy"] == pytest.approx(energy, rel=1e-10)
    assert summary["energy"] >= summary["exact_energy"] - 1e-10

    anneal = Anneal(config, target)
    middle, fraction = anneal(0.25)  # half way: U = 2.5
    assert fraction == 0.5
    np.testing.assert_allclose(
        middle.to_dense(), BoseHubbard(target.lattice, 1.0, 2.5, n_particles=4).to_dense()
    )
    assert middle.hilbert is target.hilbert  # its index tables are built once per run
    assert anneal(0.5) == (target, 1.0)


def test_a_run_without_anneal_records_the_config_s_hamiltonian(tmp_path):
    summary = run_config(from_dict(tiny_heisenberg(tmp_path / "out")), progress=False)
    record = results.read_results(summary["results_file"])
    assert [row["anneal_fraction"] for row in record.history] == [1.0] * 4


def _collapsed_jastrow_run(tmp_path, max_frozen_steps, onsite=-1000.0, **sections):
    # a ViT whose Jastrow factor has u(2) = -1000 on the unit-filled 4-site ring: every hop
    # from the Mott configuration makes a double occupancy, so once the chains reach it no
    # move is ever accepted again, and SR, whose samples are then all alike, cannot move the
    # state
    from vitqs.build import build_vmc

    data = tiny_bose_hubbard(
        tmp_path / "out",
        model={"jastrow": True},
        sampler={"max_frozen_steps": max_frozen_steps, **sections.get("sampler", {})},
        optimizer={"n_iter": 12, **sections.get("optimizer", {})},
    )
    data["hamiltonian"]["n_max"] = 2
    config = from_dict(data)
    parameters = build_vmc(config).model.state_dict()
    parameters["jastrow.onsite"] = torch.tensor([0.0, 0.0, onsite], dtype=torch.float64)
    return config, parameters


def test_a_run_whose_chains_freeze_stops_with_a_checkpoint(tmp_path):
    from vitqs.runner import RunStopped

    config, parameters = _collapsed_jastrow_run(tmp_path, 3)
    with pytest.raises(RunStopped, match=r"no move for 3 steps .*max_frozen_steps=3"):
        run_config(config, progress=False, initial_parameters=parameters)
    record = results.read_results(results.results_path(config.output.dir, config.name))
    # the last good checkpoint is kept: one written before the chains froze, not after
    assert record.status == "failed" and record.checkpoint is not None
    assert "accepted no move" in record.failure
    assert record.checkpoint_step % config.output.checkpoint_every == 0
    assert record.checkpoint_step < len(record.history)
    acceptance = [row["acceptance"] for row in record.history]
    # the first steps still move (chains thermalising into the Mott configuration), then 3
    # frozen steps in a row stop the run
    assert acceptance[0] > 0 and len(acceptance) < 12
    assert acceptance[-3:] == [0.0, 0.0, 0.0] and acceptance[-4] > 0

    # null: the steps go on to the end, and the collapsed state is no result all the same
    config, parameters = _collapsed_jastrow_run(tmp_path / "on", None)
    with pytest.raises(
        RunStopped, match=r"the chains of the last \d+ steps were frozen.*collapsed"
    ):
        run_config(config, progress=False, initial_parameters=parameters)
    record = results.read_results(results.results_path(config.output.dir, config.name))
    assert record.status == "failed" and record.final is None and len(record.history) == 12


def test_chains_that_accept_almost_no_move_are_frozen_too(tmp_path):
    # a collapsed J1-J2 8x8 run accepted ~1e-5 of its proposals, never exactly 0, and went on
    # as if sound: fewer than one accepted move per 100 sweeps is frozen
    from vitqs.runner import RunStopped
    from vitqs.vmc.reliability import chains_frozen

    assert chains_frozen(1e-5, 64) and chains_frozen(0.0, 4)
    assert not chains_frozen(2e-3, 64) and not chains_frozen(math.nan, 64)
    # u(2) = -5 with the parameters held: a few hops in the final measurement's 1,024
    # samples are accepted, far below one per 100 sweeps
    config, parameters = _collapsed_jastrow_run(
        tmp_path, None, -5.0, sampler={"n_samples": 1024}, optimizer={"lr": 1e-9}
    )
    with pytest.raises(RunStopped, match=r"chains accepted \d\.\de-0\d of their proposals: frozen"):
        run_config(config, progress=False, initial_parameters=parameters)
    record = results.read_results(results.results_path(config.output.dir, config.name))
    assert record.status == "failed" and record.final is None


def test_a_one_state_sector_is_never_called_frozen(tmp_path):
    # hard-core bosons at unit filling: one state, no move can be accepted, nothing is wrong
    data = tiny_bose_hubbard(tmp_path / "out", sampler={"max_frozen_steps": 1})
    data["hamiltonian"]["n_max"] = 1
    summary = run_config(from_dict(data), progress=False)
    record = results.read_results(summary["results_file"])
    assert summary["n_iter"] == 4 and {row["acceptance"] for row in record.history} == {0.0}


def test_init_from_starts_from_the_earlier_run_s_final_state_averaged_or_not(tmp_path):
    # full sum: the first step's energy is that of the state the run starts from. A bare
    # run's final network, averaged over translations by the next run, must give the
    # Rayleigh quotient of that average, rebuilt here from the first run's checkpoint
    from vitqs.build import build_hamiltonian, build_network
    from vitqs.models import Symmetrized
    from vitqs.physics.lattice import Lattice

    sections = {"lattice": {"shape": [8], "pbc": True}, "sampler": {"kind": "full_sum"}}
    bare = tiny_heisenberg(tmp_path / "out", name="bare", optimizer={"n_iter": 6}, **sections)
    run_config(from_dict(bare), progress=False)
    h5 = tmp_path / "out" / "bare.h5"
    config = from_dict(bare)
    hamiltonian = build_hamiltonian(config)
    network = build_network(config, hamiltonian)
    network.load_state_dict(results.load_checkpoint(results.read_results(h5))["model"])
    averaged = Symmetrized(network, Lattice((8,), pbc=True).translations)

    for name, model, init_from in (
        ("again", network, h5),
        ("sym", averaged, h5),
        ("new", None, None),
    ):
        data = tiny_heisenberg(tmp_path / "out", name=name, optimizer={"n_iter": 1}, **sections)
        data["model"].update(init_from=None if init_from is None else str(init_from))
        data["model"]["symmetrize"] = "translations" if name == "sym" else "none"
        summary = run_config(from_dict(data), progress=False)
        first = results.read_results(summary["results_file"]).history[0]["energy"]
        if model is None:  # random parameters: far from the trained state
            assert first > model_energy(network, hamiltonian) + 0.1
        else:
            assert first == pytest.approx(model_energy(model, hamiltonian), rel=1e-10)


def test_init_from_starts_the_chains_from_the_earlier_run_s_chains(tmp_path):
    from vitqs.build import build_vmc
    from vitqs.checkpoint import start_from_results

    run_config(from_dict(tiny_heisenberg(tmp_path / "out")), progress=False)
    h5 = tmp_path / "out" / "tiny.h5"
    earlier = results.load_checkpoint(results.read_results(h5))["sampler"]["chains"]  # (16, 6)

    data = tiny_heisenberg(tmp_path / "b", sampler={"n_chains": 32}, model={"init_from": str(h5)})
    config = from_dict(data)
    vmc = build_vmc(config)
    start_from_results(config, vmc.model, vmc.sampler)
    chains = vmc.sampler.state_dict()["chains"]
    torch.testing.assert_close(chains, torch.cat([earlier, earlier]), rtol=0, atol=0)
    vmc.sampler.sample(vmc.model)  # the chains run on from there with the sampler's own seed

    # chains of another sector (total S^z = 1) are not states of this one: random chains
    other = tiny_heisenberg(tmp_path / "c", model={"init_from": str(h5)})
    other["hamiltonian"]["total_sz"] = 1.0
    config = from_dict(other)
    vmc = build_vmc(config)
    start_from_results(config, vmc.model, vmc.sampler)
    assert vmc.sampler.state_dict() == {}


def test_init_from_a_smaller_lattice_extends_the_state_to_this_one(tmp_path):
    # an 8-site run carried to 16 sites: on configurations that repeat the 8-site ones the
    # 16-site network has the 8-site log ψ (up to the head's LayerNorm eps); the chains,
    # of another length, are not used
    from vitqs.build import build_network, build_vmc
    from vitqs.checkpoint import start_from_results

    small = tiny_heisenberg(tmp_path / "out", lattice={"shape": [8], "pbc": True})
    run_config(from_dict(small), progress=False)
    h5 = tmp_path / "out" / "tiny.h5"
    config_s = from_dict(small)
    network = build_network(config_s, build_vmc(config_s).hamiltonian)
    network.load_state_dict(results.load_checkpoint(results.read_results(h5))["model"])

    large = tiny_heisenberg(
        tmp_path / "big", lattice={"shape": [16], "pbc": True}, model={"init_from": str(h5)}
    )
    config = from_dict(large)
    vmc = build_vmc(config)
    start_from_results(config, vmc.model, vmc.sampler)
    x = random_spins(16, 8)
    vmc.model.head.norm.eps = network.head.norm.eps = 0.0  # else equal to ~1e-6 only
    with torch.no_grad():
        torch.testing.assert_close(
            vmc.model(torch.cat([x, x], dim=1)), network(x), rtol=0, atol=1e-11
        )
    vmc.model.head.norm.eps = network.head.norm.eps = 1e-5
    assert vmc.sampler.state_dict() == {}  # random chains: the earlier ones have 8 sites
    assert run_config(config, progress=False)["n_iter"] == 4


def test_a_carried_state_above_the_infinite_temperature_energy_is_warned_of(tmp_path, capsys):
    # a state trained under the Marshall sign, carried to the same ring without it, is a
    # state without the signs it learned: ~+1.5 against the infinite-temperature energy 0
    source = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", source, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    for sign_rule, warned in ((True, False), (False, True)):
        data = tiny_heisenberg(tmp_path / f"to_{sign_rule}", model={"init_from": str(h5)})
        data["hamiltonian"]["sign_rule"] = sign_rule
        code, _, err = run_main(capsys, "run", write_config(tmp_path / "to.yaml", data), "--quiet")
        assert code == 0, err
        assert ("above the infinite-temperature energy 0" in err) == warned, err
        if warned:
            assert f"model.init_from='{h5}' kept nothing" in err


def test_init_from_another_lattice_refuses_what_does_not_carry_over(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    for overrides, names in (
        (["lattice.shape=[12]", "model.jastrow=true"], ("model.init_from", "jastrow")),
        (["lattice.shape=[4, 4]"], ("model.init_from", "lattice.shape=[6]", "one kind")),
    ):
        sets = [a for o in [*overrides, f"model.init_from={h5}", "name=b"] for a in ("--set", o)]
        code, _, err = run_main(capsys, "run", path, *sets)
        assert_one_line_error(code, err, *names)


def test_init_from_a_file_whose_config_names_another_lattice_is_one_line(tmp_path, capsys):
    # the stored config says 12 sites, the parameters are of 6: the transfer to 8 sites once
    # ended in an IndexError traceback
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    record = results.read_results(h5)
    stored = yaml.safe_load(record.config_yaml)
    stored["lattice"]["shape"] = [12]
    record.config_yaml = yaml.safe_dump(stored)
    results.write_results(h5, record)
    sets = ["lattice.shape=[8]", f"model.init_from={h5}", "name=b"]
    code, _, err = run_main(capsys, "run", path, *[a for s in sets for a in ("--set", s)])
    assert_one_line_error(code, err, "model.init_from", "lattice.shape=[12]", "not a run of ours")


def test_init_from_refuses_a_missing_file_and_parameters_that_do_not_fit(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    for override, names in (
        (f"model.init_from={tmp_path / 'none.h5'}", ("model.init_from", "none.h5", "no such")),
        (f"model.init_from={h5}", ("model.init_from", "model.d_model=4 here, 8 there")),
    ):
        argv = ("run", path, "--set", "name=other", "--set", "model.d_model=4")
        code, _, err = run_main(capsys, *argv, "--set", override)
        assert_one_line_error(code, err, *names)
    assert sorted(os.listdir(tmp_path / "out")) == ["tiny.h5"]  # nothing written


def test_final_spin_flip_measures_the_projected_average(tmp_path):
    # full sum: a bare-trained network measured averaged over translations and projected
    # on spin inversion +1 (the sector of the 8-site ring's ground state): the final energy
    # is the Rayleigh quotient of that projection, rebuilt here from the checkpoint
    from vitqs.build import build_hamiltonian, build_network
    from vitqs.models import Symmetrized
    from vitqs.physics.lattice import Lattice

    data = tiny_heisenberg(
        tmp_path / "out",
        lattice={"shape": [8], "pbc": True},
        sampler={"kind": "full_sum"},
        final={"symmetrize": "translations", "spin_flip": 1},
    )
    config = from_dict(data)
    summary = run_config(config, progress=False)
    hamiltonian = build_hamiltonian(config)
    network = build_network(config, hamiltonian)
    network.load_state_dict(
        results.load_checkpoint(results.read_results(summary["results_file"]))["model"]
    )
    translations = Lattice((8,), pbc=True).translations
    projected = Symmetrized(network, translations, spin_flip=1)
    assert summary["energy"] == pytest.approx(model_energy(projected, hamiltonian), rel=1e-10)
    averaged_only = model_energy(Symmetrized(network, translations), hamiltonian)
    assert abs(summary["energy"] - averaged_only) > 1e-8  # the projection changed the state


@pytest.mark.slow
def test_overwrite_replaces_the_finished_file_only_when_the_new_run_finishes(tmp_path, capsys):
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    finished = h5.read_bytes()
    pending = tmp_path / "out" / ".tiny.h5.pending"
    longer = ("--set", f"optimizer.n_iter={N_ITER}", "--set", "output.checkpoint_every=1")
    process = vitqs_process("run", path, "--overwrite", *longer, "--quiet")
    _wait_for_checkpoint(process, pending)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert str(h5) in err and "until this one finishes" in err
    assert h5.read_bytes() == finished  # the finished run is all there while it is replaced
    assert results.read_results(pending).status == "interrupted"

    code, _, err = run_main(capsys, "run", path, *longer, "--quiet")  # neither flag: refused
    assert_one_line_error(code, err, "--resume", "--overwrite")
    code, out, err = run_main(capsys, "run", path, "--resume", *longer, "--quiet", "--json")
    assert code == 0, err
    assert last_json(out)["results_file"] == str(h5)
    record = results.read_results(h5)
    assert record.status == "finished" and len(record.history) == N_ITER
    assert not pending.exists()


def test_the_results_file_is_locked_before_ed_runs(tmp_path, capsys, monkeypatch):
    # the lock once came after ED: a second run could claim the name in between
    import fcntl

    from vitqs import runner as run_module

    solve = run_module.exact.ground_state
    seen = []

    def spy(*args, **kwargs):
        lock = tmp_path / "out" / ".tiny.h5.lock"
        with open(lock, "a") as handle:
            with pytest.raises(BlockingIOError):  # held by the run, whose ED this is
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        seen.append(lock)
        return solve(*args, **kwargs)

    monkeypatch.setattr(run_module.exact, "ground_state", spy)
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet")[0] == 0
    assert seen  # ED ran, under the lock


def test_no_cache_solves_ed_without_reading_or_writing_the_cache(tmp_path, capsys):
    cache = exact_cache_dir()
    path = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", path, "--quiet", "--no-cache")[0] == 0
    assert not cache.exists() or list(cache.iterdir()) == []
    assert run_main(capsys, "run", path, "--quiet", "--overwrite")[0] == 0
    assert len(list(cache.glob("*.npz"))) == 1


def exact_cache_dir():
    from vitqs.physics.exact import default_cache_dir

    return default_cache_dir()


def test_a_key_added_after_a_file_was_written_counts_as_its_default():
    """A results file written before a config key existed resumes under the key's default
    (the behaviour the code had then), and only under it."""
    from vitqs.checkpoint import changed_keys
    from vitqs.config import from_dict

    current = from_dict(tiny_heisenberg("OUT")).to_dict()
    older = {
        section: dict(values) if isinstance(values, dict) else values
        for section, values in current.items()
    }
    del older["sampler"]["bare_chains"], older["lattice"]["kind"]
    assert changed_keys(older, current) == []
    current["sampler"]["bare_chains"] = True
    assert changed_keys(older, current) == ["sampler.bare_chains"]


@pytest.mark.parametrize("flags", [(), ("--overwrite",), ("--resume",)])
def test_a_results_file_planted_as_a_link_is_refused_before_the_run(flags, tmp_path, capsys):
    victim = tmp_path / "victim.h5"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tiny.h5").symlink_to(victim)
    (out / "dangling.h5").symlink_to(tmp_path / "nowhere")
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(out))
    for name in ("tiny", "dangling"):
        code, _, err = run_main(capsys, "run", config, "--quiet", "--set", f"name={name}", *flags)
        assert_one_line_error(code, err, f"{name}.h5", "symbolic link")
    assert victim.read_text() == "precious" and not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in out.iterdir()) == ["dangling.h5", "tiny.h5"]


def test_a_busy_machine_is_named_before_a_run_shares_its_cores():
    from vitqs.runner import busy_machine

    assert busy_machine(1, load=0.3, cores=2) is None  # room for one thread
    assert busy_machine(2, load=0.0, cores=2) is None  # an idle machine takes both
    warning = busy_machine(2, load=1.9, cores=2)  # another job computes already
    assert "load 1.9 on 2 cores" in warning and "2 threads" in warning
    assert busy_machine(1, load=3.0, cores=16) is None


def test_the_progress_bar_names_the_threads(tmp_path, capsys):
    data = tiny_heisenberg(tmp_path / "out", optimizer={"n_iter": 2})
    run_config(from_dict(data), progress=True)
    assert "tiny (1 thread)" in capsys.readouterr().err
