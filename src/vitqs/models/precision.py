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
    dtypes agree (or ``dtype`` is None), else a copy made once and given the model's current
    parameters and buffers at every call.

    Args:
        dtype: ``torch.float32``, ``torch.float64`` or None (the model's own dtype).
        key: the config key named in the error for another ``dtype``.
    """

    def __init__(self, dtype: torch.dtype | None, key: str = "dtype"):
        if dtype not in _DTYPES:
            raise ValueError(f"{key}={dtype} is not one of [null, float32, float64]")
        self.dtype = dtype
        self._copy: tuple[torch.nn.Module, torch.nn.Module] | None = None  # (model, copy)

    def __call__(self, model: torch.nn.Module) -> torch.nn.Module:
        param = next(model.parameters(), None)
        if self.dtype is None or param is None or param.dtype == self.dtype:
            return model
        if self._copy is None or self._copy[0] is not model:
            self._copy = (model, copy.deepcopy(model).to(self.dtype))
        network = self._copy[1]
        with torch.no_grad():
            for target, source in zip(network.parameters(), model.parameters(), strict=True):
                target.copy_(source)
            for target, source in zip(network.buffers(), model.buffers(), strict=True):
                target.copy_(source)
        return network
