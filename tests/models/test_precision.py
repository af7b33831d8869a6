"""NetworkCopy: a model's copy in another dtype that follows the model's parameters."""

import pytest
import torch
from helpers import CHAIN, model_config, random_spins

from vitqs.models import build_model
from vitqs.models.precision import NetworkCopy
from vitqs.physics.hilbert import SpinHalf
from vitqs.vmc.sr import log_derivatives


def _vit():
    torch.manual_seed(0)
    return build_model(model_config(), CHAIN, SpinHalf(8, 0)).to(torch.float64)


@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_the_model_itself_when_no_other_dtype_is_asked_for(dtype):
    model = _vit()
    assert NetworkCopy(dtype)(model) is model


def test_a_float32_copy_follows_every_parameter_change():
    model, copy = _vit(), NetworkCopy(torch.float32)
    x = random_spins(16, 8, seed=1)
    network = copy(model)
    assert network is not model and next(network.parameters()).dtype == torch.float32
    with torch.no_grad():
        for p in model.parameters():  # an optimiser step
            p.add_(0.05 * torch.randn_like(p))
        before = network(x)
        assert copy(model) is network  # made once, refreshed in place
        after = network(x)
        torch.testing.assert_close(after.to(torch.complex128), model(x), rtol=1e-5, atol=1e-5)
    assert (after - before).abs().max() > 1e-3
    assert all(p.dtype == torch.float64 for p in model.parameters())


def test_another_model_gets_a_copy_of_its_own():
    copy = NetworkCopy(torch.float32)
    first, second = _vit(), _vit()
    assert copy(first) is not copy(second)


def test_an_unknown_dtype_names_the_config_key():
    with pytest.raises(ValueError, match=r"sampler.local_energy_dtype=torch.float16 is not one"):
        NetworkCopy(torch.float16, key="sampler.local_energy_dtype")


@pytest.mark.parametrize("route", ["rows", "per_sample"])
def test_a_float32_copy_differentiates_log_psi_to_float32_rounding(route):
    # a float32 copy's O_k(x), in the float64 model's columns: both routes read a copy
    model, x = _vit(), random_spins(32, 8, seed=2)
    exact = log_derivatives(model, x, route=route)
    rounded = log_derivatives(NetworkCopy(torch.float32)(model), x, route=route)
    assert rounded.dtype == torch.complex128 and rounded.shape == exact.shape
    assert not torch.equal(rounded, exact)
    assert (rounded - exact).abs().max() < 1e-5 * exact.abs().max()  # measured 3e-7, 4e-7
