"""The rows route of the Jacobian (one batched forward, one backward pass per part of log ψ,
per-sample products at each layer) equals each sample's own gradient, for every model it
covers; models it does not cover are refused by that route and go the per-sample way."""

import numpy as np
import pytest
import torch
from helpers import random_bosons, random_spins

from vitqs.models import Jastrow, Symmetrized, ViT, row_gradients
from vitqs.models.row_gradients import covers
from vitqs.models.symmetrize import space_group_average
from vitqs.physics.lattice import Lattice
from vitqs.vmc.sr import log_derivatives

CHAIN = Lattice((6,))
SQUARE = Lattice((4, 2))
KAGOME = Lattice((2, 1), kind="kagome")


def _perturbed(model):
    """Moves every parameter off its initial value so no gradient is trivially zero (biases
    start at 0, which would hide a wrong bias column)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _one_sample_at_a_time(model, x) -> torch.Tensor:
    """The reference: ``autograd.grad`` of each sample's Re and Im log ψ on its own."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for x_one in x:
        log_psi = model(x_one[None])[0]
        parts = []
        for part in (log_psi.real, log_psi.imag):
            grads = torch.autograd.grad(part, params, retain_graph=True, allow_unused=True)
            flat = [
                torch.zeros(p.numel(), dtype=torch.float64) if g is None else g.reshape(-1)
                for p, g in zip(params, grads, strict=True)
            ]
            parts.append(torch.cat(flat))
        rows.append(torch.complex(*parts))
    return torch.stack(rows)


# name -> (model, configurations): spins on 6 or 8 sites, or occupations 0..2
COVERED = {
    "vit-factored-ti": (lambda: ViT(CHAIN.shape, 2, 4, 2, 2), 6),
    "vit-factored-2d-patches": (lambda: ViT(SQUARE.shape, 2, 4, 2, 1), 8),
    "vit-not-ti": (lambda: ViT(SQUARE.shape, 1, 4, 2, 1, translation_invariant=False), 8),
    "vit-jastrow-onehot": (
        lambda: ViT(
            CHAIN.shape, 2, 4, 2, 1, embedding="onehot", local_states=(0, 1, 2), jastrow=True
        ),
        "bosons",
    ),
    "vit-pair-weights": (lambda: ViT(CHAIN.shape, 2, 4, 2, 1, translation_invariant=False), 6),
    "vit-sign-prior": (lambda: ViT(SQUARE.shape, 2, 4, 2, 1, sign_sites=np.arange(8) % 2 == 1), 8),
    "vit-kagome-basis": (lambda: ViT(KAGOME.shape, 1, 4, 2, 1, n_basis=3), 6),
    "symmetrized-momentum-odd": (
        lambda: Symmetrized(
            ViT(CHAIN.shape, 2, 4, 2, 1, translation_invariant=False),
            CHAIN.translations,
            spin_flip=-1,
            phases=CHAIN.translation_phases([1]),
            momentum=[1],
        ),
        6,
    ),
    "space-group-nested": (
        lambda: Symmetrized(
            space_group_average(ViT(SQUARE.shape, 2, 4, 2, 1), SQUARE),
            np.arange(8)[None, :],
            spin_flip=1,
        ),
        8,
    ),
}


@pytest.mark.parametrize("name", list(COVERED))
@pytest.mark.parametrize("stacked", [True, False], ids=["parts stacked", "one pass per part"])
def test_rows_route_equals_each_sample_own_gradient(name, stacked, monkeypatch):
    # a small batch differentiates Re and Im log ψ in one pass over the batch written
    # twice, a large one in a pass each: both must be each sample's gradient
    monkeypatch.setattr(row_gradients, "STACKED_PARTS_MAX_SITES", 10**9 if stacked else 0)
    factory, sites = COVERED[name]
    model = _perturbed(factory())
    x = random_bosons(5, 6, n_max=2) if sites == "bosons" else random_spins(5, sites)
    assert covers(model)
    expected = _one_sample_at_a_time(model, x)
    rows = log_derivatives(model, x, route="rows")
    per_sample = log_derivatives(model, x, route="per_sample")
    torch.testing.assert_close(rows, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(per_sample, expected, rtol=1e-12, atol=1e-12)


def test_rows_route_of_a_positive_head_is_real():
    model = _perturbed(ViT(CHAIN.shape, 2, 4, 2, 1, positive=True))
    x = random_spins(5, 6)
    rows = log_derivatives(model, x, route="rows")
    assert rows.dtype == torch.float64
    torch.testing.assert_close(rows, _one_sample_at_a_time(model, x).real, rtol=1e-12, atol=1e-12)


def test_rows_route_in_chunks_equals_one_call():
    model = _perturbed(ViT(CHAIN.shape, 2, 4, 2, 1))
    x = random_spins(7, 6)
    whole = log_derivatives(model, x, route="rows")
    torch.testing.assert_close(log_derivatives(model, x, chunk_size=3, route="rows"), whole)


NOT_COVERED = {
    "jastrow-alone": lambda: Jastrow(CHAIN.shape),
}


@pytest.mark.parametrize("name", list(NOT_COVERED))
def test_a_model_the_rows_route_does_not_cover_goes_sample_by_sample(name):
    model = _perturbed(NOT_COVERED[name]())
    x = random_spins(4, 6)
    assert not covers(model)
    with pytest.raises(ValueError, match="rows route does not cover"):
        log_derivatives(model, x, route="rows")
    expected = _one_sample_at_a_time(model, x)
    got = log_derivatives(model, x)
    if not got.is_complex():  # a Jastrow factor alone is positive: real log-derivatives
        expected = expected.real
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_a_frozen_parameter_has_no_column():
    model = _perturbed(ViT(CHAIN.shape, 2, 4, 2, 1))
    model.head.bias_im.requires_grad_(False)
    x = random_spins(4, 6)
    rows = log_derivatives(model, x, route="rows")
    torch.testing.assert_close(rows, _one_sample_at_a_time(model, x), rtol=1e-12, atol=1e-12)


def test_an_unknown_route_is_refused():
    with pytest.raises(ValueError, match="route='fast'"):
        log_derivatives(ViT(CHAIN.shape, 2, 4, 2, 1), random_spins(2, 6), route="fast")
