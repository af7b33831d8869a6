"""Samplers of ``|ψ(x)|²``: Metropolis-Hastings chains in parallel, and exact enumeration.

`MetropolisSampler` advances ``n_chains`` Markov chains together on the model's device, one
batched log ψ evaluation per proposal step. Proposals are symmetric, so a move ``x → x'``
is accepted with ``min(1, |ψ(x')/ψ(x)|²) = min(1, exp(2 Re(log ψ(x') − log ψ(x))))``.
With ``machine_pow = p ≠ 2`` the chains sample ``|ψ|^p`` instead (the acceptance uses
``p Re(...)``), and every sample carries the importance weight ``|ψ|^(2−p)``: expectation
values, gradients and S stay those of ``|ψ|²`` (`Samples.log_importance`). A peaked ``|ψ|²``,
such as a Mott insulator's, where 61% of the samples sit on one configuration and the
states of weight 1e-9..1e-5 get ~1% of them, is sampled more evenly with p < 2.
Rules (Hilbert-space sectors are conserved by construction):

- ``exchange``: pick a bond uniformly (the neighbour orders the Hamiltonian couples: order 1,
  plus order 2 when ``J2 ≠ 0``) and swap its two spins; equal spins make a rejected move.
- ``exchange_global``: swap a uniformly chosen up spin with a uniformly chosen down spin.
- ``hop``: pick an order-1 bond and a direction uniformly and move one boson along it; an
  empty source or a full target (``n_max``) makes a rejected move.
- ``auto``: ``exchange`` for spins, ``hop`` for bosons.

With ``dtype=torch.float32`` the chains run on a float32 copy of a float64 network (its
parameters copied at every call): forward passes 1.5-3x cheaper on CPU, where the GELU
(``erf``) takes ~7x longer in float64 than in float32. The chains then sample ``|ψ|²`` of the
float32 copy, whose ``log ψ`` differs by ~1e-7 relative; the kept samples get their
``log ψ`` from the float64 network, so local energies and gradients are computed in full
precision.

On a sector with no more states than a call makes proposals (the 6-site test configs, the
12,870 states of a 4×4 at S^z = 0 under 80,000 proposals) the chains walk it by table look-up
instead (`sector_walk`): one forward pass over the sector, then no network call per step;
the same random numbers give the same chains as the per-proposal path.

`ExactSampler` enumerates the sector and returns every state with weight ``|ψ|²/Σ|ψ|²``,
for full-sum expectation values on small sectors. Its local energies come from one sparse
matrix-vector product ``(Hψ)(x)/ψ(x)`` over the sector, with no further network evaluation.
For a model with symmetries it sums over one state per orbit instead (`sector_orbits`).

Across ``torch.distributed`` ranks the Metropolis sampler's ``n_samples`` and ``n_chains``
stay totals: each rank advances its share of the chains (``n_chains / world_size``, rank ``r``
holding chains ``r·share … (r+1)·share − 1``) with a generator of its own seed, and its
checkpoint state gathers every rank's chains and generators. The exact sampler's sum over the
whole sector belongs to one process.
"""

from __future__ import annotations

import copy
import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np
import scipy.sparse as sp
import torch

from vitqs.config import BOSON_RULES, RULES, SPIN_RULES, SamplerConfig
from vitqs.distributed import gather_rows, rank, reduce_sum, world_size
from vitqs.models.compiled import compile_passes, compile_seconds
from vitqs.models.precision import NetworkCopy
from vitqs.models.symmetrize import Symmetrized
from vitqs.physics.hilbert import Bosons, SpinHalf
from vitqs.physics.symmetry import sector_orbits
from vitqs.vmc.estimators import distinct_rows, evaluate_log_psi, local_energy
from vitqs.vmc.sector_walk import SectorMoves, apply_moves, sector_moves

# Rank r seeds its generator with seed + r * _RANK_SEED_STRIDE: streams far apart for the
# seeds a user picks by hand (0, 1, 42 ...), whose runs stay distinct on any number of ranks.
_RANK_SEED_STRIDE = 1_000_003


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


def _model_device_dtype(model) -> tuple[torch.device, torch.dtype]:
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

    @property
    def compile_seconds(self) -> float:
        """Seconds the first compiled forward pass took (``sampler.compile``); 0 for a
        sampler without compiled chains."""
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

    def state_dict(self) -> dict:
        """Returns what a checkpoint keeps of the sampler."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restores `state_dict` (applied at the next call); nothing where it keeps nothing."""
        return None


class MetropolisSampler(Sampler):
    """Metropolis-Hastings chains of ``|ψ|²`` that persist across parameter updates.

    Args:
        hamiltonian: gives the Hilbert space (sector) and the lattice bonds proposals use.
        n_samples: samples per call, in total over chains (and ranks); a multiple of
            ``n_chains``.
        n_chains: chains advanced in parallel, in total over ``torch.distributed`` ranks
            (a multiple of their number); ``n_chains`` is then this rank's share.
        sweep_size: proposals per chain between kept samples; default ``n_sites``.
        n_discard: thermalisation sweeps per chain at the start of every call (after each
            parameter update).
        rule: ``auto`` | ``exchange`` | ``exchange_global`` | ``hop``.
        seed: seeds the sampler's ``torch.Generator`` (chain initialisation and moves).
        dtype: precision of the network copy that computes the acceptance ratios; None: the
            model itself. The samples' ``log ψ`` always come from the model.
        machine_pow: the chains sample ``|ψ|^machine_pow`` (netket's name); samples then
            carry importance weights ``|ψ|^(2 − machine_pow)``. Default 2: ``|ψ|²``.
        bare_chains: chains on the network under a `Symmetrized` model, weighted to it.
        sector_table: on a sector with no more states than a call makes proposals, the
            chains walk it by table look-up (`sector_walk`): the same chains, one forward
            pass per call. False: a forward pass per proposal step always.
        compile: the chains run on a copy of the network whose forward passes go through
            ``torch.compile`` (`models.compiled`); ``compile_seconds`` says what the first
            pass cost.
    """

    def __init__(
        self,
        hamiltonian,
        *,
        n_samples: int = SamplerConfig.n_samples,
        n_chains: int = SamplerConfig.n_chains,
        sweep_size: int | None = SamplerConfig.sweep_size,
        n_discard: int = SamplerConfig.n_discard,
        rule: str = SamplerConfig.rule,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        machine_pow: float = SamplerConfig.machine_pow,
        bare_chains: bool = SamplerConfig.bare_chains,
        sector_table: bool = SamplerConfig.sector_table,
        compile: bool = SamplerConfig.compile,
    ):
        self.hilbert = hamiltonian.hilbert
        self.n_sites = self.hilbert.n_sites
        _check_counts(n_samples, n_chains, sweep_size, n_discard)
        self.n_ranks, self.rank = world_size(), rank()
        if n_chains % self.n_ranks:
            raise ValueError(
                f"sampler.n_chains={n_chains} must be a multiple of the number of "
                f"torch.distributed ranks ({self.n_ranks}): each rank runs an equal share"
            )
        self.n_chains_total = int(n_chains)
        self.n_chains = self.n_chains_total // self.n_ranks  # this rank's chains
        self.set_n_samples(n_samples)
        self.sweep_size = self.n_sites if sweep_size is None else int(sweep_size)
        self.n_discard = int(n_discard)
        self.rule = _resolve_rule(rule, self.hilbert)
        self._moves = _move_table(self.rule, hamiltonian)  # (n_moves, 2) int64
        self.seed = int(seed)
        self.compile = bool(compile)
        prepare = compile_passes if self.compile else None
        self._network_of_chains = NetworkCopy(dtype, key="sampler.dtype", prepare=prepare)
        self.dtype = dtype
        if not (math.isfinite(machine_pow) and machine_pow > 0):
            raise ValueError(f"sampler.machine_pow={machine_pow} must be a positive number")
        self.machine_pow = float(machine_pow)
        self.bare_chains = bool(bare_chains)
        self.sector_table = bool(sector_table)
        self._sector_terms_of, self._sector_terms = None, None  # H's elements on the sector
        self._generator: torch.Generator | None = None
        self._chains: torch.Tensor | None = None
        self._pending_state: dict | None = None

    def set_n_samples(self, n_samples: int) -> None:
        """Sets the samples per call over all ranks (a multiple of the total ``n_chains``);
        the chains carry on."""
        if int(n_samples) < 1 or int(n_samples) % self.n_chains_total:
            raise ValueError(
                f"sampler.n_samples={n_samples} must be a positive multiple of "
                f"sampler.n_chains={self.n_chains_total}"
            )
        self.n_samples = int(n_samples)
        self.n_per_chain = self.n_samples // self.n_chains_total

    @property
    def compile_seconds(self) -> float:
        """Seconds the first compiled pass of the chains' network took (tracing and
        compiling included); 0 without ``compile`` or before the first call."""
        network = self._network_of_chains.network
        return 0.0 if not self.compile or network is None else compile_seconds(network)

    def local_energy(self, hamiltonian, network, samples: Samples, chunk_size=None):
        """Returns the local energies of the samples, through ``network`` at the connected
        configurations only: the denominators ``ψ(x)`` are the samples' own ``log ψ``.
        Rounding in a float32 ``log ψ(x)`` would scale every term of ``E_loc(x)`` alike, while
        the numerators' errors partly average out over the terms.

        A sample where ψ vanishes (``log ψ = −∞``: chains on the bare network at a state
        the symmetry projection cancels; its importance weight is 0) gets ``E_loc = 0``."""
        vanishing = torch.isneginf(samples.log_psi.real)  # no host sync: the step's hot path
        # the model's own log ψ of every state of this sampler's sector (an annealed H
        # shares it): no forward pass
        if samples.sector_log_psi is not None and hamiltonian.hilbert is self.hilbert:
            e_loc = self._sector_local_energy(hamiltonian, samples.sector_log_psi)
            e_loc = e_loc[samples.sector_index]
        else:
            log_psi = torch.where(vanishing, torch.zeros_like(samples.log_psi), samples.log_psi)
            e_loc = local_energy(hamiltonian, network, samples.x, log_psi, chunk_size)
        return torch.where(vanishing, torch.zeros_like(e_loc), e_loc)

    def _sector_local_energy(self, hamiltonian, log_psi: torch.Tensor) -> torch.Tensor:
        """Returns ``E_loc(s) = Σ_t H_st ψ(t)/ψ(s)`` of every state ``(S,)`` from log ψ of
        every state: the same sum as `estimators.local_energy`, over H's non-zero elements
        (diagonal included), with every amplitude known already: no forward pass. On the
        6-site test configs this was 1.6 ms of an 8.5-ms step."""
        device = log_psi.device
        terms = self._sector_terms
        # the annealed H is another operator at each step
        if self._sector_terms_of is not hamiltonian or terms[0].device != device:
            coo = hamiltonian.to_sparse().tocoo()
            self._sector_terms = (
                torch.as_tensor(coo.row, dtype=torch.int64, device=device),
                torch.as_tensor(coo.col, dtype=torch.int64, device=device),
                torch.as_tensor(coo.data, dtype=torch.float64, device=device),
            )
            self._sector_terms_of = hamiltonian
        rows, cols, elements = self._sector_terms
        terms = elements.to(log_psi.real.dtype) * torch.exp(log_psi[cols] - log_psi[rows])
        return torch.zeros_like(log_psi).index_add_(0, rows, terms)

    def measuring(self) -> MetropolisSampler:
        return self.of_psi_squared()

    def of_psi_squared(self) -> MetropolisSampler:
        """Returns a sampler of ``|ψ|²`` itself that carries on these chains: this one when
        ``machine_pow`` is 2 and the chains run on ψ, else a shallow copy (the same
        generator) with 2 and chains on ψ."""
        if self.machine_pow == 2.0 and not self.bare_chains:
            return self
        plain = copy.copy(self)
        plain.machine_pow, plain.bare_chains = 2.0, False
        return plain

    # ---------------------------------------------------------------- state
    def _initialise(self, device: torch.device, dtype: torch.dtype):
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed + self.rank * _RANK_SEED_STRIDE)
            self._chains = None
        if self._pending_state is not None:
            if self._pending_state["generator"] is not None:  # None: chains given, no RNG state
                self._restore_generator(self._pending_state["generator"], device)
            self._chains = self._pending_state["chains"]
            self._pending_state = None
        if self._chains is None:
            self._chains = self.hilbert.random_states(self.n_chains, self._generator)
        self._chains = self._chains.to(device=device, dtype=dtype)
        self._move_index = torch.as_tensor(self._moves, device=device)

    def _restore_generator(self, state: torch.Tensor, device: torch.device) -> None:
        """Sets the chains' generator to a checkpoint's ``state``. A state of another kind
        of device's generator (a CUDA run resumed on the CPU) cannot be: the chains then go
        on from the seed, and a warning says that the resume is not the run it continues
        bit for bit; a state of this device's kind that does not load is an error."""
        if len(state) == len(self._generator.get_state()):
            try:
                self._generator.set_state(state)
            except RuntimeError as err:
                raise ValueError(
                    f"sampler state: the generator state does not load ({err})"
                ) from None
            return
        warnings.warn(
            f"the checkpoint's chain generator state ({len(state)} bytes) is of another kind "
            f"of device than {device.type}'s: the chains go on from their positions with a "
            "generator seeded anew, so the resumed run is not the one it continues bit for bit",
            RuntimeWarning,
            stacklevel=4,
        )

    def start_chains(self, chains) -> None:
        """Starts the chains from these configurations ``(n, n_sites)`` (e.g. the chains of
        an earlier run of a nearby state), taken in turn until there are ``n_chains``.

        Chains already near ``|ψ|²`` need no long thermalisation; random ones, which a
        warm-started run would otherwise begin from, feed its first steps samples of the wrong
        distribution. The generator keeps its own seed. Applied at the next call.

        Raises:
            ValueError: when a configuration is not a state of this sampler's sector.
        """
        chains = torch.as_tensor(chains, dtype=torch.float64).cpu()
        valid = self.hilbert.contains(chains)
        if chains.ndim != 2 or len(chains) == 0 or not valid.all():
            raise ValueError(
                f"start_chains: {int((~valid).sum())} of {len(chains)} configurations of shape "
                f"{tuple(chains.shape)} are not states of this sector "
                f"({self.hilbert.describe()})"
            )
        turns = torch.arange(self.n_chains_total) % len(chains)
        self._pending_state = {"chains": self._own(chains[turns]), "generator": None}

    def _own(self, chains: torch.Tensor) -> torch.Tensor:
        """Returns this rank's share of chains ``(n_chains_total, N)``."""
        return chains[self.rank * self.n_chains : (self.rank + 1) * self.n_chains]

    def state_dict(self) -> dict:
        """Returns the chains (CPU, float64) and the generator state, for checkpoints.

        Across ranks (a collective: every rank calls it) the chains of all ranks ``(n_chains
        total, N)`` and, under ``generators``, every rank's generator state.
        """
        if self._pending_state is not None:
            state = dict(self._pending_state)
        elif self._chains is None:
            state = {}
        else:
            state = {
                "chains": self._chains.detach().to("cpu", torch.float64),
                "generator": self._generator.get_state(),
            }
        if self.n_ranks == 1 or not state:  # not started: the same on every rank
            return state
        state["chains"] = gather_rows(state["chains"])
        own = state.pop("generator")
        if own is not None:  # started chains carry no generator state on any rank
            state["generators"] = gather_rows(own[None])  # (n_ranks, state bytes)
        return state

    def load_state_dict(self, state: dict):
        """Restores chains and generator state from `state_dict` (applied at the next call).

        A state written by another number of ranks restores the chains, shared out anew, and
        leaves each generator at its own seed.
        """
        if not state:
            return
        chains = torch.as_tensor(state["chains"], dtype=torch.float64)
        if chains.shape != (self.n_chains_total, self.n_sites):
            raise ValueError(
                f"sampler state holds chains of shape {tuple(chains.shape)}; this sampler has "
                f"sampler.n_chains={self.n_chains_total} on {self.n_sites} sites"
            )
        outside = int((~torch.as_tensor(self.hilbert.contains(chains))).sum())
        if outside:  # chains outside the sector would sample another space without a word
            raise ValueError(f"sampler state: {outside} chains are not states of this sector")
        generators = state.get("generators")
        if generators is None and self.n_ranks == 1:
            generator = state.get("generator")
        elif generators is not None and len(generators) == self.n_ranks:
            # a copy of its own: Generator.set_state reads a row view from the storage's
            # start, whatever the view's offset (torch 2.13 crashes on rank 1's row)
            generator = torch.as_tensor(generators[self.rank], dtype=torch.uint8).clone()
        else:
            generator = None
        if generator is not None and (generator.dtype != torch.uint8 or generator.ndim != 1):
            raise ValueError("sampler state: the generator state is not a byte vector")
        if generator is not None and len(generator) == len(torch.Generator().get_state()):
            try:  # a CPU generator's state: checked now, while a bad one is still a clean error
                torch.Generator().set_state(generator)
            except RuntimeError as err:
                raise ValueError(
                    f"sampler state: the generator state does not load ({err})"
                ) from None
        self._pending_state = {"chains": self._own(chains), "generator": generator}
        if self._generator is not None:
            self._initialise(self._generator.device, self._chains.dtype)

    # ------------------------------------------------------------- sampling
    @torch.no_grad()
    def sample(self, model, n_discard: int | None = None) -> Samples:
        """Returns `Samples` ``(n_chains, n_per_chain, N)`` drawn from ``|ψ|^machine_pow``
        of ``model`` (``|ψ|²`` by default).

        Runs ``n_discard`` sweeps, then keeps the chain states after each further sweep of
        ``sweep_size`` proposals. The chains' final states carry over to the next call.

        Args:
            model: ``(B, N) -> log ψ (B,)``.
            n_discard: overrides the thermalisation sweeps for this call (e.g. 0 to
                continue chains with unchanged parameters).
        """
        device, dtype = _model_device_dtype(model)
        self._initialise(device, dtype)
        n_discard = self.n_discard if n_discard is None else n_discard
        # bare chains: on the network under a symmetry average, n_copies times cheaper
        chained = model.model if self.bare_chains and isinstance(model, Symmetrized) else model
        n_proposals = self.n_chains * self.sweep_size * (n_discard + self.n_per_chain)
        sector_log_psi = sector_index = None
        if self._walks_sector(n_proposals):
            # a sector no larger than the kept samples is tabled by the network itself: one
            # forward pass, where the copy's would be followed by the samples' own
            small = self.hilbert.dimension <= self.n_chains * self.n_per_chain
            network = chained if small else self._network_of_chains(chained)
            samples_x, chain_log_psi, accepted, table = self._walk_sector(network, n_discard)
            if network is model:  # the model's own log ψ of every state: local energies too
                sector_log_psi, sector_index = table
        else:
            network = self._network_of_chains(chained)
            samples_x, chain_log_psi, accepted = self._run_chains(network, n_discard)
        samples_log_psi = chain_log_psi  # of the network the chains ran on
        if network is not model:  # the kept samples' log ψ from the model itself
            flat = samples_x.reshape(-1, self.n_sites)
            samples_log_psi = _log_psi_of_distinct(model, flat).reshape(samples_x.shape[:2])
        counts = torch.stack(
            [accepted.to(torch.float64), torch.tensor(float(n_proposals), device=device)]
        )
        total = reduce_sum(counts)
        acceptance = float(total[0] / total[1])  # the one host-device sync of the call
        log_importance = None
        if chained is not model:  # the chains drew |φ|^p of their own network: weigh |ψ|²/|φ|^p
            log_importance = 2.0 * samples_log_psi.real.to(torch.float64)
            log_importance -= self.machine_pow * chain_log_psi.real.to(torch.float64)
        elif self.machine_pow != 2.0:
            log_importance = (2.0 - self.machine_pow) * samples_log_psi.real.to(torch.float64)
        return Samples(
            samples_x,
            samples_log_psi,
            None,
            acceptance,
            log_importance,
            sector_log_psi,
            sector_index,
        )

    def _run_chains(self, network, n_discard: int):
        """Advances the chains ``n_discard`` sweeps, then keeps their states after each of
        ``n_per_chain`` sweeps; returns the kept configurations ``(C, n_per_chain, N)``, their
        log ψ under ``network`` and the number of accepted moves (a 0-d tensor)."""
        x = self._chains
        log_psi = evaluate_log_psi(network, x)  # cached for the current chain states
        accepted = torch.zeros((), dtype=torch.int64, device=x.device)
        # chains that share their configurations propose the same moves: evaluate each
        # distinct proposal once (worth its cost only then; decided from the chain states)
        distinct = x.device.type == "cpu" and 2 * distinct_rows(x).n_distinct < self.n_chains
        step = partial(self._metropolis_step, network, distinct=distinct)
        kept = (self.n_chains, self.n_per_chain)
        samples_x = torch.empty((*kept, self.n_sites), dtype=x.dtype, device=x.device)
        samples_log_psi = torch.empty(kept, dtype=log_psi.dtype, device=x.device)
        for sweep in range(n_discard + self.n_per_chain):
            picks, log_u = self._sweep_draws(x.device)
            for t in range(self.sweep_size):
                x, log_psi, accepted = step(x, log_psi, accepted, picks[t], log_u[t])
            if sweep >= n_discard:
                samples_x[:, sweep - n_discard] = x
                samples_log_psi[:, sweep - n_discard] = log_psi
        self._chains = x
        return samples_x, samples_log_psi, accepted

    def _sweep_draws(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns one sweep's random numbers, each ``(sweep_size, n_chains)``: the move each
        chain picks at each step and the log of the uniform its acceptance test compares.
        Both paths draw them so (a sweep's picks, then its uniforms), and so make the same
        chains; one draw per sweep, not two per step, spares the table walk most of its ops."""
        shape = (self.sweep_size, self.n_chains)
        picks = torch.randint(len(self._moves), shape, generator=self._generator, device=device)
        log_u = torch.rand(shape, generator=self._generator, device=device).log_()
        return picks, log_u

    def _walks_sector(self, n_proposals: int) -> bool:
        """Returns whether this call's chains walk the sector by table look-up: the sector
        has no more states than the call makes proposals (one forward pass over it then
        costs less than theirs) and its move table fits `sector_walk.MAX_TABLE_ENTRIES`."""
        if not self.sector_table or self.rule == "exchange_global":
            return False
        return self.hilbert.dimension <= n_proposals and self._sector is not None

    @cached_property
    def _sector(self) -> SectorMoves | None:
        return sector_moves(self.hilbert, self._moves, self.rule)

    def _walk_sector(self, network, n_discard: int):
        """`_run_chains` by table look-up (sector_walk.py): the same proposals and
        acceptance tests from the same random numbers, the log ψ of every state from one
        forward pass over the sector. Returns `_run_chains`' three values and the table:
        log ψ of every state ``(S,)`` and the kept samples' states ``(C, n_per_chain)``.

        The walk itself runs in numpy on the host, whatever the device: a step is a few
        gathers on ``n_chains`` integers, ~1 µs each there against ~10 µs a torch op."""
        device, dtype = self._chains.device, self._chains.dtype
        states = self._sector.states.to(device=device, dtype=dtype)  # (S, N)
        targets = self._sector.targets.numpy()  # (S, n_moves), −1: an invalid move
        log_psi = evaluate_log_psi(network, states)  # (S,)
        # entry −1 (an invalid move's target) weighs nothing: log u < −inf is never true
        log_weight = (
            torch.cat([self.machine_pow * log_psi.real, log_psi.real.new_full((1,), -math.inf)])
            .cpu()
            .numpy()
        )
        index = self.hilbert.state_index(self._chains)  # (C,)
        weight = log_weight[index]  # of each chain's state
        accepted = np.zeros(len(index), dtype=np.int64)  # per chain
        kept = np.empty((len(index), self.n_per_chain), dtype=np.int64)
        with np.errstate(invalid="ignore"):  # −inf − (−inf): a chain where ψ = 0, rejected
            for sweep in range(n_discard + self.n_per_chain):
                picks, log_u = (draw.cpu().numpy() for draw in self._sweep_draws(device))
                for t in range(self.sweep_size):
                    target = targets[index, picks[t]]
                    target_weight = log_weight[target]
                    accept = log_u[t] < target_weight - weight  # NaN ratios compare False
                    accepted += accept
                    index = np.where(accept, target, index)
                    weight = np.where(accept, target_weight, weight)
                if sweep >= n_discard:
                    kept[:, sweep - n_discard] = index
        kept = torch.as_tensor(kept, device=device)
        self._chains = states[torch.as_tensor(index, device=device)]
        n_accepted = torch.as_tensor(int(accepted.sum()), device=device)
        return states[kept], log_psi[kept], n_accepted, (log_psi, kept)

    def _metropolis_step(self, model, x, log_psi, accepted, pick, log_u, *, distinct=False):
        x_new, valid = self._propose(x, pick)
        log_psi_new = self._log_psi_of_valid(model, x_new, valid, log_psi, distinct)
        log_ratio = self.machine_pow * (log_psi_new - log_psi).real
        accept = valid & (log_u < log_ratio)  # NaN ratios compare False: rejected
        x = torch.where(accept[:, None], x_new, x)
        log_psi = torch.where(accept, log_psi_new, log_psi)
        return x, log_psi, accepted + accept.sum()

    def _propose(self, x: torch.Tensor, pick: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns proposed configurations ``(C, N)`` and whether each move is valid ``(C,)``:
        chain c makes move ``pick[c]`` (``exchange_global`` draws its own pair)."""
        if self.rule == "exchange_global":
            return _propose_exchange_global(x, self._generator, self.hilbert)
        src, dst = self._move_index[pick, 0:1], self._move_index[pick, 1:2]  # (C, 1) each
        return apply_moves(x, src, dst, self.rule, getattr(self.hilbert, "n_max", None))

    @staticmethod
    def _log_psi_of_valid(model, x_new, valid, log_psi, distinct=False):
        """Returns log ψ of the proposals ``(C,)``; rows of invalid moves keep ``log_psi``.

        On CPU only the valid proposals go through the network (an exchange of two equal
        spins or a hop from an empty site is rejected anyway; about half the proposals near
        a Néel-like state), so the forward pass shrinks with them; with ``distinct``, only
        the distinct ones (in a Mott insulator most chains sit on the uniform filling and
        propose the same few hops). On other devices every proposal is evaluated:
        compacting would need the count of valid moves on the host, a device sync per
        Metropolis step.
        """
        if x_new.device.type != "cpu":
            return evaluate_log_psi(model, x_new)
        rows = valid.nonzero()[:, 0]  # (V,)
        if distinct:
            log_psi_new = _log_psi_of_distinct(model, x_new[rows])  # (V,)
            return log_psi.index_put((rows,), log_psi_new.to(log_psi.dtype))
        if len(rows) == len(valid):
            return evaluate_log_psi(model, x_new)
        return log_psi.index_put((rows,), evaluate_log_psi(model, x_new[rows]).to(log_psi.dtype))


def _log_psi_of_distinct(model, x: torch.Tensor) -> torch.Tensor:
    """Returns log ψ ``(B,)`` of configurations ``(B, N)``, evaluating each distinct one once."""
    rows = distinct_rows(x)
    return evaluate_log_psi(model, rows.x)[rows.inverse]


def _propose_exchange_global(x, generator, hilbert):
    # Argmax of iid uniform keys over a set picks a uniform member; up and down sets are
    # disjoint, so the two picks are independent: probability 1/(n_up n_down) both ways.
    keys = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float64)
    up = keys.masked_fill(x < 0, -1.0).argmax(dim=1, keepdim=True)  # (C, 1)
    down = keys.masked_fill(x > 0, -1.0).argmax(dim=1, keepdim=True)
    x_new = x.scatter(1, up, -1.0).scatter_(1, down, 1.0)
    has_pair = 0 < hilbert.n_up < hilbert.n_sites
    valid = torch.full((x.shape[0],), has_pair, dtype=torch.bool, device=x.device)
    return x_new, valid


def _check_counts(n_samples, n_chains, sweep_size, n_discard):
    for key, value in (("n_samples", n_samples), ("n_chains", n_chains)):
        if int(value) != value or value < 1:
            raise ValueError(f"sampler.{key}={value} must be a positive integer")
    if n_samples % n_chains:
        raise ValueError(
            f"sampler.n_samples={n_samples} must be a multiple of sampler.n_chains={n_chains}"
        )
    if sweep_size is not None and (int(sweep_size) != sweep_size or sweep_size < 1):
        raise ValueError(f"sampler.sweep_size={sweep_size} must be a positive integer")
    if int(n_discard) != n_discard or n_discard < 0:
        raise ValueError(f"sampler.n_discard={n_discard} must be an integer >= 0")


def _resolve_rule(rule: str, hilbert) -> str:
    if rule not in RULES:
        raise ValueError(f"sampler.rule={rule!r} is not one of {list(RULES)}")
    is_spin = isinstance(hilbert, SpinHalf)
    allowed = SPIN_RULES if is_spin else BOSON_RULES
    if rule == "auto":
        return allowed[0]
    if rule not in allowed:
        kind = "spin" if is_spin else "boson"
        raise ValueError(
            f"sampler.rule={rule!r} does not apply to a {kind} model; use {list(allowed)}"
        )
    return rule


def _move_table(rule: str, hamiltonian) -> np.ndarray:
    """Returns the site pairs ``(n_moves, 2)`` a move picks from: bonds, or directed bonds."""
    lattice = hamiltonian.lattice
    if rule == "exchange_global":
        return np.zeros((1, 2), dtype=np.int64)  # unused
    bonds = lattice.bonds(1)
    if rule == "exchange" and getattr(hamiltonian, "J2", 0.0) != 0.0:
        bonds = np.concatenate([bonds, lattice.bonds(2)])
    if rule == "hop":
        bonds = np.concatenate([bonds, bonds[:, ::-1]])  # both directions
    if len(bonds) == 0:
        raise ValueError(
            f"sampler.rule={rule!r} needs lattice bonds; shape={list(lattice.shape)} has none"
        )
    return np.ascontiguousarray(bonds, dtype=np.int64)


class ExactSampler(Sampler):
    """Full enumeration of the sector: every state with weight ``|ψ(x)|² / Σ_x |ψ(x)|²``.

    With ``symmetry``, the model's symmetry group, a sum over the sector is a sum over its
    orbits: ψ, the local energy and the log-derivatives are the same on every state of an
    orbit (up to the character, which cancels in all three), so one representative per
    orbit with weight ``size · |ψ|²`` gives the same sums, the natural gradient included,
    at a fraction of the cost (32× fewer states for translations and spin inversion on
    4×4). Quantities that are not invariant (site-resolved observables) need the whole
    sector: `unreduced`.

    Args:
        hilbert: a Hilbert space with ``all_states()``.
        chunk_size: states per forward pass; None for one pass.
        symmetry: ``(permutations, spin_flip)`` under which ψ is invariant for every
            parameter value (`models.symmetrize.invariances`), or None: every state.
    """

    def __init__(
        self,
        hilbert: SpinHalf | Bosons,
        chunk_size: int | None = SamplerConfig.chunk_size,
        symmetry=None,
    ):
        if world_size() > 1:  # every rank would sum the whole sector, and reductions add them
            raise ValueError(
                f"sampler.kind=full_sum sums the whole sector in one process; it does not run "
                f"across {world_size()} torch.distributed ranks (start it without torchrun)"
            )
        self.hilbert = hilbert
        self.n_sites = hilbert.n_sites
        self.n_chains, self.n_discard = 1, 0
        self.chunk_size = chunk_size
        self.symmetry = symmetry
        states = hilbert.all_states()
        self.orbits = None if symmetry is None else sector_orbits(hilbert, *symmetry)
        if self.orbits is not None:
            states = states[self.orbits.representatives]
            self._log_sizes = torch.as_tensor(np.log(self.orbits.sizes), dtype=torch.float64)
        self.n_samples = self.n_per_chain = len(states)  # the states each sum runs over
        self._states_np = states
        self._states: torch.Tensor | None = None
        self._matrix, self._matrix_of = None, None

    exact = True

    @property
    def reduced(self) -> bool:
        return self.orbits is not None

    def n_batches(self, n_samples: int) -> int:
        return 1  # every call is the whole sector

    def discard_before(self, n_samples: int, n_discard: int | None = None) -> int:
        return 0  # no chain to thermalise

    def measuring(self) -> ExactSampler:
        return self.unreduced()

    def amplitudes(self, samples: Samples) -> np.ndarray | None:
        if self.reduced:
            return None
        log_psi = samples.log_psi.reshape(-1).cpu().numpy().astype(np.complex128)
        return np.exp(log_psi - log_psi.real.max())

    def local_energy(self, hamiltonian, network, samples: Samples, chunk_size=None):
        """Returns the local energies from one sparse product over the sector
        (`sector_local_energy`): no ``network`` is needed, every amplitude is known already."""
        return self.sector_local_energy(hamiltonian, samples.log_psi)

    def unreduced(self) -> ExactSampler:
        """Returns the sampler of every state of the sector (itself when not reduced)."""
        return ExactSampler(self.hilbert, self.chunk_size) if self.reduced else self

    def check_symmetry(self, model, n_states: int = 8, tolerance: float = 1e-8) -> None:
        """Raises ValueError unless ``ψ(g x) = χ(g) ψ(x)`` holds (to ``tolerance`` of the
        largest amplitude) for the group of ``symmetry`` on ``n_states`` states of the sector:
        a sum over orbits is wrong otherwise."""
        if not self.reduced:
            return
        permutations, spin_flip = self.symmetry
        device, dtype = _model_device_dtype(model)
        states = self._states_np  # one per orbit: any states will do for the check
        pick = np.linspace(0, len(states) - 1, min(n_states, len(states))).astype(np.int64)
        x = torch.as_tensor(states[pick], dtype=dtype, device=device)
        images = [(x[:, perm], 1) for perm in torch.as_tensor(np.asarray(permutations))]
        if spin_flip:
            images.append((-x, spin_flip))
        with torch.no_grad():
            log_psi = evaluate_log_psi(model, x, self.chunk_size)
            shift = log_psi.real.max()  # compare amplitudes relative to the largest: where
            psi = torch.exp(log_psi - shift)  # the symmetry forces ψ = 0, ratios are noise
            for x_g, character in images:
                psi_g = torch.exp(evaluate_log_psi(model, x_g, self.chunk_size) - shift)
                if float((psi_g - character * psi).abs().max()) > tolerance:
                    raise ValueError(
                        "sampler.sum_over_orbits: the model is not invariant under its "
                        "symmetry group (lattice symmetries, spin inversion); set "
                        "sampler.sum_over_orbits: false"
                    )

    @torch.no_grad()
    def sample(self, model, n_discard: int | None = None) -> Samples:
        """Returns all states (or one per orbit) ``(1, D, N)``, log ψ, and weights ``(1, D)``."""
        device, dtype = _model_device_dtype(model)
        if self._states is None or self._states.device != device or self._states.dtype != dtype:
            self._states = torch.as_tensor(self._states_np, dtype=dtype, device=device)
        log_psi = evaluate_log_psi(model, self._states, self.chunk_size)
        log_weights = 2 * log_psi.real.to(torch.float64)
        if self.reduced:
            log_weights = log_weights + self._log_sizes.to(log_weights.device)
        weights = torch.softmax(log_weights, dim=0)
        return Samples(self._states[None], log_psi[None], weights[None], math.nan)

    def sector_local_energy(self, hamiltonian, log_psi: torch.Tensor) -> torch.Tensor:
        """Returns ``E_loc(x) = (Hψ)(x) / ψ(x)`` for every state, shaped like ``log_psi``.

        ``log_psi`` holds log ψ over the whole sector in ``all_states()`` order (as `sample`
        returns it), so the amplitudes of all connected states are already known: one CSR
        matvec replaces the ``max_conn`` network evaluations per state of `local_energy`.
        Over orbits, the matrix is ``H`` folded onto the representatives (`_folded`).
        States whose weight underflows (``|ψ(x)|² / max|ψ|² < e^-600``) get ``H_xx``; their
        weight is zero to double precision, and ``Hψ/ψ`` there is not representable.
        """
        if hamiltonian.hilbert.dimension != self.hilbert.dimension:
            raise ValueError(
                f"the hamiltonian's sector has {hamiltonian.hilbert.dimension} states, "
                f"the sampler's {self.hilbert.dimension}"
            )
        if self._matrix_of is not hamiltonian:
            matrix = hamiltonian.to_sparse()
            self._matrix = self._folded(matrix) if self.reduced else matrix
            self._matrix_of = hamiltonian
        log_amp = log_psi.detach().reshape(-1).cpu().numpy().astype(np.complex128)
        log_amp = log_amp - log_amp.real.max()
        negligible = log_amp.real < -300.0
        psi = np.exp(np.where(negligible, 0.0, log_amp))
        psi[negligible] = 0.0
        e_loc = self._matrix @ psi
        e_loc[~negligible] /= psi[~negligible]
        e_loc[negligible] = self._matrix.diagonal()[negligible]
        return (
            torch.as_tensor(e_loc, device=log_psi.device).to(log_psi.dtype).reshape(log_psi.shape)
        )

    def _folded(self, matrix: sp.csr_matrix) -> sp.csr_matrix:
        """Returns ``H̃ (R, R)`` with ``(Hψ)(r) = Σ_s H̃[r, s] ψ(s)`` over representatives:
        ``H̃ = (H C)[representatives]``, ``C[x, o(x)] = character[x]`` spreads ψ onto the sector."""
        orbits = self.orbits
        on = orbits.orbit >= 0
        spread = sp.csr_matrix(
            (orbits.character[on].astype(np.float64), (np.flatnonzero(on), orbits.orbit[on])),
            shape=(self.hilbert.dimension, len(orbits.representatives)),
        )
        return (matrix[orbits.representatives] @ spread).tocsr()
