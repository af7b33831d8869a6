"""build_model: every option from a config, and clear errors for bad ones."""

import itertools
import math

import pytest
import torch
from helpers import CHAIN, SQUARE, model_config, random_bosons, random_spins

from vitqs.models import Symmetrized, ViT, build_model
from vitqs.physics.hilbert import Bosons, SpinHalf
from vitqs.physics.lattice import Lattice

SPINS = SpinHalf(SQUARE.n_sites, 0)
BOSONS = Bosons(SQUARE.n_sites, SQUARE.n_sites, 2)


@pytest.mark.parametrize(
    ("embedding", "symmetrize", "jastrow"),
    [
        *itertools.product(["linear", "onehot"], ["none"], [False, True]),
        ("onehot", "translations", True),
    ],
)
@pytest.mark.parametrize("bosons", [False, True], ids=["spins", "bosons"])
def test_every_option_builds_a_float64_vit(embedding, symmetrize, jastrow, bosons):
    cfg = model_config(embedding=embedding, symmetrize=symmetrize, jastrow=jastrow)
    hilbert = BOSONS if bosons else SPINS
    model = build_model(cfg, SQUARE, hilbert)
    bare = model.model if isinstance(model, Symmetrized) else model
    assert isinstance(bare, ViT) and (bare.jastrow is not None) == jastrow
    assert isinstance(model, Symmetrized) == (symmetrize == "translations")
    assert all(p.dtype == torch.float64 for p in model.parameters())
    x = random_bosons(3, 16) if bosons else random_spins(3, 16)
    log_psi = model(x)
    assert log_psi.shape == (3,) and log_psi.dtype == torch.complex128


def test_patch_size_list_and_jastrow_factor_on_a_chain():
    cfg = model_config(patch_size=[4], jastrow=True)
    model = build_model(cfg, CHAIN, SpinHalf(8, 0))
    assert model.grid.patch_extent == (4, 1)
    assert model.jastrow is not None


@pytest.mark.parametrize("invariant", [True, False])
def test_translation_average_takes_one_shift_per_patch_coset(invariant):
    # an invariant ViT on the 4x4 with 2x2 patches needs the 4 shifts inside a patch (times
    # the spin flip), not all 16; one that is not invariant needs every translation
    cfg = model_config(
        symmetrize="translations", sector={"spin_flip": 1}, translation_invariant=invariant
    )
    torch.manual_seed(2)
    model = build_model(cfg, SQUARE, SPINS)
    assert model.translations.shape == ((4, 16) if invariant else (16, 16))
    for p in model.parameters():
        p.data.add_(0.2 * torch.randn_like(p))
    full = Symmetrized(model.model, SQUARE.translations, spin_flip=1)
    x = random_spins(4, 16)
    one = torch.ones(4, dtype=torch.complex128)
    torch.testing.assert_close(torch.exp(model(x) - full(x)), one, rtol=0, atol=1e-12)
    for perm in SQUARE.translations:
        ratio = torch.exp(model(x[:, perm]) - model(x))
        torch.testing.assert_close(ratio, one, rtol=0, atol=1e-12)


def test_spin_flip_alone_wraps_with_the_identity_only():
    model = build_model(model_config(sector={"spin_flip": -1}), SQUARE, SPINS)
    assert isinstance(model, Symmetrized) and model.translations.shape == (1, 16)
    x = random_spins(2, 16)
    phase = torch.remainder(model(-x).imag - model(x).imag, 2 * math.pi)
    torch.testing.assert_close(phase, torch.full_like(phase, math.pi), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("overrides", "hilbert", "message"),
    [
        (dict(embedding="conv"), SPINS, r"model.embedding='conv'.*linear \| onehot"),
        (
            dict(symmetrize="all"),
            SPINS,
            r"model.symmetrize='all'.*none \| translations \| space_group",
        ),
        (dict(sector={"spin_flip": 2}), SPINS, r"model.sector.spin_flip=2.*0 \| 1 \| -1"),
        (
            dict(sector={"spin_flip": 1}),
            BOSONS,
            r"model.sector.spin_flip=1 needs spin-1/2 states at total_sz=0",
        ),
        (
            dict(sector={"spin_flip": 1}),
            SpinHalf(16, 1),
            r"model.sector.spin_flip=1 needs .*total_sz=1.0",
        ),
        (dict(patch_size=3), SPINS, r"model.patch_size=3 must divide lattice.shape=\[4, 4\]"),
        (dict(heads=3), SPINS, r"model.heads=3 must divide model.d_model=8"),
    ],
)
def test_bad_options_are_clear_errors(overrides, hilbert, message):
    # unknown values are refused by the model section itself (one path for YAML and
    # Python), the rest by the builder, which sees the lattice and the Hilbert space
    with pytest.raises(ValueError, match=message):
        build_model(model_config(**overrides), SQUARE, hilbert)


def test_open_lattice_jastrow_and_trivial_translations():
    lattice = Lattice((4, 4), pbc=False)
    cfg = model_config(jastrow=True, translation_invariant=False, symmetrize="translations")
    model = build_model(cfg, lattice, SPINS)
    assert model.translations.shape == (1, 16)
    assert model.model.jastrow.v.numel() == (7 * 7 - 1) // 2
