"""A failed run never looks like a result: collapsed chains, a zero variance, an update
that overflows. Each case runs the real command on a ring small enough to sum exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import (
    ComplexRBM,
    assert_one_line_error,
    last_json,
    run_main,
    tiny_heisenberg,
    write_config,
)

from vitqs import results
from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.estimators import Stats
from vitqs.vmc.reliability import FROZEN_AT_END, full_sum_energy, judge_final


def _ring(out_dir, n_sites: int, **sections) -> dict:
    data = tiny_heisenberg(out_dir, **sections)
    data["name"] = f"ring{n_sites}"
    data["lattice"]["shape"] = [n_sites]
    return data


def test_a_collapsed_run_fails_with_one_line_instead_of_reporting_variance_0(tmp_path, capsys):
    # lr 5 on the 4-site ring freezes every chain within a few steps: before, the run ended
    # "finished" at -1.0000908 ± 0.0, variance 0, where E0 = -2
    data = _ring(tmp_path / "out", 4, optimizer={"lr": 5.0, "n_iter": 60}, seed=0)
    data["hamiltonian"]["sign_rule"] = False
    config = write_config(tmp_path / "c.yaml", data)
    code, out, err = run_main(capsys, "run", config, "--quiet", "--json")
    assert_one_line_error(code, err, "collapsed", "full sum", "optimizer.lr")
    assert "Resume with" not in err  # going on from a collapsed state cannot help
    assert last_json(out)["exit_code"] == 2 and "energy" not in last_json(out)
    record = results.read_results(tmp_path / "out" / "ring4.h5")
    assert record.status == "failed" and record.final is None
    assert "collapsed" in record.failure and record.checkpoint is not None

    code, out, err = run_main(capsys, "report", tmp_path / "out")
    assert code == 0, err
    assert "| ring4 | failed |" in out
    assert "- ring4: failed: " in out and "collapsed" in out


def test_a_zero_variance_that_is_an_eigenstate_is_a_result_with_its_reason(tmp_path, capsys):
    # two sites, Marshall sign, a positive network: ψ(↑↓) = ψ(↓↑) by construction, the
    # singlet, an exact eigenstate whose Monte Carlo variance is 0 for a reason
    data = _ring(tmp_path / "out", 2, optimizer={"n_iter": 2})
    data["lattice"]["pbc"] = False
    data["model"].update(patch_size=1, d_model=4, heads=1, positive=True)
    config = write_config(tmp_path / "c.yaml", data)
    code, out, err = run_main(capsys, "run", config, "--quiet", "--json")
    assert code == 0, err
    summary = last_json(out)
    assert summary["energy"] == pytest.approx(-0.75, abs=1e-12) and summary["variance"] == 0
    assert "an eigenstate" in summary["note"] and "full sum over the 2 states" in summary["note"]
    assert "note            the Monte Carlo variance is 0" in out
    record = results.read_results(tmp_path / "out" / "ring2.h5")
    assert record.status == "finished" and record.final["acceptance"] == 1.0
    code, out, _ = run_main(capsys, "report", tmp_path / "out")
    assert "- ring2: the Monte Carlo variance is 0" in out


def test_an_update_whose_length_overflows_is_a_failed_step(tmp_path, capsys):
    # lr 1e300: every entry of lr·δθ is finite, its norm is not; the run once "finished"
    # with parameters of ±1.25e299
    data = _ring(tmp_path / "out", 4, optimizer={"lr": 1e300})
    config = write_config(tmp_path / "c.yaml", data)
    code, _, err = run_main(capsys, "run", config, "--quiet")
    assert_one_line_error(code, err, "stopped after step 0", "not finite", "optimizer.lr")
    record = results.read_results(tmp_path / "out" / "ring4.h5")
    assert record.status == "failed" and record.history == []


def _stats(mean: float, variance: float) -> Stats:
    return Stats(complex(mean), math.sqrt(variance / 100), variance, 1.0, 1.0, 100)


def test_the_verdict_trusts_full_sums_one_state_sectors_and_moving_chains():
    hamiltonian = Heisenberg(Lattice((4,)), J1=1.0)
    model = torch.nn.Linear(4, 1)  # never evaluated: no sign of a collapse
    assert judge_final(hamiltonian, model, _stats(-1.9, 0.0), math.nan, 0).failure is None
    assert (
        judge_final(hamiltonian, model, _stats(-1.9, 0.3), 0.4, FROZEN_AT_END - 1).failure is None
    )
    one_state = BoseHubbard(Lattice((4,)), J=1.0, U=4.0, n_particles=4, n_max=1)
    assert judge_final(one_state, model, _stats(0.0, 0.0), 0.0, 100).failure is None


def test_past_ranks_or_sectors_it_can_sum_a_sign_of_collapse_is_a_failure():
    hamiltonian = Heisenberg(Lattice((4,)), J1=1.0)
    model = torch.nn.Linear(4, 1)
    for acceptance, frozen, variance in ((0.0, 0, 0.3), (0.5, FROZEN_AT_END, 0.3), (0.5, 0, 0)):
        verdict = judge_final(
            hamiltonian, model, _stats(-1.0, variance), acceptance, frozen, can_sum=False
        )
        assert "mean nothing" in verdict.failure and verdict.note is None


def test_the_full_sum_energy_and_variance_are_those_of_the_dense_matrix():
    hamiltonian = Heisenberg(Lattice((6,)), J1=1.0, J2=0.3)
    model = ComplexRBM(6, seed=1).double()
    energy, variance = full_sum_energy(hamiltonian, model)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        psi = torch.exp(model(x)).numpy()
    matrix = hamiltonian.to_sparse().toarray()
    norm = np.vdot(psi, psi).real
    expected = np.vdot(psi, matrix @ psi).real / norm
    expected_square = np.vdot(psi, matrix @ (matrix @ psi)).real / norm
    assert energy == pytest.approx(expected, rel=1e-12)
    assert variance == pytest.approx(expected_square - expected**2, rel=1e-10)
    ground = exact.ground_state(hamiltonian, return_vector=True)
    assert variance > 1e-3 and energy > ground.energy


def test_the_full_sum_sees_the_variance_of_a_state_too_peaked_for_psi_squared():
    # ψ on the Mott configuration alone, e^-1000 elsewhere: |ψ|² underflows off it, so
    # Σ |ψ|² |E_loc - E|² reads 0; <Hψ|Hψ> does not: 8 hops of amplitude √2, 2 each
    hamiltonian = BoseHubbard(Lattice((4,)), J=1.0, U=4.0, n_particles=4)

    class Mott(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.tensor(-1000.0, dtype=torch.float64))

        def forward(self, x):
            return self.weight * (x - 1.0).abs().sum(-1)

    energy, variance = full_sum_energy(hamiltonian, Mott())
    assert energy == pytest.approx(0.0, abs=1e-12)
    assert variance == pytest.approx(16.0, rel=1e-12)


def _finished_tiny(tmp_path, capsys):
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", config, "--quiet")[0] == 0
    return config, tmp_path / "out" / "tiny.h5"


def test_a_chain_generator_state_that_does_not_load_is_an_error_not_the_seed(tmp_path, capsys):
    config, h5 = _finished_tiny(tmp_path, capsys)
    record = results.read_results(h5)
    state = record.checkpoint["sampler"]["generator"]
    record.checkpoint["sampler"]["generator"] = torch.zeros_like(state)  # not an mt19937 state
    results.write_results(h5, record)
    code, _, err = run_main(capsys, "run", config, "--resume", "--set", "optimizer.n_iter=6")
    assert_one_line_error(code, err, "tiny.h5", "generator state does not load")


def test_a_generator_of_another_device_goes_on_from_the_seed_and_says_so(tmp_path, capsys):
    config, h5 = _finished_tiny(tmp_path, capsys)
    record = results.read_results(h5)
    # a CUDA generator's state is 16 bytes (Philox seed and offset): a GPU run resumed here
    record.checkpoint["sampler"]["generator"] = torch.arange(16, dtype=torch.uint8)
    results.write_results(h5, record)
    with pytest.warns(RuntimeWarning, match="another kind of device.*not the one it continues"):
        code, _, err = run_main(
            capsys, "run", config, "--resume", "--quiet", "--set", "optimizer.n_iter=6"
        )
    assert code == 0, err
    assert results.read_results(h5).status == "finished"


def test_report_escapes_control_characters_of_names_read_from_files(tmp_path, capsys):
    _, h5 = _finished_tiny(tmp_path, capsys)
    record = results.read_results(h5)
    record.name = "\x1b[2J\x1b[31mred\x07"  # clear the screen, turn red, ring
    results.write_results(h5, record)
    code, out, err = run_main(capsys, "report", h5)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "| \\x1b[2J\\x1b[31mred\\x07 | finished |" in out
