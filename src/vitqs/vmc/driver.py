"""The variational Monte Carlo loop, as a generator of step results; no I/O inside.

Each step: sample ``|ψ|²`` → local energies → statistics → log-derivatives → SR / minSR
solve → ``θ ← θ − η g``. The loop owns what changes between steps (progress,
budget, annealing); loggers, checkpoints, signals and progress bars live
outside, as callbacks of `VMC.run` (`vitqs.vmc.callbacks`, `vitqs.runner`).

NaN guard: a step whose samples' log ψ (on any rank) or energy is not finite, or whose energy
is below the Hamiltonian's lower bound (`lower_bound`: no state has it, so the estimate comes
from a state the last update broke, as heavy tails of the local energy do), undoes the
previous update (the parameters return to where the energy was last sane); one whose
update, its length, or the parameters it would give, is not finite (a singular or NaN S
solves to NaN; lr 1e300 overflows) is not applied; the step is then retried with the
diagonal shift ×10 per failure. After `MAX_RETRIES` consecutive failures the run stops
with `NonFiniteEnergyError`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from vitqs.config import OptimizerConfig, SamplerConfig, steps_of
from vitqs.distributed import agree_all, agree_max, broadcast_from_root, reduce_sum
from vitqs.models.compiled import CompiledJacobian
from vitqs.models.precision import NetworkCopy
from vitqs.models.vit import ViT
from vitqs.vmc.estimators import Stats, distinct_rows, importance_weights, sample_statistics
from vitqs.vmc.optimizers import Schedule
from vitqs.vmc.samples import Samples
from vitqs.vmc.sr import (
    chosen_solve,
    log_derivatives,
    natural_gradient,
    parameter_vector,
    set_parameter_vector,
)

# Consecutive non-finite attempts of one step before the run stops (each raises the
# diagonal shift ×10): 10^5 × λ is past any shift that helps.
MAX_RETRIES = 5


class NonFiniteEnergyError(RuntimeError):
    """The energy or the update stayed non-finite after every retry.

    Attributes:
        step: the step that failed.
        last_energy: the last finite energy (None if there was none).
    """

    def __init__(self, step: int, last_energy: float | None, n_retries: int):
        self.step, self.last_energy = step, last_energy
        last = "none" if last_energy is None else f"{last_energy:.10g}"
        super().__init__(
            f"step {step}: energy or update not finite (or the energy below the Hamiltonian's "
            f"lower bound) after {n_retries} retries with a raised diagonal shift; last finite "
            f"energy {last}. Lower optimizer.lr or raise optimizer.diag_shift."
        )


@dataclass
class StepResult:
    """What one optimisation step measured; the energy is that of the parameters before it.

    Attributes:
        step: step index (0-based).
        energy: `Stats` of the local energies.
        acceptance: Metropolis acceptance rate (NaN for the exact sampler).
        update_norm: ``‖η δθ‖`` of the applied update.
        lr, diag_shift: values used (after any NaN-guard raise).
        n_retries: non-finite attempts before this one succeeded.
        timings: seconds per phase: ``sampling``, ``local_energy``, ``jacobian``, ``solve``.
        method: the solve that ran: ``sr`` or ``minsr``, whichever matrix was smaller.
        anneal_fraction: how far along ``optimizer.anneal``'s path the Hamiltonian of
            the step lies (1: the target).
    """

    step: int
    energy: Stats
    acceptance: float
    update_norm: float
    lr: float
    diag_shift: float
    n_retries: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    method: str = ""
    anneal_fraction: float = 1.0


class VMC:
    """Ground-state optimisation of ``model`` for ``hamiltonian``: the loop, and everything
    that changes between its steps. Iterate `run` for steps.

    What changes between steps is the loop's own state: the steps done and the wall-clock
    budget spent (together the run's progress, which the schedules follow), the Hamiltonian
    along the annealing path. What watches
    the loop (the results file, checkpoints, signals, frozen chains, a progress bar) is given
    to `run` as callbacks.

    Args:
        hamiltonian: the target, following the operator contract.
        model: ``(B, N) -> log ψ (B,)`` with real parameters.
        sampler: a `Sampler` (Metropolis chains, or exact sums over the sector).
        optimizer: the ``optimizer`` section (None: its defaults): method, the ``lr`` and
            ``diag_shift`` schedules, ``n_iter``, averaging and SPRING momentum.
            ``optimizer.anneal`` comes in through ``anneal``.
        chunk_size: samples per forward pass in local energies and log-derivatives.
        local_energy_dtype: precision of the network copy that evaluates the connected
            configurations in the steps' local energies (None: the model itself). The
            samples' log ψ, the ratios' sums, gradients and S stay in the model's dtype.
        anneal: a callable ``progress -> (hamiltonian, fraction)`` giving the Hamiltonian to
            optimise at that fraction of the run (``build.Anneal``); None: the target always.
        max_seconds: the wall-clock seconds the steps may run, counted across resumes from
            the clock `run` is given (`config.optimisation_seconds`: the steps' share of the
            run's budget); None: no budget. Without ``optimizer.n_iter`` the run then has
            300 steps, or with a budget as many as it allows.
    """

    def __init__(
        self,
        hamiltonian,
        model,
        sampler,
        optimizer: OptimizerConfig | None = None,
        *,
        chunk_size: int | None = SamplerConfig.chunk_size,
        local_energy_dtype: torch.dtype | None = None,
        anneal=None,
        max_seconds: float | None = None,
    ):
        self.hamiltonian, self.model, self.sampler = hamiltonian, model, sampler
        self.optimizer = OptimizerConfig() if optimizer is None else optimizer
        self.chunk_size = chunk_size
        if local_energy_dtype is not None and sampler.exact:
            raise ValueError(
                f"sampler.local_energy_dtype={local_energy_dtype} needs Monte Carlo samples; "
                "the full sum's local energies come from one sparse product, not the network"
            )
        self._local_energy_network = NetworkCopy(
            local_energy_dtype, key="sampler.local_energy_dtype"
        )
        self._jacobian: CompiledJacobian | None = None  # made at the first compiled step
        self.max_seconds = max_seconds
        self.n_steps = steps_of(self.optimizer.n_iter, budgeted=max_seconds is not None)
        # a schedule is the value: asked for the step's lr and diagonal shift
        self.lr = Schedule.of(self.optimizer.lr, self.n_steps)
        self.diag_shift = Schedule.of(self.optimizer.diag_shift, self.n_steps)
        self.anneal = anneal
        self.step_hamiltonian, self.anneal_fraction = hamiltonian, 1.0  # what the steps optimise
        self.step_count = 0
        # wall-clock seconds of the loop: of earlier invocations (a resume), and in all
        self.seconds_before = 0.0
        self.seconds = 0.0
        self._last_good: tuple[torch.Tensor, dict | None] | None = None  # before last update
        self._last_energy: float | None = None
        self._average: tuple[torch.Tensor, int] | None = None  # (mean θ, count)
        # SPRING (optimizer.momentum): the direction of the last applied update, and the one
        # before it (restored with the parameters when a step is undone)
        self._direction: torch.Tensor | None = None
        self._direction_before: torch.Tensor | None = None

    def run(
        self, n_iter: int | None = None, callbacks=(), started: float | None = None
    ) -> Iterator[StepResult]:
        """Yields one `StepResult` per step, until `n_steps` steps are done in all (or
        ``n_iter`` more) or the budget `max_seconds` is spent.

        After each step every callback is called as ``callback(vmc, result)``: one that
        returns True ends the loop after this step, one that raises ends it at once.
        ``started``: the ``time.perf_counter()`` this invocation's clock starts from (the
        run's own start, so that setting up counts against the budget); None: now.
        """
        if n_iter is None:
            n_iter = None if self.n_steps is None else self.n_steps - self.step_count
        start = time.perf_counter() if started is None else started
        self.seconds = self.seconds_before + time.perf_counter() - start
        if self.budget_spent():  # resumed after its budget: measure again, no further step
            return
        self._advance()
        for _ in range(n_iter) if n_iter is not None else itertools.count():
            result = self.step()
            if self.max_seconds is not None:
                # every rank follows the slowest clock: their schedules stay equal
                self.seconds = agree_max(self.seconds_before + time.perf_counter() - start)
            stop = [bool(callback(self, result)) for callback in callbacks]
            yield result
            if any(stop) or self.budget_spent():
                return
            self._advance()

    @property
    def compiles_log_derivatives(self) -> bool:
        """Whether the steps' log-derivatives went through a compiled graph."""
        return self._jacobian is not None and not self._jacobian.failed

    @property
    def compile_seconds(self) -> float:
        """Seconds the first compiled graphs took (tracing and compiling): the chains' and
        the log-derivatives'; 0 without them or before the first call."""
        jacobian = 0.0 if self._jacobian is None else self._jacobian.seconds or 0.0
        return self.sampler.compile_seconds + jacobian

    def budget_spent(self) -> bool:
        """Returns whether the wall-clock budget `max_seconds` is spent."""
        budget = self.max_seconds
        return budget is not None and self.seconds >= budget

    def budget_progress(self) -> float | None:
        """Returns the fraction of `max_seconds` spent (None without a budget)."""
        budget = self.max_seconds
        return None if budget is None else min(self.seconds / budget, 1.0)

    def progress(self) -> float:
        """Returns the fraction of the run done: of `n_steps` steps or of the budget."""
        steps = 0.0 if self.n_steps is None else self.step_count / self.n_steps
        return max(steps, self.budget_progress() or 0.0)

    def _advance(self) -> None:
        """Sets the Hamiltonian of the next step along the annealing path."""
        if self.anneal is not None:
            self.step_hamiltonian, self.anneal_fraction = self.anneal(self.progress())

    def step(self) -> StepResult:
        """Returns the result of one guarded step; raises `NonFiniteEnergyError`."""
        for n_retries in range(MAX_RETRIES + 1):
            result = self._attempt(boost=10.0**n_retries)
            if result is not None:
                result.n_retries = n_retries
                self.step_count += 1
                return result
        raise NonFiniteEnergyError(self.step_count, self._last_energy, MAX_RETRIES)

    def _attempt(self, boost: float) -> StepResult | None:
        timings = {}
        start = time.perf_counter()
        samples = self.sampler.sample(self.model)
        timings["sampling"] = _lap(start)
        # every rank takes the same branch: one rank's retry alone would shift its collectives
        if not agree_all(_usable(samples)):
            self._undo_last_update()
            return None
        start = time.perf_counter()
        network = self._local_energy_network(self.model)
        e_loc = self.sampler.local_energy(self.step_hamiltonian, network, samples, self.chunk_size)
        stats = sample_statistics(e_loc, samples)
        timings["local_energy"] = _lap(start)
        if not math.isfinite(abs(stats.mean)) or stats.mean.real < self._lower_bound():
            self._undo_last_update()
            return None
        lr, diag_shift = self._hyperparameters(boost)
        theta = parameter_vector(self.model)
        update, method = self._update(samples, e_loc, diag_shift, timings)
        if not bool(torch.isfinite(update).all()):
            return None  # nothing applied
        step = lr * update
        update_norm = float(step.norm())
        # a finite step whose length overflows (lr 1e300), or one that overflows θ
        if not math.isfinite(update_norm) or not bool(torch.isfinite(theta - step).all()):
            return None
        self._last_good = theta
        if self.optimizer.momentum:
            self._direction_before, self._direction = self._direction, update
        self._add_to_average(theta)  # θ whose energy was just measured finite
        set_parameter_vector(self.model, theta - step)
        self._last_energy = stats.mean.real
        return StepResult(
            step=self.step_count,
            energy=stats,
            acceptance=samples.acceptance,
            update_norm=update_norm,
            lr=lr,
            diag_shift=diag_shift,
            timings=timings,
            method=method,
            anneal_fraction=self.anneal_fraction,
        )

    def _lower_bound(self) -> float:
        """Returns the step's Hamiltonian's lower bound (it moves along an annealing path)."""
        return self.step_hamiltonian.lower_bound()

    def _add_to_average(self, theta: torch.Tensor) -> None:
        start = self.optimizer.average_from
        if start is None or self.progress() < start:
            return
        if self._average is None:
            self._average = (theta.clone(), 1)
            return
        mean, count = self._average
        self._average = (mean + (theta - mean) / (count + 1), count + 1)

    def averaged_parameters(self) -> tuple[torch.Tensor, int] | None:
        """Returns the mean of the parameters measured since ``average_from`` and how many
        steps it holds, or None (averaging off, or not reached yet)."""
        return self._average

    def _hyperparameters(self, boost: float) -> tuple[float, float]:
        progress = self.budget_progress()
        lr = self.lr(self.step_count, progress)
        diag_shift = self.diag_shift(self.step_count, progress)
        return lr, diag_shift * boost

    def _update(self, samples: Samples, e_loc, diag_shift, timings) -> tuple[torch.Tensor, str]:
        """Returns the direction ``g`` (apply ``θ ← θ − η g``), float64 ``(P,)``, and the
        solve that gave it."""
        x, weights = samples.x.reshape(-1, samples.x.shape[-1]), samples.weights
        n_rows = x.shape[0]
        e_loc = e_loc.reshape(-1)
        if weights is None:
            importance = samples.log_importance
            if importance is not None:
                importance = importance_weights(importance).reshape(-1)
            x, e_loc, weights = _distinct_samples(x, e_loc, importance)
        else:
            weights = weights.reshape(-1)
        start = time.perf_counter()
        compiled = self._compiled_jacobian(x, n_rows)
        chunk_size = self.chunk_size or (n_rows if compiled else None)  # one graph: one shape
        jac = log_derivatives(self.model, x, chunk_size, compiled=compiled)  # (N_s, P)
        timings["jacobian"] = _lap(start)
        start = time.perf_counter()
        method = chosen_solve("auto", jac)
        update = natural_gradient(
            jac,
            e_loc,
            diag_shift=diag_shift,
            weights=weights,
            method=method,
            momentum=self.optimizer.momentum or 0.0,
            previous=self._direction,
        )
        timings["solve"] = _lap(start)
        # every rank solved the same system; rank 0's answer keeps the parameters equal
        # on all ranks even where rounding differs between them
        return broadcast_from_root(update), method

    def _compiled_jacobian(self, x: torch.Tensor, n_rows: int) -> CompiledJacobian | None:
        """Returns the compiled log-derivatives of a run whose chains are compiled (a run
        long enough to pay a compile back, `build.compiled_chains`), of a bare ViT of
        complex log ψ on the CPU (`CompiledJacobian` says where it pays); None otherwise,
        or where fewer than half the samples are distinct (a Mott insulator's): the eager
        routes then differentiate the distinct ones alone, where the graph would take them
        padded to every sample."""
        model = self.model
        bare_complex = type(model) is ViT and not model.positive
        if not (self.sampler.compiled and bare_complex and x.device.type == "cpu"):
            return None
        if self._jacobian is None:
            self._jacobian = CompiledJacobian(self.model)
        return self._jacobian if 2 * x.shape[0] > n_rows else None

    def _undo_last_update(self):
        if self._last_good is None:
            return
        set_parameter_vector(self.model, self._last_good)
        self._direction = self._direction_before

    def state_dict(self) -> dict:
        """Returns the step counter and last good state, for checkpoints."""
        return {
            "step": self.step_count,
            "last_energy": self._last_energy,
            "last_good": self._last_good,
            "average": self._average,
            "direction": self._direction,
            "direction_before": self._direction_before,
        }

    def load_state_dict(self, state: dict):
        """Restores `state_dict`'s values; ValueError when they are not of its shapes (a
        checkpoint read from a file is data anyone may have written)."""
        _check_state(state, parameter_vector(self.model).shape)
        self.step_count = int(state["step"])
        self._last_energy = state.get("last_energy")
        self._last_good = last_good_parameters(state)
        self._average = state.get("average")
        self._direction = state.get("direction")
        self._direction_before = state.get("direction_before")


def last_good_parameters(state: dict) -> torch.Tensor | None:
    """Returns the parameters a checkpoint's VMC state last measured sane, or None; files
    written before Adam was removed (issue 51) keep them as ``(θ, None)``."""
    last_good = state.get("last_good")
    return last_good[0] if isinstance(last_good, tuple) else last_good


def _check_state(state: dict, n_params: torch.Size) -> None:
    """Raises ValueError unless ``state`` has the types and shapes `VMC.state_dict` gives
    (or gave before Adam was removed, without Adam's moments)."""

    def vector(value) -> bool:
        return isinstance(value, torch.Tensor) and value.shape == n_params

    step, last_good, average = state.get("step"), state.get("last_good"), state.get("average")
    checks = {
        "step": isinstance(step, int) and step >= 0,
        "adam": state.get("adam") is None,  # an Adam run's moments: no update takes them now
        "last_energy": state.get("last_energy") is None
        or isinstance(state.get("last_energy"), float),
        "last_good": last_good is None
        or vector(last_good)
        or (
            isinstance(last_good, tuple)
            and len(last_good) == 2
            and vector(last_good[0])
            and last_good[1] is None
        ),
        "average": average is None
        or (
            isinstance(average, tuple)
            and len(average) == 2
            and vector(average[0])
            and isinstance(average[1], int)
        ),
        # None or absent: a checkpoint from before SPRING, or a run without momentum
        "direction": state.get("direction") is None or vector(state.get("direction")),
        "direction_before": state.get("direction_before") is None
        or vector(state.get("direction_before")),
    }
    wrong = [key for key, ok in checks.items() if not ok]
    if wrong:
        raise ValueError(
            f"optimizer state {wrong} is not what a VMC of {n_params.numel()} parameters keeps"
        )


def final_estimate(
    hamiltonian, model, sampler, *, n_samples: int | None = None, chunk_size=None
) -> Stats:
    """Returns the energy `Stats` of the current parameters from ``n_samples`` samples."""
    samples = sampler.draw(model, n_samples)
    return sample_statistics(sampler.local_energy(hamiltonian, model, samples, chunk_size), samples)


def _distinct_samples(x: torch.Tensor, e_loc: torch.Tensor, importance=None):
    """Returns the distinct configurations of Monte Carlo samples, their local energies and
    weights ``count / N_s``: the same S and F as the ``N_s`` rows of equal weight ``1/N_s``
    (a repeated row adds its outer product ``count`` times), at one log-derivative and one
    kernel row per distinct configuration. A Mott insulator's samples repeat the uniform
    filling most of the time (~100 distinct of 1,024 at U = 10 on 12 sites).

    With ``importance``, the samples' normalised importance weights ``(N_s,)``, a distinct
    configuration weighs the sum of its samples' weights instead, and one of weight 0 is
    left out: it adds nothing to S and F, and where ψ vanishes (a state a symmetry
    projection cancels, drawn by chains on the bare network) its log-derivatives are not
    finite.
    """
    rows = distinct_rows(x)
    if importance is not None:
        weights = torch.zeros(rows.n_distinct, dtype=torch.float64, device=x.device)
        weights.index_add_(0, rows.inverse, importance.to(torch.float64))
        kept = weights > 0
        return rows.x[kept], e_loc[rows.first][kept], weights[kept]
    n_samples = reduce_sum(torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device))
    weights = rows.counts.to(torch.float64) / n_samples
    return rows.x, e_loc[rows.first], weights


def _usable(samples: Samples) -> bool:
    """Returns whether every sample's ``log ψ`` is finite, or ``−∞`` with importance weight 0:
    chains on the bare network under a symmetry projection may stand where the projection
    cancels (ψ = 0), which the estimates then leave out."""
    finite = torch.isfinite(samples.log_psi)
    if samples.log_importance is not None:
        finite |= torch.isneginf(samples.log_psi.real) & torch.isneginf(samples.log_importance)
    return bool(finite.all())


def _lap(start: float) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start
