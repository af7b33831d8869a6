"""The network Metropolis chains run on, for a model: built once from the config
(`build.build_sampler`) and handed to the sampler, which then needs nothing of models.

Two choices make it:

- *bare* (``sampler.bare_chains``): under a symmetry average (`Symmetrized`) the chains may
  sample ``|φ|^p`` of the network inside it, one forward pass per proposal instead of one per
  symmetry copy; every kept sample is then weighted by ``|ψ|²/|φ|^p`` (the sampler's
  importance weights), so the estimates stay those of ``|ψ|²``;
- *the copy the chains evaluate* (``sampler.dtype``; compiled where `build.compiled_chains`
  says it pays): a float32 copy of a float64 network (forward passes 1.5-3x cheaper on CPU).
  Compiled chains on CUDA take that copy's forward passes through ``torch.compile``
  (`compiled.compile_passes`); on the CPU the sampler compiles whole Metropolis steps
  instead (`vmc/compiled_sweep.py`), and a pass it runs outside them (a sector table)
  stays eager. The kept samples' log ψ always come from the model itself.
"""

from __future__ import annotations

import copy

import torch

from vitqs.models.compiled import compile_passes, compile_seconds
from vitqs.models.precision import NetworkCopy
from vitqs.models.symmetrize import Symmetrized


class ChainNetwork:
    """Says, for a model, which network the chains sample and which copy evaluates it.

    Args:
        dtype: precision of the copy the chains evaluate (None: the network itself).
        compile: that copy's forward passes without gradients through ``torch.compile``.
        bare: under a `Symmetrized` model, the chains sample the network inside it.
    """

    def __init__(self, dtype: torch.dtype | None = None, *, compile=False, bare=False):
        self.compile, self.bare = bool(compile), bool(bare)
        prepare = _compile_passes_on_cuda if self.compile else None
        self._copy = NetworkCopy(dtype, key="sampler.dtype", prepare=prepare)

    @property
    def dtype(self) -> torch.dtype | None:
        return self._copy.dtype

    def sampled(self, model: torch.nn.Module) -> torch.nn.Module:
        """Returns the network whose ``|·|^p`` the chains sample: ``model``, or its bare
        network under a symmetry average when the chains are bare."""
        return model.model if self.bare and isinstance(model, Symmetrized) else model

    def evaluating(self, network: torch.nn.Module) -> torch.nn.Module:
        """Returns what evaluates ``network`` for the chains: its float32 (or compiled) copy,
        given ``network``'s current parameters, or ``network`` itself."""
        return self._copy(network)

    def of_psi(self) -> ChainNetwork:
        """Returns the same copies for chains of ψ itself (not bare): the final measurement's."""
        if not self.bare:
            return self
        plain = copy.copy(self)
        plain.bare = False
        return plain

    @property
    def compile_seconds(self) -> float:
        """Seconds the first compiled pass took (tracing and compiling); 0 without compiling
        or before it."""
        network = self._copy.network
        return 0.0 if not self.compile or network is None else compile_seconds(network)


def _compile_passes_on_cuda(network: torch.nn.Module) -> None:
    """Compiles the forward passes of a copy on CUDA (`compiled.compile_passes`): there they
    took the J1-J2 6×6's sampling from 0.74 to 0.30 s a step, where compiled sweeps gained
    nothing on the 10×10 (results/performance.md). On the CPU the sweeps are compiled."""
    parameter = next(network.parameters(), None)
    if parameter is not None and parameter.device.type == "cuda":
        compile_passes(network)
