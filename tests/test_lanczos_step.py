"""One Lanczos step on a state: the step by Monte Carlo (samples of g²) against the exact sums
over the sector, the full-sum form against the dense vectors to 1e-10, and ψ₁ never above ψ."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ComplexRBM

from vitqs.models.precision import NetworkCopy
from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.lanczos_step import (
    GuidedState,
    Moments,
    full_sum_moments,
    krylov_step,
    krylov_terms,
    sampled_step,
    second_local_energy,
    step_of,
)
from vitqs.vmc.sampler import MetropolisSampler

SYSTEMS = {
    "chain 12": lambda: Heisenberg(Lattice((12,)), J1=1.0),
    "J1-J2 4x4": lambda: Heisenberg(Lattice((4, 4)), J1=1.0, J2=0.5),
    "bosons 6": lambda: BoseHubbard(Lattice((6,)), U=4.0, n_particles=6),
}


def _model(hamiltonian, seed=3):
    return ComplexRBM(hamiltonian.n_sites, n_hidden=8, scale=0.2, seed=seed)


def _vectors(hamiltonian, model):
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        psi = torch.exp(model(x)).numpy()
    return psi / np.linalg.norm(psi), hamiltonian.to_sparse()


def _summed_terms(hamiltonian, model, connected=None, *, guided):
    """Returns the `krylov_terms` of every state weighted as samples of |ψ|² (or g²) would
    come, summed: the exact Gram matrix, and the E, σ² it was built with."""
    sampler = ExactSampler(hamiltonian.hilbert)
    with torch.no_grad():
        samples = sampler.sample(model)
        x, log_psi = samples.x.reshape(-1, hamiltonian.n_sites), samples.log_psi.reshape(-1)
        e_loc, l2 = second_local_energy(hamiltonian, model, x, log_psi, connected=connected)
    weights = samples.weights.reshape(-1).to(torch.float64)  # |ψ|², normalised
    energy = float((weights * e_loc.real).sum()) + 0.01  # a guide's E and σ² need not be ψ's
    variance = 1.3 * float((weights * (e_loc - energy).abs() ** 2).sum())
    spread = (e_loc - energy).abs() ** 2 / variance  # |D|²
    terms = krylov_terms(e_loc, l2, energy, variance, spread if guided else None)
    if guided:  # the states as often as g² = |ψ|² (1 + |D|²) has them
        weights = weights * (1 + spread)
    gram = (terms * weights[:, None, None]).sum(dim=0) / weights.sum()
    return gram.numpy(), energy, variance


@pytest.mark.parametrize("system", ["chain 12", "bosons 6"])
@pytest.mark.parametrize("guided", [True, False])
def test_the_full_sum_of_the_local_estimators_is_the_dense_step(system, guided):
    hamiltonian = SYSTEMS[system]()
    model = _model(hamiltonian)
    gram, energy, variance = _summed_terms(hamiltonian, model, guided=guided)
    e0, var0, e1, var1, alpha = krylov_step(gram, energy, variance)
    dense = full_sum_moments(hamiltonian, model)
    v, matrix = _vectors(hamiltonian, model)
    exact_energy = np.vdot(v, matrix @ v).real
    shifted = matrix.toarray() - exact_energy * np.eye(len(v))  # H − E
    central = [np.vdot(v, np.linalg.matrix_power(shifted, k) @ v).real for k in (2, 3, 4)]
    np.testing.assert_allclose(
        [dense.mean, dense.c2, dense.c3, dense.c4], [exact_energy, *central], rtol=1e-10
    )
    np.testing.assert_allclose([e0, var0], [exact_energy, central[0]], rtol=1e-10)
    np.testing.assert_allclose([e1, var1, alpha], step_of(dense), rtol=1e-9)


def test_connected_configurations_in_float32_keep_the_step_to_float32s_rounding():
    # the step's cost is the max_conn² amplitudes a sample, so they may come from a float32
    # copy (sampler.local_energy_dtype); E_L(x) and the samples' log ψ stay float64
    hamiltonian = SYSTEMS["J1-J2 4x4"]()
    model = _model(hamiltonian)
    sampler = ExactSampler(hamiltonian.hilbert)
    with torch.no_grad():
        samples = sampler.sample(model)
        x, log_psi = samples.x.reshape(-1, hamiltonian.n_sites), samples.log_psi.reshape(-1)
        e_64, l2_64 = second_local_energy(hamiltonian, model, x, log_psi)
        copy = NetworkCopy(torch.float32)(model)
        e_32, l2_32 = second_local_energy(hamiltonian, model, x, log_psi, connected=copy)
    assert torch.equal(e_32, e_64)  # ψ's own local energies: the model's dtype
    worst = float((l2_32 - l2_64).abs().max() / l2_64.abs().max())
    assert 0 < worst < 2e-6  # measured 3.4e-7: float32 did the sums (float64: ~1e-15)
    weights = samples.weights.reshape(-1, 1, 1).to(torch.float64)
    energy = float((weights.reshape(-1) * e_64.real).sum())
    variance = float((weights.reshape(-1) * (e_64 - energy).abs() ** 2).sum())
    steps = [
        krylov_step(
            (krylov_terms(e, l2, energy, variance) * weights).sum(0).numpy(),
            energy,
            variance,
        )
        for e, l2 in ((e_64, l2_64), (e_32, l2_32))
    ]
    np.testing.assert_allclose(steps[1], steps[0], rtol=1e-6)
    assert steps[1][2] < steps[1][0]  # the step lowers the energy in both


@pytest.mark.parametrize("system", ["chain 12", "bosons 6"])
def test_the_step_is_the_best_state_of_its_two_vectors_and_never_above_psi(system):
    hamiltonian = SYSTEMS[system]()
    model = _model(hamiltonian)
    energy, variance, alpha = step_of(full_sum_moments(hamiltonian, model))
    v, matrix = _vectors(hamiltonian, model)
    hv = matrix @ v

    def rayleigh(a):
        psi = v + a * hv
        return np.vdot(psi, matrix @ psi).real / np.vdot(psi, psi).real

    psi1 = v + alpha * hv
    h_psi1 = matrix @ psi1
    norm = np.vdot(psi1, psi1).real
    assert energy == pytest.approx(rayleigh(alpha), rel=1e-10)
    assert variance == pytest.approx(np.vdot(h_psi1, h_psi1).real / norm - energy**2, rel=1e-8)
    scan = [rayleigh(a) for a in alpha * np.linspace(-3, 3, 61)]
    assert energy <= min(scan) + 1e-12  # the minimum over α
    ground = exact.ground_state(hamiltonian).energy
    assert ground - 1e-10 <= energy < np.vdot(v, hv).real  # variational, and lower than ψ


def test_an_eigenstate_is_its_own_step():
    assert step_of(Moments(mean=-2.0, c2=0.0, c3=0.0, c4=0.0)) == (-2.0, 0.0, 0.0)


def test_near_an_eigenstate_the_step_stays_above_the_ground_state():
    # a state 1e-8 from the ground state of the 12-site chain: the raw moments <H^k> lose
    # the step in their cancellations (it once came out below E0); the central ones do not
    hamiltonian = SYSTEMS["chain 12"]()
    ground = exact.ground_state(hamiltonian, return_vector=True)
    matrix = hamiltonian.to_sparse()
    noise = np.random.default_rng(0).normal(size=len(ground.vector))
    v = ground.vector + 3e-5 * noise / np.linalg.norm(noise)
    v /= np.linalg.norm(v)
    energy = np.vdot(v, matrix @ v).real
    d1 = matrix @ v - energy * v
    d2 = matrix @ d1 - energy * d1
    m = Moments(energy, np.vdot(d1, d1).real, np.vdot(d1, d2).real, np.vdot(d2, d2).real)
    step_energy, _, alpha = step_of(m)
    psi1 = v + alpha * (matrix @ v)
    direct = np.vdot(psi1, matrix @ psi1).real / np.vdot(psi1, psi1).real
    assert ground.energy - 1e-12 <= step_energy < energy
    assert step_energy == pytest.approx(direct, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("system", ["chain 12", "J1-J2 4x4"])
def test_monte_carlo_step_on_samples_of_g_squared_agrees_with_the_exact_sums(system):
    # chains of g² = |ψ|² (1 + |E_L − E|²/σ²), E and σ² a rough guess as a final measurement
    # gives them; each chain one block: the jackknife over chains gives the error bars
    hamiltonian = SYSTEMS[system]()
    model = _model(hamiltonian, seed=5)
    exact_moments = full_sum_moments(hamiltonian, model)
    energy, variance = exact_moments.mean * 0.999, exact_moments.c2 * 1.2
    guide = GuidedState(hamiltonian, model, energy, variance)
    sampler = MetropolisSampler(
        hamiltonian, n_samples=2048, n_chains=64, n_discard=40, seed=7, sector_table=False
    )
    with torch.no_grad():
        samples = sampler.sample(guide)
        x = samples.x.reshape(-1, hamiltonian.n_sites)
        log_psi = model(x)
        e_loc, l2 = second_local_energy(hamiltonian, model, x, log_psi)
    terms = krylov_terms(e_loc, l2, energy, variance, guide.spread(e_loc))
    terms = terms.reshape(*samples.x.shape[:2], 4, 4)
    step = sampled_step(terms, energy, variance)
    exact_energy, exact_variance, _ = step_of(exact_moments)
    assert abs(step.energy_0 - exact_moments.mean) < 3 * step.energy_0_error
    assert abs(step.energy - exact_energy) < 3 * step.energy_error
    assert step.gain == pytest.approx(step.energy - step.energy_0, abs=1e-12)
    exact_gain = exact_energy - exact_moments.mean
    assert abs(step.gain - exact_gain) < 3 * step.gain_error, (step.gain, exact_gain)
    assert step.gain_error > 0 and step.energy_error > 0
    assert step.energy < step.energy_0 + step.energy_error  # ψ₁ below ψ, within its error
    assert step.variance < step.variance_0 and exact_variance < exact_moments.c2


def test_vitqs_lanczos_keeps_the_step_in_the_file_and_report_shows_it(
    tmp_path, capsys, monkeypatch
):
    from helpers import assert_one_line_error, last_json, run_main, tiny_heisenberg, write_config

    import vitqs
    from vitqs import lanczos_file, results

    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    assert run_main(capsys, "run", config, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    code, out, err = run_main(capsys, "lanczos", h5, "--full-sum", "--json")
    assert code == 0, err
    summed = last_json(out)
    assert summed["full_sum"] == 1 and summed["energy_error"] == 0
    assert summed["energy"] <= summed["energy_0"] and summed["variance"] < summed["variance_0"]
    record = results.read_results(h5)
    assert record.lanczos["energy"] == summed["energy"] and record.status == "finished"
    code, out, _ = run_main(capsys, "report", h5)
    line = next(line for line in out.splitlines() if "one Lanczos step" in line)
    assert "(a full sum)" in line and "nan" not in line and "gain" not in line
    # the same final state by Monte Carlo, from the run's chains: within its error bars
    code, out, err = run_main(capsys, "lanczos", h5, "--n-samples", "4096", "--json")
    assert code == 0, err
    sampled = last_json(out)
    assert sampled["n_samples"] == 4096 and sampled["energy_error"] > 0
    # progress on stderr: the sampling, then every tenth of the samples' H²ψ
    assert "lanczos: sampling g²: 4096 samples in " in err
    assert 1 <= err.count("lanczos: H²ψ: ") <= 10 and "H²ψ: 4096/4096 samples" in err
    assert abs(sampled["energy"] - summed["energy"]) < 3 * sampled["energy_error"]
    assert abs(sampled["energy_0"] - summed["energy_0"]) < 3 * sampled["energy_0_error"]
    # ψ₁ as the run's final measurement of ψ plus the gain: the two errors combined, and
    # the summed ψ₁ within them
    final = record.final
    assert sampled["final_plus_gain"] == pytest.approx(final["energy"] + sampled["gain"])
    assert sampled["final_plus_gain_error"] == pytest.approx(
        np.hypot(final["energy_error"], sampled["gain_error"])
    )
    assert abs(sampled["final_plus_gain"] - summed["energy"]) < 3 * sampled["final_plus_gain_error"]
    assert summed["gain"] == pytest.approx(summed["energy"] - summed["energy_0"])
    assert "final_plus_gain" not in summed  # a full sum is exact already
    # the chains of g² agree (split R̂ of their local energies); were they not to, a note says it
    assert 0.9 < sampled["r_hat"] < lanczos_file.R_HAT_LIMIT and "note" not in sampled
    assert f"R̂ {sampled['r_hat']:.2f}" in out
    assert vitqs.load(h5).lanczos["energy"] == sampled["energy"]
    code, out, _ = run_main(capsys, "report", h5)
    how = f"4096 samples of g², chains' R̂ {sampled['r_hat']:.2f}"
    assert f"- tiny: one Lanczos step ({how}): E₁ = " in out
    assert "; final measurement + gain " in out

    monkeypatch.setattr(lanczos_file, "R_HAT_LIMIT", 0.5)
    code, out, _ = run_main(capsys, "lanczos", h5, "--n-samples", "1024", "--json")
    assert "note: the chains of the step's samples disagree (split R̂" in out
    assert last_json(out)["note"].startswith("the chains of the step's samples disagree")
    code, out, _ = run_main(capsys, "report", h5)
    assert "; note: the chains of the step's samples disagree (split R̂" in out

    record.status, record.final, record.observables = "interrupted", None, {}
    results.write_results(h5, record)
    code, _, err = run_main(capsys, "lanczos", h5)
    assert_one_line_error(code, err, "tiny.h5", "finished run")
    code, _, err = run_main(capsys, "lanczos", h5, "--n-samples", "0")
    assert_one_line_error(code, err, "--n-samples")
    code, _, err = run_main(capsys, "lanczos", h5, "--threads", "0")
    assert_one_line_error(code, err, "--threads")


def test_vitqs_lanczos_computes_on_the_run_s_threads_or_those_asked(tmp_path, capsys):
    from helpers import run_main, tiny_heisenberg, write_config

    data = tiny_heisenberg(tmp_path / "out")
    data["threads"] = 1
    config = write_config(tmp_path / "tiny.yaml", data)
    assert run_main(capsys, "run", config, "--quiet")[0] == 0
    h5 = tmp_path / "out" / "tiny.h5"
    torch.set_num_threads(2)  # conftest restores torch's own after the test
    assert run_main(capsys, "lanczos", h5, "--full-sum")[0] == 0
    assert torch.get_num_threads() == 1  # the run's
    assert run_main(capsys, "lanczos", h5, "--full-sum", "--threads", "2")[0] == 0
    assert torch.get_num_threads() == 2
