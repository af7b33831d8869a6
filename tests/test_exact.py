"""Exact diagonalization: published values, Majumdar-Ghosh, dense agreement, cache, size guard."""

import numpy as np
import pytest

from vitqs import exact
from vitqs.lattice import Lattice
from vitqs.operators import BoseHubbard, Heisenberg


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


def test_sector_over_the_limit_is_refused_before_anything_is_built():
    ham = Heisenberg(Lattice((6, 6)))  # 9e9 states: building them would never finish
    with pytest.raises(exact.SectorTooLargeError, match="max_dim") as refusal:
        exact.ground_state(ham, max_dim=5_000_000)
    # out of any machine's reach: the error does not suggest raising the bound
    assert "ED needs a smaller lattice" in str(refusal.value)
    with pytest.raises(exact.SectorTooLargeError, match="raise exact.max_dim"):
        exact.ground_state(Heisenberg(Lattice((6, 4))), max_dim=1_000_000)  # 2.7e6 states
