"""Two-body Jastrow factor with translation-invariant pair couplings."""

from __future__ import annotations

import numpy as np
import torch
from einops import einsum
from torch import nn

from vitqs.models.patching import lattice_extent


def pair_classes(
    lattice_shape: tuple[int, ...], pbc=True, n_basis: int = 1
) -> tuple[np.ndarray, int]:
    """Returns ``(pair_class, n_classes)``: the coupling index of every site pair.

    ``pair_class`` is ``(n_sites, n_sites)`` int64. Pairs ``(i, j)`` with the same cell
    displacement ``r_i − r_j`` and the same basis sites, up to exchanging the two, share a class
    (``x_i x_j`` is symmetric, so ``v(r)`` and ``v(−r)`` could not be told apart): the classes
    are the orbits of pairs under translations by whole cells. Displacements are wrapped
    along periodic axes (``pbc``: one bool or one per axis) and taken as plain vectors along
    open ones. The diagonal ``i = j`` gets the class ``n_classes``, which the on-site term
    ``g`` covers instead.

    Class counts with one site per cell: periodic ``(N + n_half − 2)/2`` with
    ``n_half = (1 + [Lx even])(1 + [Ly even])`` the displacements equal to their own negative;
    open ``((2Lx − 1)(2Ly − 1) − 1)/2``.
    """
    lx, ly = lattice_extent(lattice_shape)
    periodic = (pbc,) * len(lattice_shape) if np.ndim(pbc) == 0 else tuple(pbc)
    periodic = tuple(bool(p) for p in periodic) + (True,) * (2 - len(periodic))
    n_sites = lx * ly * n_basis
    cell, basis = np.arange(n_sites) // n_basis, np.arange(n_sites) % n_basis
    coords = np.stack([cell % lx, cell // lx], axis=1)
    delta = coords[:, None, :] - coords[None, :, :]  # (i, j, axis)
    bi, bj = basis[:, None], basis[None, :]
    n_pairs = n_basis * n_basis
    code = _displacement_code(delta, (lx, ly), periodic) * n_pairs + bi * n_basis + bj
    code_of_swap = _displacement_code(-delta, (lx, ly), periodic) * n_pairs + bj * n_basis + bi
    canonical = np.maximum(code, code_of_swap)  # one representative of (i, j) and (j, i)
    off_diagonal = ~np.eye(n_sites, dtype=bool)
    classes, inverse = np.unique(canonical[off_diagonal], return_inverse=True)
    pair_class = np.full((n_sites, n_sites), len(classes), dtype=np.int64)
    pair_class[off_diagonal] = inverse.ravel()
    return pair_class, len(classes)


def _displacement_code(delta: np.ndarray, extent, periodic) -> np.ndarray:
    """Returns an integer that labels each displacement ``(..., 2)`` uniquely."""
    code, width = np.zeros(delta.shape[:-1], dtype=np.int64), 1
    for axis, (length, wrap) in enumerate(zip(extent, periodic, strict=True)):
        d = delta[..., axis]
        code = code + width * (d % length if wrap else d + length - 1)
        width *= length if wrap else 2 * length - 1
    return code


class Jastrow(nn.Module):
    """Returns ``log J(x) = Σ_{i≠j} v(r_i − r_j) x_i x_j + Σ_i u(x_i)`` as a complex ``(B,)``.

    The couplings ``v`` are translation invariant and symmetric, ``v(r) = v(−r)``, one per
    pair of basis sites on a lattice with a basis (see
    ``pair_classes``). The on-site term ``u`` is ``u(x) = g x²`` by default; with
    ``local_states`` it is a free table ``u(n)`` over the values a site can take (a Gutzwiller
    factor), which bosons need: the exact ``U = 0`` ground state has ``log ψ = −½ Σ_i log n_i!``
    (all N bosons in the k = 0 orbital) and large ``U`` suppresses each multiple occupancy by
    its own factor, neither of which is quadratic in ``n``. Parameters are real; ``v`` and ``g``
    start at zero, so without a table ``J = 1`` at initialisation and a model it multiplies
    starts unchanged; the table starts at ``u(n) = −½ log n!``, so with ``v = 0`` the factor
    is exactly the free-boson (U = 0) ground state, a far better start than the uniform
    amplitude over the Fock sector. The result is real (imaginary part zero): enough for
    bosons (a stoquastic ``H``, positive ground state) and for spins whose sign is carried
    elsewhere. Used alone or as a factor on a ViT (Denis, Sinibaldi & Carleo,
    arXiv:2404.07869).

    Args:
        lattice_shape: ``(L,)`` or ``(Lx, Ly)`` unit cells, sites numbered as in `patching`.
        pbc: wrap displacements periodically: one bool, or one per axis.
        local_states: the site values ``(n_states,)`` for the on-site table ``u``; None keeps
            the single parameter ``g``.
    """

    def __init__(
        self,
        lattice_shape: tuple[int, ...],
        pbc=True,
        local_states: tuple | None = None,
        n_basis: int = 1,
    ):
        super().__init__()
        self.positive = True  # log J is real: J(x) > 0
        self.translation_period = (1, 1)  # depends on displacements only
        pair_class, n_classes = pair_classes(lattice_shape, pbc, n_basis)
        self.register_buffer("pair_class", torch.as_tensor(pair_class), persistent=False)
        self.v = nn.Parameter(torch.zeros(n_classes, dtype=torch.float64))
        if local_states is None:
            self.g = nn.Parameter(torch.zeros((), dtype=torch.float64))
            self.onsite = None
        else:
            states = torch.as_tensor(tuple(local_states), dtype=torch.float64)
            if torch.any(states < 0) or torch.any(states != states.round()):
                raise ValueError(
                    f"Jastrow local_states={tuple(local_states)} must be occupations 0, 1, 2, ..."
                )
            self.register_buffer("local_states", states, persistent=False)
            # u(n) = −½ log n!: the exact U = 0 ground state; the uniform state instead puts
            # most weight on multiple occupancies, and the first SR steps then overshoot
            self.onsite = nn.Parameter(-0.5 * torch.lgamma(states + 1))

    def couplings(self) -> torch.Tensor:
        """Returns ``V_ij = v(r_i − r_j)`` ``(n_sites, n_sites)``, with zero diagonal."""
        v_with_diagonal = torch.cat([self.v, self.v.new_zeros(1)])
        return v_with_diagonal[self.pair_class]

    def onsite_term(self, x: torch.Tensor) -> torch.Tensor:
        """Returns ``Σ_i u(x_i)`` ``(B,)``."""
        if self.onsite is None:
            return self.g * (x * x).sum(dim=-1)
        onehot = (x[..., None] == self.local_states).to(x.dtype)  # (batch, site, state)
        return einsum(onehot, self.onsite, "batch site state, state -> batch")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_j = self.log_amplitude(x)
        return torch.complex(log_j, torch.zeros_like(log_j))

    def log_amplitude(self, x: torch.Tensor) -> torch.Tensor:
        """Returns the real ``log J(x)`` ``(B,)``."""
        x = x.to(self.v.dtype)
        # Σ_ij x_i V_ij x_j as a product and a row sum: a three-operand einsum fixes the
        # batch size for torch.compile (its contraction order depends on the sizes)
        log_j = (torch.matmul(x, self.couplings()) * x).sum(dim=-1)
        return log_j + self.onsite_term(x)
