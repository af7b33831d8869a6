"""Chains that walk a small sector by table look-up: the table is the moves' own, and the
chains are those of the per-proposal path."""

import itertools

import pytest
import torch
from helpers import ComplexRBM

from vitqs.models.chains import ChainNetwork
from vitqs.models.symmetrize import Symmetrized
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.estimators import local_energy
from vitqs.vmc.rules import proposal_rule
from vitqs.vmc.sampler import MetropolisSampler
from vitqs.vmc.sector_walk import MAX_TABLE_ENTRIES, sector_moves

CASES = {
    "exchange J1-J2": (lambda: Heisenberg(Lattice((3, 2)), J2=0.5), "exchange"),
    "exchange open": (lambda: Heisenberg(Lattice((6,), pbc=False)), "exchange"),
    "hop": (lambda: BoseHubbard(Lattice((4,)), n_particles=4), "hop"),
    "hop cutoff": (lambda: BoseHubbard(Lattice((4,)), n_particles=4, n_max=2), "hop"),
}


def _moved_by_hand(state: list[int], i: int, j: int, rule: str, n_max) -> list[int] | None:
    """Returns the state move (i, j) makes, written out site by site; None if invalid."""
    new = list(state)
    if rule == "exchange":
        if state[i] == state[j]:
            return None
        new[i], new[j] = state[j], state[i]
    else:
        if state[i] == 0 or state[j] >= n_max:
            return None
        new[i], new[j] = state[i] - 1, state[j] + 1
    return new


@pytest.mark.parametrize("case", list(CASES))
def test_move_table_leads_where_each_move_leads(case):
    make_hamiltonian, rule = CASES[case]
    hamiltonian = make_hamiltonian()
    hilbert = hamiltonian.hilbert
    moves = proposal_rule(hamiltonian).moves
    table = sector_moves(hilbert, moves, rule)
    states = [list(map(int, s)) for s in hilbert.all_states()]
    position = {tuple(s): k for k, s in enumerate(states)}
    n_invalid = 0
    for (s, state), (m, (i, j)) in itertools.product(enumerate(states), enumerate(moves)):
        moved = _moved_by_hand(state, i, j, rule, getattr(hilbert, "n_max", None))
        expected = -1 if moved is None else position[tuple(moved)]
        assert int(table.targets[s, m]) == expected, (state, (i, j))
        n_invalid += moved is None
    assert 0 < n_invalid < table.targets.numel()
    assert torch.equal(table.states, torch.as_tensor(hilbert.all_states(), dtype=torch.float64))


def test_no_table_for_a_sector_too_large():
    hamiltonian = Heisenberg(Lattice((6, 6)), J2=0.5)  # 9.1e9 states
    moves = proposal_rule(hamiltonian).moves
    assert hamiltonian.hilbert.dimension * len(moves) > MAX_TABLE_ENTRIES
    assert sector_moves(hamiltonian.hilbert, moves, "exchange") is None


SETTINGS = {  # keyword arguments, made anew for each sampler
    "float64": dict,
    "float32 chains": lambda: {"chains": ChainNetwork(torch.float32)},
    "machine_pow 1.5": lambda: {"machine_pow": 1.5},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_table_walk_gives_the_chains_of_the_per_proposal_path(case, setting):
    """The same seed draws the same moves and the same uniforms in both paths: the kept
    configurations, their log ψ, the weights and the acceptance agree, over two calls."""
    make_hamiltonian, rule = CASES[case]
    hamiltonian = make_hamiltonian()
    model = ComplexRBM(hamiltonian.n_sites, n_hidden=4, scale=0.3, seed=2)
    kwargs = {"n_samples": 48, "n_chains": 16, "n_discard": 4, "seed": 5}
    walked = MetropolisSampler(hamiltonian, **kwargs, **SETTINGS[setting]())
    stepped = MetropolisSampler(hamiltonian, **kwargs, **SETTINGS[setting](), sector_table=False)
    assert walked._walks_sector(16 * hamiltonian.n_sites * 7)
    for _ in range(2):
        a, b = walked.sample(model), stepped.sample(model)
        assert torch.equal(a.x, b.x)
        assert a.acceptance == b.acceptance and 0.0 < a.acceptance < 1.0
        torch.testing.assert_close(a.log_psi, b.log_psi, rtol=0, atol=1e-12)
        if b.log_importance is not None:
            torch.testing.assert_close(a.log_importance, b.log_importance, rtol=0, atol=1e-12)
    torch.testing.assert_close(walked.state_dict(), stepped.state_dict(), rtol=0, atol=0)


def test_bare_chains_walk_the_sector_of_the_bare_network():
    hamiltonian = Heisenberg(Lattice((6,)))
    bare = ComplexRBM(6, n_hidden=6, scale=0.15, seed=5)
    model = Symmetrized(bare, Lattice((6,)).translations[:3], spin_flip=1)
    kwargs = {"n_samples": 32, "n_chains": 16, "seed": 11}
    a = MetropolisSampler(hamiltonian, **kwargs, chains=ChainNetwork(bare=True)).sample(model)
    b = MetropolisSampler(
        hamiltonian, **kwargs, chains=ChainNetwork(bare=True), sector_table=False
    ).sample(model)
    assert torch.equal(a.x, b.x)
    torch.testing.assert_close(a.log_importance, b.log_importance, rtol=0, atol=1e-12)


def test_the_table_is_walked_only_when_the_sector_has_fewer_states_than_the_proposals():
    hamiltonian = Heisenberg(Lattice((4, 4)))  # 12,870 states
    sampler = MetropolisSampler(hamiltonian, n_samples=64, n_chains=16, n_discard=4)
    assert not sampler._walks_sector(12_869)
    assert sampler._walks_sector(12_870)
    switched_off = MetropolisSampler(hamiltonian, n_samples=64, n_chains=16, sector_table=False)
    assert not switched_off._walks_sector(10**9)


class _NoForwardPass(torch.nn.Module):
    """A network the tabled local energies must not call."""

    def forward(self, x):
        raise AssertionError("a forward pass where every amplitude was tabled")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("machine_pow", [2.0, 1.5])
def test_local_energies_from_the_table_are_those_of_forward_passes(case, machine_pow):
    """A sector no larger than the kept samples is tabled by the model itself: the local
    energies come from H's elements and the table, equal to the forward-pass route's."""
    make_hamiltonian, rule = CASES[case]
    hamiltonian = make_hamiltonian()
    model = ComplexRBM(hamiltonian.n_sites, n_hidden=4, scale=0.3, seed=2)
    n_samples = 48  # ≥ every case's sector (19–35 states)
    assert hamiltonian.hilbert.dimension <= n_samples
    sampler = MetropolisSampler(
        hamiltonian, n_samples=n_samples, n_chains=16, seed=5, machine_pow=machine_pow
    )
    for samples in (sampler.sample(model), sampler.draw(model, 3 * n_samples)):
        assert samples.sector_log_psi is not None
        tabled = sampler.local_energy(hamiltonian, _NoForwardPass(), samples)
        forward = local_energy(hamiltonian, model, samples.x, samples.log_psi)
        assert tabled.shape == samples.log_psi.shape
        torch.testing.assert_close(tabled, forward, rtol=0, atol=1e-12 * float(forward.abs().max()))


def test_tabled_local_energies_follow_the_hamiltonian_of_the_step():
    """An annealed H shares the sampler's sector: its own elements are used, not the first's."""
    hamiltonian = Heisenberg(Lattice((3, 2)), J2=0.5)
    model = ComplexRBM(6, n_hidden=4, scale=0.3, seed=4)
    sampler = MetropolisSampler(hamiltonian, n_samples=32, n_chains=16, seed=1)
    samples = sampler.sample(model)
    for J2 in (0.5, 0.0, 0.8):
        step = Heisenberg(Lattice((3, 2)), J2=J2)
        step.hilbert = hamiltonian.hilbert
        tabled = sampler.local_energy(step, _NoForwardPass(), samples)
        forward = local_energy(step, model, samples.x, samples.log_psi)
        torch.testing.assert_close(tabled, forward, rtol=0, atol=1e-12)
    other_sector = Heisenberg(Lattice((3, 2)), J2=0.5)  # its own Hilbert space: no table
    forward = local_energy(other_sector, model, samples.x, samples.log_psi)
    torch.testing.assert_close(sampler.local_energy(other_sector, model, samples), forward)


def test_no_local_energies_from_a_table_the_model_did_not_make():
    """The float32 copy tables a sector larger than the kept samples, the bare network that of
    bare chains: neither is the model's ψ, so the local energies take forward passes."""
    hamiltonian = Heisenberg(Lattice((6,)))  # 20 states
    model = ComplexRBM(6, n_hidden=4, scale=0.3, seed=2)
    chains = ChainNetwork(torch.float32)
    copy = MetropolisSampler(hamiltonian, n_samples=16, n_chains=16, chains=chains)
    assert copy._walks_sector(16 * 6 * 5) and copy.sample(model).sector_log_psi is None
    bare = ComplexRBM(6, n_hidden=6, scale=0.15, seed=5)
    symmetrized = Symmetrized(bare, Lattice((6,)).translations[:3], spin_flip=1)
    chains = MetropolisSampler(
        hamiltonian, n_samples=32, n_chains=16, chains=ChainNetwork(bare=True)
    )
    assert chains.sample(symmetrized).sector_log_psi is None
