"""Bethe ansatz for the periodic Heisenberg chain: ED agreement, the L → ∞ limit, the equations
themselves, input checks and the J scaling."""

import math

import numpy as np
import pytest

from vitqs.physics import bethe, exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg


@pytest.mark.parametrize("n_sites", [8, 10, 12, 14, 16, 18, 20])
def test_bethe_energy_equals_exact_diagonalization(n_sites):
    # ED in the S^z = 0 sector holds the singlet ground state; L = 20 has 184,756 states (~1 s)
    ed = exact.ground_state(Heisenberg(Lattice((n_sites,)), J1=1.0), use_cache=False)
    assert bethe.heisenberg_chain_energy(n_sites) == pytest.approx(ed.energy, abs=1e-10)


def test_two_site_ring_counts_its_doubled_bond_twice():
    # the formula's ring of two sites has the bond (0, 1) twice: E = 2 × (−3/4), while
    # Lattice((2,)) keeps the bond once and ED gives −3/4
    ed = exact.ground_state(Heisenberg(Lattice((2,))), use_cache=False)
    assert bethe.heisenberg_chain_energy(2) == pytest.approx(2 * ed.energy, abs=1e-14)


@pytest.mark.parametrize("n_sites", [6, 64, 1000])
def test_rapidities_solve_the_bethe_equations_and_are_odd(n_sites):
    rapidities = bethe.bethe_rapidities(n_sites)
    quantum_numbers = bethe.ground_state_quantum_numbers(n_sites)
    residual, _ = bethe.bethe_residual(rapidities, quantum_numbers, n_sites)
    # each equation's terms are up to ~π L in size: round-off leaves ~eps·π L
    assert np.abs(residual).max() < 1e-15 * np.pi * n_sites * 10
    assert np.all(np.diff(rapidities) > 0)
    np.testing.assert_array_equal(rapidities, -rapidities[::-1])


def test_jacobian_equals_finite_differences_of_the_residual(rng):
    n_sites = 12
    quantum_numbers = bethe.ground_state_quantum_numbers(n_sites)
    rapidities = np.sort(rng.normal(size=n_sites // 2))
    _, jacobian = bethe.bethe_residual(rapidities, quantum_numbers, n_sites)
    h = 1e-6
    numeric = np.stack(
        [
            (
                bethe.bethe_residual(rapidities + h * e, quantum_numbers, n_sites)[0]
                - bethe.bethe_residual(rapidities - h * e, quantum_numbers, n_sites)[0]
            )
            / (2 * h)
            for e in np.eye(len(rapidities))
        ],
        axis=1,
    )  # (M, M): column k is ∂F/∂λ_k
    np.testing.assert_allclose(jacobian, numeric, atol=1e-7)


def test_energy_per_site_approaches_quarter_minus_ln2_as_one_over_length_squared():
    # Hulthén's e_∞ = 1/4 − ln 2, approached from below as −π²/(12 L²) times a factor
    # 1 + O(1/ln³ L) (Affleck et al. 1989); that factor makes L²(e − e_∞) drift by < 0.1 %
    # between L = 500 and 1000, where a wrong limit would change it by far more
    assert bethe.E_INFINITY_PER_SITE == pytest.approx(-0.4431471805599453, abs=1e-16)
    scaled = {}
    for n_sites in (500, 1000):
        energy_per_site = bethe.heisenberg_chain_energy(n_sites) / n_sites
        scaled[n_sites] = (energy_per_site - bethe.E_INFINITY_PER_SITE) * n_sites**2
    assert scaled[500] < 0 and scaled[1000] < 0
    assert scaled[1000] == pytest.approx(scaled[500], rel=1e-3)
    assert scaled[1000] == pytest.approx(-(math.pi**2) / 12, rel=2e-3)


@pytest.mark.parametrize("n_sites", [7, 1, 0, -4])
def test_odd_or_too_small_length_raises_naming_the_value(n_sites):
    with pytest.raises(ValueError, match=f"n_sites={n_sites} .*even chain length >= 2"):
        bethe.heisenberg_chain_energy(n_sites)


def test_non_integer_length_raises():
    with pytest.raises(ValueError, match="n_sites=8.5"):
        bethe.heisenberg_chain_energy(8.5)


@pytest.mark.parametrize("J", [2.0, 0.37])
def test_energy_scales_with_the_coupling(J):
    assert bethe.heisenberg_chain_energy(16, J=J) == pytest.approx(
        J * bethe.heisenberg_chain_energy(16), rel=1e-14
    )
