"""Metropolis-Hastings chains of ``|ψ(x)|²`` in parallel.

`MetropolisSampler` advances ``n_chains`` Markov chains together on the model's device, one
batched log ψ evaluation per proposal step; a symmetric move ``x → x'`` is accepted with
``min(1, exp(p Re(log ψ(x') − log ψ(x))))``, ``p = machine_pow`` (2: ``|ψ|²``). For ``p ≠ 2``
every sample carries the importance weight ``|ψ|^(2−p)``, so estimates stay those of ``|ψ|²``
(`Samples.log_importance`): a peaked ``|ψ|²``, such as a Mott insulator's (61% of the
samples on one configuration), is sampled more evenly with p < 2.

The moves are a `rules` object (exchange for spins, hop for bosons). The network the chains sample
and the copy that evaluates it (float32, compiled; the bare network under a symmetry average)
come from a chain network built once with the sampler (`models.chains.ChainNetwork`,
`build.build_sampler`): the chains of a float32 copy sample ``|ψ|²`` of that copy, whose
``log ψ`` differs by ~1e-7 relative, and the kept samples get their ``log ψ`` from the model
itself, so local energies and gradients are computed in full precision.

On a sector with no more states than a call makes proposals (the 6-site test configs, the
12,870 states of a 4×4 at S^z = 0 under 80,000 proposals) the chains walk it by table look-up
instead (`sector_walk`): one forward pass over the sector, then no network call per step;
the same random numbers give the same chains as the per-proposal path.

Compiled chains of a bond rule on a ViT take a sweep's steps through compiled graphs
(`compiled_sweep`): the same moves from the same random numbers, several times fewer
operator calls. Their positions and generator, and what a checkpoint keeps of them, are
`chain_state.ChainState`'s.

Exact sums over the sector are `exact_sampler.ExactSampler`, behind the same interface.

Across ``torch.distributed`` ranks the Metropolis sampler's ``n_samples`` and ``n_chains``
stay totals: each rank advances its share of the chains (``n_chains / world_size``, rank ``r``
holding chains ``r·share … (r+1)·share − 1``) with a generator of its own seed, and its
checkpoint state gathers every rank's chains and generators.
"""

from __future__ import annotations

import copy
import math
from functools import cached_property, partial

import torch

from vitqs.config import SamplerConfig
from vitqs.distributed import rank, reduce_sum, world_size
from vitqs.vmc.chain_state import ChainState
from vitqs.vmc.compiled_sweep import CompiledSweeps
from vitqs.vmc.estimators import distinct_rows, evaluate_log_psi, local_energy
from vitqs.vmc.rules import BondRule, proposal_rule
from vitqs.vmc.samples import ModelItself, Sampler, Samples, model_device_dtype
from vitqs.vmc.sector_walk import SectorMoves, walk

# Chains from which a Metropolis step passes only the valid proposals through the network
# (CPU). Below it the pass costs about the same for fewer rows, and picking them out (the
# valid rows' indices, a gather, a scatter back) mostly costs more than the rows it saves. A
# step's evaluation compacted, over all rows (one thread): 1.14x at 16 chains for issue 51's
# small config (a 1-layer ViT, d_model 8, chain of 16), 1.10x for the 6x6 recipe's network,
# 0.91x for the J1-J2 4x4 recipe's; 0.78-1.03x at 32-64 chains, 0.76-0.81x at 128-256
# (results/history/performance_notes.md, 2026-12-08).
COMPACT_FROM = 32


class MetropolisSampler(ChainState, Sampler):
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
        rule: the proposal rule, an object of `rules`; None: the Hamiltonian's
            (`rules.proposal_rule`: exchange for spins, hop for bosons).
        seed: seeds the sampler's ``torch.Generator`` (chain initialisation and moves).
        chains: which network the chains sample and which copy evaluates it
            (`models.chains.ChainNetwork`: float32, compiled, bare under a symmetry
            average); None: the model itself. The samples' ``log ψ`` always come from the
            model, and samples of a bare network carry the importance weights back to it.
        machine_pow: the chains sample ``|ψ|^machine_pow`` (netket's name); samples then
            carry importance weights ``|ψ|^(2 − machine_pow)``. Default 2: ``|ψ|²``.
        sector_table: on a sector with no more states than a call makes proposals, the
            chains walk it by table look-up (`sector_walk`): the same chains, one forward
            pass per call. False: a forward pass per proposal step always.
    """

    def __init__(
        self,
        hamiltonian,
        *,
        n_samples: int = SamplerConfig.n_samples,
        n_chains: int = SamplerConfig.n_chains,
        sweep_size: int | None = None,
        n_discard: int = SamplerConfig.n_discard,
        rule=None,
        seed: int = 0,
        chains=None,
        machine_pow: float = SamplerConfig.machine_pow,
        sector_table: bool = True,
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
        self.rule = proposal_rule(hamiltonian) if rule is None else rule
        self.seed = int(seed)
        self.chains = ModelItself() if chains is None else chains
        if not (math.isfinite(machine_pow) and machine_pow > 0):
            raise ValueError(f"sampler.machine_pow={machine_pow} must be a positive number")
        self.machine_pow = float(machine_pow)
        self.sector_table = bool(sector_table)
        self._sector_terms_of, self._sector_terms = None, None  # H's elements on the sector
        self._generator: torch.Generator | None = None
        self._chains: torch.Tensor | None = None
        self._pending_state: dict | None = None
        self._sweeps: CompiledSweeps | None = None  # compiled chains of a bond rule

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
    def compiled(self) -> bool:
        return self.chains.compile

    @property
    def compile_seconds(self) -> float:
        """Seconds the first compiled graphs of the chains took (tracing and compiling
        included); 0 without compiled chains or before the first call."""
        sweeps = 0.0 if self._sweeps is None else self._sweeps.seconds or 0.0
        return self.chains.compile_seconds + sweeps

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
        if self.machine_pow == 2.0 and not self.chains.bare:
            return self
        plain = copy.copy(self)
        plain.machine_pow, plain.chains = 2.0, self.chains.of_psi()
        return plain

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
        device, dtype = model_device_dtype(model)
        self._initialise(device, dtype)
        n_discard = self.n_discard if n_discard is None else n_discard
        # bare chains: on the network under a symmetry average, n_copies times cheaper
        chained = self.chains.sampled(model)
        n_proposals = self.n_chains * self.sweep_size * (n_discard + self.n_per_chain)
        sector_log_psi = sector_index = None
        if self._walks_sector(n_proposals):
            # a sector no larger than the kept samples is tabled by the network itself: one
            # forward pass, where the copy's would be followed by the samples' own
            small = self.hilbert.dimension <= self.n_chains * self.n_per_chain
            network = chained if small else self.chains.evaluating(chained)
            samples_x, chain_log_psi, accepted, table = self._walk_sector(network, n_discard)
            if network is model:  # the model's own log ψ of every state: local energies too
                sector_log_psi, sector_index = table
        else:
            network = self.chains.evaluating(chained)
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
        sweeps = self._compiled_sweeps(network)
        if sweeps is None:
            log_psi = evaluate_log_psi(network, x)  # cached for the current chain states
        else:  # the same pass in real arithmetic as the sweeps' graphs run
            log_psi = _log_psi_in_parts(network, x)
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
            swept = None
            if sweeps is not None and not sweeps.failed:
                swept = sweeps.sweep(network, x, log_psi, picks, log_u, self.machine_pow)
            if swept is not None:
                x, log_psi, n_accepted = swept
                accepted = accepted + n_accepted
            else:
                for t in range(self.sweep_size):
                    x, log_psi, accepted = step(x, log_psi, accepted, picks[t], log_u[t])
            if sweep >= n_discard:
                samples_x[:, sweep - n_discard] = x
                samples_log_psi[:, sweep - n_discard] = log_psi
        self._chains = x
        return samples_x, samples_log_psi, accepted

    def _compiled_sweeps(self, network) -> CompiledSweeps | None:
        """Returns the compiled sweeps of compiled chains on the CPU whose moves are a bond
        rule's and whose network gives log ψ in real arithmetic (``has_parts``: a ViT, or one
        under a symmetry average); None otherwise: the chains then step one proposal at a
        time (on CUDA through the copy's compiled forward pass: there the 10×10's 4,096
        chains sampled in 0.246 s a step by sweeps against 0.218 s by the compiled pass,
        after twice its compile, 35 s; results/performance.md)."""
        if not self.chains.compile or not isinstance(self.rule, BondRule):
            return None
        if self._chains is None or self._chains.device.type != "cpu":
            return None
        if not getattr(network, "has_parts", False):
            return None
        if self._sweeps is None:
            table = torch.as_tensor(self.rule.moves)
            self._sweeps = CompiledSweeps(table, self.rule.name, self.rule.n_max)
        return None if self._sweeps.failed else self._sweeps

    def _sweep_draws(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns one sweep's random numbers, each ``(sweep_size, n_chains)``: the move each
        chain picks at each step and the log of the uniform its acceptance test compares.
        Both paths draw them so (a sweep's picks, then its uniforms), and so make the same
        chains; one draw per sweep, not two per step, spares the table walk most of its ops."""
        shape = (self.sweep_size, self.n_chains)
        picks = torch.randint(self.rule.n_moves, shape, generator=self._generator, device=device)
        log_u = torch.rand(shape, generator=self._generator, device=device).log_()
        return picks, log_u

    def _walks_sector(self, n_proposals: int) -> bool:
        """Returns whether this call's chains walk the sector by table look-up: the sector
        has no more states than the call makes proposals (one forward pass over it then
        costs less than theirs) and its move table fits `sector_walk.MAX_TABLE_ENTRIES`."""
        if not self.sector_table:
            return False
        return self.hilbert.dimension <= n_proposals and self._sector is not None

    @cached_property
    def _sector(self) -> SectorMoves | None:
        return self.rule.sector_moves(self.hilbert)  # None: too large, or a rule without one

    def _walk_sector(self, network, n_discard: int):
        """`_run_chains` by table look-up (sector_walk.py): the same proposals and
        acceptance tests from the same random numbers, the log ψ of every state from one
        forward pass over the sector. Returns `_run_chains`' three values and the table:
        log ψ of every state ``(S,)`` and the kept samples' states ``(C, n_per_chain)``.

        The walk itself runs in numpy on the host, whatever the device: a step is a few
        gathers on ``n_chains`` integers, ~1 µs each there against ~10 µs a torch op."""
        device, dtype = self._chains.device, self._chains.dtype
        states = self._sector.states.to(device=device, dtype=dtype)  # (S, N)
        log_psi = evaluate_log_psi(network, states)  # (S,)
        draws = (self._sweep_draws(device) for _ in range(n_discard + self.n_per_chain))
        index, kept, accepted = walk(
            self._sector.targets.numpy(),
            (self.machine_pow * log_psi.real).cpu().numpy(),
            self.hilbert.state_index(self._chains),
            draws,
            self.sweep_size,
            n_discard,
        )
        kept = torch.as_tensor(kept, device=device)
        self._chains = states[torch.as_tensor(index, device=device)]
        n_accepted = torch.as_tensor(accepted, device=device)
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
        chain c makes move ``pick[c]``."""
        return self.rule.propose(x, pick, self._generator)

    @staticmethod
    def _log_psi_of_valid(model, x_new, valid, log_psi, distinct=False):
        """Returns log ψ of the proposals ``(C,)``; on CPU rows of invalid moves keep
        ``log_psi`` (elsewhere they hold the network's value of the unchanged row: the
        step rejects them either way).

        On CPU, from `COMPACT_FROM` chains on, only the valid proposals go through the
        network (an exchange of two equal spins or a hop from an empty site is rejected
        anyway; about half the proposals near a Néel-like state), so the forward pass shrinks
        with them; with ``distinct``, only the distinct ones (in a Mott insulator most chains
        sit on the uniform filling and propose the same few hops). On other devices every
        proposal is evaluated: compacting would need the count of valid moves on the host, a
        device sync per Metropolis step.
        """
        if x_new.device.type != "cpu":
            return evaluate_log_psi(model, x_new)
        if len(x_new) < COMPACT_FROM and not distinct:
            return torch.where(valid, evaluate_log_psi(model, x_new).to(log_psi.dtype), log_psi)
        rows = valid.nonzero()[:, 0]  # (V,)
        if distinct:
            log_psi_new = _log_psi_of_distinct(model, x_new[rows])  # (V,)
            return log_psi.index_put((rows,), log_psi_new.to(log_psi.dtype))
        if len(rows) == len(valid):
            return evaluate_log_psi(model, x_new)
        return log_psi.index_put((rows,), evaluate_log_psi(model, x_new[rows]).to(log_psi.dtype))


def _log_psi_in_parts(network, x: torch.Tensor) -> torch.Tensor:
    """Returns the complex log ψ ``(B,)`` of ``network``'s eager pass in real arithmetic."""
    dtype = next(network.parameters()).dtype
    return torch.complex(*network.log_psi_parts(x.to(dtype)))


def _log_psi_of_distinct(model, x: torch.Tensor) -> torch.Tensor:
    """Returns log ψ ``(B,)`` of configurations ``(B, N)``, evaluating each distinct one once."""
    rows = distinct_rows(x)
    return evaluate_log_psi(model, rows.x)[rows.inverse]


def _check_counts(n_samples, n_chains, sweep_size, n_discard):
    for key, value in (("n_samples", n_samples), ("n_chains", n_chains)):
        if int(value) != value or value < 1:
            raise ValueError(f"sampler.{key}={value} must be a positive integer")
    if n_samples % n_chains:
        raise ValueError(
            f"sampler.n_samples={n_samples} must be a multiple of sampler.n_chains={n_chains}"
        )
    if sweep_size is not None and (int(sweep_size) != sweep_size or sweep_size < 1):
        raise ValueError(f"sweep_size={sweep_size} must be a positive integer")
    if int(n_discard) != n_discard or n_discard < 0:
        raise ValueError(f"sampler.n_discard={n_discard} must be an integer >= 0")
