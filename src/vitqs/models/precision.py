"""A network's copy in another floating dtype, for forward passes that need no gradient.

Metropolis acceptance ratios (``sampler.dtype``) and the amplitude ratios of the training
steps' local energies (``sampler.local_energy_dtype``) tolerate float32's ~1e-7 relative
rounding, and a float32 ViT's forward passes are 1.5-3x cheaper on CPU (GELU's ``erf`` alone
is ~7x dearer in float64; the 6x6 J1-J2 ViT's local energies 2.3x). Gradients, S and the
final energy stay in the model's own dtype.
"""

from __future__ import annotations

import copy

import torch

_DTYPES = (None, torch.float32, torch.float64)


def torch_dtype(name: str | None) -> torch.dtype | None:
    """Returns the torch dtype a config names (``"float32"``, ``"float64"``), None for None."""
    return None if name is None else getattr(torch, name)


class NetworkCopy:
    """Returns, when called with a model, that model in ``dtype``: the model itself when the
    dtypes agree (or ``dtype`` is None) and nothing is to be ``prepare``d, else a copy made
    once and given the model's current parameters and buffers at every call.

    Args:
        dtype: ``torch.float32``, ``torch.float64`` or None (the model's own dtype).
        key: the config key named in the error for another ``dtype``.
        prepare: called once with each new copy (e.g. `compiled.compile_passes`); the model
            itself is then never returned, so what it changes stays on the copy.
    """

    def __init__(self, dtype: torch.dtype | None, key: str = "dtype", prepare=None):
        if dtype not in _DTYPES:
            raise ValueError(f"{key}={dtype} is not one of [null, float32, float64]")
        self.dtype = dtype
        self.prepare = prepare
        self._copy: tuple[torch.nn.Module, torch.nn.Module] | None = None  # (model, copy)

    @property
    def network(self) -> torch.nn.Module | None:
        """The copy made last (None before the first one)."""
        return None if self._copy is None else self._copy[1]

    def __call__(self, model: torch.nn.Module) -> torch.nn.Module:
        param = next(model.parameters(), None)
        if param is None:
            return model
        same_dtype = self.dtype is None or param.dtype == self.dtype
        if same_dtype and self.prepare is None:
            return model
        if self._copy is None or self._copy[0] is not model:
            network = copy.deepcopy(model).to(self.dtype or param.dtype)
            if self.prepare is not None:
                self.prepare(network)
            self._copy = (model, network)
        network = self._copy[1]
        with torch.no_grad():
            for target, source in zip(network.parameters(), model.parameters(), strict=True):
                target.copy_(source)
            for target, source in zip(network.buffers(), model.buffers(), strict=True):
                target.copy_(source)
        return network
