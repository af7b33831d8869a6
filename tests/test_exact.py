"""Exact diagonalization: published values, Majumdar-Ghosh, dense agreement, cache, size guard."""

import json
import os

import numpy as np
import pytest

from vitqs.physics import exact
from vitqs.physics.lanczos import lowest_ritz_value
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg


def test_heisenberg_chain_8_matches_the_bethe_ansatz_value():
    # finite-size Bethe-ansatz / ED value for L = 8 (PBC), quoted widely, e.g. in NetKet's docs ×1/4
    assert exact.ground_state(Heisenberg(Lattice((8,)))).energy == pytest.approx(
        -3.651093408937, abs=1e-10
    )


def test_heisenberg_4x4_matches_the_literature():
    # Schulz, Ziman & Poilblanc, J. Phys. I 6, 675 (1996): E/N = -0.7017802 on the 4x4 torus
    result = exact.ground_state(Heisenberg(Lattice((4, 4))))
    assert result.energy == pytest.approx(-11.228483, abs=1e-6)
    assert result.dimension == 12870


@pytest.mark.parametrize("length", [8, 10, 12])
def test_majumdar_ghosh_point_is_exact(length):
    # at J2 = J1/2 the dimer product states are exact ground states with E = -3/8 J1 per site
    result = exact.ground_state(Heisenberg(Lattice((length,)), J1=1.0, J2=0.5))
    assert result.energy == pytest.approx(-0.375 * length, abs=1e-10)


@pytest.mark.parametrize(
    "ham",
    [
        # Lanczos path (>= 400 states) yet small enough for a dense eigh in seconds
        Heisenberg(Lattice((4, 3)), J2=0.5),  # 924 states
        BoseHubbard(Lattice((6,)), U=3.3, n_particles=6),  # 462 states
        Heisenberg(Lattice((3, 2)), J2=0.3),  # tiny: dense path
    ],
)
def test_lanczos_agrees_with_dense_diagonalization(ham):
    result = exact.ground_state(ham, return_vector=True, use_cache=False)
    dense = ham.to_dense()
    assert result.energy == pytest.approx(np.linalg.eigvalsh(dense)[0], abs=1e-9)
    vector = result.vector
    np.testing.assert_allclose(dense @ vector, result.energy * vector, atol=1e-7)
    assert exact.expectation(dense, vector) == pytest.approx(result.energy, abs=1e-9)


def test_results_are_cached_by_every_parameter(tmp_path):
    ham = BoseHubbard(Lattice((6,)), U=2.0, n_particles=6)
    first = exact.ground_state(ham, cache_dir=tmp_path, return_vector=True)
    again = exact.ground_state(ham, cache_dir=tmp_path, return_vector=True)
    assert not first.cached and again.cached
    assert again.energy == first.energy
    np.testing.assert_array_equal(again.vector, first.vector)
    other = exact.ground_state(BoseHubbard(Lattice((6,)), U=2.5, n_particles=6), cache_dir=tmp_path)
    assert not other.cached and other.energy != first.energy
    assert len(list(tmp_path.glob("*.npz"))) == 2


def test_a_corrupt_cache_entry_is_solved_again(tmp_path):
    ham = Heisenberg(Lattice((6,)))
    exact.ground_state(ham, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.npz")
    entry.write_bytes(b"not a numpy file")
    result = exact.ground_state(ham, cache_dir=tmp_path)
    assert not result.cached and result.energy == pytest.approx(-2.8027756377, abs=1e-9)


def _rewrite_entry(entry, **changes):
    with np.load(entry) as data:
        values = {key: data[key] for key in data.files}
    values.update(changes)
    np.savez(entry, **values)


@pytest.mark.parametrize(
    "damage",
    [
        "energy",  # a wrong energy beside the right vector: served once as "(from cache)"
        "excited",  # an excited eigenvector with its own energy: it passed the first check
        "vector",  # another eigenvector's components
        "description",  # the entry of another Hamiltonian under this key
        "dimension",
        "format",  # an entry of an older vitqs
        "empty",  # EOFError: crashed every later run of the Hamiltonian
        "truncated",  # BadZipFile: likewise
    ],
)
def test_a_cache_entry_that_does_not_check_out_is_solved_again_and_replaced(damage, tmp_path):
    ham = Heisenberg(Lattice((8,)), J2=0.3)
    truth = exact.ground_state(ham, cache_dir=tmp_path, return_vector=True)
    (entry,) = tmp_path.glob("*.npz")
    if damage == "energy":
        _rewrite_entry(entry, energy=truth.energy + 1e-4)
    elif damage == "excited":
        values, vectors = np.linalg.eigh(ham.to_sparse().toarray())
        assert exact.is_eigenvector(ham, vectors[:, 1], values[1])
        _rewrite_entry(entry, energy=values[1], vector=vectors[:, 1])
    elif damage == "vector":
        rng = np.random.default_rng(0)
        _rewrite_entry(entry, vector=rng.normal(size=truth.dimension))
    elif damage == "description":
        other = Heisenberg(Lattice((8,)), J2=0.4)
        _rewrite_entry(entry, description=json.dumps(other.describe(), sort_keys=True))
    elif damage == "dimension":
        _rewrite_entry(entry, dimension=truth.dimension + 1)
    elif damage == "format":
        _rewrite_entry(entry, format=1)
    elif damage == "empty":
        entry.write_bytes(b"")
    else:
        entry.write_bytes(entry.read_bytes()[:200])
    again = exact.ground_state(ham, cache_dir=tmp_path)
    assert not again.cached and again.energy == pytest.approx(truth.energy, abs=1e-12)
    replaced = exact.ground_state(ham, cache_dir=tmp_path)  # the bad entry was replaced
    assert replaced.cached and replaced.energy == again.energy
    assert sorted(p.name for p in tmp_path.iterdir()) == [entry.name]


def test_the_eigenvector_check_accepts_lanczos_and_refuses_a_changed_digit():
    for ham in (
        Heisenberg(Lattice((4, 4)), J2=0.5),
        BoseHubbard(Lattice((9,)), U=10.0, n_particles=9),
    ):
        result = exact.ground_state(ham, return_vector=True, use_cache=False)
        assert exact.is_eigenvector(ham, result.vector, result.energy)
        assert not exact.is_eigenvector(ham, result.vector, result.energy * (1 + 1e-7))


def test_the_lowest_level_check_accepts_the_ground_state_and_refuses_the_next_levels():
    import scipy.sparse.linalg as sla

    for ham in (
        Heisenberg(Lattice((4, 4)), J2=0.5),  # the first excited level 3.5 % above
        BoseHubbard(Lattice((9,)), U=10.0, n_particles=9),
    ):
        matrix = ham.to_sparse()
        values = np.sort(sla.eigsh(matrix, k=6, which="SA", tol=1e-12)[0])
        assert exact.is_lowest(matrix, values[0])
        above = values[values > values[0] + 1e-6]
        assert not any(exact.is_lowest(matrix, value) for value in above)
        # a Ritz value never falls below the lowest eigenvalue
        assert lowest_ritz_value(matrix, 60) >= values[0] - 1e-10


def test_use_cache_false_neither_reads_nor_writes(tmp_path):
    ham = Heisenberg(Lattice((6,)))
    result = exact.ground_state(ham, cache_dir=tmp_path, use_cache=False)
    assert not result.cached and list(tmp_path.iterdir()) == []


def test_a_link_planted_in_the_cache_folder_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    cache = tmp_path / "cache"
    cache.mkdir()
    ham = Heisenberg(Lattice((6,)))
    key = exact.cache_key(ham)
    for name in (f"{key}.{os.getpid()}.tmp.npz", f"{key}.tmp.npz"):  # the old fixed names
        (cache / name).symlink_to(victim)
    exact.ground_state(ham, cache_dir=cache)
    assert victim.read_text() == "precious"
    assert exact.ground_state(ham, cache_dir=cache).cached


def test_a_cache_that_cannot_be_written_warns_and_the_result_stands(tmp_path):
    # a cache folder under a regular file (or a full disk) once ended the run with a traceback
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    ham = Heisenberg(Lattice((6,)))
    with pytest.warns(RuntimeWarning, match="could not write"):
        solved = exact.ground_state(ham, cache_dir=blocker / "ed")
    assert solved.energy == pytest.approx(exact.ground_state(ham, use_cache=False).energy)
    assert not solved.cached


def test_sector_over_the_limit_is_refused_before_anything_is_built():
    ham = Heisenberg(Lattice((6, 6)))  # 9e9 states: building them would never finish
    with pytest.raises(exact.SectorTooLargeError, match="max_dim") as refusal:
        exact.ground_state(ham, max_dim=5_000_000)
    # out of any machine's reach: the error does not suggest raising the bound
    assert "ED needs a smaller lattice" in str(refusal.value)
    with pytest.raises(exact.SectorTooLargeError, match="raise exact.max_dim"):
        exact.ground_state(Heisenberg(Lattice((6, 4))), max_dim=1_000_000)  # 2.7e6 states
