"""Sector enumeration and ranking against brute force."""

import itertools
from math import comb

import numpy as np
import pytest
import torch

from vitqs.physics.hilbert import Bosons, SpinHalf


def _brute_force(local, n_sites, keep):
    states = [s for s in itertools.product(local, repeat=n_sites) if keep(s)]
    # increasing code: the last site is the most significant digit
    return np.array(sorted(states, key=lambda s: tuple(reversed([local.index(v) for v in s]))))


@pytest.mark.parametrize(
    "n_sites, total_sz", [(1, 0.5), (4, 0), (6, 1), (7, -0.5), (8, 0), (5, 2.5)]
)
def test_spin_sector_matches_brute_force(n_sites, total_sz):
    hilbert = SpinHalf(n_sites, total_sz)
    expected = _brute_force((-1, 1), n_sites, lambda s: sum(s) == 2 * total_sz)
    assert hilbert.dimension == len(expected) == comb(n_sites, hilbert.n_up)
    assert np.array_equal(hilbert.all_states(), expected)
    assert np.array_equal(hilbert.state_index(expected), np.arange(len(expected)))


@pytest.mark.parametrize(
    "n_sites, n_particles, n_max",
    [(4, 4, 4), (5, 3, 1), (4, 6, 2), (3, 0, 1), (6, 5, 3), (2, 7, 4)],
)
def test_boson_sector_matches_brute_force(n_sites, n_particles, n_max):
    hilbert = Bosons(n_sites, n_particles, n_max)
    expected = _brute_force(tuple(range(n_max + 1)), n_sites, lambda s: sum(s) == n_particles)
    assert hilbert.dimension == len(expected)
    assert np.array_equal(hilbert.all_states(), expected)
    assert np.array_equal(hilbert.state_index(expected), np.arange(len(expected)))


def test_large_sector_round_trip_is_fast_enough():
    hilbert = Bosons(10, 10)  # 92,378 states; the ranking is vectorized
    states = hilbert.all_states()
    assert hilbert.dimension == comb(19, 9)
    assert np.array_equal(hilbert.state_index(states), np.arange(len(states)))


def test_states_outside_the_sector_are_refused():
    with pytest.raises(ValueError, match="not in this sector"):
        SpinHalf(4, 0).state_index(np.array([[1, 1, 1, -1]]))
    with pytest.raises(ValueError):
        Bosons(3, 3, 2).state_index(np.array([[3, 0, 0]]))


# particle-by-particle placement is valid but not uniform: keep every state likely enough to be seen
@pytest.mark.parametrize("hilbert", [SpinHalf(10, 1), Bosons(6, 9, 2), Bosons(4, 4)])
def test_random_states_are_valid_and_cover_the_sector(hilbert):
    gen = torch.Generator().manual_seed(0)
    states = hilbert.random_states(4000, gen)
    assert states.dtype == torch.float64 and states.shape == (4000, hilbert.n_sites)
    index = hilbert.state_index(states)  # raises if any state is invalid
    if hilbert.dimension < 400:
        assert len(np.unique(index)) == hilbert.dimension


def test_random_spin_states_are_uniform():
    hilbert = SpinHalf(6, 0)  # 20 states
    counts = np.bincount(
        hilbert.state_index(hilbert.random_states(20000, torch.Generator().manual_seed(3))),
        minlength=20,
    )
    chi2 = ((counts - 1000) ** 2 / 1000).sum()
    assert chi2 < 43.8  # 99.9% quantile of chi-square with 19 dof


@pytest.mark.parametrize(
    "kwargs",
    [dict(n_sites=4, total_sz=0.5), dict(n_sites=4, total_sz=3), dict(n_sites=0, total_sz=0)],
)
def test_impossible_spin_sectors(kwargs):
    with pytest.raises(ValueError):
        SpinHalf(**kwargs)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(n_sites=3, n_particles=-1), "n_particles"),
        (dict(n_sites=3, n_particles=2, n_max=0), "n_max"),
        (dict(n_sites=2, n_particles=5, n_max=2), "n_particles"),
    ],
)
def test_impossible_boson_sectors(kwargs, key):
    with pytest.raises(ValueError, match=key):
        Bosons(**kwargs)


def test_contains_accepts_the_sector_and_nothing_else():
    spins = SpinHalf(6, 1)
    states = spins.all_states()
    assert spins.contains(states).all()
    flipped = states.copy()
    flipped[:, 0] *= -1  # one spin flipped: another S^z
    assert not spins.contains(flipped).any()
    assert not spins.contains(np.zeros((2, 6))).any()  # 0 is not a spin value
    assert not spins.contains(states[:, :5]).any()  # another number of sites

    bosons = Bosons(4, 4, n_max=2)
    assert bosons.contains(torch.as_tensor(bosons.all_states(), dtype=torch.float64)).all()
    outside = np.array([[4, 0, 0, 0], [1, 1, 1, 0], [2, 2, 0, 1], [1.5, 1.5, 1, 0]])
    assert not bosons.contains(outside).any()  # above n_max, N = 3, N = 5, not integers
