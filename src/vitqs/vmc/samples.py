"""What a sampler gives and what every sampler answers: `Samples` (configurations with their
chain structure, log ψ and weights) and the `Sampler` interface of Metropolis chains
(`sampler.MetropolisSampler`) and exact sums (`exact_sampler.ExactSampler`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Samples:
    """Configurations with chain structure, their log ψ, and exact weights if any.

    Attributes:
        x: configurations ``(n_chains, n_per_chain, N)``, the model's floating dtype.
        log_psi: complex ``log ψ(x)`` ``(n_chains, n_per_chain)``.
        weights: ``(n_chains, n_per_chain)`` summing to 1 (exact sampler), or None for
            Monte Carlo samples of equal weight.
        acceptance: fraction of accepted proposals in this call (NaN for exact samples).
        log_importance: ``(n_chains, n_per_chain)`` float64 ``(2 − p) Re log ψ`` for Monte
            Carlo samples of ``|ψ|^p`` (``machine_pow = p``): the log of each sample's
            unnormalised weight (`estimators.importance_weights`); None for samples of
            ``|ψ|²``.
        sector_log_psi: ``(S,)`` log ψ of every state of the sector, in ``all_states``
            order, when the chains walked a sector the model itself tabled (`sector_walk`):
            then the local energies need no further forward pass. None otherwise.
        sector_index: ``(n_chains, n_per_chain)`` int64, each sample's state in that
            order; None without ``sector_log_psi``.
    """

    x: torch.Tensor
    log_psi: torch.Tensor
    weights: torch.Tensor | None = None
    acceptance: float = math.nan
    log_importance: torch.Tensor | None = None
    sector_log_psi: torch.Tensor | None = None
    sector_index: torch.Tensor | None = None

    @property
    def n_chains(self) -> int:
        return self.x.shape[0]

    @property
    def n_per_chain(self) -> int:
        return self.x.shape[1]

    @property
    def n_samples(self) -> int:
        return self.n_chains * self.n_per_chain


def model_device_dtype(model) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters(), None)
    if param is None:
        return torch.device("cpu"), torch.float64
    return param.device, param.dtype


class Sampler(ABC):
    """What the VMC loop, the final measurement and the checkpoints ask of a sampler: the one
    interface of Monte Carlo chains (`MetropolisSampler`) and exact sums (`ExactSampler`).
    A subclass draws (`sample`) and measures (`local_energy`); the rest has the behaviour of
    a sampler without chains unless a subclass says otherwise.

    Attributes:
        hilbert: the sector sampled.
        n_samples: samples per call over all ranks (for exact sums: the states summed over).
        n_chains: chains on this rank (1 for exact sums: one "chain" holds the sector).
        n_per_chain: samples each chain keeps per call.
        n_discard: sweeps per chain before a call keeps samples (0 for exact sums).
        exact: the samples are the whole sector (or one state per orbit) with weights
            ``|ψ|²/Σ|ψ|²``: the sums are exact, no sample carries noise.
    """

    exact: bool = False

    @abstractmethod
    def sample(self, model, n_discard: int | None = None) -> Samples:
        """Returns one batch of `Samples` of ``|ψ|²`` (or of ``|ψ|^machine_pow``)."""

    @abstractmethod
    def local_energy(self, hamiltonian, network, samples: Samples, chunk_size=None):
        """Returns the local energies ``(n_chains, n_per_chain)`` of ``samples``; ``network``
        evaluates ψ at the connected configurations (the model, or its float32 copy)."""

    def set_n_samples(self, n_samples: int) -> None:
        """Sets the samples per call from now on; a sampler
        whose every call covers the same states keeps them."""
        return None

    # whether the chains' network goes through torch.compile (`build.compiled_chains`)
    compiled = False

    @property
    def compile_seconds(self) -> float:
        """Seconds the first compiled forward pass took; 0 for a sampler without compiled
        chains."""
        return 0.0

    def start_chains(self, chains) -> None:
        """Starts the chains from these configurations ``(n, n_sites)`` (``model.init_from``);
        nothing for a sampler without chains."""
        return None

    def measuring(self) -> Sampler:
        """Returns the sampler of the final measurement: of ``|ψ|²`` itself, over every state
        of the sector (site-resolved observables are not invariant under the symmetries)."""
        return self

    def amplitudes(self, samples: Samples) -> np.ndarray | None:
        """Returns ψ over the whole sector in ``all_states`` order, complex128 and scaled to
        a largest amplitude of 1, when ``samples`` hold every state; else None."""
        return None

    def n_batches(self, n_samples: int) -> int:
        """Returns the calls of `sample` that `draw` makes for ``n_samples`` samples."""
        return math.ceil(n_samples / self.n_samples)

    def discard_before(self, n_samples: int, n_discard: int | None = None) -> int:
        """Returns the sweeps each chain makes before a measurement of ``n_samples`` keeps
        samples: ``n_discard`` when given, else as many as each chain then keeps (half of
        every chain is thrown away, whatever distribution the chains came from), at least the
        sampler's own ``n_discard``."""
        if n_discard is not None:
            return n_discard
        kept = self.n_batches(n_samples) * self.n_per_chain  # one per sweep
        return max(self.n_discard, kept)

    def draw(self, model, n_samples: int | None = None, n_discard: int | None = None) -> Samples:
        """Returns at least ``n_samples`` samples, joined along each chain.

        Draws `n_batches` batches: the first after ``n_discard`` sweeps per chain (None: the
        sampler's ``n_discard``), the later ones continuing the chains without discarding.
        """
        n_samples = self.n_samples if n_samples is None else n_samples
        batches = [
            self.sample(model, n_discard=n_discard if b == 0 else 0)
            for b in range(self.n_batches(n_samples))
        ]
        return joined(batches)

    def state_dict(self) -> dict:
        """Returns what a checkpoint keeps of the sampler."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict` (applied at the next call); nothing where it keeps nothing."""
        return None


def joined(batches: list[Samples]) -> Samples:
    """Returns batches of the same chains (drawn one after the other, with the same
    parameters) as one `Samples`, joined along each chain."""
    if len(batches) == 1:
        return batches[0]
    tabled = all(s.sector_log_psi is not None for s in batches)
    return Samples(
        x=torch.cat([s.x for s in batches], dim=1),
        log_psi=torch.cat([s.log_psi for s in batches], dim=1),
        weights=None,
        acceptance=sum(s.acceptance for s in batches) / len(batches),
        log_importance=None
        if batches[0].log_importance is None
        else torch.cat([s.log_importance for s in batches], dim=1),
        # the same parameters in every batch: one table holds every sample's log ψ
        sector_log_psi=batches[0].sector_log_psi if tabled else None,
        sector_index=torch.cat([s.sector_index for s in batches], dim=1) if tabled else None,
    )


class ModelItself:
    """Chains on the model itself, in its own dtype: what a sampler runs without a chain
    network (`models.chains.ChainNetwork` holds the float32, compiled and bare choices)."""

    bare = compile = False
    compile_seconds = 0.0

    def sampled(self, model):
        return model

    def evaluating(self, network):
        return network

    def of_psi(self):
        return self
