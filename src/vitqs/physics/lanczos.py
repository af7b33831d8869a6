"""Lanczos on a sector's sparse matrix: the lowest Ritz value of a short run, and the levels a
state has weight in.

`lowest_ritz_value` bounds the ground-state energy from above after a few steps from a random
start: the ED cache checks with it that an entry is the lowest level (an excited eigenvector
passes the eigenvector check). `spectral_weights` runs from a given state with full
reorthogonalisation and returns its weight in each level it resolves (`vitqs report`'s
``by_level``). Both take any matrix with ``@`` (scipy's sparse matrices, `Hamiltonian.to_sparse`).
"""

from __future__ import annotations

import numpy as np


def lowest_ritz_value(matrix, n_steps: int, seed: int = 1) -> float:
    """Returns the lowest eigenvalue of the tridiagonal matrix of ``n_steps`` Lanczos steps
    on ``matrix`` from a random start (no reorthogonalisation: a short run needs none for
    its lowest value). Stops early where the Krylov space closes."""
    dim = matrix.shape[0]
    vector = np.random.default_rng(seed).normal(size=dim)
    vector /= np.linalg.norm(vector)
    previous, beta = np.zeros(dim), 0.0
    alphas, betas = [], []
    for _ in range(min(n_steps, dim)):
        w = matrix @ vector - beta * previous
        alpha = float(np.vdot(vector, w).real)
        w = w - alpha * vector
        alphas.append(alpha)
        beta = float(np.linalg.norm(w))
        if beta < 1e-12:
            break
        betas.append(beta)
        previous, vector = vector, w / beta
    tridiagonal = np.diag(alphas) + np.diag(betas[: len(alphas) - 1], 1)
    tridiagonal += np.diag(betas[: len(alphas) - 1], -1)
    return float(np.linalg.eigvalsh(tridiagonal)[0])


def spectral_weights(matrix, psi: np.ndarray, max_steps: int = 200, max_bytes: float = 2e9):
    """Returns ``[(E, w, v)]``, ascending in ``E``: the levels of the Hermitian ``matrix`` that
    the normalised ``psi`` has weight in, ``w = |P_E ψ|²``, and ``v = P_E ψ / |P_E ψ|``, for
    each level that Lanczos from ``psi`` resolved (residual below 1e-8 of the spectrum's
    scale; weights below 1e-6 dropped).

    Lanczos with full reorthogonalisation, at most ``max_steps`` steps and ``max_bytes`` of
    Krylov vectors: the Ritz values are the levels ψ sees and ``|s_j[0]|²`` their weights.
    """
    n = len(psi)
    steps = int(min(max_steps, n, max(2, max_bytes // (16 * n))))
    basis = np.zeros((steps, n), dtype=np.complex128)
    alpha, beta = np.zeros(steps), np.zeros(steps)
    basis[0] = psi / np.linalg.norm(psi)
    for j in range(steps):
        w = matrix @ basis[j]
        alpha[j] = np.vdot(basis[j], w).real
        w -= basis[: j + 1].T @ (basis[: j + 1].conj() @ w)  # full reorthogonalisation
        w -= basis[: j + 1].T @ (basis[: j + 1].conj() @ w)  # twice is enough
        beta[j] = np.linalg.norm(w)
        # ψ's Krylov space is exhausted: the rest of w is rounding noise, whose copies of
        # the levels already found would show as spurious levels
        if j + 1 == steps or beta[j] < 1e-8 * max(1.0, np.abs(alpha[: j + 1]).max()):
            steps = j + 1
            break
        basis[j + 1] = w / beta[j]
    tridiagonal = (
        np.diag(alpha[:steps]) + np.diag(beta[: steps - 1], 1) + np.diag(beta[: steps - 1], -1)
    )
    ritz, vectors = np.linalg.eigh(tridiagonal)
    scale = max(1.0, np.abs(ritz).max())
    converged = np.abs(beta[steps - 1] * vectors[-1]) < 1e-8 * scale
    levels = []
    # ψ = Σ_j s_j[0] y_j over the Ritz vectors y_j; Ritz values closer than rounding are one
    # level (an exactly degenerate level is split at 1e-15 by rounding, and Lanczos may see it)
    for group in _clusters(ritz, 1e-8 * scale):
        if not converged[group].any():
            continue
        weight = float((vectors[0, group] ** 2).sum())
        if weight < 1e-6:
            continue
        part = basis[:steps].T @ (vectors[:, group] @ vectors[0, group])
        levels.append((float(ritz[group].mean()), weight, part / np.linalg.norm(part)))
    return levels


def _clusters(values: np.ndarray, tolerance: float) -> list[np.ndarray]:
    """Returns the indices of ascending ``values`` in groups whose neighbours lie within
    ``tolerance``."""
    edges = np.flatnonzero(np.diff(values) > tolerance) + 1
    return np.split(np.arange(len(values)), edges)
