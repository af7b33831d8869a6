"""Log-derivatives, SR and minSR against dense formulas, and schedules."""

import numpy as np
import pytest
import torch
from helpers import ComplexRBM

from vitqs.models import ViT
from vitqs.models.symmetrize import Symmetrized
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.estimators import local_energy
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.optimizers import Schedule
from vitqs.vmc.sr import (
    _scaled_centred,
    energy_gradient,
    force,
    gram,
    log_derivatives,
    natural_gradient,
    parameter_vector,
    set_parameter_vector,
    solve_gram,
    solve_shifted,
)


def _configurations(hamiltonian, n=None):
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    return x if n is None else x[:n]


def test_log_derivatives_match_single_sample_autograd():
    hamiltonian = BoseHubbard(Lattice((4,)), n_particles=3)
    model = ComplexRBM(4, seed=1)
    x = _configurations(hamiltonian, 7)
    jac = log_derivatives(model, x)
    assert jac.shape == (7, parameter_vector(model).numel()) and jac.dtype == torch.complex128
    for s in range(len(x)):
        rows = []
        for part in (torch.real, torch.imag):
            model.zero_grad()
            part(model(x[s : s + 1])[0]).backward()
            rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        torch.testing.assert_close(jac[s], torch.complex(*rows), rtol=1e-12, atol=1e-12)


def test_log_derivatives_match_finite_differences():
    model = ComplexRBM(6, seed=2)
    x = _configurations(Heisenberg(Lattice((6,))), 5)
    jac = log_derivatives(model, x)
    theta = parameter_vector(model)
    step = 1e-6
    for k in range(0, theta.numel(), 5):
        shift = torch.zeros_like(theta)
        shift[k] = step
        with torch.no_grad():
            set_parameter_vector(model, theta + shift)
            plus = model(x)
            set_parameter_vector(model, theta - shift)
            minus = model(x)
        set_parameter_vector(model, theta)
        torch.testing.assert_close(jac[:, k], (plus - minus) / (2 * step), rtol=1e-6, atol=1e-8)


def test_chunked_log_derivatives_are_identical():
    model = ComplexRBM(6, seed=3)
    x = _configurations(Heisenberg(Lattice((6,))))
    torch.testing.assert_close(log_derivatives(model, x, chunk_size=4), log_derivatives(model, x))


def _random_problem(n_samples, n_params, seed, weighted):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    jac = torch.complex(randn(n_samples, n_params), randn(n_samples, n_params))
    e_loc = torch.complex(randn(n_samples), randn(n_samples))
    weights = torch.softmax(randn(n_samples), dim=0) if weighted else None
    return jac, e_loc, weights


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("n_samples", "n_params"), [(10, 60), (60, 10), (30, 30)])
def test_sr_and_minsr_give_the_same_update(n_samples, n_params, weighted):
    jac, e_loc, weights = _random_problem(n_samples, n_params, seed=n_samples, weighted=weighted)
    for diag_shift in (1e-2, 1e-1):
        kwargs = {"diag_shift": diag_shift, "weights": weights}
        sr = natural_gradient(jac, e_loc, method="sr", **kwargs)
        minsr = natural_gradient(jac, e_loc, method="minsr", **kwargs)
        assert float((sr - minsr).norm() / sr.norm()) < 1e-10


@pytest.mark.parametrize(
    ("n_samples", "n_params"),
    [(250, 700), (260, 700), (400, 500), (400, 520)],
    ids=["minsr_500_rows", "minsr_520_rows", "sr_500", "sr_520"],
)
def test_the_update_is_the_dense_one_on_both_sides_of_the_mixed_solves_threshold(
    n_samples, n_params
):
    # below sr.MIXED_SOLVE_FROM (512) rows of the Gram matrix the float64 Gram matrix is
    # solved, from it on a float32 one refined: the same update either way
    jac, e_loc, _ = _random_problem(n_samples, n_params, seed=n_params, weighted=False)
    X, e = _scaled_centred(jac, e_loc, None)
    diag_shift = 1e-2
    S = X.T @ X + diag_shift * torch.eye(n_params, dtype=torch.float64)
    expected = torch.linalg.solve(S, X.T @ e)
    got = natural_gradient(jac, e_loc, diag_shift=diag_shift)
    assert float((got - expected).norm() / expected.norm()) < 1e-10


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("n_samples", "n_params"), [(10, 60), (60, 10)])
def test_spring_solves_the_least_squares_problem_pulled_towards_the_last_direction(
    n_samples, n_params, weighted
):
    # SPRING's g minimises |X g − e|² + λ |g − μ g₋|²: the stacked least-squares problem
    # [X; √λ I] g = [e; √λ μ g₋], solved here by numpy's lstsq, is the reference
    jac, e_loc, weights = _random_problem(n_samples, n_params, seed=7, weighted=weighted)
    previous = torch.randn(
        n_params, generator=torch.Generator().manual_seed(8), dtype=torch.float64
    )
    momentum, diag_shift = 0.9, 5e-2
    X, e = (t.numpy() for t in _scaled_centred(jac, e_loc, weights))
    stacked = np.vstack([X, np.sqrt(diag_shift) * np.eye(n_params)])
    target = np.concatenate([e, np.sqrt(diag_shift) * momentum * previous.numpy()])
    expected = np.linalg.lstsq(stacked, target, rcond=None)[0]
    plain = natural_gradient(jac, e_loc, diag_shift=diag_shift, weights=weights).numpy()
    assert np.linalg.norm(plain - expected) > 1e-3 * np.linalg.norm(expected)  # μ matters
    for method in ("sr", "minsr"):
        g = natural_gradient(
            jac,
            e_loc,
            diag_shift=diag_shift,
            weights=weights,
            method=method,
            momentum=momentum,
            previous=previous,
        )
        assert np.linalg.norm(g.numpy() - expected) < 1e-10 * np.linalg.norm(expected)


def test_spring_without_a_last_direction_or_momentum_is_plain_sr():
    jac, e_loc, _ = _random_problem(12, 30, seed=3, weighted=False)
    plain = natural_gradient(jac, e_loc, diag_shift=1e-2)
    first = natural_gradient(jac, e_loc, diag_shift=1e-2, momentum=0.9, previous=None)
    off = natural_gradient(jac, e_loc, diag_shift=1e-2, momentum=0.0, previous=torch.ones(30))
    torch.testing.assert_close(first, plain, rtol=0, atol=0)
    torch.testing.assert_close(off, plain, rtol=0, atol=0)


def test_auto_method_picks_the_smaller_solve_and_agrees():
    jac, e_loc, _ = _random_problem(8, 40, seed=1, weighted=False)
    auto = natural_gradient(jac, e_loc, diag_shift=1e-2)
    torch.testing.assert_close(auto, natural_gradient(jac, e_loc, diag_shift=1e-2, method="sr"))


def test_mc_weights_are_one_over_n_samples():
    jac, e_loc, _ = _random_problem(12, 5, seed=2, weighted=False)
    uniform = torch.full((12,), 1 / 12, dtype=torch.float64)
    torch.testing.assert_close(
        natural_gradient(jac, e_loc, diag_shift=1e-3),
        natural_gradient(jac, e_loc, diag_shift=1e-3, weights=uniform),
    )


def _dense_qgt_and_force(model, hamiltonian):
    """S and F from the state vector ψ(θ) and its derivatives ∂_k ψ, by dense algebra."""
    x = _configurations(hamiltonian)
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]

    def psi_parts(vector):  # θ -> (Re ψ, Im ψ) over the sector
        pieces = torch.split(vector, [int(np.prod(shape)) for shape in shapes])
        params = {n: v.reshape(s) for n, v, s in zip(names, pieces, shapes, strict=True)}
        psi = torch.exp(torch.func.functional_call(model, params, (x,)))
        return torch.stack([psi.real, psi.imag])

    jac = torch.autograd.functional.jacobian(psi_parts, parameter_vector(model))  # (2, D, P)
    with torch.no_grad():
        psi = torch.exp(model(x)).numpy()
    dpsi = (jac[0] + 1j * jac[1]).numpy()  # (D, P)
    H = hamiltonian.to_dense()
    norm = np.vdot(psi, psi).real
    overlap = dpsi.conj().T @ psi / norm  # ⟨∂_k ψ|ψ⟩/⟨ψ|ψ⟩
    S = (dpsi.conj().T @ dpsi / norm - np.outer(overlap, overlap.conj())).real
    energy = np.vdot(psi, H @ psi) / norm
    F = (dpsi.conj().T @ H @ psi / norm - overlap * energy).real
    return S, F


@pytest.mark.parametrize(
    "make_hamiltonian",
    [lambda: Heisenberg(Lattice((6,)), J2=0.3), lambda: BoseHubbard(Lattice((4,)), n_particles=3)],
)
def test_qgt_and_force_from_the_exact_distribution_match_dense_formulas(make_hamiltonian):
    hamiltonian = make_hamiltonian()
    model = ComplexRBM(hamiltonian.n_sites, seed=5)
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    x, weights = samples.x[0], samples.weights[0]
    jac = log_derivatives(model, x)
    e_loc = local_energy(hamiltonian, model, x, samples.log_psi[0])
    S = _quantum_geometric_tensor(jac, weights)
    F = force(jac, e_loc, weights)
    S_dense, F_dense = _dense_qgt_and_force(model, hamiltonian)
    np.testing.assert_allclose(S.numpy(), S_dense, atol=1e-10)
    np.testing.assert_allclose(F.numpy(), F_dense, atol=1e-10)


def _quantum_geometric_tensor(jac, weights) -> torch.Tensor:
    """Returns ``S = XᵀX = Re⟨Ō† Ō⟩`` from the scaled, centred rows the solves use."""
    X, _ = _scaled_centred(jac, torch.zeros(jac.shape[0], device=jac.device), weights)
    return gram(X, rows=False)


def _positive_vit(hamiltonian, symmetrize=False):
    lattice = hamiltonian.lattice
    states = tuple(hamiltonian.hilbert.local_states)
    model = ViT(lattice.shape, 2, 8, 2, 1, local_states=states, jastrow=True, positive=True)
    for p in model.parameters():  # away from the initial values, so every derivative is alive
        p.data.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return Symmetrized(model, lattice.translations) if symmetrize else model


@pytest.mark.parametrize(
    "make_hamiltonian",
    [
        lambda: Heisenberg(Lattice((8,)), sign_rule=True),
        lambda: BoseHubbard(Lattice((6,)), U=3.3, n_particles=6),
    ],
)
@pytest.mark.parametrize("symmetrize", [False, True])
def test_a_positive_vit_has_real_log_derivatives_and_the_exact_qgt_and_force(
    make_hamiltonian, symmetrize
):
    hamiltonian = make_hamiltonian()
    model = _positive_vit(hamiltonian, symmetrize)
    assert model.positive
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    x, weights = samples.x[0], samples.weights[0]
    assert torch.all(samples.log_psi[0].imag == 0)
    jac = log_derivatives(model, x)
    assert jac.dtype == torch.float64 and jac.shape == (len(x), parameter_vector(model).numel())
    e_loc = local_energy(hamiltonian, model, x, samples.log_psi[0])
    S_dense, F_dense = _dense_qgt_and_force(model, hamiltonian)
    np.testing.assert_allclose(_quantum_geometric_tensor(jac, weights).numpy(), S_dense, atol=1e-10)
    np.testing.assert_allclose(force(jac, e_loc, weights).numpy(), F_dense, atol=1e-10)


@pytest.mark.parametrize("method", ["sr", "minsr"])
@pytest.mark.parametrize("weighted", [False, True])
def test_real_log_derivatives_give_the_update_of_zero_imaginary_parts(method, weighted):
    # the Im rows of X are zero for a positive ψ: leaving them out changes nothing, even
    # though the local energies keep an imaginary part
    jac, e_loc, weights = _random_problem(20, 50, seed=4, weighted=weighted)
    real = jac.real.contiguous()
    kwargs = {"diag_shift": 1e-2, "weights": weights, "method": method}
    torch.testing.assert_close(
        natural_gradient(real, e_loc, **kwargs),
        natural_gradient(torch.complex(real, torch.zeros_like(real)), e_loc, **kwargs),
        rtol=1e-10,
        atol=1e-12,
    )


def test_energy_gradient_is_twice_the_force_and_matches_autograd():
    hamiltonian = Heisenberg(Lattice((6,)), J2=0.2)
    model = ComplexRBM(6, seed=6)
    samples = ExactSampler(hamiltonian.hilbert).sample(model)
    x, weights = samples.x[0], samples.weights[0]
    jac = log_derivatives(model, x)
    gradient = energy_gradient(jac, local_energy(hamiltonian, model, x), weights)
    H = torch.as_tensor(hamiltonian.to_dense(), dtype=torch.complex128)
    psi = torch.exp(model(x))
    energy = (psi.conj() @ H @ psi).real / (psi.conj() @ psi).real
    energy.backward()
    autograd = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(gradient, autograd, rtol=1e-9, atol=1e-11)


def test_a_small_sr_step_lowers_the_exact_energy():
    hamiltonian = BoseHubbard(Lattice((4,)), U=2.0, n_particles=4)
    model = ComplexRBM(4, seed=7)
    sampler = ExactSampler(hamiltonian.hilbert)

    def exact_energy():
        samples = sampler.sample(model)
        e_loc = local_energy(hamiltonian, model, samples.x[0], samples.log_psi[0])
        return float((samples.weights[0] * e_loc).sum().real), samples, e_loc

    before, samples, e_loc = exact_energy()
    jac = log_derivatives(model, samples.x[0])
    update = natural_gradient(jac, e_loc, diag_shift=1e-3, weights=samples.weights[0])
    set_parameter_vector(model, parameter_vector(model) - 0.01 * update)
    assert exact_energy()[0] < before


def test_singular_matrix_falls_back_to_a_pseudo_inverse():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    A = X.T @ X  # rank 3
    b = A @ torch.randn(6, generator=gen, dtype=torch.float64)  # in the range of A
    solution = solve_shifted(A, b, diag_shift=0.0)
    assert torch.isfinite(solution).all()
    torch.testing.assert_close(solution, torch.linalg.pinv(A) @ b, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("rows", [True, False], ids=["minsr_kernel", "sr_matrix"])
@pytest.mark.parametrize("shape", [(300, 120), (120, 300)])
@pytest.mark.parametrize("decay", [0, 4])
def test_the_mixed_precision_solve_is_the_float64_one(rows, shape, decay):
    # a float32 Gram matrix refined with float64 residuals: the float64 solution, whether
    # refined (λ well above float32's resolution of A) or solved again in float64 (λ = 0,
    # tiny λ): the difference is the float64 solve's own rounding, ~cond · 1e-16
    gen = torch.Generator().manual_seed(decay)
    n, p = shape
    left = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))[0]
    right = torch.linalg.qr(torch.randn(p, p, generator=gen, dtype=torch.float64))[0]
    k = min(n, p)
    singular = torch.logspace(0, -decay, k, dtype=torch.float64)  # condition up to 1e8
    X = (left[:, :k] * singular) @ right[:, :k].T
    b = torch.randn(n if rows else p, generator=gen, dtype=torch.float64)
    A = X @ X.T if rows else X.T @ X
    # the smallest eigenvalue of A: 0 where A (n x n or p x p) has rank k below its size
    smallest = float(singular[-1]) ** 2 if len(A) == k else 0.0
    for diag_shift in (1e-1, 1e-3, 1e-5, 1e-9, 0.0):
        if smallest + diag_shift == 0:
            continue  # singular: a pseudo-inverse, compared in another test
        expected = solve_shifted(A, b, diag_shift)
        got = solve_gram(X, b, diag_shift, rows=rows)
        assert got.dtype == torch.float64
        error = float((got - expected).norm() / expected.norm())
        condition = (1 + diag_shift) / (smallest + diag_shift)
        assert error < 1e-12 + 1e-14 * condition, (diag_shift, condition, error)
    nan_row = X.clone()
    nan_row[2, 1] = float("nan")
    assert torch.isnan(solve_gram(nan_row, b, 1e-3, rows=rows)).all()


def test_unknown_method_raises():
    jac, e_loc, _ = _random_problem(4, 4, seed=0, weighted=False)
    with pytest.raises(ValueError, match="method=.cg. is not a natural gradient"):
        natural_gradient(jac, e_loc, diag_shift=1e-3, method="cg")


def test_schedules():
    assert Schedule(0.1)(50) == 0.1
    exponential = Schedule(1e-2, 1e-4, "exponential", n_steps=100)
    assert exponential(0) == pytest.approx(1e-2)
    assert exponential(50) == pytest.approx(1e-3)
    assert exponential(1000) == pytest.approx(1e-4)
    assert exponential(10, progress=0.5) == pytest.approx(1e-3)  # a budget half spent leads
    assert exponential(50, progress=0.1) == pytest.approx(1e-3)  # the steps lead
    assert exponential(0, progress=2.0) == pytest.approx(1e-4)  # never past the end
    cosine = Schedule(1.0, 0.0, "cosine", n_steps=10)
    assert [cosine(0), cosine(5), cosine(10)] == pytest.approx([1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="schedule kind"):
        Schedule(1.0, 0.1, "linear")
    with pytest.raises(ValueError, match="final"):
        Schedule(1.0, None, "cosine")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("method", ["sr", "minsr"])
def test_a_non_finite_jacobian_gives_a_nan_update_not_an_exception(bad, method):
    # the eigh fallback of the solve raised LinAlgError on a NaN S, past the VMC NaN guard
    gen = torch.Generator().manual_seed(0)
    jac = torch.randn(16, 6, dtype=torch.complex128, generator=gen)
    jac[3, 2] = bad
    e_loc = torch.randn(16, dtype=torch.complex128, generator=gen)
    update = natural_gradient(jac, e_loc, diag_shift=1e-3, method=method)
    assert update.shape == (6,) and torch.isnan(update).all()
    A = torch.eye(4, dtype=torch.float64)
    A[1, 1] = bad
    assert torch.isnan(solve_shifted(A, torch.ones(4, dtype=torch.float64), 0.0)).all()
