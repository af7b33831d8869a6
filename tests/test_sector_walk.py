"""Chains that walk a small sector by table look-up: the table is the moves' own, and the
chains are those of the per-proposal path."""

import itertools

import pytest
import torch
from helpers import ComplexRBM

from vitqs.models.symmetrize import Symmetrized
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.sampler import MetropolisSampler, _move_table
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
    moves = _move_table(rule, hamiltonian)
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
    moves = _move_table("exchange", hamiltonian)
    assert hamiltonian.hilbert.dimension * len(moves) > MAX_TABLE_ENTRIES
    assert sector_moves(hamiltonian.hilbert, moves, "exchange") is None


SETTINGS = {
    "float64": {},
    "float32 chains": {"dtype": torch.float32},
    "machine_pow 1.5": {"machine_pow": 1.5},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_table_walk_gives_the_chains_of_the_per_proposal_path(case, setting):
    """The same seed draws the same moves and the same uniforms in both paths: the kept
    configurations, their log ψ, the weights and the acceptance agree, over two calls."""
    make_hamiltonian, rule = CASES[case]
    hamiltonian = make_hamiltonian()
    model = ComplexRBM(hamiltonian.n_sites, n_hidden=4, scale=0.3, seed=2)
    kwargs = {"n_samples": 48, "n_chains": 16, "n_discard": 4, "rule": rule, "seed": 5}
    kwargs.update(SETTINGS[setting])
    walked = MetropolisSampler(hamiltonian, **kwargs)
    stepped = MetropolisSampler(hamiltonian, **kwargs, sector_table=False)
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
    kwargs = {"n_samples": 32, "n_chains": 16, "seed": 11, "bare_chains": True}
    a = MetropolisSampler(hamiltonian, **kwargs).sample(model)
    b = MetropolisSampler(hamiltonian, **kwargs, sector_table=False).sample(model)
    assert torch.equal(a.x, b.x)
    torch.testing.assert_close(a.log_importance, b.log_importance, rtol=0, atol=1e-12)


def test_the_table_is_walked_only_when_the_sector_has_fewer_states_than_the_proposals():
    hamiltonian = Heisenberg(Lattice((4, 4)))  # 12,870 states
    sampler = MetropolisSampler(hamiltonian, n_samples=64, n_chains=16, n_discard=4)
    assert not sampler._walks_sector(12_869)
    assert sampler._walks_sector(12_870)
    switched_off = MetropolisSampler(hamiltonian, n_samples=64, n_chains=16, sector_table=False)
    assert not switched_off._walks_sector(10**9)
    everywhere = MetropolisSampler(hamiltonian, n_samples=64, n_chains=16, rule="exchange_global")
    assert not everywhere._walks_sector(10**9)
