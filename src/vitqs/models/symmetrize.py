"""Projection of a wave function onto a sector of the lattice translations (k = 0 by default,
or a chosen crystal momentum), or onto the trivial representation of the space group, with an
optional spin-inversion parity."""

from __future__ import annotations

import math

import numpy as np
import torch
from einops import einsum, rearrange
from torch import nn

from vitqs.config import SPIN_FLIPS, SYMMETRIZE, FinalConfig
from vitqs.models._checks import check_choice


def complex_logsumexp(log_terms: torch.Tensor, dim: int) -> torch.Tensor:
    """Returns ``log Σ exp(log_terms)`` along ``dim`` for complex ``log_terms``, stably.

    The largest real part is subtracted before exponentiating (and added back), so terms of
    ``|Re| ~ 1e3`` neither overflow nor all underflow. The shift is detached: the result does
    not depend on it mathematically. Exactly cancelling terms give ``−inf`` real part.
    """
    shift = log_terms.real.amax(dim=dim, keepdim=True).detach()
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    total = (log_terms - shift).exp().sum(dim=dim)
    return total.log() + shift.squeeze(dim)


class Symmetrized(nn.Module):
    """Returns ``log ψ_sym(x) = log [(1/n_c) Σ_T Σ_{σ} s^σ e^{−ik·a_T} ψ(σ T x)]``, complex
    ``(B,)``.

    ``T`` runs over the ``n_T`` given translations (shift ``a_T``). Without spin flip ``σ = +1``
    only (``n_c = n_T``); with ``spin_flip = s ∈ {+1, −1}`` also ``σ = −1`` (global spin
    inversion ``x → −x``, weight ``s``) and ``n_c = 2 n_T``. Then ``ψ_sym(T x) = e^{ik·a_T}
    ψ_sym(x)`` for every ``T`` of the group (``k = 0`` unless ``phases`` are given) and
    ``ψ_sym(−x) = s ψ_sym(x)``. A weight ``−1`` enters the complex logsumexp as ``+iπ``, a
    weight ``e^{−iθ}`` as ``−iθ``. All ``n_c`` copies go through the model in one batched call.

    Args:
        model: maps ``(B, n_sites)`` to complex ``log ψ`` ``(B,)``.
        translations: ``(n_T, n_sites)`` integer permutations, ``(T_t x)[i] = x[perm_t[i]]``:
            all translations of the lattice, or one per coset of those ``model`` is invariant
            under; or the same for a larger group (``group``).
        spin_flip: 0 (off), +1 or −1 (eigenvalue of spin inversion to project on).
        group: ``(n_G, n_sites)``, the group the average is invariant under when it is not
            the translations (the space group, when ``translations`` holds rotations and
            reflections too); None for the translations.
        phases: ``k · a_T`` ``(n_T,)`` of each row of ``translations`` (`momentum_translations`),
            or None for ``k = 0``.
        momentum: the integers ``[n_x, n_y]`` of ``k`` (`Lattice.translation_phases`) that
            ``phases`` come from, kept to tell which translations leave ``ψ_sym`` unchanged.
    """

    def __init__(
        self,
        model: nn.Module,
        translations,
        spin_flip: int = 0,
        group=None,
        phases=None,
        momentum=None,
    ):
        super().__init__()
        check_choice("spin_flip", spin_flip, SPIN_FLIPS)
        translations = torch.as_tensor(np.asarray(translations), dtype=torch.long)
        if translations.ndim != 2:
            raise ValueError(
                f"translations must be (n_T, n_sites), got {tuple(translations.shape)}"
            )
        self.model = model
        self.spin_flip = int(spin_flip)
        self.momentum = tuple(int(n) for n in momentum) if momentum and any(momentum) else None
        if (phases is None) != (self.momentum is None) or (
            phases is not None and len(phases) != len(translations)
        ):
            raise ValueError("phases (one per translation) must come with a momentum ≠ 0")
        phases = np.zeros(len(translations)) if phases is None else np.asarray(phases)
        # a sum of positive terms stays positive; an odd spin-flip projection or a phase does not
        self.positive = (
            bool(getattr(model, "positive", False)) and self.spin_flip >= 0 and not self.momentum
        )
        self.register_buffer("translations", translations, persistent=False)
        self.register_buffer(  # the weight of each copy is exp(−i k·a_T)
            "copy_phase", -torch.as_tensor(phases, dtype=torch.float64), persistent=False
        )
        # the permutations ψ_sym is invariant under when they are more than the translations
        # (`invariances`): the space group, for an average over rotations and reflections too
        self.group = None if group is None else np.asarray(group)
        # Each spin-inversion sector σ: the factor on x and the phase of its weight s^σ.
        signs = (1.0, -1.0) if spin_flip else (1.0,)
        flip_phase = (0.0, 0.0 if spin_flip > 0 else math.pi) if spin_flip else (0.0,)
        self.register_buffer(
            "flip_sign", torch.tensor(signs, dtype=torch.float64), persistent=False
        )
        # the phase of each copy's weight s^σ e^{−ik·a_T}, (σ, T): added once per forward
        weight_phase = torch.tensor(flip_phase, dtype=torch.float64)[:, None] + self.copy_phase
        self.register_buffer("weight_phase", weight_phase, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_t = x[:, self.translations]  # (batch, t, site)
        copies = einsum(self.flip_sign.to(x.dtype), x_t, "f, batch t site -> batch f t site")
        log_psi = self.model(rearrange(copies, "batch f t site -> (batch f t) site"))
        log_terms = rearrange(
            log_psi, "(batch f t) -> batch f t", f=len(self.flip_sign), t=x_t.shape[1]
        )
        log_terms = log_terms + 1j * self.weight_phase.to(log_psi.real.dtype)
        log_terms = rearrange(log_terms, "batch f t -> batch (f t)")
        return complex_logsumexp(log_terms, dim=1) - math.log(log_terms.shape[1])


def symmetrize_translations(model: nn.Module, lattice, momentum=None) -> nn.Module:
    """Returns ``model`` averaged over the lattice translations it is not invariant under,
    projected on the crystal momentum ``momentum`` (`Lattice.translation_phases`; None: 0).

    A translation-invariant ViT is already invariant under shifts by whole patches, so the
    average over all translations equals the average over one shift per coset: the
    ``b_x · b_y`` shifts inside a patch (``translation_period``), not all ``L_x · L_y``. A model
    already averaged over translations comes back unchanged.
    """
    if isinstance(model, Symmetrized) and model.translations.shape[0] > 1:
        return model
    inner = model.model if isinstance(model, Symmetrized) else model
    table, phases = momentum_translations(inner, lattice, momentum)
    if len(table) == 1:
        return model
    return Symmetrized(
        model, table, phases=phases, momentum=momentum if phases is not None else None
    )


def momentum_translations(model: nn.Module, lattice, momentum=None):
    """Returns `coset_translations` and the phase ``k · a_T`` of each, None for ``k = 0``.

    Raises:
        ValueError: for a ``k`` that ``model`` cannot have: it is invariant under a shift
            (a whole patch of a translation-invariant ViT) whose phase is not 1, so every
            term of the projection cancels.
    """
    keep = _coset_mask(model, lattice)
    if not momentum or not any(momentum):
        return lattice.translations[keep], None
    phases = lattice.translation_phases(momentum)
    own, _ = invariances(model, lattice)
    own_rows = _rows_of(lattice.translations, own)
    if not np.allclose(np.cos(phases[own_rows]), 1.0):
        raise ValueError(
            f"model.momentum={list(momentum)}: the network is invariant under shifts by whole "
            f"patches (model.translation_invariant: true, model.patch_size), on which this "
            "momentum's phase is not 1, so its projection vanishes; set "
            "model.translation_invariant: false (or a patch_size b with n_i b_i a multiple "
            "of L_i)"
        )
    return lattice.translations[keep], phases[keep]


def _rows_of(table: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """Returns the row of ``table`` of each permutation of ``perms``."""
    index = {tuple(row): i for i, row in enumerate(table)}
    return np.array([index[tuple(p)] for p in perms], dtype=np.int64)


def final_symmetrized(
    model: nn.Module,
    symmetrize: str,
    lattice,
    spin_flip: int = FinalConfig.spin_flip,
    momentum=None,
) -> nn.Module:
    """Returns ``model`` averaged as ``final.symmetrize`` asks (one of `config.SYMMETRIZE`),
    over translations on the crystal momentum ``model.momentum`` (None: 0), and projected on
    the spin-inversion eigenvalue ``final.spin_flip`` (0: none), on the device of its
    parameters."""
    if symmetrize not in SYMMETRIZE:
        raise ValueError(f"final.symmetrize={symmetrize!r} is not one of {list(SYMMETRIZE)}")
    check_choice("spin_flip", spin_flip, SPIN_FLIPS)
    device = next(model.parameters()).device
    if symmetrize == "translations":
        model = symmetrize_translations(model, lattice, momentum)
    elif symmetrize == "space_group":
        model = symmetrize_space_group(model, lattice)
    if spin_flip:
        model = _with_spin_flip(model, spin_flip, lattice.n_sites)
    return model.to(device)


def _with_spin_flip(model: nn.Module, spin_flip: int, n_sites: int) -> nn.Module:
    """Returns ``model`` (averaged or not) also projected on spin inversion ``spin_flip``."""
    if not isinstance(model, Symmetrized):
        identity = np.arange(n_sites)[None, :]
        return Symmetrized(model, identity, spin_flip=spin_flip)
    if model.spin_flip == spin_flip:
        return model
    if model.spin_flip:
        raise ValueError(
            f"final.spin_flip={spin_flip} contradicts the model's own projection "
            f"model.spin_flip={model.spin_flip}"
        )
    table = model.translations.cpu().numpy()
    phases = None if model.momentum is None else -model.copy_phase.cpu().numpy()
    return Symmetrized(
        model.model,
        table,
        spin_flip=spin_flip,
        group=model.group,
        phases=phases,
        momentum=model.momentum,
    )


def symmetrize_space_group(model: nn.Module, lattice) -> nn.Module:
    """Returns ``model`` averaged over the space group of ``lattice``: the translations it is
    not invariant under (`coset_translations`), each after each rotation and reflection.

    A model already averaged over the space group comes back unchanged. One averaged over
    translations, or projected on a spin-inversion sector, is averaged anew from its bare
    network, keeping that projection. For a state in the fully symmetric sector (every
    Bose-Hubbard ground state) the average removes the parts of the error that break the
    point group, which the translation average leaves.
    """
    spin_flip = 0
    if isinstance(model, Symmetrized):
        if model.group is not None:
            return model
        if model.momentum is not None:
            raise ValueError(
                f"the space group's average is the k = 0 sector, and this model is projected "
                f"on model.momentum={list(model.momentum)}"
            )
        spin_flip, model = model.spin_flip, model.model
    table = space_group_table(model, lattice)
    return Symmetrized(model, table, spin_flip=spin_flip, group=lattice.space_group())


def space_group_table(model: nn.Module, lattice) -> np.ndarray:
    """Returns the permutations ``(n_T · n_P, n_sites)`` whose average over ``model`` is the
    average over the whole space group: each of `coset_translations` after each element of
    the point group."""
    points = lattice.point_group()
    return np.stack([p[t] for t in coset_translations(model, lattice) for p in points])


def coset_translations(model: nn.Module, lattice) -> np.ndarray:
    """Returns the translations ``(n_T, n_sites)`` whose average over ``model`` equals the
    average over every translation of ``lattice``: one per coset of the translations that
    ``model`` is invariant under (its ``translation_period``), or all of them."""
    return lattice.translations[_coset_mask(model, lattice)]


def _coset_mask(model: nn.Module, lattice) -> np.ndarray:
    """Returns which rows of ``lattice.translations`` `coset_translations` keeps."""
    period = getattr(model, "translation_period", None)
    if period is None:
        return np.ones(len(lattice.translations), dtype=bool)
    dx, dy = _shift_vectors(lattice)
    return (dx < period[0]) & (dy < period[1])


def _shift_vectors(lattice) -> tuple[np.ndarray, np.ndarray]:
    """Returns the cell shift ``(dx, dy)`` of each row of ``lattice.translations`` (only
    along the periodic axes)."""
    shifts = lattice.translation_shifts
    return shifts[:, 0], shifts[:, 1]


def invariances(model: nn.Module, lattice) -> tuple[np.ndarray, int]:
    """Returns the symmetries ``model`` has for every value of its parameters.

    Returns ``(permutations, spin_flip)``:
    - ``permutations`` ``(n_G, n_sites)``: a group of lattice symmetries with
      ``ψ(g x) = ψ(x)``. A model averaged over the space group has all of it, one averaged
      over translations all of these (at a momentum k ≠ 0 only those whose phase
      ``e^{ik·a}`` is 1). A translation-invariant ViT or a Jastrow
      (``translation_period``) has the shifts by whole periods. Any other model has the
      identity only.
    - ``spin_flip``: ``s`` with ``ψ(−x) = s ψ(x)`` (±1), or 0 for no such symmetry.
    """
    spin_flip = 0
    if isinstance(model, Symmetrized):
        spin_flip = model.spin_flip
        if model.group is not None:
            return model.group, spin_flip
        if model.translations.shape[0] > 1:  # one shift per coset: every translation
            if model.momentum is None:
                return lattice.translations, spin_flip
            phases = lattice.translation_phases(model.momentum)
            return lattice.translations[np.isclose(np.cos(phases), 1.0)], spin_flip
        model = model.model
    table = lattice.translations
    period = getattr(model, "translation_period", None)
    if period is None:
        return table[:1], spin_flip
    dx, dy = _shift_vectors(lattice)
    return table[(dx % period[0] == 0) & (dy % period[1] == 0)], spin_flip


def sector_characters(model: nn.Module, lattice) -> tuple[np.ndarray, np.ndarray, int]:
    """Returns the sector ``model`` lies in for every value of its parameters:
    ``(permutations, characters, spin_flip)`` with ``ψ(g x) = χ_g ψ(x)`` for each row ``g``
    (complex ``χ_g``: ``e^{ik·a}`` for the translations of a model at ``model.momentum``, else
    1 on `invariances`) and ``ψ(−x) = spin_flip · ψ(x)`` (0: no such constraint)."""
    perms, spin_flip = invariances(model, lattice)
    if isinstance(model, Symmetrized) and model.momentum is not None:
        perms = lattice.translations
        return perms, np.exp(1j * lattice.translation_phases(model.momentum)), spin_flip
    return perms, np.ones(len(perms), dtype=np.complex128), spin_flip


def load_network_state(model: nn.Module, state: dict) -> None:
    """Loads the ``state_dict`` of a network into ``model``, either of them averaged by
    `Symmetrized` or not.

    The average over symmetry copies adds no parameters: a network trained bare can go on
    averaged (cheap steps first, the symmetric state last), and back.

    Raises:
        RuntimeError: from ``load_state_dict``, when the parameters do not fit the network.
    """
    bare = model.model if isinstance(model, Symmetrized) else model
    if set(state) != set(bare.state_dict()):
        wrapped = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
        if len(wrapped) == len(state):  # saved from a Symmetrized: its network is "model"
            state = wrapped
    bare.load_state_dict(state)
