"""log_cosh: the naive formula where it is safe, |Re z| − log 2 + i·(sign) Im z far out."""

import math

import numpy as np
import torch

from vitqs.models import log_cosh


def _wrap(phase):
    return (phase + np.pi) % (2 * np.pi) - np.pi


def test_matches_naive_formula_where_safe():
    rng = np.random.default_rng(0)
    z = rng.uniform(-20, 20, 500) + 1j * rng.uniform(-10, 10, 500)
    naive = np.log(np.cosh(z))
    ours = log_cosh(torch.as_tensor(z)).numpy()
    np.testing.assert_allclose(ours.real, naive.real, rtol=1e-12, atol=1e-12)
    # the imaginary part is a phase: equal modulo 2π
    np.testing.assert_allclose(_wrap(ours.imag - naive.imag), 0, atol=1e-11)


def test_real_input_matches_naive_formula():
    x = torch.linspace(-30, 30, 301, dtype=torch.float64)
    torch.testing.assert_close(log_cosh(x), torch.log(torch.cosh(x)), rtol=1e-13, atol=1e-13)


def test_finite_and_asymptotic_for_large_real_part():
    re = np.array([1e2, 1e3, 1e4, -1e2, -1e3, -1e4])
    im = np.array([0.3, -1.2, 2.5, 0.7, -0.1, 3.0])
    z = torch.as_tensor(re + 1j * im)
    out = log_cosh(z).numpy()
    assert np.all(np.isfinite(out.real)) and np.all(np.isfinite(out.imag))
    # cosh z ≈ exp(±z)/2 for Re z → ±∞: log cosh z ≈ |Re z| − log 2 + i sign(Re z) Im z
    np.testing.assert_allclose(out.real, np.abs(re) - math.log(2), rtol=1e-15)
    np.testing.assert_allclose(_wrap(out.imag - np.sign(re) * im), 0, atol=1e-12)


def test_gradient_is_tanh_and_finite_far_out():
    z = torch.tensor([0.3 + 0.2j, -2.0 + 1.0j, 5e3 - 1.0j], dtype=torch.complex128)
    z.requires_grad_(True)
    log_cosh(z).real.sum().backward()
    # d Re f / d(Re z, Im z) packed as conj(f'(z)) for holomorphic f, with f' = tanh
    torch.testing.assert_close(z.grad, torch.tanh(z.detach()).conj())
