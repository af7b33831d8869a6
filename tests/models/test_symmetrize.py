"""Symmetrized: exact invariance under every translation, spin-inversion parity, stable sums."""

import math

import numpy as np
import pytest
import torch
from helpers import random_spins

from vitqs.models import Jastrow, Symmetrized, ViT, complex_logsumexp, symmetrize_translations
from vitqs.models.symmetrize import momentum_translations
from vitqs.physics.lattice import Lattice


def _same_phase(a, b, atol=1e-12):
    """Checks log ψ values agree: real parts equal, imaginary parts equal modulo 2π."""
    torch.testing.assert_close(a.real, b.real, rtol=0, atol=atol)
    phase = torch.remainder(a.imag - b.imag + math.pi, 2 * math.pi) - math.pi
    assert phase.abs().max() < atol


def _vit(lattice):
    # translation_invariant=False: the bare model has no symmetry, the projection must add it
    model = ViT(lattice.shape, 2, 8, 2, 1, translation_invariant=False)
    for p in model.parameters():
        p.data.add_(0.2 * torch.randn_like(p))  # away from the nearly flat initial state
    return model


@pytest.mark.parametrize("lattice", [Lattice((8,)), Lattice((4, 4))], ids=["chain", "square"])
def test_invariant_under_every_translation(lattice):
    model = Symmetrized(_vit(lattice), lattice.translations)
    x = random_spins(3, lattice.n_sites)
    log_psi = model(x)
    assert log_psi.shape == (3,) and log_psi.dtype == torch.complex128
    bare = model.model(x)
    assert (bare - model.model(x[:, lattice.translations[1]])).abs().max() > 1e-3
    for perm in lattice.translations:
        _same_phase(model(x[:, perm]), log_psi)


@pytest.mark.parametrize("spin_flip", [1, -1])
def test_spin_inversion_parity(spin_flip):
    lattice = Lattice((4, 4))
    model = Symmetrized(_vit(lattice), lattice.translations, spin_flip=spin_flip)
    x = random_spins(4, lattice.n_sites)
    log_psi = model(x)
    # ψ(−x) = s ψ(x): log ψ(−x) = log ψ(x) + iπ for s = −1
    shift = 0.0 if spin_flip == 1 else math.pi
    _same_phase(model(-x), log_psi + 1j * shift)
    _same_phase(model(-x[:, lattice.translations[5]]), log_psi + 1j * shift)


def test_equals_the_plain_average():
    lattice = Lattice((6,))
    bare = _vit(lattice)
    model = Symmetrized(bare, lattice.translations, spin_flip=-1)
    # the first state's inverse is its mirror image, not a translation: ψ_sym ≠ 0 there
    x = torch.cat([torch.tensor([[1.0, 1, -1, 1, -1, -1]]), random_spins(3, lattice.n_sites)])
    psi = torch.zeros(4, dtype=torch.complex128)
    for perm in lattice.translations:
        psi += bare(x[:, perm]).exp() - bare(-x[:, perm]).exp()
    psi = psi / (2 * len(lattice.translations))
    assert psi[0].abs() > 1e-3
    torch.testing.assert_close(model(x).exp(), psi, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("spin_flip", [0, 1, -1])
@pytest.mark.parametrize("momentum", [None, [2]])
def test_the_pass_in_real_parts_is_the_complex_pass(spin_flip, momentum):
    # what compiled sweeps of chains on ψ_sym evaluate: forward's log ψ to rounding, the
    # phases of a momentum and of an odd spin inversion included; where the copies cancel
    # (ψ_sym(x) = 0 but for rounding) both are rounding, ~1e-16 of the largest copy
    lattice = Lattice((8,))
    vit = _vit(lattice)
    table, phases = momentum_translations(vit, lattice, momentum)
    model = Symmetrized(vit, table, spin_flip, phases=phases, momentum=momentum)
    x = random_spins(16, lattice.n_sites)
    log_psi = model(x)
    real, imag = model.log_psi_parts(x)
    vanishing = log_psi.real < log_psi.real.max() - 25
    assert torch.equal(real < log_psi.real.max() - 25, vanishing)
    kept = ~vanishing
    assert kept.sum() >= 8
    _same_phase(torch.complex(real[kept], imag[kept]), log_psi[kept], atol=1e-11)


def test_complex_logsumexp_is_stable_and_handles_signs():
    log_terms = torch.tensor(
        [[1000.0 + 0.0j, 1000.0 + 0.5j, 990.0 + 1j * math.pi]], dtype=torch.complex128
    )
    out = complex_logsumexp(log_terms, dim=1)
    reference = 1000.0 + np.log(1 + np.exp(0.5j) - np.exp(-10.0))
    assert np.isclose(out.item(), reference, rtol=1e-14)
    # +iπ is a weight −1: exact cancellation
    cancelled = complex_logsumexp(
        torch.tensor([[2.0 + 0j, 2.0 + 1j * math.pi]], dtype=torch.complex128), dim=1
    )
    assert cancelled.real.item() < -30


def test_keeps_the_model_precision():
    lattice = Lattice((4,))
    model = Symmetrized(Jastrow(lattice.shape), lattice.translations, spin_flip=-1)
    assert model.to(torch.float32)(random_spins(2, 4)).dtype == torch.complex64


def test_bad_spin_flip_is_a_clear_error():
    with pytest.raises(ValueError, match=r"model.sector.spin_flip=2.*\[0, 1, -1\]"):
        Symmetrized(Jastrow((4,)), Lattice((4,)).translations, spin_flip=2)


@pytest.mark.parametrize(
    "lattice, patch", [(Lattice((8,)), 2), (Lattice((4, 4)), 2), (Lattice((6, 4)), (3, 2))]
)
def test_coset_average_of_an_invariant_vit_equals_the_full_average(lattice, patch):
    # a translation-invariant ViT needs one shift per coset of the patch translations: the
    # cheap average must be the same state as the average over every translation
    torch.manual_seed(4)
    model = ViT(lattice.shape, patch, 8, 2, 1, translation_invariant=True)
    for p in model.parameters():
        p.data.add_(0.2 * torch.randn_like(p))
    cheap = symmetrize_translations(model, lattice)
    patch_len = model.grid.patch_len
    assert cheap.translations.shape[0] == patch_len < len(lattice.translations)
    full = Symmetrized(model, lattice.translations)
    x = random_spins(5, lattice.n_sites)
    _same_phase(cheap(x), full(x))
    for perm in lattice.translations:
        _same_phase(cheap(x[:, perm]), cheap(x))


def test_symmetrize_translations_leaves_symmetric_models_alone():
    lattice = Lattice((4, 4))
    jastrow = Jastrow(lattice.shape, pbc=True)
    assert symmetrize_translations(jastrow, lattice) is jastrow
    averaged = Symmetrized(_vit(lattice), lattice.translations)
    assert symmetrize_translations(averaged, lattice) is averaged
    bare = _vit(lattice)  # not invariant: every translation is averaged
    assert symmetrize_translations(bare, lattice).translations.shape[0] == 16


def test_network_state_loads_across_the_symmetry_average_both_ways():
    from vitqs.models import load_network_state

    lattice = Lattice((8,))
    trained, fresh = _vit(lattice), ViT(lattice.shape, 2, 8, 2, 1, translation_invariant=False)
    averaged = Symmetrized(fresh, lattice.translations, spin_flip=1)
    load_network_state(averaged, trained.state_dict())  # bare -> averaged
    x = random_spins(16, 8)
    torch.testing.assert_close(
        averaged(x), Symmetrized(trained, lattice.translations, spin_flip=1)(x), rtol=0, atol=0
    )
    back = ViT(lattice.shape, 2, 8, 2, 1, translation_invariant=False)
    load_network_state(back, averaged.state_dict())  # averaged -> bare
    torch.testing.assert_close(back(x), trained(x), rtol=0, atol=0)

    wider = ViT(lattice.shape, 2, 16, 2, 1, translation_invariant=False)
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_network_state(wider, averaged.state_dict())
