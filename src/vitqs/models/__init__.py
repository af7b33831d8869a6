"""Neural-network wave functions: ``x (B, n_sites) → complex log ψ(x) (B,)``, real parameters.

`vit` (the Vision Transformer: patches, attention blocks, a log-cosh head), `jastrow` (the
ViT's two-body factor), `attention`, `patching`, `symmetrize` (averages over lattice
symmetries and spin inversion), `precision` (a network's float32 copy), `cache` (tensors
derived from parameters, kept between forward passes without gradients) and `build`
(`build_model` from the ``model`` section).

May import: torch, einops, numpy, the base (`config` for the option vocabulary and
defaults) and, from `physics`, the symmetry generators of a lattice (`physics.symmetry`, for
the averages of `symmetrize`); nothing of `vmc` or the shell. Lattices come in as objects
with ``shape``, ``pbc`` and translation tables.
"""

from vitqs.models.build import build_model
from vitqs.models.jastrow import Jastrow
from vitqs.models.symmetrize import (
    Symmetrized,
    complex_logsumexp,
    final_symmetrized,
    invariances,
    load_network_state,
    sector_characters,
    symmetrize_space_group,
    symmetrize_translations,
)
from vitqs.models.vit import ViT, log_cosh

__all__ = [
    "ViT",
    "Jastrow",
    "Symmetrized",
    "build_model",
    "log_cosh",
    "complex_logsumexp",
    "symmetrize_translations",
    "symmetrize_space_group",
    "final_symmetrized",
    "invariances",
    "sector_characters",
    "load_network_state",
]
