"""Autograd gradients of Re and Im log ψ with respect to every parameter match finite differences.

Each parameter tensor is moved along a random direction ``u``: the reverse-mode gradient
contracted with ``u`` must equal the central difference ``[log ψ(θ + εu) − log ψ(θ − εu)]/2ε``,
per sample, for the real part and for the phase (wrapped, since Im log ψ is defined mod 2π).
This covers every parameter at two forward passes per tensor; the Jastrow is also checked
entry by entry with ``torch.autograd.gradcheck``.
"""

import math

import pytest
import torch
from helpers import random_bosons, random_spins

from vitqs.models import Jastrow, Symmetrized, ViT
from vitqs.physics.lattice import Lattice

CHAIN = Lattice((4,))
SQUARE = Lattice((2, 2))


def _perturbed(model):
    """Moves every parameter off its initial value so no gradient is trivially zero."""
    for p in model.parameters():
        p.data.add_(0.3 * torch.randn_like(p))
    return model


MODELS = {
    "vit-factored-ti": lambda: ViT(CHAIN.shape, 2, 4, 2, 1, jastrow=True),
    "vit-factored-2d": lambda: ViT(SQUARE.shape, 1, 4, 2, 1, translation_invariant=False),
    "vit-onehot": lambda: ViT(CHAIN.shape, 2, 4, 2, 1, False, "onehot", local_states=(0, 1, 2)),
    "jastrow": lambda: Jastrow(SQUARE.shape),
    "symmetrized": lambda: Symmetrized(
        ViT(CHAIN.shape, 2, 4, 1, 1, translation_invariant=False), CHAIN.translations, 1
    ),
}


EPS = 1e-5


def _wrap(phase):
    return torch.remainder(phase + math.pi, 2 * math.pi) - math.pi


def _central_difference(model, x, param, direction):
    with torch.no_grad():
        param.add_(EPS * direction)
        plus = model(x)
        param.sub_(2 * EPS * direction)
        minus = model(x)
        param.add_(EPS * direction)
    return (plus.real - minus.real) / (2 * EPS), _wrap(plus.imag - minus.imag) / (2 * EPS)


def _directional_gradient(model, x, param, direction):
    log_psi = model(x)
    rows = []
    for part in (log_psi.real, log_psi.imag):
        for value in part:
            (grad,) = torch.autograd.grad(value, param, retain_graph=True)
            rows.append((grad * direction).sum())
    return torch.stack(rows).reshape(2, len(x))


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_match_central_differences(name):
    model = _perturbed(MODELS[name]())
    x = random_bosons(2, 4, n_max=2) if name.endswith("onehot") else random_spins(2, 4)
    for param_name, param in model.named_parameters():
        direction = torch.randn_like(param)
        expected = torch.stack(_central_difference(model, x, param, direction))
        got = _directional_gradient(model, x, param, direction)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-8, msg=param_name)


def test_jastrow_gradcheck_entry_by_entry():
    model = _perturbed(Jastrow(SQUARE.shape, pbc=False))
    x = random_spins(3, 4)

    def log_j(v, g):
        return torch.func.functional_call(model, {"v": v, "g": g}, (x,))

    params = tuple(p.detach().clone().requires_grad_(True) for p in (model.v, model.g))
    assert torch.autograd.gradcheck(log_j, params)
