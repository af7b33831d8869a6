"""References past exact diagonalization: which Hamiltonians have one, and how a run uses it."""

from pathlib import Path

import h5py
import pytest
from helpers import last_json, run_main, tiny_bose_hubbard, tiny_heisenberg, write_config

from vitqs import results
from vitqs.physics.bethe import heisenberg_chain_energy
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.physics.reference import BETHE_ANSATZ, EXACT_DIAGONALIZATION, reference_energy

OLD_FILES = Path(__file__).parent / "data" / "pre_redesign"


@pytest.mark.parametrize(
    ("J2", "per_site"), [(0.0, -0.678872), (0.5, -0.503810)], ids=["heisenberg", "j1j2"]
)
@pytest.mark.parametrize("J1", [1.0, 2.0])
def test_square_6x6_has_the_published_energy_with_its_citation(J1, J2, per_site):
    reference = reference_energy(Heisenberg(Lattice((6, 6)), J1=J1, J2=J2 * J1))
    assert reference.energy == pytest.approx(per_site * 36 * J1, rel=1e-15)
    assert reference.method.startswith("published: ED, Schulz, Ziman & Poilblanc")


@pytest.mark.parametrize("n_sites", [22, 64, 100])
def test_even_heisenberg_ring_has_the_bethe_energy(n_sites):
    reference = reference_energy(Heisenberg(Lattice((n_sites,)), J1=1.0))
    assert reference == type(reference)(heisenberg_chain_energy(n_sites), BETHE_ANSATZ)


@pytest.mark.parametrize(
    "hamiltonian",
    [
        Heisenberg(Lattice((64,)), J1=1.0, J2=0.4),  # frustrated: no Bethe ansatz
        Heisenberg(Lattice((64,), pbc=False), J1=1.0),  # open: another spectrum
        Heisenberg(Lattice((64,)), J1=1.0, total_sz=1.0),  # not the ground state's sector
        Heisenberg(Lattice((64,)), J1=-1.0),  # ferromagnet
        Heisenberg(Lattice((6, 6)), J1=1.0, J2=0.3),  # a ratio nobody tabulated here
        Heisenberg(Lattice((12, 12)), J1=1.0),  # no QMC figure tabulated here
        Heisenberg(Lattice((6, 6), pbc=False), J1=1.0),
        BoseHubbard(Lattice((12,)), J=1.0, U=3.3, n_particles=12),
    ],
    ids=["j1j2-chain", "open", "sz1", "ferro", "j2-0.3", "12x12", "open-6x6", "bose-hubbard"],
)
def test_no_reference_where_none_is_exact(hamiltonian):
    assert reference_energy(hamiltonian) is None


def test_a_run_past_ed_is_measured_against_the_bethe_ansatz_and_says_so(tmp_path, capsys):
    # exact.max_dim below the 20 states of the 6-site sector: ED is out, the Bethe ansatz in
    data = tiny_heisenberg(tmp_path, exact={"enabled": "auto", "max_dim": 10})
    code, out, err = run_main(capsys, "run", write_config(tmp_path / "c.yaml", data), "--json")
    assert code == 0, err
    summary = last_json(out)
    bethe = heisenberg_chain_energy(6)
    assert summary["reference"] == BETHE_ANSATZ and summary["exact_energy"] == bethe
    expected = (summary["energy"] - bethe) / abs(bethe)
    assert summary["relative_error"] == pytest.approx(expected, rel=1e-12)
    assert "(Bethe ansatz)" in out
    record = results.read_results(tmp_path / "tiny.h5")
    assert record.exact["dimension"] == 0  # no diagonalization ran
    assert not any(name.startswith("exact_") for name in record.observables)
    with h5py.File(tmp_path / "tiny.h5") as f:
        assert f["exact"].attrs["reference"] == BETHE_ANSATZ


def test_a_run_within_ed_says_exact_diagonalization(tmp_path, capsys):
    data = tiny_heisenberg(tmp_path)
    code, out, err = run_main(capsys, "run", write_config(tmp_path / "c.yaml", data), "--json")
    assert code == 0, err
    summary = last_json(out)
    assert summary["reference"] == EXACT_DIAGONALIZATION
    assert summary["exact_energy"] == pytest.approx(heisenberg_chain_energy(6), abs=1e-12)


def test_no_reference_at_all_gives_no_relative_error(tmp_path, capsys):
    data = tiny_bose_hubbard(tmp_path, exact={"enabled": "auto", "max_dim": 10})
    code, out, err = run_main(capsys, "run", write_config(tmp_path / "c.yaml", data), "--json")
    assert code == 0, err
    summary = last_json(out)
    assert summary["reference"] is None and summary["exact_energy"] is None
    assert summary["relative_error"] is None


def test_files_before_the_reference_attribute_read_as_exact_diagonalization():
    record = results.read_results(OLD_FILES / "chain.h5")
    assert "reference" not in record.exact
    assert results.summary(record)["reference"] == EXACT_DIAGONALIZATION


def test_the_8x8_j1j2_has_the_best_published_estimate_and_says_it_is_not_exact():
    from vitqs.physics.lattice import Lattice
    from vitqs.physics.operators import Heisenberg
    from vitqs.physics.reference import reference_energy

    reference = reference_energy(Heisenberg(Lattice((8, 8)), J1=1.0, J2=0.5))
    assert reference.energy == pytest.approx(-0.49906 * 64, rel=1e-12)
    assert "not exact" in reference.method and "Hu, Becca, Parola & Sorella" in reference.method
    assert reference_energy(Heisenberg(Lattice((8, 8)), J1=1.0, J2=0.4)) is None


def test_the_10x10_j1j2_has_the_best_published_variational_energy_and_says_it_is_not_exact():
    from vitqs.physics.lattice import Lattice
    from vitqs.physics.operators import Heisenberg
    from vitqs.physics.reference import reference_energy

    reference = reference_energy(Heisenberg(Lattice((10, 10)), J1=1.0, J2=0.5))
    assert reference.energy == pytest.approx(-0.4976939 * 100, rel=1e-12)
    assert "not exact" in reference.method and "arXiv:2603.14425" in reference.method


@pytest.mark.parametrize("size, per_site", [(8, -0.67349005), (10, -0.67155266)])
def test_the_unfrustrated_square_past_ed_has_sandviks_qmc_energy(size, per_site):
    from vitqs.physics.lattice import Lattice
    from vitqs.physics.operators import Heisenberg
    from vitqs.physics.reference import reference_energy

    for sign_rule in (False, True):  # a change of basis: the same energy
        hamiltonian = Heisenberg(Lattice((size, size)), J1=2.0, sign_rule=sign_rule)
        reference = reference_energy(hamiltonian)
        assert reference.energy == pytest.approx(per_site * 2.0 * size**2, rel=1e-12)
        assert "QMC" in reference.method and "Sandvik, arXiv:2601.20189" in reference.method
