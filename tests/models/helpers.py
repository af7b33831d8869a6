"""Small helpers for the model tests: tiny lattices, random configurations, model configs."""

from __future__ import annotations

import torch

from vitqs.config import ModelConfig
from vitqs.physics.hilbert import Bosons, SpinHalf
from vitqs.physics.lattice import Lattice


def random_spins(n_states: int, n_sites: int, seed: int = 0) -> torch.Tensor:
    """Returns ``(n_states, n_sites)`` float64 spins at total Sz = 0."""
    return SpinHalf(n_sites, 0).random_states(n_states, torch.Generator().manual_seed(seed))


def random_bosons(n_states: int, n_sites: int, n_max: int = 2, seed: int = 0) -> torch.Tensor:
    """Returns ``(n_states, n_sites)`` float64 occupations at filling one."""
    hilbert = Bosons(n_sites, n_sites, n_max)
    return hilbert.random_states(n_states, torch.Generator().manual_seed(seed))


def model_config(**overrides) -> ModelConfig:
    """Returns a small model config; keyword arguments replace its fields."""
    cfg = dict(
        kind="vit",
        patch_size=2,
        d_model=8,
        heads=2,
        layers=1,
        attention="factored",
        translation_invariant=True,
        embedding="linear",
        jastrow=False,
        symmetrize="none",
        spin_flip=0,
    )
    cfg.update(overrides)
    return ModelConfig(**cfg)


CHAIN = Lattice((8,))
SQUARE = Lattice((4, 4))
