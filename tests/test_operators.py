"""Hamiltonians against matrices built independently from the operator definitions."""

from functools import reduce

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from tests.conftest import TINY
from vitqs.physics.hilbert import SpinHalf
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg

# ---- an independent reference: Kronecker products in the full space, then the sector ----


def _site_operator(local_op, site, n_sites):
    """Returns local_op on one site of the full space; site 0 is the least significant factor."""
    eye = sp.identity(local_op.shape[0], format="csr")
    factors = [sp.csr_matrix(local_op) if s == site else eye for s in reversed(range(n_sites))]
    return reduce(lambda a, b: sp.kron(a, b, format="csr"), factors)


def _full_space_index(states, local_values):
    """Returns the full-space basis index of configurations, local basis = local_values order."""
    lookup = {v: k for k, v in enumerate(local_values)}
    digits = np.vectorize(lookup.get)(np.asarray(states))
    return digits @ (len(local_values) ** np.arange(states.shape[1]))


def _dense_heisenberg(ham: Heisenberg):
    n = ham.n_sites
    # local basis (down, up): S^z = diag(-1/2, 1/2), S^+ = |up><down|
    sz = np.diag([-0.5, 0.5])
    s_plus = np.array([[0.0, 0.0], [1.0, 0.0]])
    s_minus = s_plus.T
    full = sp.csr_matrix((2**n, 2**n))
    bonds = [(ham.J1, b, True) for b in ham.lattice.bonds(1)]
    if ham.J2 != 0:
        bonds += [(ham.J2, b, False) for b in ham.lattice.bonds(2)]
    for coupling, (i, j), nearest in bonds:
        flip = -1.0 if (ham.sign_rule and nearest) else 1.0
        zz = _site_operator(sz, i, n) @ _site_operator(sz, j, n)
        pm = _site_operator(s_plus, i, n) @ _site_operator(s_minus, j, n)
        full = full + coupling * (zz + flip * 0.5 * (pm + pm.T))
    index = _full_space_index(ham.hilbert.all_states(), (-1, 1))
    return full[index][:, index].toarray()


def _dense_bose_hubbard(ham: BoseHubbard):
    n, n_max = ham.n_sites, ham.n_max
    b = np.diag(np.sqrt(np.arange(1, n_max + 1)), k=1)  # b|n> = sqrt(n)|n-1>
    num = b.T @ b
    full = sp.csr_matrix(((n_max + 1) ** n,) * 2)
    for i, j in ham.lattice.bonds(1):
        hop = _site_operator(b.T, i, n) @ _site_operator(b, j, n)
        full += -ham.J * (hop + hop.T)
    for i in range(n):
        ni = _site_operator(num, i, n)
        full += ham.U / 2 * ni @ (ni - sp.identity(ni.shape[0])) - ham.mu * ni
    index = _full_space_index(ham.hilbert.all_states(), tuple(range(n_max + 1)))
    return full[index][:, index].toarray()


def _dense_reference(ham):
    return _dense_heisenberg(ham) if isinstance(ham, Heisenberg) else _dense_bose_hubbard(ham)


# ---- the tests --------------------------------------------------------------------------


def test_sparse_matrix_equals_independent_dense_matrix(tiny_hamiltonian):
    sparse = tiny_hamiltonian.to_sparse()
    np.testing.assert_allclose(sparse.toarray(), _dense_reference(tiny_hamiltonian), atol=1e-13)


def test_hamiltonian_is_hermitian(tiny_hamiltonian):
    matrix = tiny_hamiltonian.to_sparse()
    assert abs(matrix - matrix.T).max() < 1e-14


def test_get_conn_padded_rows_reproduce_sparse_rows(tiny_hamiltonian, generator):
    ham = tiny_hamiltonian
    x = ham.hilbert.random_states(64, generator)
    x_conn, mels = ham.get_conn_padded(x)  # (B, K, N), (B, K)
    assert x_conn.shape == (64, ham.max_conn, ham.n_sites) and mels.shape == (64, ham.max_conn)
    # the contract: diagonal first, padding rows equal x with element zero
    assert torch.equal(x_conn[:, 0], x)
    padding = mels == 0
    padding[:, 0] = False
    assert torch.equal(x_conn[padding], x.unsqueeze(1).expand_as(x_conn)[padding])
    sparse = ham.to_sparse()
    rows = ham.hilbert.state_index(x)
    for b in range(len(x)):
        rebuilt = np.zeros(ham.hilbert.dimension)
        cols = ham.hilbert.state_index(x_conn[b])
        np.add.at(rebuilt, cols, mels[b].numpy())
        np.testing.assert_allclose(rebuilt, sparse[rows[b]].toarray().ravel(), atol=1e-13)


def test_get_conn_padded_keeps_float32(generator):
    ham = TINY["bh_chain5"]
    x_conn, mels = ham.get_conn_padded(ham.hilbert.random_states(4, generator).float())
    assert x_conn.dtype == mels.dtype == torch.float32


def _lowest(ham):
    return np.linalg.eigvalsh(ham.to_dense())[0]


def test_energy_scales_with_the_couplings():
    lattice = Lattice((3, 3))
    e = _lowest(Heisenberg(lattice, 1.0, 0.4, total_sz=0.5))
    assert _lowest(Heisenberg(lattice, 2.0, 0.8, total_sz=0.5)) == pytest.approx(2 * e, rel=1e-12)
    chain = Lattice((6,))
    e = _lowest(BoseHubbard(chain, J=1.0, U=3.0, mu=0.5, n_particles=6))
    doubled = _lowest(BoseHubbard(chain, J=2.0, U=6.0, mu=1.0, n_particles=6))
    assert doubled == pytest.approx(2 * e, rel=1e-12)


def test_sign_rule_keeps_the_spectrum_and_makes_the_ground_state_positive():
    lattice = Lattice((4, 2))
    plain = np.linalg.eigh(Heisenberg(lattice).to_dense())
    rotated = np.linalg.eigh(Heisenberg(lattice, sign_rule=True).to_dense())
    np.testing.assert_allclose(plain[0], rotated[0], atol=1e-12)
    ground = rotated[1][:, 0] * np.sign(rotated[1][0, 0])
    assert np.all(ground > 0)


def test_sign_rule_refused_on_frustrated_bonds():
    with pytest.raises(ValueError, match="sign_rule"):
        Heisenberg(Lattice((5,)), sign_rule=True, total_sz=0.5)


def test_mean_field_limits_of_bose_hubbard():
    # J = 0: the ground state spreads particles as evenly as possible (unit filling: E = 0)
    ham = BoseHubbard(Lattice((4,)), J=0.0, U=5.0, n_particles=6)
    assert _lowest(ham) == pytest.approx(5.0 / 2 * (2 * 2), abs=1e-12)  # two doubly occupied sites
    # U = 0: all bosons in the k = 0 orbital, E = -2 J N on a periodic chain
    ham = BoseHubbard(Lattice((5,)), J=1.0, U=0.0, n_particles=3)
    assert _lowest(ham) == pytest.approx(-2.0 * 3, abs=1e-10)


def test_heisenberg_diagonal_of_neel_state():
    ham = Heisenberg(Lattice((4, 4)), J1=1.0, J2=0.5)
    neel = torch.tensor(ham.lattice.sublattice_sign, dtype=torch.float64)[None]
    # every J1 bond antiparallel (-1/4), every J2 bond parallel (+1/4)
    expected = 32 * (-0.25) + 32 * 0.5 * 0.25
    assert ham.diagonal(neel).item() == pytest.approx(expected)


def test_hilbert_space_is_spin_half_for_heisenberg():
    assert isinstance(Heisenberg(Lattice((4,))).hilbert, SpinHalf)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_get_conn_padded_on_cuda_equals_cpu(tiny_hamiltonian, generator):
    x = tiny_hamiltonian.hilbert.random_states(32, generator)
    x_cpu, mels_cpu = tiny_hamiltonian.get_conn_padded(x)
    x_gpu, mels_gpu = tiny_hamiltonian.get_conn_padded(x.cuda())
    assert torch.equal(x_gpu.cpu(), x_cpu)
    torch.testing.assert_close(mels_gpu.cpu(), mels_cpu, rtol=0, atol=1e-14)
