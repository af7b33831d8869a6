"""Hilbert spaces with a conserved quantity: spin-1/2 at fixed total Sz, bosons at fixed N.

A configuration is a row of ``n_sites`` numbers: ``±1`` (σ^z eigenvalues) for spins,
occupations ``0..n_max`` for bosons. ``all_states()`` enumerates the sector in a fixed order
and ``state_index`` inverts it, both vectorized over states (no Python loop per state), so
that sectors of a few million states are built in seconds for exact diagonalization.

Ordering: a state's integer code is ``Σ_i d_i · 2^(bits·i)`` with digit ``d_i`` the local
state (spin up = 1, down = 0, or the occupation) and ``bits`` enough bits for one digit (a
power-of-two radix orders states exactly as radix ``n_max + 1`` would, and lets digits be read
with shifts). The sector is enumerated in increasing code; ``state_index`` ranks a code with a
few table look-ups (see ``_FixedSector.code_index``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from math import comb, lgamma

import numpy as np
import torch


def _digits_to_code(digits: np.ndarray, bits: int) -> np.ndarray:
    """Returns ``Σ_i digits[..., i] · 2^(bits·i)`` as int64; digits ``(..., n_sites)``."""
    weights = np.left_shift(1, bits * np.arange(digits.shape[-1], dtype=np.int64))
    return digits.astype(np.int64) @ weights


class _FixedSector(ABC):
    """Shared machinery: codes, enumeration, ranking. Subclasses define the digits."""

    n_sites: int
    base: int  # local dimension

    @property
    def bits(self) -> int:
        """Returns the bits one site's digit takes in a state code."""
        return max(1, int(self.base - 1).bit_length())

    @property
    @abstractmethod
    def dimension(self) -> int:
        """Returns the number of states in the sector."""

    @abstractmethod
    def _enumerate_digits(self) -> np.ndarray:
        """Returns the digits of every state ``(dimension, n_sites)`` in increasing code."""

    @abstractmethod
    def to_digits(self, states: np.ndarray) -> np.ndarray:
        """Returns the digits (local state index) of configurations."""

    @abstractmethod
    def from_digits(self, digits: np.ndarray) -> np.ndarray:
        """Returns configurations from digits."""

    def _check_code_range(self):
        if self.n_sites * self.bits > 62:
            raise ValueError(
                f"a sector of {self.n_sites} sites with local dimension {self.base} is too large "
                "to enumerate (state codes overflow 64 bits)"
            )

    @cached_property
    def codes(self) -> np.ndarray:
        """Returns the sorted int64 codes of every state in the sector ``(dimension,)``."""
        self._check_code_range()
        return _digits_to_code(self._enumerate_digits(), self.bits)

    def all_states(self) -> np.ndarray:
        """Returns every state of the sector ``(dimension, n_sites)`` int8, in index order."""
        return self.from_digits(self.codes_to_digits(self.codes))

    def codes_to_digits(self, codes: np.ndarray) -> np.ndarray:
        """Returns digits ``(len(codes), n_sites)`` int8 of integer codes."""
        codes = np.asarray(codes, dtype=np.int64)
        digits = np.empty((len(codes), self.n_sites), dtype=np.int8)
        mask = (1 << self.bits) - 1
        for i in range(self.n_sites):
            digits[:, i] = (codes >> (self.bits * i)) & mask
        return digits

    def contains(self, states) -> np.ndarray:
        """Returns whether each configuration ``(B, n)`` is a state of this sector, bool ``(B,)``
        (False for every row when ``n`` is not ``n_sites``)."""
        states = states.cpu().numpy() if isinstance(states, torch.Tensor) else np.asarray(states)
        if states.ndim != 2 or states.shape[1] != self.n_sites:
            return np.zeros(len(states), dtype=bool)
        local = np.isin(states, self.local_states).all(axis=1)
        safe = np.where(local[:, None], states, self.local_states[0])  # to_digits wants these
        return local & (self.to_digits(safe).sum(axis=1) == self._n_digit_sum)

    def state_index(self, states) -> np.ndarray:
        """Returns the index of each state ``(B, n_sites)`` in ``all_states()``, as int64 ``(B,)``.

        Raises ValueError for states outside the sector.
        """
        states = states.cpu().numpy() if isinstance(states, torch.Tensor) else np.asarray(states)
        digits = self.to_digits(states)
        if digits.min(initial=0) < 0 or digits.max(initial=0) >= self.base:
            raise ValueError("state_index: some states have local values outside the Hilbert space")
        return self.code_index(_digits_to_code(digits, self.bits))

    # The sector is "n_digit_sum particles on n_sites sites, at most base-1 per site" (spins
    # are hard-core bosons: up = 1). The rank of a state in increasing-code order is
    #   rank = Σ_i Σ_{v < d_i} W(i, P − Σ_{k>i} d_k − v),
    # W(i, m) = placements of m particles on sites 0..i−1. Cut the sites into chunks: a
    # chunk's share depends only on its own digits and on the particles above it, so
    # rank = Σ_chunks table[chunk code, particles above] — a few gathers per state.
    _CHUNK_STATES = 1 << 16

    @property
    def _n_digit_sum(self) -> int:
        return self.n_particles

    @cached_property
    def _rank_chunks(self):
        n, base, total = self.n_sites, self.base, self._n_digit_sum
        ways = np.zeros((n + 1, total + 1), dtype=np.int64)  # ways[i, m] = W(i, m)
        ways[0, 0] = 1
        for i in range(1, n + 1):
            for v in range(base):
                ways[i, v:] += ways[i - 1, : total + 1 - v]
        size = max(1, self._CHUNK_STATES.bit_length() // self.bits)
        chunks = []
        for lo in range(0, n, size):
            width = min(size, n - lo)
            digits = self.codes_to_digits(np.arange(1 << (self.bits * width)))[:, :width]
            digit_sum = digits.sum(axis=1, dtype=np.int64)
            # a digit above n_max marks the chunk code invalid: push the count out of range
            digit_sum[(digits >= base).any(axis=1)] = total + 1
            chunks.append((lo, width, self._chunk_table(ways, lo, digits), digit_sum))
        return chunks[::-1]  # most significant chunk first

    def _chunk_table(self, ways, lo, digits) -> np.ndarray:
        """Returns table[chunk code, particles above the chunk] of the chunk's rank share."""
        total = self._n_digit_sum
        above = np.arange(total + 1)[None, :]  # (1, total+1)
        table = np.zeros((len(digits), total + 1), dtype=np.int64)
        used = np.zeros((len(digits), 1), dtype=np.int64)  # particles on chunk sites above i
        for k in range(digits.shape[1] - 1, -1, -1):
            d = digits[:, k : k + 1].astype(np.int64)
            for v in range(self.base - 1):
                m = total - above - used - v
                share = ways[lo + k, np.clip(m, 0, total)] * (m >= 0)
                table += share * (v < d)
            used += d
        return table

    def code_index(self, codes: np.ndarray) -> np.ndarray:
        """Returns the index of each code ``(B,)``; ValueError for codes outside the sector."""
        codes = np.asarray(codes, dtype=np.int64)
        rank = np.zeros(codes.shape, dtype=np.int64)
        used = np.zeros(codes.shape, dtype=np.int64)
        for lo, width, table, digit_sum in self._rank_chunks:
            chunk = (codes >> (self.bits * lo)) & ((1 << (self.bits * width)) - 1)
            rank += table[chunk, np.minimum(used, self._n_digit_sum)]
            used += digit_sum[chunk]
        if np.any(used != self._n_digit_sum) or np.any(codes >> (self.bits * self.n_sites)):
            raise ValueError("state_index: some states are not in this sector")
        return rank


class SpinHalf(_FixedSector):
    """Spin-1/2 on ``n_sites`` sites with fixed total ``S^z = total_sz``; states are ``±1``.

    Args:
        n_sites: number of sites, positive.
        total_sz: total S^z (S = σ/2); ``n_sites/2 + total_sz`` spins point up, which must be
            an integer between 0 and ``n_sites``.
    """

    base = 2

    def __init__(self, n_sites: int, total_sz: float = 0.0):
        if int(n_sites) != n_sites or n_sites < 1:
            raise ValueError(f"n_sites={n_sites} must be a positive integer")
        n_up = n_sites / 2 + total_sz
        if n_up != int(n_up) or not 0 <= n_up <= n_sites:
            allowed = "an integer" if n_sites % 2 == 0 else "a half-integer"
            raise ValueError(
                f"hamiltonian.total_sz={total_sz} is impossible on {n_sites} sites: "
                f"it must be {allowed} between {-n_sites / 2} and {n_sites / 2}"
            )
        self.n_sites = int(n_sites)
        self.total_sz = float(total_sz)
        self.n_up = int(n_up)

    @property
    def local_states(self) -> tuple[int, ...]:
        return (-1, 1)

    @property
    def _n_digit_sum(self) -> int:
        return self.n_up

    @property
    def dimension(self) -> int:
        return comb(self.n_sites, self.n_up)

    def log_dimension(self) -> float:
        """Returns ln(dimension) without computing the (possibly huge) integer."""
        n, k = self.n_sites, self.n_up
        return lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1)

    def to_digits(self, states):
        return (np.asarray(states) > 0).astype(np.int8)

    def from_digits(self, digits):
        return (2 * digits.astype(np.int8) - 1).astype(np.int8)

    def _enumerate_digits(self) -> np.ndarray:
        # Choose the up positions: unranking all combinations in colex order is a loop
        # over the n_up positions (vectorized over states), not over states.
        n, k, dim = self.n_sites, self.n_up, self.dimension
        digits = np.zeros((dim, n), dtype=np.int8)
        rank = np.arange(dim, dtype=np.int64)
        for j in range(k, 0, -1):
            # largest c with comb(c, j) <= rank; comb(c, j) is increasing in c for c >= j-1
            table = np.array([comb(c, j) for c in range(n)], dtype=np.int64)
            c = np.searchsorted(table, rank, side="right") - 1
            digits[np.arange(dim), c] = 1
            rank -= table[c]
        # colex order of combinations is increasing order of the bit code
        return digits

    def random_states(self, n_states: int, generator: torch.Generator, device=None):
        """Returns ``(n_states, n_sites)`` uniformly random states of the sector (float64 ±1)."""
        keys = torch.rand(n_states, self.n_sites, generator=generator, device=generator.device)
        order = keys.argsort(dim=1)
        states = torch.full((n_states, self.n_sites), -1.0, dtype=torch.float64, device=keys.device)
        states.scatter_(1, order[:, : self.n_up], 1.0)
        return states.to(device) if device is not None else states

    def describe(self) -> dict:
        return {"kind": "spin_half", "n_sites": self.n_sites, "total_sz": self.total_sz}


def placements(n_sites: int, n_particles: int, n_max: int) -> list[int]:
    """Returns ``ways`` with ``ways[m]`` the number of ways to put ``m = 0 … n_particles``
    bosons on ``n_sites`` sites with at most ``n_max`` each (exact Python integers)."""
    ways = [1] + [0] * n_particles
    for _ in range(n_sites):
        ways = [sum(ways[m - v] for v in range(min(m, n_max) + 1)) for m in range(len(ways))]
    return ways


class Bosons(_FixedSector):
    """Bosons on ``n_sites`` sites with ``n_particles`` in total and at most ``n_max`` per site.

    Args:
        n_sites: number of sites, positive.
        n_particles: total particle number, ≥ 0.
        n_max: per-site cutoff, ≥ 1; default ``n_particles`` (no truncation).
    """

    def __init__(self, n_sites: int, n_particles: int, n_max: int | None = None):
        if int(n_sites) != n_sites or n_sites < 1:
            raise ValueError(f"n_sites={n_sites} must be a positive integer")
        if int(n_particles) != n_particles or n_particles < 0:
            raise ValueError(f"hamiltonian.n_particles={n_particles} must be an integer >= 0")
        n_max = max(int(n_particles), 1) if n_max is None else n_max
        if int(n_max) != n_max or n_max < 1:
            raise ValueError(f"hamiltonian.n_max={n_max} must be an integer >= 1")
        if n_particles > n_sites * n_max:
            raise ValueError(
                f"hamiltonian.n_particles={n_particles} does not fit on {n_sites} sites "
                f"with n_max={n_max}: at most {n_sites * n_max}"
            )
        self.n_sites = int(n_sites)
        self.n_particles = int(n_particles)
        self.n_max = int(n_max)
        self.base = self.n_max + 1

    @property
    def local_states(self) -> tuple[int, ...]:
        return tuple(range(self.n_max + 1))

    def log_dimension(self) -> float:
        """Returns ln(dimension), or an upper bound when the cutoff truncates and counting
        exactly would be slow (the bound is the count without cutoff)."""
        n, p = self.n_sites, self.n_particles
        if self.n_max < p and n * p * self.n_max <= 10**7:
            return float(np.log(self.dimension))
        return lgamma(n + p) - lgamma(p + 1) - lgamma(n)

    @cached_property
    def dimension(self) -> int:
        return placements(self.n_sites, self.n_particles, self.n_max)[self.n_particles]

    def mean_pair_occupation(self) -> float:
        """Returns ``⟨n_i(n_i − 1)⟩`` of one site averaged uniformly over the sector (the same
        for every site): ``2 N(N − 1) / (L(L + 1))`` without cutoff, counted with one."""
        n, p = self.n_sites, self.n_particles
        if self.n_max >= p:  # uniform weak compositions of p into n parts
            return 2 * p * (p - 1) / (n * (n + 1))
        rest = placements(n - 1, p, self.n_max)  # the other sites hold p - k
        pairs = sum(k * (k - 1) * rest[p - k] for k in range(min(p, self.n_max) + 1))
        return pairs / self.dimension  # exact integers, one rounding

    def to_digits(self, states):
        return np.asarray(states).astype(np.int8)

    def from_digits(self, digits):
        return digits.astype(np.int8)

    def _enumerate_digits(self) -> np.ndarray:
        # Build the sector from the most significant site (the last) down. If the rows for
        # sites i+1.. are in increasing code, prepending digit v keeps (old row, v) order,
        # which np.nonzero yields row-major: no sort needed.
        partial = np.zeros((1, 0), dtype=np.int8)
        used = np.zeros(1, dtype=np.int64)
        for i in range(self.n_sites - 1, -1, -1):
            new_used = used[:, None] + np.arange(self.base)[None, :]  # (rows, base)
            rest = self.n_particles - new_used
            fits = (rest >= 0) & (rest <= i * self.n_max)  # sites 0..i-1 must hold the rest
            row, digit = np.nonzero(fits)
            partial = np.concatenate([digit[:, None].astype(np.int8), partial[row]], axis=1)
            used = new_used[row, digit]
        return partial

    def random_states(self, n_states: int, generator: torch.Generator, device=None):
        """Returns ``(n_states, n_sites)`` random valid occupations (float64), placed one by one.

        Each particle goes to a uniformly chosen site that is below ``n_max``.
        """
        dev = generator.device
        states = torch.zeros(n_states, self.n_sites, dtype=torch.float64, device=dev)
        rows = torch.arange(n_states, device=dev)
        for _ in range(self.n_particles):
            keys = torch.rand(n_states, self.n_sites, generator=generator, device=dev)
            keys = keys.masked_fill(states >= self.n_max, -1.0)
            states[rows, keys.argmax(dim=1)] += 1.0
        return states.to(device) if device is not None else states

    def describe(self) -> dict:
        return {
            "kind": "bosons",
            "n_sites": self.n_sites,
            "n_particles": self.n_particles,
            "n_max": self.n_max,
        }
