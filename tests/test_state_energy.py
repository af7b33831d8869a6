"""``scripts/state_energy.py``: the enumerated energy of a trained state is the dense
Rayleigh quotient of the same (translation-averaged) state, never below the ground state."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from _shell_helpers import keep_torch_threads, tiny_heisenberg  # noqa: F401

from vitqs import results
from vitqs.config import from_dict
from vitqs.lattice import Lattice
from vitqs.models import Symmetrized
from vitqs.run import build_hamiltonian, build_network, run_config

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "state_energy.py"


def _script():
    spec = importlib.util.spec_from_file_location("state_energy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dense_energy(model, hamiltonian, group) -> float:
    """Returns <ψ_G|H|ψ_G>/<ψ_G|ψ_G> of ``model`` averaged over every permutation in ``group``."""
    averaged = Symmetrized(model, group)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        psi = torch.exp(averaged(x)).numpy()
    return np.vdot(psi, hamiltonian.to_dense() @ psi).real / np.vdot(psi, psi).real


@pytest.mark.parametrize("symmetrize", ["translations", "space_group"])
def test_enumerated_energy_of_a_monte_carlo_run_is_its_rayleigh_quotient(tmp_path, symmetrize):
    data = tiny_heisenberg(
        tmp_path / "out", lattice={"shape": [8], "pbc": True}, final={"symmetrize": symmetrize}
    )
    config = from_dict(data)
    summary = run_config(config, progress=False)
    row = _script().state_energy(Path(summary["results_file"]), max_dim=10_000)

    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    record = results.read_results(summary["results_file"])
    model.load_state_dict(results.load_checkpoint(record)["model"])
    # every element of the group, not the cosets the code averages over
    lattice = Lattice((8,))
    group = lattice.translations if symmetrize == "translations" else lattice.space_group()
    dense = _dense_energy(model, hamiltonian, group)
    assert row["enumerated"] == pytest.approx(dense, rel=1e-10)
    assert row["relative_error"] >= 0
    # the Monte Carlo final energy estimates the same number
    assert abs(row["monte_carlo"] - row["enumerated"]) < 6 * row["monte_carlo_error"] + 1e-12
    assert _script().state_energy(Path(summary["results_file"]), max_dim=10) is None
    assert "last_iterate_relative_error" not in row  # no averaging in this run


def test_an_averaged_run_also_reports_its_last_iterate(tmp_path):
    from vitqs.sr import set_parameter_vector

    data = tiny_heisenberg(tmp_path / "out", optimizer={"n_iter": 6, "average_from": 0.5})
    config = from_dict(data)
    summary = run_config(config, progress=False)
    row = _script().state_energy(Path(summary["results_file"]), max_dim=10_000)
    record = results.read_results(summary["results_file"])
    theta_last = results.load_checkpoint(record)["vmc"]["last_good"][0]

    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    set_parameter_vector(model, theta_last)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        psi = torch.exp(model(x)).numpy()
    dense = np.vdot(psi, hamiltonian.to_dense() @ psi).real / np.vdot(psi, psi).real
    exact = record.exact["energy"]
    assert row["last_iterate_relative_error"] == pytest.approx(
        (dense - exact) / abs(exact), rel=1e-9
    )
    assert row["last_iterate_relative_error"] != row["relative_error"]


def test_another_final_average_can_be_asked_for(tmp_path):
    # a run measured with the translation average, enumerated with the space-group one: the
    # Rayleigh quotient of the trained ViT averaged over all 16 translations and reflections
    data = tiny_heisenberg(
        tmp_path / "out", lattice={"shape": [8], "pbc": True}, final={"symmetrize": "translations"}
    )
    config = from_dict(data)
    summary = run_config(config, progress=False)
    path = Path(summary["results_file"])
    own = _script().state_energy(path, max_dim=10_000)
    other = _script().state_energy(path, max_dim=10_000, symmetrize="space_group")

    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    model.load_state_dict(results.load_checkpoint(results.read_results(path))["model"])
    dense = _dense_energy(model, hamiltonian, Lattice((8,)).space_group())
    assert other["enumerated"] == pytest.approx(dense, rel=1e-10)
    assert other["enumerated"] != pytest.approx(own["enumerated"], rel=1e-12)
