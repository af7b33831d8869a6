"""The state of Metropolis chains: where they start, what a checkpoint keeps of them and how
it is restored, on one rank or across ``torch.distributed`` ranks (`MetropolisSampler`).

Across ranks a checkpoint gathers every rank's chains and generator state; a state written
by another number of ranks restores the chains, shared out anew, and leaves each generator
at its own seed.
"""

from __future__ import annotations

import warnings

import torch

from vitqs.distributed import gather_rows

# Rank r seeds its generator with seed + r * RANK_SEED_STRIDE: streams far apart for the
# seeds a user picks by hand (0, 1, 42 ...), whose runs stay distinct on any number of ranks.
RANK_SEED_STRIDE = 1_000_003


class ChainState:
    """The chains' positions and generator, for `MetropolisSampler` (which sets ``hilbert``,
    ``n_sites``, ``n_chains`` (this rank's), ``n_chains_total``, ``n_ranks``, ``rank`` and
    ``seed``): started at the first call, restored from checkpoints, applied lazily."""

    _generator: torch.Generator | None = None
    _chains: torch.Tensor | None = None
    _pending_state: dict | None = None

    def _initialise(self, device: torch.device, dtype: torch.dtype):
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed + self.rank * RANK_SEED_STRIDE)
            self._chains = None
        if self._pending_state is not None:
            if self._pending_state["generator"] is not None:  # None: chains given, no RNG state
                self._restore_generator(self._pending_state["generator"], device)
            self._chains = self._pending_state["chains"]
            self._pending_state = None
        if self._chains is None:
            self._chains = self.hilbert.random_states(self.n_chains, self._generator)
        self._chains = self._chains.to(device=device, dtype=dtype)

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
