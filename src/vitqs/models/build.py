"""Build the wave-function module that a model config asks for."""

from __future__ import annotations

import numpy as np
from torch import nn

from vitqs.config import FIXED_SIGN_PRIORS, ModelConfig
from vitqs.models.symmetrize import Symmetrized, momentum_translations, space_group_average
from vitqs.models.vit import ViT


def build_model(cfg: ModelConfig, lattice, hilbert) -> nn.Module:
    """Returns the float64 model described by ``cfg`` on ``lattice`` and ``hilbert``.

    Args:
        cfg: the ``model`` section (its values checked by the section itself).
        lattice: provides ``shape`` (unit cells), ``n_basis``, ``pbc``, ``n_sites`` and
            ``translations``.
        hilbert: provides ``local_states``; spin inversion also needs ``total_sz == 0``.

    Raises:
        ValueError: an option value that is unknown or does not fit the lattice / Hilbert space,
            naming the ``model.<key>``.
    """
    _check_options(cfg, hilbert)
    model = _build_bare(cfg, lattice, hilbert)
    if cfg.symmetrize != "none" or cfg.spin_flip:
        # A translation-invariant ViT needs one shift per patch coset, not every translation:
        # the same state at a fraction of the cost (4 copies instead of 36 on the 6x6).
        if cfg.symmetrize == "space_group":  # each coset shift after each rotation/reflection
            average = space_group_average(
                model, lattice, cfg.spin_flip, cfg.momentum, cfg.point_characters
            )
            return average.double()
        table, phases = np.arange(lattice.n_sites)[None, :], None
        if cfg.symmetrize == "translations":  # at the sector's momentum (k = 0: null)
            table, phases = momentum_translations(model, lattice, cfg.momentum)
        momentum = cfg.momentum if phases is not None else None
        model = Symmetrized(model, table, spin_flip=cfg.spin_flip, phases=phases, momentum=momentum)
    return model.double()


def _check_options(cfg: ModelConfig, hilbert) -> None:
    """Raises ValueError for option values that do not fit together or the Hilbert space."""
    if cfg.spin_flip and (
        tuple(hilbert.local_states) != (-1, 1) or getattr(hilbert, "total_sz", None) != 0
    ):
        raise ValueError(
            f"model.sector.spin_flip={cfg.spin_flip} needs spin-1/2 states at total_sz=0, "
            f"got local_states={tuple(hilbert.local_states)}, "
            f"total_sz={getattr(hilbert, 'total_sz', None)}; set model.sector.spin_flip=0"
        )


def _build_bare(cfg: ModelConfig, lattice, hilbert) -> nn.Module:
    """Returns the unsymmetrized ViT."""
    patch_size = cfg.patch_size if np.ndim(cfg.patch_size) == 0 else tuple(cfg.patch_size)
    return ViT(
        lattice.shape,
        patch_size,
        cfg.d_model,
        cfg.heads,
        cfg.layers,
        translation_invariant=cfg.translation_invariant,
        embedding=cfg.embedding,
        local_states=tuple(hilbert.local_states),
        jastrow=cfg.jastrow,
        pbc=lattice.pbc,
        n_basis=lattice.n_basis,
        positive=cfg.positive,
        sign_sites=sign_prior_sites(cfg, lattice, hilbert),
    )


# the cell coordinates whose sum decides a site's mark, per model.sign_prior
_STRIPE_AXES = {"stripes_x": (1, 0), "stripes_y": (0, 1), "stripes_xy": (1, 1)}


def sign_prior_sites(cfg: ModelConfig, lattice, hilbert) -> np.ndarray | None:
    """Returns whether each site carries ``model.sign_prior``'s sign (ψ gains a factor −1 per
    up spin on a marked site), or None without a prior.

    Raises ValueError where the marks do not fit the lattice: an odd extent along a periodic
    axis that decides them (the stripes would not close around the torus), or a translation-
    invariant ViT whose shift by one patch along a periodic axis swaps marked and unmarked
    sites while the sector holds an odd number of up spins (ψ would change sign under a
    shift the network is invariant under).
    """
    if cfg.sign_prior == "none":
        return None
    if cfg.sign_prior == "search":  # `vitqs run` races the priors first (sector_search)
        raise ValueError(
            "model.sign_prior=search is decided by `vitqs run` before its steps; here set "
            f"one of {', '.join(FIXED_SIGN_PRIORS)}"
        )
    weights = _STRIPE_AXES[cfg.sign_prior][: lattice.ndim]
    for axis, weight in enumerate(weights):
        if weight and lattice.pbc[axis] and lattice.shape[axis] % 2:
            raise ValueError(
                f"model.sign_prior={cfg.sign_prior} alternates along axis {axis}, whose "
                f"periodic extent {lattice.shape[axis]} is odd; needs an even extent there"
            )
    marked = (lattice.coords @ np.asarray(weights)) % 2 == 1
    if cfg.translation_invariant:
        n_up = round(lattice.n_sites / 2 + hilbert.total_sz)
        patch = np.broadcast_to(np.asarray(cfg.patch_size), (lattice.ndim,))
        flips = any(  # a shift by an odd number of cells along a periodic marked axis
            w and p % 2 and periodic
            for w, p, periodic in zip(weights, patch, lattice.pbc, strict=True)
        )
        if flips and n_up % 2:
            raise ValueError(
                f"model.sign_prior={cfg.sign_prior} changes sign under a shift by one patch "
                f"(model.patch_size={cfg.patch_size}) with {n_up} up spins, and the "
                "translation-invariant ViT does not: use an even patch size along the "
                "stripes' axis or model.translation_invariant=false"
            )
    return marked
