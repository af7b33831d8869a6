"""Shared fixtures: small lattices and Hamiltonians, an isolated ED cache, torch's thread count
restored after every test; helpers live in ``helpers.py``."""

import numpy as np
import pytest
import torch

from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg


@pytest.fixture(autouse=True)
def _isolated_ed_cache(tmp_path_factory, monkeypatch):
    # every test sees an empty ED cache of its own, never the user's ~/.cache
    monkeypatch.setenv("VITQS_CACHE_DIR", str(tmp_path_factory.mktemp("ed_cache")))


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    # configs with threads: 1 set torch's global thread count; give the next test its own
    n_threads = torch.get_num_threads()
    yield
    torch.set_num_threads(n_threads)


@pytest.fixture
def single_thread():
    """Runs a test on one intra-op thread: tiny batched ops on a shared 2-core machine are
    many times faster without OpenMP hand-offs (LayerNorm opens a region at any size and
    waits ~10 ms for a second thread)."""
    torch.set_num_threads(1)


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def tiny_hamiltonians():
    """Small systems covering spins and bosons, PBC and OBC, J2 != 0, n_max < N."""
    return {
        "chain6_pbc": Heisenberg(Lattice((6,)), J1=1.0),
        "chain7_obc_sz": Heisenberg(Lattice((7,), pbc=False), J1=0.8, total_sz=0.5),
        "chain8_j2": Heisenberg(Lattice((8,)), J1=1.0, J2=0.4),
        "chain8_sign": Heisenberg(Lattice((8,)), J1=1.0, J2=0.3, sign_rule=True),
        "square3x2_obc_j2": Heisenberg(Lattice((3, 2), pbc=False), J1=1.0, J2=0.7, total_sz=1),
        "square2x4_j2": Heisenberg(Lattice((2, 4)), J1=1.1, J2=0.5),
        "square3x3_j2": Heisenberg(Lattice((3, 3)), J1=1.0, J2=0.5, total_sz=-0.5),
        "bh_chain5": BoseHubbard(Lattice((5,)), J=1.0, U=3.3, mu=0.2, n_particles=5),
        "bh_chain5_obc_nmax2": BoseHubbard(
            Lattice((5,), pbc=False), J=0.7, U=2.0, n_particles=4, n_max=2
        ),
        "bh_square2x3": BoseHubbard(
            Lattice((2, 3)), J=1.0, U=10.0, mu=-0.5, n_particles=4, n_max=3
        ),
        "bh_square3x2_obc": BoseHubbard(Lattice((3, 2), pbc=False), J=1.0, U=1.0, n_particles=6),
    }


TINY = tiny_hamiltonians()


@pytest.fixture(params=sorted(TINY))
def tiny_hamiltonian(request):
    return TINY[request.param]
