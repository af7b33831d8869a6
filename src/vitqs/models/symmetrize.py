"""Projection of a wave function onto a sector of the lattice translations (k = 0 by default,
or a chosen crystal momentum), or onto a one-dimensional representation of the space group's
little group at that momentum (the trivial one by default), with an optional spin-inversion
parity."""

from __future__ import annotations

import math

import numpy as np
import torch
from einops import einsum, rearrange
from torch import nn

from vitqs.config import SPIN_FLIPS, SYMMETRIZE, FinalConfig
from vitqs.models._checks import check_choice
from vitqs.physics.symmetry import generators


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
        group: ``(n_G, n_sites)``, the group ``ψ_sym`` transforms under when it is not the
            translations (the space group or its little group at ``momentum``, when
            ``translations`` holds rotations and reflections too); None for the translations.
        phases: the phase of each row of ``translations``: ``k · a_T`` (`momentum_translations`),
            plus ``arg χ_P`` of its point-group element (`space_group_table`); None for all 0.
        momentum: the integers ``[n_x, n_y]`` of ``k`` (`Lattice.translation_phases`) that
            ``phases`` come from, kept to tell which translations leave ``ψ_sym`` unchanged.
        group_characters: ``(n_G,)`` complex, ``ψ_sym(g x) = χ_g ψ_sym(x)`` for each row of
            ``group`` (`little_space_group`); None for all 1.
    """

    def __init__(
        self,
        model: nn.Module,
        translations,
        spin_flip: int = 0,
        group=None,
        phases=None,
        momentum=None,
        group_characters=None,
    ):
        super().__init__()
        check_choice("sector.spin_flip", spin_flip, SPIN_FLIPS)
        translations = torch.as_tensor(np.asarray(translations), dtype=torch.long)
        if translations.ndim != 2:
            raise ValueError(
                f"translations must be (n_T, n_sites), got {tuple(translations.shape)}"
            )
        self.model = model
        self.spin_flip = int(spin_flip)
        self.momentum = tuple(int(n) for n in momentum) if momentum and any(momentum) else None
        if (self.momentum is not None and phases is None) or (
            phases is not None and len(phases) != len(translations)
        ):
            raise ValueError("phases (one per translation) must come with a momentum ≠ 0")
        phases = np.zeros(len(translations)) if phases is None else np.asarray(phases)
        # a sum of positive terms stays positive; an odd spin-flip projection or a phase does not
        self.positive = (
            bool(getattr(model, "positive", False))
            and self.spin_flip >= 0
            and np.allclose(np.cos(phases), 1.0)
        )
        self.register_buffer("translations", translations, persistent=False)
        self.register_buffer(  # the weight of each copy is exp(−i k·a_T)
            "copy_phase", -torch.as_tensor(phases, dtype=torch.float64), persistent=False
        )
        # the permutations ψ_sym is invariant under when they are more than the translations
        # (`invariances`): the space group, for an average over rotations and reflections too
        self.group = None if group is None else np.asarray(group)
        self.group_characters = (
            None if group_characters is None else np.asarray(group_characters, dtype=complex)
        )
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

    @property
    def has_parts(self) -> bool:
        """Whether `log_psi_parts` can run: the network inside gives its own."""
        return bool(getattr(self.model, "has_parts", False))

    def log_psi_parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(Re, Im)`` of `forward`'s ``log ψ_sym`` ``(B,)`` in real arithmetic, from
        the network's own `log_psi_parts` (a ViT's): what ``torch.compile`` fuses (the compiled
        sweeps of chains on ψ_sym). ``Im`` is the principal phase, as `forward`'s."""
        x_t = x[:, self.translations]  # (batch, t, site)
        n_copies = len(self.flip_sign) * x_t.shape[1]
        copies = self.flip_sign.to(x.dtype)[None, :, None, None] * x_t[:, None]
        real, imag = self.model.log_psi_parts(copies.reshape(-1, x.shape[1]))
        real = real.reshape(-1, n_copies)
        imag = imag.reshape(-1, *self.weight_phase.shape) + self.weight_phase.to(imag.dtype)
        imag = imag.reshape(-1, n_copies)
        shift = real.amax(dim=1, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        weight = torch.exp(real - shift)
        total_re = (weight * torch.cos(imag)).sum(dim=1)
        total_im = (weight * torch.sin(imag)).sum(dim=1)
        magnitude = 0.5 * torch.log(total_re**2 + total_im**2)  # −inf where the copies cancel
        return magnitude + shift[:, 0] - math.log(n_copies), torch.atan2(total_im, total_re)


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
            f"model.sector.momentum={list(momentum)}: the network is invariant under shifts by "
            f"whole patches (model.translation_invariant: true, model.patch_size), on which this "
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
    point_characters=None,
) -> nn.Module:
    """Returns ``model`` averaged as ``final.symmetrize`` asks (one of `config.SYMMETRIZE`),
    on the crystal momentum of ``model.sector`` (None: 0) and, over the space group, on
    its characters of the momentum's little group (None: all 1), and projected on
    the spin-inversion eigenvalue ``final.spin_flip`` (0: none), on the device of its
    parameters."""
    if symmetrize not in SYMMETRIZE:
        raise ValueError(f"final.symmetrize={symmetrize!r} is not one of {list(SYMMETRIZE)}")
    check_choice("spin_flip", spin_flip, SPIN_FLIPS)
    device = next(model.parameters()).device
    if symmetrize == "translations":
        model = symmetrize_translations(model, lattice, momentum)
    elif symmetrize == "space_group":
        model = symmetrize_space_group(model, lattice, momentum, point_characters)
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
            f"model.sector.spin_flip={model.spin_flip}"
        )
    table = model.translations.cpu().numpy()
    return Symmetrized(
        model.model,
        table,
        spin_flip=spin_flip,
        group=model.group,
        phases=-model.copy_phase.cpu().numpy(),
        momentum=model.momentum,
        group_characters=model.group_characters,
    )


def symmetrize_space_group(
    model: nn.Module, lattice, momentum=None, point_characters=None
) -> nn.Module:
    """Returns ``model`` projected on a sector of the space group of ``lattice``: averaged over
    the translations it is not invariant under (`coset_translations`), each after each
    rotation and reflection of the little group of ``momentum`` (None: k = 0, the whole point
    group), weighted by ``e^{−ik·a}`` and the characters ``point_characters`` (None: all 1).

    A model already averaged over the space group comes back unchanged. One averaged over
    translations, or projected on a spin-inversion sector, is averaged anew from its bare
    network, keeping that projection. For a state in the fully symmetric sector (every
    Bose-Hubbard ground state) the average removes the parts of the error that break the
    point group, which the translation average leaves; where the ground state is odd under a
    reflection (the kagome 2x3's), the projection removes the even levels below it.
    """
    spin_flip = 0
    if isinstance(model, Symmetrized):
        if model.group is not None:
            return model
        if model.momentum is not None and model.momentum != _momentum_key(momentum):
            raise ValueError(
                f"the space group's average at momentum {momentum} does not keep this model's "
                f"model.sector.momentum={list(model.momentum)}"
            )
        spin_flip, model = model.spin_flip, model.model
    return space_group_average(model, lattice, spin_flip, momentum, point_characters)


def space_group_average(
    model: nn.Module, lattice, spin_flip: int = 0, momentum=None, point_characters=None
) -> Symmetrized:
    """Returns the bare network ``model`` as `symmetrize_space_group` averages it, projected on
    spin inversion ``spin_flip`` (0: none) too."""
    table, phases = space_group_table(model, lattice, momentum, point_characters)
    group, characters = little_space_group(lattice, momentum, point_characters)
    trivial = np.allclose(characters, 1.0)
    return Symmetrized(
        model,
        table,
        spin_flip=spin_flip,
        group=group,
        phases=None if trivial else phases,
        momentum=_momentum_key(momentum),
        group_characters=None if trivial else characters,
    )


def _momentum_key(momentum) -> tuple | None:
    """Returns ``momentum`` as `Symmetrized` keeps it: a tuple, None for k = 0."""
    return tuple(int(n) for n in momentum) if momentum and any(momentum) else None


def space_group_table(model: nn.Module, lattice, momentum=None, point_characters=None):
    """Returns ``(table, phases)``: the permutations ``(n_T · n_P, n_sites)`` whose average
    over ``model`` is the average over the little space group at ``momentum`` (each of
    `coset_translations` after each element of `Lattice.little_group`), and the phase
    ``k · a_T + arg χ_P`` of each row (`Symmetrized` weighs it by ``e^{−i phase}``)."""
    points = lattice.point_group()[lattice.little_group(momentum)]
    chi = np.ones(len(points)) if point_characters is None else np.asarray(point_characters)
    translations, shifts = momentum_translations(model, lattice, momentum)
    shifts = np.zeros(len(translations)) if shifts is None else shifts
    table = np.stack([p[t] for t in translations for p in points])
    phases = np.array([a + np.angle(c) for a in shifts for c in chi])
    return table, phases


def little_space_group(lattice, momentum=None, point_characters=None):
    """Returns ``(group, characters)``: every element ``g = T_a P`` of the little space group
    at ``momentum`` as a permutation ``(n_T · n_P, n_sites)`` (`space_group_table`'s order,
    all translations), and its character ``χ_g = e^{ik·a} χ_P`` in the one-dimensional
    representation that ``point_characters`` (None: all 1) gives the little group: a state of
    that sector has ``ψ(g x) = χ_g ψ(x)``.

    Raises:
        ValueError: naming ``model.sector.point_characters``, when they are not ±1, one per element
            of the little group (identity first, +1), or not a representation
            (``χ_{gh} ≠ χ_g χ_h`` for some pair).
    """
    little = lattice.little_group(momentum)
    points = lattice.point_group()[little]
    chi = _checked_point_characters(point_characters, len(little), momentum)
    phases = np.zeros(len(lattice.translations))
    if momentum is not None and any(momentum):
        phases = lattice.translation_phases(momentum)
    group = np.stack([p[t] for t in lattice.translations for p in points])
    characters = np.array([np.exp(1j * a) * c for a in phases for c in chi])
    if point_characters is not None:  # e^{ik·a} alone is always one
        _check_representation(group, characters, point_characters)
    return group, characters


def _checked_point_characters(point_characters, n_little: int, momentum) -> np.ndarray:
    if point_characters is None:
        return np.ones(n_little)
    chi = list(point_characters)
    if len(chi) != n_little or any(c not in (1, -1) for c in chi) or chi[0] != 1:
        raise ValueError(
            f"model.sector.point_characters={chi} must be {n_little} values of +1 or -1, the "
            "first +1: one per rotation or reflection that keeps the momentum "
            f"{momentum or [0]} (the identity first), as `vitqs ed` reports the ground state's"
        )
    return np.asarray(chi, dtype=float)


def _check_representation(group: np.ndarray, characters: np.ndarray, point_characters) -> None:
    """Raises ValueError unless ``χ_{gh} = χ_g χ_h`` for every ``g`` of ``group`` and every
    generator ``h``: then it holds for every pair, and the projection is a projector."""
    row_of = {tuple(g): i for i, g in enumerate(group)}
    for h in generators(group):
        for i, g in enumerate(group):
            product = row_of.get(tuple(group[h][g]))  # (g x)[i] = x[g[i]]: g after h
            if product is None or abs(characters[product] - characters[i] * characters[h]) > 1e-9:
                raise ValueError(
                    f"model.sector.point_characters={list(point_characters)} is not a "
                    "representation of the little group at this momentum (the characters of "
                    "two elements do not multiply to their product's), so its projection "
                    "vanishes; take them from `vitqs ed`"
                )


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
            if model.group_characters is None:
                return model.group, spin_flip
            return model.group[np.isclose(model.group_characters, 1.0)], spin_flip
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
    if isinstance(model, Symmetrized) and model.group_characters is not None:
        return model.group, model.group_characters, spin_flip
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
