"""The ViT's forward pass under torch.compile (`sampler.compile`): the same function as the
eager pass, to float64 rounding, and the same Metropolis chains; its log-derivatives under
torch.compile (`CompiledJacobian`): the eager routes' Jacobian to float64 rounding, in padded
chunks, and taken by a run whose chains are compiled."""

import copy

import pytest
import torch

from vitqs.models.chains import ChainNetwork
from vitqs.models.compiled import CompiledJacobian, compile_passes, compile_seconds
from vitqs.models.symmetrize import Symmetrized
from vitqs.models.vit import ViT
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg
from vitqs.vmc.driver import VMC
from vitqs.vmc.sampler import MetropolisSampler
from vitqs.vmc.sr import log_derivatives

NETWORKS = {
    # a chain: factored attention on displacements, a Jastrow factor, a sign prior
    "factored chain": (
        lambda: ViT(
            (12,),
            patch_size=2,
            d_model=8,
            heads=2,
            layers=2,
            jastrow=True,
            sign_sites=[i % 2 for i in range(12)],
        ),
        lambda g, n: 2.0 * torch.randint(0, 2, (n, 12), generator=g).double() - 1.0,
    ),
    # bosons on a square: one-hot patches, not translation invariant, ψ > 0
    "bosons": (
        lambda: ViT(
            (4, 4),
            patch_size=2,
            d_model=8,
            heads=2,
            layers=1,
            translation_invariant=False,
            embedding="onehot",
            local_states=(0, 1, 2),
            positive=True,
        ),
        lambda g, n: torch.randint(0, 3, (n, 16), generator=g).double(),
    ),
}


def _randomised(network: torch.nn.Module, seed: int, scale: float = 0.5) -> torch.nn.Module:
    """Adds random values of order ``scale`` to every parameter (the attention bias and the
    head's zero biases included), so that no term of the pass is trivially zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in network.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return network


@pytest.mark.parametrize("name", list(NETWORKS))
def test_compiled_pass_equals_the_eager_one_in_float64(name):
    make_network, configurations = NETWORKS[name]
    network = _randomised(make_network(), seed=1)
    (compiled,) = compile_passes(network)
    x = configurations(torch.Generator().manual_seed(2), 37)
    with torch.no_grad():
        for update in range(2):  # an in-place update is seen by the compiled graph
            log_psi = network(x)
            assert compiled.seconds is not None  # the compiled pass ran
            assert log_psi.dtype == torch.complex128
            torch.testing.assert_close(log_psi, network._log_psi(x), rtol=0, atol=1e-12)
            _randomised(network, seed=3 + update)
        one = network(x[:1])  # a batch of one runs eager
        torch.testing.assert_close(one, network._log_psi(x[:1]), rtol=0, atol=0)


def test_a_copy_of_a_compiled_network_runs_eager_until_compiled():
    network, _ = NETWORKS["factored chain"]
    original = network()
    compile_passes(original)
    assert copy.deepcopy(original).compiled is None
    assert compile_seconds(original) == 0.0  # nothing compiled before the first pass


def test_compile_needs_a_vit():
    with pytest.raises(ValueError, match="compiled chains compile a ViT's forward pass"):
        compile_passes(torch.nn.Linear(3, 1))


def test_compiled_chains_are_the_eager_chains():
    """float64 chains: the compiled and eager log ψ agree to rounding, so the same seed
    makes the same moves and the same acceptance decisions, over two calls and a parameter
    update between them; the samples' own log ψ come from the model, never compiled."""
    hamiltonian = Heisenberg(Lattice((12,)))
    bare = _randomised(NETWORKS["factored chain"][0](), seed=4, scale=0.05)
    model = Symmetrized(bare, Lattice((12,)).translations[:2], spin_flip=1)
    kwargs = {"n_samples": 64, "n_chains": 16, "n_discard": 3, "seed": 9}
    kwargs.update(sector_table=False)
    compiled = MetropolisSampler(
        hamiltonian, **kwargs, chains=ChainNetwork(torch.float64, compile=True)
    )
    eager = MetropolisSampler(hamiltonian, **kwargs, chains=ChainNetwork(torch.float64))
    for call in range(2):
        a, b = compiled.sample(model), eager.sample(model)
        assert torch.equal(a.x, b.x)
        assert a.acceptance == b.acceptance and 0.0 < a.acceptance < 1.0
        torch.testing.assert_close(a.log_psi, b.log_psi, rtol=0, atol=0)
        _randomised(model, seed=5 + call, scale=0.05)
    assert compiled.compile_seconds > 0.0 and eager.compile_seconds == 0.0
    assert model.model.compiled is None  # the model itself stays eager: a copy compiled


def test_a_compiler_that_fails_leaves_the_eager_pass_and_says_why():
    """A machine without a working C++ compiler: inductor's own error, named in a warning;
    the pass and every later one run eager."""
    from torch._inductor import config as inductor

    network = ViT((10,), patch_size=5, d_model=4, heads=1, layers=1)  # not compiled before
    compile_passes(network)
    x = 2.0 * torch.randint(0, 2, (9, 10), generator=torch.Generator().manual_seed(0)) - 1.0
    no_compiler = {"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}
    with inductor.patch(no_compiler), torch.no_grad():
        with pytest.warns(RuntimeWarning, match=r"torch.compile failed \(.*C\+\+ compiler"):
            log_psi = network(x)
        assert network.compiled is None
        torch.testing.assert_close(log_psi, network._log_psi(x.double()), rtol=0, atol=0)


# ---- the log-derivatives ---------------------------------------------------------------------


def test_a_compiler_that_fails_leaves_eager_log_derivatives_and_says_why():
    from torch._inductor import config as inductor

    network = _randomised(ViT((4,), 2, 2, 1, 1), 3)
    x = 2.0 * torch.randint(0, 2, (7, 4), generator=torch.Generator().manual_seed(4)) - 1.0
    compiled = CompiledJacobian(network)
    with inductor.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}):
        with pytest.warns(RuntimeWarning, match=r"compiled log-derivatives: torch.compile failed"):
            jac = log_derivatives(network, x, compiled=compiled)
    assert compiled.failed
    torch.testing.assert_close(jac, log_derivatives(network, x), rtol=0, atol=0)


def _vmc(model, compile_chains: bool) -> VMC:
    lattice = Lattice((8,))
    chains = ChainNetwork(compile=compile_chains)
    sampler = MetropolisSampler(
        Heisenberg(lattice), n_samples=16, n_chains=8, n_discard=1, seed=5, chains=chains
    )
    return VMC(Heisenberg(lattice), model, sampler, chunk_size=5)  # chunks 5, 5, 5, 1 padded


def test_a_run_with_compiled_chains_compiles_a_bare_vits_log_derivatives_alone():
    # complex log ψ, a Jastrow factor (a 0-d coupling) and a sign prior
    sites = [i % 2 for i in range(8)]
    vit = _randomised(ViT((8,), 2, 4, 1, 1, jastrow=True, sign_sites=sites), 6, 0.1)
    compiled, eager = _vmc(vit, True), _vmc(vit, False)
    samples = eager.sampler.sample(vit)
    e_loc = eager.sampler.local_energy(eager.hamiltonian, vit, samples)
    update, _ = compiled._update(samples, e_loc, 1e-3, {})
    assert compiled.compiles_log_derivatives and compiled.compile_seconds > 0
    assert not eager.compiles_log_derivatives and eager.compile_seconds == 0
    torch.testing.assert_close(update, eager._update(samples, e_loc, 1e-3, {})[0])
    x = samples.x.reshape(16, 8)
    _randomised(vit, 7)  # an in-place update is seen by the compiled graph
    jac = log_derivatives(vit, x, 5, compiled=compiled._jacobian)
    torch.testing.assert_close(jac, log_derivatives(vit, x, 5), rtol=0, atol=1e-12)
    # half the samples distinct or fewer (a Mott insulator's): the eager routes take the
    # distinct ones, not the graph padded to every sample
    assert compiled._compiled_jacobian(x[:8], 16) is None
    assert compiled._compiled_jacobian(x[:9], 16) is compiled._jacobian
    # a symmetry average is not a bare ViT; a positive ψ's derivatives take the rows route
    symmetrized = _vmc(Symmetrized(vit, [list(range(8)), [*range(1, 8), 0]]), True)
    assert symmetrized._compiled_jacobian(x, 16) is None
    assert _vmc(ViT((8,), 2, 4, 1, 1, positive=True), True)._compiled_jacobian(x, 16) is None
    with pytest.raises(ValueError, match="positive"):
        CompiledJacobian(ViT((8,), 2, 4, 1, 1, positive=True))
