"""Projection on a crystal momentum k ≠ 0 (`model.momentum`): ψ(T_a x) = e^{ik·a} ψ(x), the
explicit sum over the group on every state of a sector, the cheap coset average of a
translation-invariant ViT, and the sector of a real ground state (the kagome 2×3's)."""

import math

import numpy as np
import pytest
import torch
from helpers import ComplexRBM, LookupTable, random_spins

from vitqs.config import ModelConfig
from vitqs.models import Symmetrized, ViT, build_model, final_symmetrized, invariances
from vitqs.models.symmetrize import momentum_translations, symmetrize_translations
from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg


def _same_phase(a, b, atol=1e-11):
    torch.testing.assert_close(a.real, b.real, rtol=0, atol=atol)
    phase = torch.remainder(a.imag - b.imag + math.pi, 2 * math.pi) - math.pi
    assert phase.abs().max() < atol


def _vit(lattice, **options):
    torch.manual_seed(3)
    model = ViT(lattice.shape, 1, 8, 2, 1, n_basis=lattice.n_basis, **options).double()
    for p in model.parameters():
        p.data.add_(0.2 * torch.randn_like(p))
    return model


CASES = {  # lattice, momentum: a complex phase (chain, square) and the kagome's k = (π, 0)
    "chain_8_k3": (Lattice((8,)), [3]),
    "square_4x4_k12": (Lattice((4, 4)), [1, 2]),
    "kagome_2x3_k10": (Lattice((2, 3), kind="kagome"), [1, 0]),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("spin_flip", [0, -1])
def test_projection_has_the_momentum_under_every_translation(name, spin_flip):
    lattice, momentum = CASES[name]
    model = symmetrize_translations(_vit(lattice, translation_invariant=False), lattice, momentum)
    if spin_flip:
        model = final_symmetrized(model, "none", lattice, spin_flip)
    assert model.momentum == tuple(momentum) and not model.positive
    x = random_spins(4, lattice.n_sites)
    log_psi = model(x)
    phases = lattice.translation_phases(momentum)
    assert np.abs(np.exp(1j * phases) - 1).max() > 1  # some phase far from 1
    for perm, phase in zip(lattice.translations, phases, strict=True):
        _same_phase(model(x[:, perm]), log_psi + 1j * phase)
    if spin_flip:
        _same_phase(model(-x), log_psi + 1j * math.pi)


def test_projection_is_the_explicit_sum_over_the_group_on_every_state():
    # ψ_k(x) = (1/n_T) Σ_T e^{−ik·a_T} ψ(T x), summed by hand on the 70 states of S^z = 0
    lattice, momentum = Lattice((8,)), [3]
    hamiltonian = Heisenberg(lattice, J2=0.3)
    bare = ComplexRBM(8, seed=5, scale=0.4)
    model = symmetrize_translations(bare, lattice, momentum)
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    by_hand = torch.zeros(len(x), dtype=torch.complex128)
    for perm, phase in zip(lattice.translations, lattice.translation_phases(momentum), strict=True):
        by_hand += np.exp(-1j * phase) * bare(x[:, perm]).exp()
    by_hand /= len(lattice.translations)
    assert by_hand.abs().max() > 1e-2
    torch.testing.assert_close(model(x).exp(), by_hand, rtol=1e-12, atol=1e-14)


def test_coset_average_of_an_invariant_vit_equals_the_full_average_at_k_pi():
    # a ViT invariant under shifts by whole patches of 2: k = π has phase 1 on them, so one
    # shift per coset (2 copies) is the same state as the 8-copy average
    lattice, momentum = Lattice((8,)), [4]
    torch.manual_seed(4)
    vit = ViT(lattice.shape, 2, 8, 2, 1, translation_invariant=True).double()
    for p in vit.parameters():
        p.data.add_(0.2 * torch.randn_like(p))
    cheap = symmetrize_translations(vit, lattice, momentum)
    assert len(cheap.translations) == 2
    phases = lattice.translation_phases(momentum)
    full = Symmetrized(vit, lattice.translations, phases=phases, momentum=momentum)
    x = random_spins(5, 8)
    _same_phase(cheap(x), full(x))
    assert (cheap(x).real - vit(x).real).abs().max() > 1e-3  # not the bare network


def test_a_momentum_the_network_cannot_have_is_a_clear_error():
    vit = ViT((8,), 2, 8, 2, 1, translation_invariant=True).double()
    with pytest.raises(
        ValueError, match=r"model.sector.momentum=\[1\].*translation_invariant: false"
    ):
        momentum_translations(vit, Lattice((8,)), [1])


def test_invariances_at_a_momentum_are_the_translations_of_phase_one():
    lattice = Lattice((2, 3), kind="kagome")
    model = symmetrize_translations(_vit(lattice, translation_invariant=False), lattice, [1, 0])
    perms, _ = invariances(model, lattice)
    shifts = {
        tuple(lattice.translation_shifts[i])
        for i, row in enumerate(lattice.translations)
        if any((row == p).all() for p in perms)
    }
    assert shifts == {(0, 0), (0, 1), (0, 2)}  # k = (π, 0): even shifts along x only


def test_build_model_projects_on_model_momentum():
    lattice = Lattice((2, 3), kind="kagome")
    hamiltonian = Heisenberg(lattice)
    options = dict(patch_size=1, d_model=8, heads=2, layers=1, symmetrize="translations")
    options.update(sector={"spin_flip": -1, "momentum": [1, 0]})
    cfg = ModelConfig(translation_invariant=False, **options)
    model = build_model(cfg, lattice, hamiltonian.hilbert)
    assert model.momentum == (1, 0) and model.spin_flip == -1 and len(model.translations) == 6
    with pytest.raises(ValueError, match="model.sector.momentum"):  # the invariant ViT: k = 0 only
        build_model(
            ModelConfig(translation_invariant=True, **options), lattice, hamiltonian.hilbert
        )


def test_the_kagome_2x3_ground_state_lies_at_momentum_pi_0():
    # why the option exists: the exact ground state of the 18-site kagome cluster is at
    # k = (π, 0), odd under spin inversion. Its projection on that sector is itself; on
    # k = 0 it vanishes, so a k = 0 ansatz cannot come closer than the k = 0 sector's
    # lowest state (5e-3 above it)
    lattice = Lattice((2, 3), kind="kagome")
    hamiltonian = Heisenberg(lattice)
    found = exact.ground_state(hamiltonian, return_vector=True, use_cache=False)
    vector = found.vector / np.abs(found.vector).max()
    table = LookupTable.from_vector(hamiltonian.hilbert, vector.astype(np.complex128))
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        at_k = final_symmetrized(table, "translations", lattice, -1, momentum=[1, 0])(x).exp()
        at_zero = final_symmetrized(table, "translations", lattice, -1)(x).exp()
    torch.testing.assert_close(
        at_k, torch.as_tensor(vector, dtype=torch.complex128), rtol=1e-9, atol=1e-9
    )
    assert at_zero.abs().max() < 1e-9
