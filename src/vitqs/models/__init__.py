"""Neural-network wave functions: ``x (B, n_sites) → complex log ψ(x) (B,)``, real parameters."""

from vitqs.models.build import build_model
from vitqs.models.jastrow import Jastrow
from vitqs.models.simple_vit import SimpleViT
from vitqs.models.symmetrize import (
    Symmetrized,
    complex_logsumexp,
    final_symmetrized,
    invariances,
    load_network_state,
    symmetrize_space_group,
    symmetrize_translations,
)
from vitqs.models.vit import ViT, log_cosh

__all__ = [
    "ViT",
    "SimpleViT",
    "Jastrow",
    "Symmetrized",
    "build_model",
    "log_cosh",
    "complex_logsumexp",
    "symmetrize_translations",
    "symmetrize_space_group",
    "final_symmetrized",
    "invariances",
    "load_network_state",
]
