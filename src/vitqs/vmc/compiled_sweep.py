"""Metropolis steps of bond moves as one compiled graph: the compiled chains' sweep.

Eager PyTorch pays per operator: a Metropolis step of 16 chains on a 16-site chain (a
one-layer ViT of width 8) is ~250 operator calls, ~280 µs, of which almost nothing is
arithmetic (issue 51's small config: its sampling at 1 % of the matrix-product peak). Under
``torch.compile`` a run of steps — the proposal's gathers and scatters, the ViT's forward
pass, the acceptance test and the updates — becomes one graph: ~47 µs a step when 16 steps
are unrolled (a probe of stop 57). The steps are those of `MetropolisSampler._run_chains`
from the same random numbers, with every proposal evaluated (the eager CPU path evaluates
only the valid ones; an invalid one is rejected either way), so float64 chains make the same
moves as the eager ones; float32 chains agree to rounding.

A graph unrolls `steps_per_graph` steps, a divisor of the sweep holding at most 16 encoder
layers in all: every call has the same shapes and compiles once. ``machine_pow`` enters as
a tensor, so the final measurement's |ψ|² reuses the graph of the training's |ψ|^p. If the
compiler fails (no C++ compiler, an unsupported platform) a warning names the cause and the
chains run eager from then on.
"""

from __future__ import annotations

import functools
import time
import warnings

import torch

from vitqs.errors import first_line
from vitqs.vmc.sector_walk import apply_moves

# Encoder layers unrolled into one graph at most (steps × layers): the compile grows with
# the graph, the saving per step little beyond a few steps (one step a graph took 84 µs, 16
# steps 47 µs a step on the 16-site chain's one-layer ViT)
MAX_LAYERS_PER_GRAPH = 16


def steps_per_graph(sweep_size: int, layers: int = 1) -> int:
    """Returns the steps one graph unrolls: the largest divisor of ``sweep_size`` whose
    steps hold at most `MAX_LAYERS_PER_GRAPH` encoder layers (one step at least)."""
    most = max(1, MAX_LAYERS_PER_GRAPH // max(1, layers))
    return max(k for k in range(1, min(sweep_size, most) + 1) if sweep_size % k == 0)


def _steps(network, table, x, real, imag, picks, log_u, machine_pow, rule: str, n_max):
    """Runs ``len(picks)`` Metropolis steps of bond moves; returns the chains ``(C, N)``, the
    real and imaginary parts of their log ψ ``(C,)`` and the accepted moves (0-d)."""
    dtype = real.dtype
    accepted = torch.zeros((), dtype=torch.int64, device=x.device)
    for t in range(picks.shape[0]):
        src, dst = table[picks[t], 0:1], table[picks[t], 1:2]
        x_new, valid = apply_moves(x, src, dst, rule, n_max)
        real_new, imag_new = network.log_psi_parts(x_new.to(dtype))
        accept = valid & (log_u[t] < machine_pow * (real_new - real))  # NaN: rejected
        x = torch.where(accept[:, None], x_new, x)
        real = torch.where(accept, real_new, real)
        imag = torch.where(accept, imag_new, imag)
        accepted = accepted + accept.sum()
    return x, real, imag, accepted


@functools.cache
def _compiled_steps():
    """One compiled function for every sampler: graphs are cached per network architecture,
    dtype, chain count and steps. Made at first use (importing inductor takes ~2 s).

    Inductor's C++ wrapper calls a graph's kernels and matrix products from C++ instead of
    Python: sampling took 0.71-0.93x the time of the Python wrapper's, in one process,
    alternated (issue 51's small config 5.8 against 8.1 ms, one thread; the Heisenberg 6x6,
    J1-J2 chain 20 and Bose-Hubbard chain 12 recipes 236 against 276, 174 against 188 and 90
    against 104 ms, two threads), after a cold compile of 15-30 s (results/history/
    performance_notes.md, 2026-12-08)."""
    return torch.compile(_steps, dynamic=False, options={"cpp_wrapper": True})


class CompiledSweeps:
    """Runs the chains' Metropolis steps of a bond rule through compiled graphs.

    ``seconds``: the wall time of the first call, where dynamo traces and inductor compiles
    (None before it). ``failed``: the compiler failed once; the caller then runs eager.
    """

    def __init__(self, table: torch.Tensor, rule: str, n_max: int | None):
        self.table, self.rule, self.n_max = table, rule, n_max
        self._tables: dict[torch.device, torch.Tensor] = {}  # the move table on each device
        self.seconds: float | None = None
        self.failed = False

    def sweep(self, network, x, log_psi, picks, log_u, machine_pow: float):
        """Returns the chains ``(C, N)``, their complex log ψ ``(C,)`` and the accepted moves
        (0-d) after the steps of ``picks`` and ``log_u`` ``(S, C)``, or None if the compiler
        failed (nothing moved then)."""
        table = self._tables.get(x.device)
        if table is None:
            table = self._tables[x.device] = self.table.to(x.device)
        power = torch.tensor(machine_pow, dtype=log_psi.real.dtype, device=x.device)
        real, imag = log_psi.real.contiguous(), log_psi.imag.contiguous()
        accepted = torch.zeros((), dtype=torch.int64, device=x.device)
        inner = getattr(network, "model", network)  # the ViT under a symmetry average
        chunk = steps_per_graph(len(picks), len(getattr(inner, "blocks", ())))
        start = time.perf_counter()
        for first in range(0, len(picks), chunk):
            steps = slice(first, first + chunk)
            try:
                x, real, imag, n = _compiled_steps()(
                    network, table, x, real, imag, picks[steps], log_u[steps], power,
                    self.rule, self.n_max,
                )  # fmt: skip
            except Exception as err:  # the compiler's failure, whatever its kind: run eager
                if first:  # a graph that ran once does not fail on the same shapes
                    raise
                self.failed = True
                warnings.warn(
                    f"compiled chains: torch.compile failed ({first_line(err, 200)}); the "
                    "chains run eager",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return None
            accepted = accepted + n
            if self.seconds is None:
                self.seconds = time.perf_counter() - start
        return x, torch.complex(real, imag), accepted
