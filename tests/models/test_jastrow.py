"""Jastrow: the pair sum written out, translation invariance, coupling counts."""

import itertools

import numpy as np
import pytest
import torch
from helpers import random_bosons, random_spins

from vitqs.models import Jastrow
from vitqs.physics.lattice import Lattice


def _n_classes(shape, pbc):
    """Distinct couplings v(r) = v(−r), r ≠ 0, written out."""
    lx, ly = shape[0], shape[1] if len(shape) == 2 else 1
    if pbc:
        n_half = (1 + (lx % 2 == 0)) * (1 + (ly % 2 == 0))  # displacements with 2r ≡ 0
        return (lx * ly + n_half - 2) // 2
    return ((2 * lx - 1) * (2 * ly - 1) - 1) // 2


@pytest.mark.parametrize(
    ("shape", "pbc"), [((6,), True), ((5,), True), ((6,), False), ((4, 4), True), ((3, 4), False)]
)
def test_parameter_count(shape, pbc):
    model = Jastrow(shape, pbc)
    assert sum(p.numel() for p in model.parameters()) == _n_classes(shape, pbc) + 1


def _log_j_by_loops(x, lattice, coupling, g):
    """Σ_{i≠j} v(r_i − r_j) x_i x_j + g Σ x_i², with v looked up by the displacement itself."""
    total = g * float((x**2).sum())
    for i, j in itertools.permutations(range(lattice.n_sites), 2):
        total += coupling(lattice.coords[i] - lattice.coords[j]) * float(x[i] * x[j])
    return total


@pytest.mark.parametrize("lattice", [Lattice((4, 3)), Lattice((4, 3), pbc=False)])
def test_equals_the_pair_sum(lattice):
    model = Jastrow(lattice.shape, lattice.pbc)
    torch.nn.init.normal_(model.v)
    model.g.data.fill_(0.3)
    couplings = model.couplings().detach().numpy()
    extent = np.asarray(lattice.shape)

    def key(r):
        r = r % extent if lattice.periodic else r
        minus = -r % extent if lattice.periodic else -r
        return max(tuple(r), tuple(minus))

    table = {}  # every pair with the same ±displacement must carry one coupling
    for i, j in itertools.permutations(range(lattice.n_sites), 2):
        r = lattice.coords[i] - lattice.coords[j]
        table.setdefault(key(r), couplings[i, j])
        assert couplings[i, j] == table[key(r)]
    assert len(table) == model.v.numel()
    x = random_bosons(3, lattice.n_sites, n_max=3)
    log_j = model(x)
    assert log_j.dtype == torch.complex128
    assert torch.all(log_j.imag == 0)
    for b in range(3):
        expected = _log_j_by_loops(x[b].numpy(), lattice, lambda r: table[key(r)], 0.3)
        assert log_j[b].real.item() == pytest.approx(expected, rel=1e-12)


def test_starts_at_one_and_is_translation_invariant():
    lattice = Lattice((4, 4))
    model = Jastrow(lattice.shape)
    x = random_spins(4, lattice.n_sites)
    assert torch.all(model(x) == 0)  # J = 1 at initialisation
    torch.nn.init.normal_(model.v)
    log_j = model(x)
    for perm in lattice.translations:
        torch.testing.assert_close(model(x[:, perm]), log_j, rtol=0, atol=1e-12)


def test_onsite_table_is_looked_up_per_site():
    lattice = Lattice((4, 2))
    states = (0, 1, 2, 3)
    model = Jastrow(lattice.shape, lattice.pbc, local_states=states)
    assert sum(p.numel() for p in model.parameters()) == model.v.numel() + len(states)
    torch.nn.init.normal_(model.v)
    torch.nn.init.normal_(model.onsite)
    x = random_bosons(5, lattice.n_sites, n_max=3)
    table = model.onsite.detach().numpy()
    pair = np.einsum("bi,ij,bj->b", x.numpy(), model.couplings().detach().numpy(), x.numpy())
    expected = pair + table[x.numpy().astype(int)].sum(axis=1)
    np.testing.assert_allclose(model(x).real.detach().numpy(), expected, rtol=1e-12)


def test_boson_jastrow_starts_at_the_exact_free_boson_ground_state():
    # at U = 0 all N bosons sit in the k = 0 orbital: ψ(n) ∝ (N!/Π n_i!)^½, i.e. v = 0 and
    # u(n) = −½ log n!, the initial table; its local energy is −2 J N on a periodic chain for
    # every configuration (zero variance)
    from vitqs.physics.operators import BoseHubbard
    from vitqs.vmc.estimators import local_energy

    lattice = Lattice((5,))
    hamiltonian = BoseHubbard(lattice, 1.0, 0.0, 0.0, 4, None)
    states = tuple(hamiltonian.hilbert.local_states)
    model = Jastrow(lattice.shape, lattice.pbc, local_states=states)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    e_loc = local_energy(hamiltonian, model, x)
    torch.testing.assert_close(e_loc.real, torch.full_like(e_loc.real, -8.0), rtol=0, atol=1e-10)
    assert torch.all(e_loc.imag.abs() < 1e-12)


def test_onsite_table_needs_occupations():
    with pytest.raises(ValueError, match=r"local_states=\(-1, 1, 3\) must be occupations"):
        Jastrow((4,), local_states=(-1, 1, 3))
