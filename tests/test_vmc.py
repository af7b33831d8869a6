"""The VMC loop: convergence to ED, NaN guard, checkpoints, final estimate, end-to-end ViT runs."""

import math

import numpy as np
import pytest
import torch
from helpers import (
    ComplexRBM,
    exact_ground_state,
    tiny_bose_hubbard,
    tiny_heisenberg,
    widen_head,
)

from vitqs.build import build_vmc
from vitqs.config import OptimizerConfig, from_dict
from vitqs.models.chains import ChainNetwork
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.driver import MAX_RETRIES, VMC, NonFiniteEnergyError, final_estimate
from vitqs.vmc.estimators import (
    evaluate_log_psi,
    importance_weights,
    local_energy,
    sample_statistics,
    statistics,
)
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.sampler import MetropolisSampler
from vitqs.vmc.samples import Sampler, Samples
from vitqs.vmc.sr import (
    force,
    log_derivatives,
    natural_gradient,
    parameter_vector,
)


class FlakyHamiltonian:
    """Wraps a Hamiltonian; the local-energy evaluations listed in ``poisoned`` (calls of
    ``get_conn_padded``, or products ``H @ ψ`` with its sparse matrix in full-sum mode) come
    out NaN (a non-finite energy); ``poisoned_from`` poisons every call from then on."""

    def __init__(self, hamiltonian, poisoned=(), poisoned_from=None):
        self._hamiltonian = hamiltonian
        self.poisoned, self.poisoned_from = set(poisoned), poisoned_from
        self.n_calls = 0

    def __getattr__(self, name):
        return getattr(self._hamiltonian, name)

    def _poison_this_call(self) -> bool:
        call, self.n_calls = self.n_calls, self.n_calls + 1
        return call in self.poisoned or (
            self.poisoned_from is not None and call >= self.poisoned_from
        )

    def get_conn_padded(self, x):
        x_conn, mels = self._hamiltonian.get_conn_padded(x)
        if self._poison_this_call():
            mels = mels.clone()
            mels[:, 0] = float("nan")
        return x_conn, mels

    def to_sparse(self):
        return _FlakyMatrix(self._hamiltonian.to_sparse(), self)


class _FlakyMatrix:
    """The sparse matrix of a `FlakyHamiltonian`: ``@`` counts as one local-energy call."""

    def __init__(self, matrix, owner):
        self._matrix, self._owner = matrix, owner

    def diagonal(self):
        return self._matrix.diagonal()

    def __matmul__(self, vector):
        product = self._matrix @ vector
        return product * float("nan") if self._owner._poison_this_call() else product


def test_full_sum_sr_reaches_the_exact_ground_state_of_a_4_site_chain():
    hamiltonian = Heisenberg(Lattice((4,)))
    energy, _ = exact_ground_state(hamiltonian)
    model = ComplexRBM(4, n_hidden=8, scale=0.1, seed=0)
    settings = OptimizerConfig(lr=0.1, diag_shift=1e-4, n_iter=150)
    sampler = ExactSampler(hamiltonian.hilbert)
    results = list(VMC(hamiltonian, model, sampler, settings).run())
    assert results[-1].energy.mean.real == pytest.approx(energy, rel=1e-6)
    assert [r.step for r in results] == list(range(150))
    assert math.isnan(results[-1].acceptance)


@pytest.mark.usefixtures("single_thread")
def test_monte_carlo_run_lowers_the_energy_and_reports_every_phase():
    hamiltonian = BoseHubbard(Lattice((4,)), U=2.0, n_particles=4)
    energy, _ = exact_ground_state(hamiltonian)
    model = ComplexRBM(4, n_hidden=6, scale=0.1, seed=1)
    sampler = MetropolisSampler(hamiltonian, n_samples=256, n_chains=32, n_discard=2, seed=2)
    settings = OptimizerConfig(lr=0.05, diag_shift=1e-2, n_iter=40)
    results = list(VMC(hamiltonian, model, sampler, settings).run())
    first, last = results[0], results[-1]
    assert last.energy.mean.real < first.energy.mean.real
    assert abs(last.energy.mean.real - energy) < 0.25 * abs(first.energy.mean.real - energy)
    assert set(last.timings) == {"sampling", "local_energy", "jacobian", "solve"}
    assert 0 < last.acceptance < 1 and last.update_norm > 0 and last.n_retries == 0


def test_schedules_reach_the_step_results():
    hamiltonian = Heisenberg(Lattice((4,)))
    settings = OptimizerConfig(
        lr={"schedule": "exponential", "start": 0.1, "end": 0.01},
        diag_shift={"schedule": "cosine", "start": 1e-2, "end": 1e-4},
        n_iter=4,
    )
    model = ComplexRBM(4, seed=4)
    results = list(VMC(hamiltonian, model, ExactSampler(hamiltonian.hilbert), settings).run())
    assert [r.lr for r in results] == pytest.approx([0.1 * 0.1 ** (k / 4) for k in range(4)])
    assert results[0].diag_shift == pytest.approx(1e-2)
    assert results[2].diag_shift == pytest.approx((1e-2 + 1e-4) / 2)


def test_nan_guard_undoes_the_update_and_retries_with_a_larger_shift():
    hamiltonian = FlakyHamiltonian(Heisenberg(Lattice((4,))), poisoned={1})  # step 1's energy
    model = ComplexRBM(4, seed=5)
    settings = OptimizerConfig(lr=0.05, diag_shift=1e-3, n_iter=3)
    vmc = VMC(hamiltonian, model, ExactSampler(hamiltonian.hilbert), settings)
    theta_0 = parameter_vector(model)
    first = vmc.step()
    retried = vmc.step()
    # the retry starts again from the parameters where the energy was last finite
    assert retried.energy.mean == pytest.approx(first.energy.mean, abs=1e-14)
    assert retried.n_retries == 1 and retried.step == 1
    assert retried.diag_shift == pytest.approx(10 * first.diag_shift)
    assert not torch.equal(parameter_vector(model), theta_0)
    assert math.isfinite(vmc.step().energy.mean.real)


def test_nan_guard_stops_with_an_error_naming_the_step_and_last_energy():
    hamiltonian = FlakyHamiltonian(Heisenberg(Lattice((4,))), poisoned_from=2)
    model = ComplexRBM(4, seed=6)
    settings = OptimizerConfig(lr=0.05, n_iter=10)
    vmc = VMC(hamiltonian, model, ExactSampler(hamiltonian.hilbert), settings)
    results = []
    with pytest.raises(NonFiniteEnergyError, match="step 2") as error:
        for result in vmc.run():
            results.append(result)
    # the first try and MAX_RETRIES retries
    assert len(results) == 2 and hamiltonian.n_calls == 2 + 1 + MAX_RETRIES
    assert error.value.last_energy == pytest.approx(results[-1].energy.mean.real)
    assert f"{results[-1].energy.mean.real:.6f}"[:8] in str(error.value)
    assert all(torch.isfinite(parameter_vector(model)))


class ClaimedBound:
    """Wraps a Hamiltonian; its lower bound is the next of ``bounds`` at each call (the
    last one after them): a guard test can put the bound above the energy for one step."""

    def __init__(self, hamiltonian, bounds):
        self._hamiltonian, self.bounds = hamiltonian, list(bounds)

    def __getattr__(self, name):
        return getattr(self._hamiltonian, name)

    def lower_bound(self):
        return self.bounds.pop(0) if len(self.bounds) > 1 else self.bounds[0]


def test_an_energy_below_the_lower_bound_is_retried_from_before_the_last_update():
    # the seed-1 J1-J2 4x4 blow-up: finite steps whose energy (-30,920) was far below any
    # eigenvalue (-36) passed the NaN guard and the run went on from a broken state
    ring = Heisenberg(Lattice((4,)))
    hamiltonian = ClaimedBound(ring, [-math.inf, 100.0, -math.inf])  # step 1's first try
    model = ComplexRBM(4, seed=5)
    vmc = VMC(hamiltonian, model, ExactSampler(ring.hilbert), OptimizerConfig(lr=0.05))
    first = vmc.step()
    retried = vmc.step()
    assert retried.n_retries == 1 and retried.energy.mean == pytest.approx(first.energy.mean)
    stuck = VMC(ClaimedBound(ring, [100.0]), ComplexRBM(4, seed=5), ExactSampler(ring.hilbert))
    with pytest.raises(NonFiniteEnergyError, match="below the Hamiltonian's lower bound"):
        stuck.step()


@pytest.mark.parametrize(
    "hamiltonian",
    [
        Heisenberg(Lattice((4, 2)), J2=0.5),
        Heisenberg(Lattice((6,)), sign_rule=True),
        Heisenberg(Lattice((3, 2), kind="ladder"), J2=-0.3),
        BoseHubbard(Lattice((4,)), U=3.3, n_particles=4),
        BoseHubbard(Lattice((3,)), J=-1.0, U=-2.0, mu=0.5, n_particles=3, n_max=2),
        BoseHubbard(Lattice((2, 2)), U=1.0, n_particles=3),
    ],
    ids=["j1j2 4x2", "ring sign rule", "ladder J2<0", "bh chain", "bh attractive", "bh 2x2"],
)
def test_the_lower_bound_is_below_every_eigenvalue(hamiltonian):
    spectrum = np.linalg.eigvalsh(hamiltonian.to_sparse().toarray())
    assert hamiltonian.lower_bound() <= spectrum[0] + 1e-12


def test_non_finite_update_is_not_applied(monkeypatch):
    import vitqs.vmc.driver as vmc_module

    hamiltonian = Heisenberg(Lattice((4,)))
    model = ComplexRBM(4, seed=7)
    vmc = VMC(hamiltonian, model, ExactSampler(hamiltonian.hilbert), OptimizerConfig(lr=0.05))
    real_solve, calls = vmc_module.natural_gradient, []

    def flaky_solve(*args, **kwargs):
        calls.append(kwargs["diag_shift"])
        update = real_solve(*args, **kwargs)
        return update * float("nan") if len(calls) == 1 else update

    monkeypatch.setattr(vmc_module, "natural_gradient", flaky_solve)
    result = vmc.step()
    assert calls == pytest.approx([1e-3, 1e-2]) and result.n_retries == 1
    assert all(torch.isfinite(parameter_vector(model)))


@pytest.mark.parametrize("chain_dtype", [None, torch.float32])
@pytest.mark.usefixtures("single_thread")
def test_checkpoint_resumes_the_same_trajectory(chain_dtype):
    hamiltonian = Heisenberg(Lattice((6,)))

    def build():
        model = ComplexRBM(6, seed=8)
        sampler = MetropolisSampler(
            hamiltonian, n_samples=64, n_chains=16, seed=9, chains=ChainNetwork(chain_dtype)
        )
        settings = OptimizerConfig(lr=0.01, n_iter=10)
        return model, sampler, VMC(hamiltonian, model, sampler, settings)

    model, sampler, vmc = build()
    list(vmc.run(3))
    checkpoint = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "sampler": sampler.state_dict(),
        "vmc": vmc.state_dict(),
    }
    expected = [r.energy.mean for r in vmc.run(2)]
    model, sampler, vmc = build()
    model.load_state_dict(checkpoint["model"])
    sampler.load_state_dict(checkpoint["sampler"])
    vmc.load_state_dict(checkpoint["vmc"])
    resumed = list(vmc.run(2))
    assert [r.energy.mean for r in resumed] == expected
    assert resumed[0].step == 3


def test_parameters_are_averaged_over_the_late_steps_and_kept_in_checkpoints():
    hamiltonian = Heisenberg(Lattice((4,)))
    model = ComplexRBM(4, seed=12)
    settings = OptimizerConfig(lr=0.05, n_iter=8, average_from=0.5)
    vmc = VMC(hamiltonian, model, ExactSampler(hamiltonian.hilbert), settings)
    measured = []  # θ before each step: the parameters whose energy that step measured
    for _ in range(5):
        measured.append(parameter_vector(model))
        vmc.step()
    assert vmc.averaged_parameters() is not None  # steps 4 (= 0.5 · 8) and on
    state = vmc.state_dict()
    for _ in range(3):
        measured.append(parameter_vector(model))
        vmc.step()
    mean, count = vmc.averaged_parameters()
    assert count == 4
    torch.testing.assert_close(mean, torch.stack(measured[4:]).mean(dim=0), rtol=0, atol=1e-14)
    assert float((mean - parameter_vector(model)).norm()) > 0  # not just the last iterate
    resumed = VMC(hamiltonian, ComplexRBM(4, seed=12), ExactSampler(hamiltonian.hilbert), settings)
    resumed.load_state_dict(state)
    assert resumed.averaged_parameters()[1] == 1
    with pytest.raises(ValueError, match="optimizer.average_from"):
        OptimizerConfig(average_from=1.5)


class FixedSampler(Sampler):
    """Returns the same Monte Carlo samples at every call."""

    local_energy = MetropolisSampler.local_energy  # through the network, as chains' samples

    def __init__(self, x, model, log_importance=None):
        log_psi = evaluate_log_psi(model, x.reshape(-1, x.shape[-1])).reshape(x.shape[:-1])
        self.samples = Samples(x, log_psi, None, 0.5, log_importance)
        self.n_samples = self.samples.n_samples

    def sample(self, model, n_discard=None):
        return self.samples


# hidden units that make the auto solve SR (8 parameters, fewer than the 2 × 7 rows) or minSR
@pytest.mark.parametrize(("method", "n_hidden"), [("sr", 0), ("minsr", 6)])
def test_a_step_on_repeated_samples_equals_the_step_over_every_row(method, n_hidden):
    # The step takes each distinct configuration once, weighted by its count: S, F and the
    # minSR kernel solve must give the update of all rows with weight 1/N_s.
    hamiltonian = BoseHubbard(Lattice((4,)), U=6.0, n_particles=4)
    model = ComplexRBM(4, n_hidden=n_hidden, scale=0.3, seed=9)
    states = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    pick = torch.tensor([0, 5, 0, 0, 7, 5, 1, 0, 9, 7, 0, 5, 2, 0, 0, 3, 5, 0, 1, 0])
    x = states[pick].reshape(4, 5, 4)  # (chains, per chain, sites): 7 distinct of 20
    e_loc = local_energy(hamiltonian, model, x).reshape(-1)
    jac = log_derivatives(model, x.reshape(20, 4))  # every row, weight 1/20
    expected = natural_gradient(jac, e_loc, diag_shift=1e-3, method=method)
    theta = parameter_vector(model)
    settings = OptimizerConfig(lr=0.1, diag_shift=1e-3)
    result = VMC(hamiltonian, model, FixedSampler(x, model), settings).step()
    assert result.method == method
    expected_theta = theta - 0.1 * expected
    torch.testing.assert_close(parameter_vector(model), expected_theta, rtol=1e-10, atol=1e-12)
    assert result.energy.mean == statistics(e_loc.reshape(4, 5)).mean


@pytest.mark.parametrize(("method", "n_hidden"), [("sr", 0), ("minsr", 6)])
def test_a_step_on_importance_weighted_samples_weighs_each_row_by_its_normalised_weight(
    method, n_hidden
):
    # Samples of |ψ|^p carry weights |ψ|^(2−p): the step is the natural gradient over every
    # row with those weights normalised (repeated rows summed), and the energy is their
    # weighted mean.
    hamiltonian = BoseHubbard(Lattice((4,)), U=6.0, n_particles=4)
    model = ComplexRBM(4, n_hidden=n_hidden, scale=0.3, seed=9)
    states = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    pick = torch.tensor([0, 5, 0, 0, 7, 5, 1, 0, 9, 7, 0, 5, 2, 0, 0, 3, 5, 0, 1, 0])
    x = states[pick].reshape(4, 5, 4)
    log_psi = evaluate_log_psi(model, x.reshape(20, 4)).detach()
    log_importance = 0.5 * log_psi.real.reshape(4, 5)
    weights = torch.softmax(log_importance.reshape(-1), dim=0)
    e_loc = local_energy(hamiltonian, model, x).reshape(-1)
    jac = log_derivatives(model, x.reshape(20, 4))
    expected = natural_gradient(jac, e_loc, diag_shift=1e-3, weights=weights, method=method)
    theta = parameter_vector(model)
    settings = OptimizerConfig(lr=0.1, diag_shift=1e-3)
    sampler = FixedSampler(x, model, log_importance)
    result = VMC(hamiltonian, model, sampler, settings).step()
    assert result.method == method
    torch.testing.assert_close(
        parameter_vector(model), theta - 0.1 * expected, rtol=1e-10, atol=1e-12
    )
    assert result.energy.mean.real == pytest.approx(float((weights * e_loc.real).sum()), rel=1e-12)


@pytest.mark.usefixtures("single_thread")
def test_samples_of_a_lower_power_give_the_energy_and_force_of_psi_squared():
    """Chains of |ψ|^1, reweighted, estimate the exact (full-sum) energy and SR force of
    |ψ|²; the same samples unweighted miss both by far."""
    hamiltonian = BoseHubbard(Lattice((4,)), U=8.0, n_particles=4)
    model = ComplexRBM(4, n_hidden=4, scale=0.3, seed=3)
    exact_sampler = ExactSampler(hamiltonian.hilbert)
    exact_samples = exact_sampler.sample(model)
    all_states = exact_samples.x.reshape(-1, 4)
    exact_e = exact_sampler.local_energy(hamiltonian, model, exact_samples).reshape(-1)
    exact_weights = exact_samples.weights.reshape(-1)
    exact_force = force(log_derivatives(model, all_states), exact_e, exact_weights)
    sampler = MetropolisSampler(
        hamiltonian, n_samples=8192, n_chains=8192, n_discard=50, seed=5, machine_pow=1.0
    )
    samples = sampler.sample(model)
    stats = sample_statistics(local_energy(hamiltonian, model, samples.x), samples)
    assert abs(stats.mean.real - float(exact_e.real @ exact_weights)) < 4 * stats.error_of_mean
    x = samples.x.reshape(-1, 4)
    e_loc = local_energy(hamiltonian, model, x)
    jac = log_derivatives(model, x)
    weights = importance_weights(samples.log_importance).reshape(-1)
    error = float((force(jac, e_loc, weights) - exact_force).norm() / exact_force.norm())
    unweighted = float((force(jac, e_loc) - exact_force).norm() / exact_force.norm())
    assert error < 0.05 < 0.3 < unweighted
    plain = statistics(local_energy(hamiltonian, model, samples.x))
    assert abs(plain.mean.real - stats.mean.real) > 10 * stats.error_of_mean


@pytest.mark.usefixtures("single_thread")
def test_final_estimate_uses_the_requested_samples():
    hamiltonian = Heisenberg(Lattice((6,)))
    model = ComplexRBM(6, seed=10)
    exact = final_estimate(hamiltonian, model, ExactSampler(hamiltonian.hilbert))
    sampler = MetropolisSampler(hamiltonian, n_samples=256, n_chains=32, seed=11)
    stats = final_estimate(hamiltonian, model, sampler, n_samples=1000)
    assert stats.n_samples == 1024 and exact.error_of_mean == 0.0
    assert abs(stats.mean.real - exact.mean.real) < 4.5 * stats.error_of_mean


def test_bad_settings_raise_with_the_config_key():
    with pytest.raises(ValueError, match="optimizer.lr.schedule"):
        OptimizerConfig(lr={"schedule": "linear", "start": 0.1, "end": 0.01})
    with pytest.raises(ValueError, match="optimizer.lr"):
        OptimizerConfig(lr=-1.0)


def _one_step_in_each_dtype(tiny, tmp_path, section: str, key: str, edit=None) -> dict:
    """Returns ``{dtype: (energy, update)}`` of one step of the tiny config with ``section.key``
    null and float32 (a wide head: ψ far from uniform, ratios far from 1), after ``edit(data)``;
    the model's parameters stay float64 either way."""
    steps = {}
    for dtype in (None, "float32"):
        data = tiny(tmp_path, **{section: {key: dtype}})
        if edit is not None:
            edit(data)
        vmc = build_vmc(from_dict(data))
        widen_head(vmc.model, 10.0)  # a head started at std 1
        theta = parameter_vector(vmc.model)
        result = vmc.step()
        steps[dtype] = (result.energy.mean, theta - parameter_vector(vmc.model))
        assert all(p.dtype == torch.float64 for p in vmc.model.parameters())
    return steps


def _outnumbering_the_proposals(data) -> None:
    """Makes the tiny system one whose sector holds more states than a step's proposals
    (a chain of 16 spins, 8 bosons on 8 sites), so that the chains step per proposal."""
    n = 16 if data["hamiltonian"]["kind"] == "heisenberg" else 8
    data["lattice"]["shape"] = [n]
    if data["hamiltonian"]["kind"] == "bose_hubbard":
        data["hamiltonian"]["n_particles"] = n


@pytest.mark.parametrize("tiny", [tiny_heisenberg, tiny_bose_hubbard])
@pytest.mark.usefixtures("single_thread")
def test_a_step_with_float32_local_energies_is_the_float64_step_to_float32_rounding(tmp_path, tiny):
    # the same model, samples and SR solve; only the connected configurations' log ψ are
    # evaluated by a float32 copy (the chains step per proposal: a sector the model tables
    # has every amplitude in float64 already, and its local energies take no forward pass)
    steps = _one_step_in_each_dtype(
        tiny, tmp_path, "sampler", "local_energy_dtype", _outnumbering_the_proposals
    )
    (e64, update64), (e32, update32) = steps[None], steps["float32"]
    assert e32 != e64  # the float32 copy did the work
    assert abs(e32 - e64) < 1e-5 * abs(e64)  # measured: 6e-7 (spins), 5e-7 (bosons)
    assert float((update32 - update64).norm()) < 1e-4 * float(update64.norm())  # 9e-7, 3e-6


def test_float32_local_energies_are_refused_for_a_full_sum():
    hamiltonian = Heisenberg(Lattice((4,)))
    sampler = ExactSampler(hamiltonian.hilbert)
    with pytest.raises(ValueError, match="sampler.local_energy_dtype=torch.float32 needs Monte"):
        VMC(
            hamiltonian,
            ComplexRBM(4),
            sampler,
            OptimizerConfig(),
            local_energy_dtype=torch.float32,
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_smoke():
    hamiltonian = Heisenberg(Lattice((6,)))
    model = ComplexRBM(6, seed=12).to("cuda")
    sampler = MetropolisSampler(hamiltonian, n_samples=256, n_chains=64, seed=13)
    results = list(VMC(hamiltonian, model, sampler, OptimizerConfig(lr=0.02, n_iter=3)).run())
    assert all(math.isfinite(r.energy.mean.real) for r in results)
    assert sampler.state_dict()["chains"].device.type == "cpu"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_float32_chains():
    # chains on a float32 copy on the GPU; the kept samples' log ψ are the float64 model's
    hamiltonian = Heisenberg(Lattice((6,)))
    model = ComplexRBM(6, seed=12).to("cuda")
    sampler = MetropolisSampler(
        hamiltonian, n_samples=256, n_chains=64, seed=13, chains=ChainNetwork(torch.float32)
    )
    samples = sampler.sample(model)
    x = samples.x.reshape(-1, 6)
    with torch.no_grad():
        expected = model(x.to(torch.float64))
    torch.testing.assert_close(samples.log_psi.reshape(-1), expected, rtol=0, atol=1e-12)
    settings = OptimizerConfig(lr=0.02, n_iter=14)
    results = list(VMC(hamiltonian, model, sampler, settings).run())
    assert all(math.isfinite(r.energy.mean.real) for r in results)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_float32_local_energies():
    # per-proposal chains: the 6-site sector's table would give every amplitude in float64
    # with no forward pass, and the float32 copy would do nothing (measured on an H200)
    hamiltonian = Heisenberg(Lattice((6,)))
    energies = {}
    for dtype in (None, torch.float32):
        model = ComplexRBM(6, seed=12).to("cuda")
        sampler = MetropolisSampler(
            hamiltonian, n_samples=256, n_chains=64, seed=13, sector_table=False
        )
        vmc = VMC(hamiltonian, model, sampler, OptimizerConfig(), local_energy_dtype=dtype)
        energies[dtype] = vmc.step().energy.mean
    assert energies[torch.float32] != energies[None]
    assert abs(energies[torch.float32] - energies[None]) < 1e-5 * abs(energies[None])


# --------------------------------------------------------------- end to end
def _relative_error(energy, exact):
    return abs(energy - exact) / abs(exact)


def _optimise_vit(
    hamiltonian, model, *, n_iter, lr_final=None, n_samples=512, n_chains=128, seed=1
):
    """Runs SR from the model's random start (lr 0.05, constant or decaying exponentially to
    ``lr_final``; diag_shift 1e-3); returns the final energy Stats from 16384 samples."""
    sampler = MetropolisSampler(
        hamiltonian, n_samples=n_samples, n_chains=n_chains, n_discard=2, seed=seed
    )
    lr = 0.05 if lr_final is None else {"schedule": "exponential", "start": 0.05, "end": lr_final}
    settings = OptimizerConfig(lr=lr, diag_shift=1e-3, n_iter=n_iter)
    for _ in VMC(hamiltonian, model, sampler, settings).run():
        pass
    return final_estimate(hamiltonian, model, sampler, n_samples=16384)


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
def test_vit_reaches_the_heisenberg_chain_ground_state():
    """L = 8 periodic chain, J1 = 1, with the Marshall sign rule.

    Without the sign rule the same run stalls near E = +2: the nearly uniform initial ψ is
    then the fully polarised multiplet state, an eigenstate, where the gradient vanishes.
    A constant lr converges faster here than one decaying to 0.01 (rel. error ~2e-5 vs ~8e-4
    after 60 steps).
    """
    from vitqs.models import ViT

    hamiltonian = Heisenberg(Lattice((8,)), J1=1.0, sign_rule=True)
    energy, _ = exact_ground_state(hamiltonian)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ViT((8,), patch_size=2, d_model=8, heads=2, layers=1)
    stats = _optimise_vit(hamiltonian, model, n_iter=60)
    assert _relative_error(stats.mean.real, energy) <= 1e-3
    assert stats.error_of_mean < 3e-4 * abs(energy)


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
def test_vit_reaches_the_bose_hubbard_chain_ground_state():
    """L = N = 6 periodic chain, J = 1, U = 4, no occupation cutoff."""
    from vitqs.models import ViT

    hamiltonian = BoseHubbard(Lattice((6,)), J=1.0, U=4.0, n_particles=6)
    energy, _ = exact_ground_state(hamiltonian)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ViT(
            (6,), patch_size=2, d_model=8, heads=2, layers=1, embedding="onehot",
            local_states=tuple(range(7)), jastrow=True,
        )  # fmt: skip
    stats = _optimise_vit(hamiltonian, model, n_iter=100, lr_final=0.01)  # calms late noise
    assert _relative_error(stats.mean.real, energy) <= 1e-3
    assert stats.error_of_mean < 3e-4 * abs(energy)


def test_schedules_follow_a_wall_clock_budget_that_ends_first():
    # a budget half spent at step 1 of 100: the schedule is half way, not at 1 %
    hamiltonian = Heisenberg(Lattice((4,)))
    settings = OptimizerConfig(
        lr={"schedule": "exponential", "start": 0.1, "end": 0.001},
        diag_shift={"schedule": "exponential", "start": 1e-2, "end": 1e-4},
        n_iter=100,
    )
    model, sampler = ComplexRBM(4, seed=1), ExactSampler(hamiltonian.hilbert)
    vmc = VMC(hamiltonian, model, sampler, settings, max_seconds=100.0)
    assert vmc.step().lr == pytest.approx(0.1)
    vmc.seconds = 50.0  # the loop's clock, which run() keeps
    result = vmc.step()
    assert result.lr == pytest.approx(0.01) and result.diag_shift == pytest.approx(1e-3)
    vmc.seconds = 0.1  # behind the step count: the steps lead
    assert vmc.step().lr == pytest.approx(0.1 * 0.01 ** (2 / 100))


@pytest.mark.usefixtures("single_thread")
def test_momentum_feeds_each_step_the_last_direction_and_resumes_identically():
    def spring_vmc():
        hamiltonian = Heisenberg(Lattice((6,)))
        model = ComplexRBM(6, seed=21)
        sampler = MetropolisSampler(hamiltonian, n_samples=32, n_chains=8, seed=22)
        settings = OptimizerConfig(lr=0.05, n_iter=40, momentum=0.9, diag_shift=1e-2)
        return model, VMC(hamiltonian, model, sampler, settings)

    model, vmc = spring_vmc()
    before = parameter_vector(model)
    list(vmc.run(1))
    first = vmc._direction
    torch.testing.assert_close(before - 0.05 * first, parameter_vector(model))
    list(vmc.run(5))
    state = vmc.state_dict()
    assert state["direction_before"] is not None
    resumed_model, resumed = spring_vmc()
    resumed_model.load_state_dict(model.state_dict())
    resumed.load_state_dict(state)
    resumed.sampler.load_state_dict(vmc.sampler.state_dict())
    rng = torch.get_rng_state()
    list(vmc.run(3))
    torch.set_rng_state(rng)
    list(resumed.run(3))
    torch.testing.assert_close(parameter_vector(resumed_model), parameter_vector(model))
    # without the stored direction the next step differs: the memory is in the checkpoint
    forgetful_model, forgetful = spring_vmc()
    forgetful_model.load_state_dict(resumed_model.state_dict())
    forgetful.load_state_dict({**resumed.state_dict(), "direction": None})
    forgetful.sampler.load_state_dict(resumed.sampler.state_dict())
    torch.set_rng_state(rng)
    list(resumed.run(1))
    torch.set_rng_state(rng)
    list(forgetful.run(1))
    assert not torch.allclose(parameter_vector(forgetful_model), parameter_vector(resumed_model))


def test_momentum_needs_a_diagonal_shift_and_the_natural_gradient():
    from vitqs.config import ConfigError, from_dict

    base = {"lattice": {"shape": [4]}, "hamiltonian": {"kind": "heisenberg"}}
    for optimizer, words in (
        ({"momentum": 0.9, "diag_shift": 0.0}, r"optimizer.diag_shift=0.0 must be > 0"),
        ({"momentum": 1.0}, r"optimizer.momentum=1.0 must be between 0.0 and 0.999"),
    ):
        with pytest.raises(ConfigError, match=words):
            from_dict({**base, "optimizer": optimizer})
