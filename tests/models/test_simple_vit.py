"""SimpleViT baseline: contract, real log-amplitude, size."""

import pytest
import torch
from helpers import CHAIN, SQUARE, random_spins

from vitqs.models import SimpleViT


@pytest.mark.parametrize("lattice", [CHAIN, SQUARE], ids=["chain", "square"])
def test_real_log_amplitude_per_sample(lattice):
    model = SimpleViT(lattice.shape, 2, 8, 2)
    x = random_spins(5, lattice.n_sites)
    log_psi = model(x)
    assert log_psi.shape == (5,) and log_psi.dtype == torch.complex128
    assert torch.all(log_psi.imag == 0)
    torch.testing.assert_close(log_psi[2:3], model(x[2:3]), rtol=0, atol=1e-13)
    assert model.to(torch.float32)(x).dtype == torch.complex64


def test_parameter_count():
    d, patch_len = 8, 4
    model = SimpleViT((4, 4), 2, d, 2)
    embedding = patch_len * d + d
    attention = 3 * d * d + d * d + d  # QKV without bias, output projection
    assert sum(p.numel() for p in model.parameters()) == embedding + attention


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match=r"model.heads=3 must divide model.d_model=8"):
        SimpleViT((4, 4), 2, 8, 3)
