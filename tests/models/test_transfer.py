"""A ViT state carried to another lattice size: the tables extended, periodic images kept."""

import itertools

import numpy as np
import pytest
import torch
from helpers import random_spins

from vitqs.models import ViT
from vitqs.models.patching import PatchGrid
from vitqs.models.transfer import extend_relative_table, transfer_state
from vitqs.vmc.sr import parameter_vector, set_parameter_vector

# The head's LayerNorm sees the patch sum, n_patches times larger on the larger lattice: it is
# scale-invariant but for its eps = 1e-5, which moves log ψ by ~1e-7 relative here. With
# eps = 0 the two agree to rounding.
EPS_RTOL = 1e-6


def _assert_same_log_psi(model_l, model_s, x_l, x_s):
    with torch.no_grad():
        torch.testing.assert_close(model_l(x_l), model_s(x_s), rtol=EPS_RTOL, atol=0)
        model_l.head.norm.eps = model_s.head.norm.eps = 0.0
        torch.testing.assert_close(model_l(x_l), model_s(x_s), rtol=0, atol=1e-11)


def _trained_like(model: ViT, seed: int) -> ViT:
    """Returns ``model`` with every parameter moved off its initialisation (biases, norms and
    tables included), as training would."""
    theta = parameter_vector(model)
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(theta.shape, dtype=theta.dtype, generator=generator)
    set_parameter_vector(model, theta + 0.3 * noise)
    return model


@pytest.mark.parametrize(
    ("source", "target"),
    [((8,), (32,)), ((2,), (3,)), ((2, 2), (3, 3)), ((2, 2), (4, 4)), ((3, 2), (5, 4))],
)
def test_every_row_of_the_extended_attention_sums_as_before(source, target):
    grid_s, grid_t = PatchGrid(source, 1), PatchGrid(target, 1)
    table = torch.randn(4, grid_s.n_patches, dtype=torch.float64)
    extended = extend_relative_table(table, grid_s, grid_t)
    torch.testing.assert_close(extended.sum(dim=1), table.sum(dim=1), rtol=0, atol=1e-14)
    # the displacements of the old lattice keep their place: zero displacement first
    torch.testing.assert_close(extended[:, 0], table[:, 0], rtol=0, atol=0)


def test_each_displacement_goes_to_its_shortest_image_and_the_new_ones_get_zero():
    table = torch.arange(1.0, 9.0, dtype=torch.float64)[None]  # (1, 8): displacements 0..7
    extended = extend_relative_table(table, PatchGrid((8,), 1), PatchGrid((32,), 1))[0]
    # 1, 2, 3 ahead stay; 5, 6, 7 ahead are 3, 2, 1 behind; 4 ahead is also 4 behind: halves
    expected = torch.zeros(32, dtype=torch.float64)
    expected[[0, 1, 2, 3, 29, 30, 31]] = torch.tensor([1.0, 2, 3, 4, 6, 7, 8], dtype=torch.float64)
    expected[[4, 28]] = 5.0 / 2
    torch.testing.assert_close(extended, expected, rtol=0, atol=0)


def _tiled(x: torch.Tensor, small: tuple, large: tuple) -> torch.Tensor:
    """Returns configurations on ``large`` that repeat those on ``small`` (sites row-major)."""
    lx, ly = small[0], small[1] if len(small) == 2 else 1
    big_x, big_y = large[0], large[1] if len(large) == 2 else 1
    xs, ys = np.meshgrid(np.arange(big_x), np.arange(big_y))  # (y, x)
    source_site = (xs % lx) + lx * (ys % ly)
    return x[:, torch.as_tensor(source_site.reshape(-1))]


@pytest.mark.parametrize(
    ("small", "large"), [((16,), (64,)), ((4, 4), (8, 8)), ((4, 4), (8, 4))], ids=str
)
def test_a_tiled_configuration_has_the_small_lattice_s_log_psi(small, large):
    model_s = _trained_like(ViT(small, 2, 16, 4, 2), seed=1)
    model_l = ViT(large, 2, 16, 4, 2)
    state = transfer_state(model_s.state_dict(), model_l, model_s.grid)
    model_l.load_state_dict(state)
    x = random_spins(32, int(np.prod(small)))
    with torch.no_grad():  # not by accident: another configuration of the large lattice differs
        other = random_spins(32, int(np.prod(large)))
        assert (model_l(other) - model_s(x)).abs().max() > 1e-2
    _assert_same_log_psi(model_l, model_s, _tiled(x, small, large), x)


def test_a_4x4_state_on_6x6_keeps_log_psi_of_configurations_periodic_with_the_patch():
    # 6 is no multiple of 4: what both lattices hold are the configurations that repeat
    # every 2 sites along x and y (Néel, stripes, ...), all 16 of their 2×2 motifs
    model_s = _trained_like(ViT((4, 4), 2, 16, 4, 2), seed=2)
    model_l = ViT((6, 6), 2, 16, 4, 2)
    model_l.load_state_dict(transfer_state(model_s.state_dict(), model_l, model_s.grid))
    motifs = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=4)), dtype=torch.float64)
    x_s, x_l = _tiled(motifs, (2, 2), (4, 4)), _tiled(motifs, (2, 2), (6, 6))
    with torch.no_grad():
        assert model_s(x_s).real.std() > 1e-2  # the motifs have different amplitudes
    _assert_same_log_psi(model_l, model_s, x_l, x_s)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"translation_invariant": False}, "translation_invariant"),
        ({"jastrow": True}, "jastrow"),
    ],
)
def test_what_depends_on_the_lattice_does_not_carry_over(kwargs, message):
    small, large = ViT((8,), 2, 8, 2, 1, **kwargs), ViT((16,), 2, 8, 2, 1, **kwargs)
    with pytest.raises(ValueError, match=message):
        transfer_state(small.state_dict(), large, small.grid)


def test_patches_of_another_shape_are_refused():
    small, large = ViT((8,), 2, 8, 2, 1), ViT((16,), 4, 8, 2, 1)
    with pytest.raises(ValueError, match="patch_size"):
        transfer_state(small.state_dict(), large, small.grid)
