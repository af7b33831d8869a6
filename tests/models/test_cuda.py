"""Models give the same numbers on a CUDA device as on the CPU (float64)."""

import pytest
import torch
from helpers import SQUARE, model_config, random_spins

from vitqs.models import build_model
from vitqs.physics.hilbert import SpinHalf

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(jastrow=True, symmetrize="translations", sector={"spin_flip": 1}),
        dict(translation_invariant=False, embedding="onehot"),
    ],
)
def test_cuda_equals_cpu(overrides):
    model = build_model(model_config(layers=2, **overrides), SQUARE, SpinHalf(16, 0))
    for p in model.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    x = random_spins(32, 16)
    on_cpu = model(x)
    on_cuda = model.to("cuda")(x.to("cuda")).cpu()
    torch.testing.assert_close(on_cuda, on_cpu, rtol=0, atol=1e-10)


def test_final_space_group_average_on_cuda_equals_cpu():
    # the averaging module's buffers (permutations, spin-flip weights) follow the model
    from vitqs.models import final_symmetrized

    config = model_config(layers=2, symmetrize="translations", sector={"spin_flip": 1})
    model = build_model(config, SQUARE, SpinHalf(16, 0))
    for p in model.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    x = random_spins(32, 16)
    on_cpu = final_symmetrized(model, "space_group", SQUARE)(x)
    on_cuda = final_symmetrized(model.to("cuda"), "space_group", SQUARE)(x.to("cuda")).cpu()
    torch.testing.assert_close(on_cuda, on_cpu, rtol=0, atol=1e-10)
