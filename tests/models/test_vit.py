"""ViT: contract (shapes, dtypes, per-sample), symmetry of the attention, sizes, errors."""

import itertools

import numpy as np
import pytest
import torch
from helpers import CHAIN, SQUARE, random_bosons, random_spins

from vitqs.models import ViT
from vitqs.models.patching import PatchGrid
from vitqs.models.precision import NetworkCopy
from vitqs.models.vit import HEAD_INIT_STD, exact_gelu
from vitqs.physics.lattice import Lattice
from vitqs.vmc.sr import parameter_vector, set_parameter_vector

OPTIONS = list(itertools.product([True, False], ["linear", "onehot"]))


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("translation_invariant", "embedding"), OPTIONS)
@pytest.mark.parametrize("lattice", [CHAIN, SQUARE], ids=["chain", "square"])
def test_spins_give_complex128_per_sample(lattice, translation_invariant, embedding):
    model = ViT(lattice.shape, 2, 8, 2, 2, translation_invariant, embedding, (-1, 1))
    x = random_spins(5, lattice.n_sites)
    log_psi = model(x)
    assert log_psi.shape == (5,) and log_psi.dtype == torch.complex128
    assert torch.isfinite(torch.view_as_real(log_psi)).all()
    one_by_one = torch.cat([model(x[b : b + 1]) for b in range(5)])
    torch.testing.assert_close(log_psi, one_by_one, rtol=0, atol=1e-13)


@pytest.mark.parametrize("embedding", ["linear", "onehot"])
def test_bosons_with_jastrow_give_complex128_per_sample(embedding):
    model = ViT(SQUARE.shape, 2, 8, 2, 1, embedding=embedding, local_states=(0, 1, 2), jastrow=True)
    x = random_bosons(4, SQUARE.n_sites, n_max=2)
    log_psi = model(x)
    assert log_psi.shape == (4,) and log_psi.dtype == torch.complex128
    torch.testing.assert_close(log_psi[1:2], model(x[1:2]), rtol=0, atol=1e-13)


def test_all_parameters_are_real_float64():
    model = ViT(SQUARE.shape, 2, 8, 2, 1, jastrow=True)
    assert all(p.dtype == torch.float64 for p in model.parameters())


def test_float32_model_gives_complex64():
    model = ViT(SQUARE.shape, 2, 8, 2, 1, embedding="onehot", jastrow=True).to(torch.float32)
    x = random_spins(3, SQUARE.n_sites)
    log_psi = model(x)  # float64 input: the model casts to its own precision
    assert log_psi.dtype == torch.complex64
    torch.testing.assert_close(log_psi, model(x.float()))


def test_initial_wave_function_is_near_uniform_with_a_spread_set_by_the_head_init():
    # log ψ ≈ Σ_α (w_α·z)²/2 at the start: its spread over configurations grows as σ². The
    # default σ keeps |ψ|² within a few e-folds (no peaked start) yet away from the flat
    # state, an eigenstate where SR stalls (see HEAD_INIT_STD)
    x = random_spins(64, SQUARE.n_sites)
    spread = {}
    for std in (0.01, HEAD_INIT_STD):
        torch.manual_seed(0)
        log_psi = ViT(SQUARE.shape, 2, 16, 2, 2, head_init_std=std)(x).detach()
        spread[std] = float((log_psi - log_psi.mean()).abs().max())
    assert spread[0.01] < 0.05
    assert 0.1 < spread[HEAD_INIT_STD] < 3.0
    assert 30 < spread[HEAD_INIT_STD] / spread[0.01] < 300  # σ² scaling, σ ratio 10


@pytest.mark.parametrize(
    ("shape", "patch_size"),
    [((12,), 2), ((6, 4), 2), ((4, 6), (2, 1))],
    ids=["1d", "2d", "2d-rect"],
)
def test_factored_attention_weights_are_circulant_on_the_patch_lattice(shape, patch_size):
    model = ViT(shape, patch_size, 8, 2, 1, translation_invariant=True)
    alpha = model.blocks[0].attention.attention_weights().detach()  # (heads, i, j)
    grid = PatchGrid(shape, patch_size)
    px, py = grid.grid_extent
    coords = grid.patch_coords()

    def shifted(patch, ax, ay):
        x, y = coords[patch]
        return (x + ax) % px + px * ((y + ay) % py)

    for ax, ay in itertools.product(range(px), range(py)):
        perm = [shifted(p, ax, ay) for p in range(grid.n_patches)]
        torch.testing.assert_close(alpha[:, perm][:, :, perm], alpha, rtol=0, atol=0)
    # and not trivially constant
    assert alpha[0].std() > 0


@pytest.mark.parametrize("lattice", [Lattice((8,)), Lattice((4, 4))], ids=["chain", "square"])
def test_translation_invariant_vit_is_invariant_under_patch_translations(lattice):
    model = ViT(lattice.shape, 2, 8, 2, 2, translation_invariant=True)
    # move every parameter off its initial value, so that all take part in the check
    for p in model.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    x = random_spins(4, lattice.n_sites)
    log_psi = model(x)
    # (T x)[i] = x[perm[i]] = x[i − shift], so site 0 reads site −shift
    shifts = -lattice.coords[lattice.translations[:, 0]] % np.asarray(lattice.shape)
    by_whole_patches = np.all(shifts % 2 == 0, axis=1)
    assert by_whole_patches.sum() == lattice.n_sites // 2**lattice.ndim
    for perm in lattice.translations[by_whole_patches]:
        torch.testing.assert_close(model(x[:, perm]), log_psi, rtol=0, atol=1e-12)


def _vit_param_count(n_sites_patch, n_local, n_patches, d, heads, layers, ti):
    """Parameter count of ViT written out term by term."""
    embedding = n_sites_patch * n_local * d + d
    attn = d * d + (d * d + d) + heads * (n_patches if ti else n_patches**2)  # V, W_O, α
    mlp = (d * 4 * d + 4 * d) + (4 * d * d + d)
    block = 2 * (2 * d) + attn + mlp  # two LayerNorms
    head = 2 * d + 2 * (d * d) + 2 * d  # LayerNorm, W_re, W_im, b_re, b_im (hidden = d)
    return embedding + layers * block + head


@pytest.mark.parametrize(("translation_invariant", "embedding"), OPTIONS)
def test_parameter_count_matches_formula(translation_invariant, embedding):
    d, heads, layers = 8, 2, 3
    model = ViT((4, 6), 2, d, heads, layers, translation_invariant, embedding, (0, 1, 2))
    n_local = 3 if embedding == "onehot" else 1
    expected = _vit_param_count(4, n_local, 6, d, heads, layers, translation_invariant)
    assert _n_params(model) == expected


def test_positive_vit_is_real_and_drops_the_imaginary_head():
    complex_model = ViT((4, 4), 2, 8, 2, 1)
    positive = ViT((4, 4), 2, 8, 2, 1, positive=True)
    # the head loses W_im (d × d) and b_im (d)
    assert _n_params(complex_model) - _n_params(positive) == 8 * 8 + 8
    log_psi = positive(random_spins(6, 16))
    assert log_psi.dtype == torch.complex128 and torch.all(log_psi.imag == 0)
    assert torch.isfinite(log_psi.real).all() and log_psi.real.std() > 0


def test_jastrow_factor_adds_its_parameters():
    plain = ViT((4, 4), 2, 8, 2, 1)
    with_jastrow = ViT((4, 4), 2, 8, 2, 1, jastrow=True)
    # periodic 4 × 4: (N + n_half − 2)/2 = (16 + 4 − 2)/2 = 9 couplings, plus g
    assert _n_params(with_jastrow) - _n_params(plain) == 9 + 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(patch_size=3), r"model.patch_size=3 must divide lattice.shape=\[4, 4\]"),
        (dict(heads=3), r"model.heads=3 must divide model.d_model=8"),
        (dict(embedding="conv"), r"model.embedding='conv'.*\['linear', 'onehot'\]"),
        (dict(d_model=0), r"model.d_model=0 must be a positive integer"),
        (dict(layers=-1), r"model.layers=-1"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, message):
    args = dict(lattice_shape=(4, 4), patch_size=2, d_model=8, heads=2, layers=1) | kwargs
    with pytest.raises(ValueError, match=message):
        ViT(**args)


def test_boson_jastrow_carries_an_onsite_table_over_the_occupations():
    plain = ViT((8,), 2, 8, 2, 1, embedding="onehot", local_states=(0, 1, 2, 3))
    with_jastrow = ViT(
        (8,), 2, 8, 2, 1, embedding="onehot", local_states=(0, 1, 2, 3), jastrow=True
    )
    # periodic chain of 8: (8 + 2 − 2)/2 = 4 couplings v(r), plus u(n) for n = 0..3
    assert _n_params(with_jastrow) - _n_params(plain) == 4 + 4
    assert with_jastrow.jastrow.onsite is not None


@pytest.mark.parametrize("translation_invariant", [True, False])
@pytest.mark.parametrize("lattice", [Lattice((12,)), Lattice((4, 4))], ids=["chain", "square"])
def test_factored_attention_as_one_matrix_equals_its_factored_form(lattice, translation_invariant):
    """Without gradients a narrow factored layer is one product with `kernel()`; with them it
    keeps its factored form. Both are the same map (and so the same log ψ)."""
    model = ViT(lattice.shape, 2, 16, 4, 2, translation_invariant=translation_invariant)
    attention = model.blocks[0].attention
    n_patches = lattice.n_sites // 2**lattice.ndim
    h = torch.randn(64, n_patches, 16, dtype=torch.float64)
    factored = attention(h)  # gradients on: the factored form
    with torch.no_grad():
        fused = attention(h)
        log_psi_fused = model(random_spins(64, lattice.n_sites))
    torch.testing.assert_close(fused, factored.detach(), rtol=0, atol=1e-13)
    torch.testing.assert_close(
        log_psi_fused, model(random_spins(64, lattice.n_sites)).detach(), rtol=0, atol=1e-12
    )
    assert attention.kernel().shape == (n_patches * 16, n_patches * 16)


@pytest.mark.parametrize("lattice", [Lattice((12,)), Lattice((4, 4))], ids=["chain", "square"])
def test_fused_attention_follows_every_parameter_update(lattice):
    """The fused matrix is kept between forward passes without gradients (`DerivedCache`):
    a parameter update, a `load_state_dict` and a float32 copy refreshed from the model must
    each be seen by the next forward pass, which then equals the factored form."""
    model = ViT(lattice.shape, 2, 16, 4, 2)
    x = random_spins(32, lattice.n_sites)
    copy32 = NetworkCopy(torch.float32)
    theta = parameter_vector(model)
    generator = torch.Generator().manual_seed(1)
    moved = theta + 0.1 * torch.randn(theta.shape, dtype=theta.dtype, generator=generator)
    with torch.no_grad():
        before = model(x)
        copy32(model)(x)  # both caches filled
        set_parameter_vector(model, moved)
        after_step, after_step32 = model(x), copy32(model)(x)
    expected = model(x).detach()  # gradients on: the factored form, never cached
    assert (before - expected).abs().min() > 1e-3  # the update moved every log ψ
    torch.testing.assert_close(after_step, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(after_step32.to(expected.dtype), expected, rtol=0, atol=1e-4)
    other = ViT(lattice.shape, 2, 16, 4, 2)
    with torch.no_grad():
        model.load_state_dict(other.state_dict())
        after_load = model(x)
    torch.testing.assert_close(after_load, other(x).detach(), rtol=0, atol=1e-12)


def test_exact_gelu_is_torchs_gelu():
    """The float64 GELU spelled out for speed is ``F.gelu`` to rounding, tails included."""
    x = torch.cat([torch.linspace(-40, 40, 8001, dtype=torch.float64), torch.randn(1000) * 3])
    expected = torch.nn.functional.gelu(x)
    torch.testing.assert_close(exact_gelu(x), expected, rtol=1e-14, atol=1e-15)
    x32 = x.float()
    torch.testing.assert_close(exact_gelu(x32), torch.nn.functional.gelu(x32), rtol=0, atol=0)


@pytest.mark.parametrize("embedding", ["linear", "onehot"])
def test_forward_without_gradients_in_batches_equals_the_autograd_forward(embedding):
    """Without gradients a large batch goes through the network in passes of
    `_rows_per_pass` configurations, with the MLP's hidden layer updated in place; with
    gradients in one pass through ``nn.Sequential``. Same log ψ (and so the same energies)."""
    model = ViT(SQUARE.shape, 2, 8, 2, 2, True, embedding, (-1, 1), jastrow=True)
    rows = model._rows_per_pass(torch.zeros((), dtype=torch.float64))
    x = random_spins(2 * rows + 3, SQUARE.n_sites)
    with torch.no_grad():
        for parameter in model.parameters():  # away from the initial near-uniform state
            parameter.add_(0.3 * torch.randn_like(parameter))
        batched = model(x)
    with_autograd = model(x).detach()
    assert with_autograd.real.std() > 0.1
    torch.testing.assert_close(batched, with_autograd, rtol=0, atol=1e-12)
