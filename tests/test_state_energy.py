"""``vitqs.report.state_energy``: the enumerated energy of a trained state is the dense
Rayleigh quotient of the same (translation-averaged) state, never below the ground state;
``scripts/state_energy.py`` prints it."""

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import model_energy, tiny_heisenberg

from vitqs import results
from vitqs.build import build_hamiltonian, build_network
from vitqs.config import from_dict
from vitqs.models import Symmetrized
from vitqs.physics.lanczos import spectral_weights
from vitqs.physics.lattice import Lattice
from vitqs.report import (
    by_level,
    by_probability,
    infidelity_by_probability,
    state_energy,
)
from vitqs.runner import run_config
from vitqs.vmc.driver import last_good_parameters


def _dense_energy(model, hamiltonian, group) -> float:
    """Returns <ψ_G|H|ψ_G>/<ψ_G|ψ_G> of ``model`` averaged over every permutation in ``group``."""
    return model_energy(Symmetrized(model, group), hamiltonian)


@pytest.mark.parametrize("symmetrize", ["translations", "space_group"])
def test_enumerated_energy_of_a_monte_carlo_run_is_its_rayleigh_quotient(tmp_path, symmetrize):
    data = tiny_heisenberg(
        tmp_path / "out", lattice={"shape": [8], "pbc": True}, final={"symmetrize": symmetrize}
    )
    config = from_dict(data)
    summary = run_config(config, progress=False)
    row = state_energy(Path(summary["results_file"]), max_dim=10_000)

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
    assert state_energy(Path(summary["results_file"]), max_dim=10) is None
    assert "last_iterate_relative_error" not in row  # no averaging in this run


def test_an_averaged_run_also_reports_its_last_iterate(tmp_path):
    from vitqs.vmc.sr import set_parameter_vector

    data = tiny_heisenberg(tmp_path / "out", optimizer={"n_iter": 6, "average_from": 0.5})
    config = from_dict(data)
    summary = run_config(config, progress=False)
    row = state_energy(Path(summary["results_file"]), max_dim=10_000)
    record = results.read_results(summary["results_file"])
    theta_last = last_good_parameters(results.load_checkpoint(record)["vmc"])

    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    set_parameter_vector(model, theta_last)
    dense = model_energy(model, hamiltonian)
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
    own = state_energy(path, max_dim=10_000)
    other = state_energy(path, max_dim=10_000, symmetrize="space_group")

    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    model.load_state_dict(results.load_checkpoint(results.read_results(path))["model"])
    dense = _dense_energy(model, hamiltonian, Lattice((8,)).space_group())
    assert other["enumerated"] == pytest.approx(dense, rel=1e-10)
    assert other["enumerated"] != pytest.approx(own["enumerated"], rel=1e-12)


def test_distance_by_probability_lies_where_the_state_differs():
    # φ over 6 states with weights 0.9 .. 9e-6 (decades -1 .. -6); ψ differs only on the
    # state of weight 9e-5, so the distance lies in that decade (elsewhere only through the
    # normalisation, a second-order 1e-4 of it)
    weights = np.array([0.5, 0.05, 5e-3, 5e-4, 5e-5, 5e-6])  # 0.9 .. 9e-6, normalised
    phi = np.sqrt(weights / weights.sum())
    psi = phi.copy()
    psi[4] *= 1.1
    table = infidelity_by_probability(np.log(psi) + 3.0, -phi, n_samples=1000)
    rows = {row[0]: row for row in table["rows"]}
    assert sorted(rows) == [-6, -5, -4, -3, -2, -1]
    assert rows[-5][5] == pytest.approx(table["distance"], rel=1e-3)
    assert sum(row[5] for row in table["rows"]) == pytest.approx(table["distance"], rel=1e-12)
    unit = psi / np.linalg.norm(psi)
    assert table["infidelity"] == pytest.approx(1 - np.dot(unit, phi) ** 2, rel=1e-10)
    assert rows[-1][4] == pytest.approx(1000 * phi[0] ** 2, rel=1e-12)


def test_by_probability_of_a_run_against_dense_ed(tmp_path, capsys):
    import state_energy as script  # scripts/state_energy.py: the command line
    from helpers import tiny_bose_hubbard

    data = tiny_bose_hubbard(tmp_path / "out", lattice={"shape": [6], "pbc": True})
    data["hamiltonian"].update(n_particles=6, U=6.0)
    config = from_dict(data)
    summary = run_config(config, progress=False)
    table = by_probability(Path(summary["results_file"]), max_dim=10_000)
    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    model.load_state_dict(
        results.load_checkpoint(results.read_results(summary["results_file"]))["model"]
    )
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        psi = torch.exp(model(x)).numpy()
    _, vectors = np.linalg.eigh(hamiltonian.to_dense())
    overlap = abs(np.vdot(vectors[:, 0], psi)) ** 2 / np.vdot(psi, psi).real
    assert table["infidelity"] == pytest.approx(1 - overlap, rel=1e-8)
    assert sum(row[1] for row in table["rows"]) == hamiltonian.hilbert.dimension
    assert sum(row[2] for row in table["rows"]) == pytest.approx(1.0, rel=1e-12)
    assert sum(row[3] for row in table["rows"]) == pytest.approx(1.0, rel=1e-12)
    assert table["distance"] == pytest.approx(2 * (1 - np.sqrt(overlap)), rel=1e-8)
    assert script.main([summary["results_file"], "--by-probability"]) == 0
    printed = capsys.readouterr().out
    assert f"tiny_bh: infidelity {table['infidelity']:.3e}" in printed
    assert printed.count("| 1e") == len(table["rows"])


def test_repeated_final_measurements_of_a_trained_averaged_run(tmp_path):
    # scripts/final_bias.py: the steps' distribution (|ψ|^1.25 of the last iterate) first,
    # then the final state (averaged, translation-averaged, |ψ|²) with each discard
    import final_bias

    data = tiny_heisenberg(
        tmp_path / "out",
        lattice={"shape": [8], "pbc": True},
        sampler={"machine_pow": 1.25},
        optimizer={"n_iter": 10, "average_from": 0.5},
        final={"symmetrize": "translations", "n_samples": 512},
    )
    summary = run_config(from_dict(data), progress=False)
    found = final_bias.repeated_finals(Path(summary["results_file"]), 4, [0, 16], 5)
    enumerated = state_energy(Path(summary["results_file"]), max_dim=10_000)
    assert found["enumerated"] == pytest.approx(enumerated["enumerated"], rel=1e-12)
    assert found["default"] == 32  # 512 final samples: 8 batches of 4 per chain (64 in 16)
    for discard, values in found["measured"].items():
        energies, errors = np.array(values).T
        assert len(energies) == 4 and len(set(energies)) == 4, discard  # distinct streams
        assert np.all(np.abs(energies - found["enumerated"]) < 5 * errors), discard


def test_spectral_weights_are_the_projections_on_each_level_degenerate_or_not():
    # a Hermitian matrix with a 3-fold and a 2-fold level: ψ's weight in each level is the
    # norm of its projection on the whole eigenspace, found from Lanczos started at ψ
    rng = np.random.default_rng(7)
    values = np.array([-3.0, -2.0, -2.0, -2.0, -1.5, -1.5] + list(np.linspace(-1, 4, 54)))
    q, _ = np.linalg.qr(rng.normal(size=(60, 60)) + 1j * rng.normal(size=(60, 60)))
    matrix = (q * values) @ q.conj().T
    psi = rng.normal(size=60) + 1j * rng.normal(size=60)
    psi /= np.linalg.norm(psi)
    levels = spectral_weights(matrix, psi)
    for energy, count in ((-3.0, 1), (-2.0, 3), (-1.5, 2)):
        inside = np.isclose(values, energy)
        assert inside.sum() == count
        projection = q[:, inside] @ (q[:, inside].conj().T @ psi)
        found = [level for level in levels if abs(level[0] - energy) < 1e-8]
        assert len(found) == 1  # one level, whatever its degeneracy
        assert found[0][1] == pytest.approx(np.linalg.norm(projection) ** 2, rel=1e-8)
        overlap = abs(np.vdot(found[0][2], projection)) / np.linalg.norm(projection)
        assert overlap == pytest.approx(1.0, abs=1e-8)
    assert sum(level[1] for level in levels) == pytest.approx(1.0, abs=1e-6)


def test_by_level_of_a_run_against_dense_ed(tmp_path, capsys):
    import state_energy as script

    data = tiny_heisenberg(tmp_path / "out", lattice={"shape": [8], "pbc": True})
    config = from_dict(data)
    summary = run_config(config, progress=False)
    path = Path(summary["results_file"])
    table = by_level(path, max_dim=10_000, n_levels=4)
    infidelity = by_probability(path, max_dim=10_000)["infidelity"]
    assert table["ground_weight"] == pytest.approx(1 - infidelity, rel=1e-8)
    energy, gap, sector, weight = table["rows"][0]
    assert weight == pytest.approx(table["ground_weight"], rel=1e-6)
    assert gap == pytest.approx(0.0, abs=1e-10) and sector["momentum"] == [0]
    energies = np.linalg.eigvalsh(build_hamiltonian(config).to_dense())
    assert all(np.abs(energies - row[0]).min() < 1e-8 for row in table["rows"])
    # the weights and the levels give back the enumerated energy, to the weight left above
    enumerated = state_energy(path, max_dim=10_000)["enumerated"]
    below = sum(row[0] * row[3] for row in table["rows"])
    assert below + table["above"] * table["rows"][-1][0] <= enumerated + 1e-9
    assert script.main([str(path), "--levels", "4"]) == 0
    printed = capsys.readouterr().out
    assert f"weight in the exact levels (ground state {table['ground_weight']:.4f})" in printed
