"""Compiled chains of a bond rule (`vmc/compiled_sweep.py`): Metropolis steps unrolled into
one compiled graph make the eager chains' moves from the same random numbers."""

import pytest
import torch

from vitqs.models.chains import ChainNetwork
from vitqs.models.symmetrize import Symmetrized
from vitqs.models.vit import ViT
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.compiled_sweep import steps_per_graph
from vitqs.vmc.sampler import MetropolisSampler


def _randomised(network: torch.nn.Module, seed: int, scale: float) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in network.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device))
    return network


def _spins():
    """A 12-site chain at J2 ≠ 0 (moves on first and second neighbours) and a ViT with a
    Jastrow factor and a sign prior, averaged over two translations and spin inversion."""
    lattice = Lattice((12,))
    vit = ViT((12,), 2, 8, 2, 2, jastrow=True, sign_sites=[i % 2 for i in range(12)])
    model = Symmetrized(_randomised(vit, 4, 0.05), lattice.translations[:2], spin_flip=1)
    return Heisenberg(lattice, J2=0.5), model, {"sweep_size": 12}


def _bosons():
    """Bosons hopping on a 3×3 torus, one-site patches, one-hot."""
    lattice = Lattice((3, 3))
    vit = ViT((3, 3), 1, 8, 2, 1, embedding="onehot", local_states=(0, 1, 2, 3))
    return BoseHubbard(lattice, U=4.0, n_particles=9, n_max=3), _randomised(vit, 5, 0.1), {}


@pytest.mark.parametrize("system", [_spins, _bosons])
@pytest.mark.parametrize("machine_pow", [2.0, 1.25])
def test_compiled_sweeps_make_the_eager_chains(system, machine_pow):
    """float64 chains: the graph's log ψ agree with the eager pass to rounding, so the same
    seed makes the same moves and acceptance decisions, over two calls with a parameter
    update between them, and then for the final measurement's |ψ|² on the same graph."""
    hamiltonian, model, sweep = system()
    kwargs = {"n_samples": 48, "n_chains": 16, "n_discard": 2, "seed": 9, **sweep}
    kwargs.update(sector_table=False, machine_pow=machine_pow)
    bare = isinstance(model, Symmetrized)
    samplers = {
        compiled: MetropolisSampler(
            hamiltonian,
            **kwargs,
            chains=ChainNetwork(torch.float64, compile=compiled, bare=bare),
        )
        for compiled in (True, False)
    }
    for call in range(3):
        if call == 2:  # the final measurement's chains: |ψ|² of ψ itself
            samplers = {key: s.of_psi_squared() for key, s in samplers.items()}
        a, b = (samplers[key].sample(model) for key in (True, False))
        assert torch.equal(a.x, b.x)
        assert a.acceptance == b.acceptance and 0.0 < a.acceptance < 1.0
        # the kept samples' log ψ: the model's own pass (compiled) or the chains' (eager, ψ's
        # own network there), the same numbers from passes over other batches
        torch.testing.assert_close(a.log_psi, b.log_psi, rtol=1e-12, atol=1e-12)
        if a.log_importance is not None:
            torch.testing.assert_close(a.log_importance, b.log_importance, rtol=1e-12, atol=1e-12)
        _randomised(model, seed=6 + call, scale=0.05)
    compiled = samplers[True]
    assert compiled._sweeps is not None and not compiled._sweeps.failed  # the graph ran
    assert compiled.compile_seconds > 0.0 and samplers[False].compile_seconds == 0.0


def test_a_compiler_that_fails_leaves_eager_chains_and_says_why():
    """No working C++ compiler: inductor's error is named in a warning and the chains step
    eager, the same chains as without compiling."""
    from torch._inductor import config as inductor

    lattice = Lattice((10,))
    vit = _randomised(ViT((10,), 5, 4, 1, 1), 3, 0.1)
    kwargs = {"n_samples": 14, "n_chains": 7, "n_discard": 1, "seed": 2, "sector_table": False}
    compiled, eager = (
        MetropolisSampler(Heisenberg(lattice), **kwargs, chains=ChainNetwork(compile=flag))
        for flag in (True, False)
    )
    no_compiler = {"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}
    with inductor.patch(no_compiler):
        with pytest.warns(RuntimeWarning, match=r"compiled chains: torch.compile failed"):
            a = compiled.sample(vit)
    b = eager.sample(vit)
    assert compiled._sweeps.failed
    assert torch.equal(a.x, b.x) and a.acceptance == b.acceptance


@pytest.mark.parametrize(
    "sweep_size, layers, steps",
    [(16, 1, 16), (36, 1, 12), (100, 1, 10), (18, 1, 9), (17, 1, 1), (4, 1, 4), (1, 1, 1)]
    + [(16, 2, 8), (36, 4, 4), (100, 4, 4), (18, 2, 6), (36, 20, 1)],
)
def test_a_graph_unrolls_the_largest_divisor_of_the_sweep_up_to_16_layers(
    sweep_size, layers, steps
):
    assert steps_per_graph(sweep_size, layers) == steps
