"""Tensors derived from parameters, computed once while the parameters stay unchanged.

A Metropolis call evaluates the network tens to thousands of times with the same parameters;
quantities that depend on the parameters only (the factored attention's ``(n·d)²`` matrix, the
Jastrow couplings) need not be rebuilt in each forward pass. The cache is keyed on the source
tensors themselves (held, so no new tensor can take their place), their data pointer, dtype and
version counter, which every in-place write (an optimizer step, ``load_state_dict``, a
`NetworkCopy` refresh) advances. Only used without gradients: under autograd or a
``torch.func`` transform the derived tensor must be part of the graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class DerivedCache:
    """Holds one tensor derived from source tensors: `get` returns it, recomputed only when a
    source changed (or under autograd, where it is always recomputed, never stored)."""

    def __init__(self):
        self._key: tuple | None = None
        self._value = None

    def get(self, sources: tuple[torch.Tensor, ...], compute: Callable[[], object]):
        """Returns ``compute()``, from the cache when ``sources`` are unchanged since."""
        if torch.is_grad_enabled():
            return compute()
        key = tuple((t, t.data_ptr(), t.dtype, t._version) for t in sources)
        if self._key is None or not _same(self._key, key):
            self._value = compute()
            self._key = key
        return self._value

    def __deepcopy__(self, memo):  # a copy of the module starts empty
        return DerivedCache()


def _same(old: tuple, new: tuple) -> bool:
    if len(old) != len(new):
        return False
    return all(a[0] is b[0] and a[1:] == b[1:] for a, b in zip(old, new, strict=True))
