"""The variational Monte Carlo loop, as a generator of step results; no I/O inside.

Each step: sample ``|ψ|²`` → local energies → statistics → log-derivatives → SR / minSR
solve (or Adam) → ``θ ← θ − η g``. Loggers, checkpoints and progress bars live outside and
consume the yielded `StepResult`s.

NaN guard: a step whose samples' log ψ or energy is not finite undoes the previous update
(the parameters return to where the energy was last finite); one whose update, or the
parameters it would give, is not finite (a singular or NaN S solves to NaN) is not applied;
the step is then retried with the diagonal shift ×10 per failure (Adam: the learning rate
÷10). After ``max_retries`` consecutive failures the run stops with `NonFiniteEnergyError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from vitqs.distributed import broadcast_from_root, reduce_sum
from vitqs.models.precision import NetworkCopy
from vitqs.vmc.estimators import (
    Stats,
    distinct_rows,
    importance_statistics,
    importance_weights,
    local_energy,
    statistics,
)
from vitqs.vmc.sampler import ExactSampler, Samples
from vitqs.vmc.sr import (
    METHODS,
    SCHEDULES,
    Adam,
    Schedule,
    clip_local_energy,
    energy_gradient,
    log_derivatives,
    natural_gradient,
    parameter_vector,
    set_parameter_vector,
)

# The trust bound (`OptimizerSettings.max_update_ratio`) compares a step with the median
# length of this many applied before it, and waits until this many are known.
UPDATE_WINDOW = 50
UPDATE_MIN_HISTORY = 10


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
            f"step {step}: energy or update not finite after {n_retries} retries with a raised "
            f"diagonal shift; last finite energy {last}. Lower optimizer.lr or raise "
            "optimizer.diag_shift."
        )


@dataclass
class OptimizerSettings:
    """How parameters move; field names are the ``optimizer`` config keys.

    Attributes:
        method: ``auto`` | ``sr`` | ``minsr`` (natural gradient) or ``adam``.
        lr: learning rate η (initial value when scheduled).
        lr_final, lr_schedule: final value and ``constant`` | ``exponential`` | ``cosine``.
        diag_shift: λ added to S (or to the kernel) (initial value when scheduled).
        diag_shift_final, diag_shift_schedule: as for the learning rate.
        n_iter: number of steps; schedules run over it.
        average_from: fraction of the run (of ``n_iter`` or of the wall-clock budget) after
            which the measured parameters are averaged (None: off); `averaged_parameters`
            gives the mean. At a constant lr, SR's noise keeps θ diffusing around the optimum
            it has reached; the mean of the iterates sits closer to it than any one of them.
        clip_local_energy: for the SR force only, cut local energies to this many mean
            absolute deviations from their mean (`clip_local_energy`; None: off). Monte
            Carlo only: a full sum's gradient is exact.
        max_update_ratio: a trust bound on the step: an update ``η δθ`` longer than this
            many times the median length of the last ``UPDATE_WINDOW`` applied updates is
            scaled down to that length, its direction kept (None: off): a rare sample with a
            huge local energy cannot set one step many times longer than the rest.
        max_retries: consecutive non-finite retries before the run stops.
    """

    method: str = "auto"
    lr: float = 0.02
    lr_final: float | None = None
    lr_schedule: str = "constant"
    diag_shift: float = 1e-3
    diag_shift_final: float | None = None
    diag_shift_schedule: str = "constant"
    n_iter: int = 200
    average_from: float | None = None
    clip_local_energy: float | None = None
    max_update_ratio: float | None = None
    max_retries: int = 5

    def __post_init__(self):
        if self.method not in (*METHODS, "adam"):
            raise ValueError(f"optimizer.method={self.method!r} is not one of {[*METHODS, 'adam']}")
        for key in ("lr_schedule", "diag_shift_schedule"):
            if getattr(self, key) not in SCHEDULES:
                raise ValueError(
                    f"optimizer.{key}={getattr(self, key)!r} is not one of {list(SCHEDULES)}"
                )
        if self.lr <= 0 or self.diag_shift < 0:
            raise ValueError(
                f"optimizer.lr={self.lr} must be > 0 and "
                f"optimizer.diag_shift={self.diag_shift} >= 0"
            )
        if self.average_from is not None and not 0 <= self.average_from <= 1:
            raise ValueError(
                f"optimizer.average_from={self.average_from} must be between 0 and 1 (or null)"
            )
        if self.clip_local_energy is not None and not self.clip_local_energy > 0:
            raise ValueError(
                f"optimizer.clip_local_energy={self.clip_local_energy} must be > 0 (or null)"
            )
        if self.max_update_ratio is not None and not self.max_update_ratio >= 1:
            raise ValueError(
                f"optimizer.max_update_ratio={self.max_update_ratio} must be >= 1 (or null)"
            )
        if self.n_iter < 1 or self.max_retries < 0:
            raise ValueError(
                f"optimizer.n_iter={self.n_iter} must be >= 1, max_retries={self.max_retries} >= 0"
            )

    def lr_at(self, step: int, progress: float | None = None) -> float:
        return Schedule(self.lr, self.lr_final, self.lr_schedule, self.n_iter)(step, progress)

    def diag_shift_at(self, step: int, progress: float | None = None) -> float:
        schedule = Schedule(
            self.diag_shift, self.diag_shift_final, self.diag_shift_schedule, self.n_iter
        )
        return schedule(step, progress)


@dataclass
class StepResult:
    """What one optimisation step measured; the energy is that of the parameters before it.

    Attributes:
        step: step index (0-based).
        energy: `Stats` of the local energies.
        acceptance: Metropolis acceptance rate (NaN for the exact sampler).
        update_norm: ``‖η δθ‖`` of the applied update (after any trust bound).
        update_capped: whether the trust bound (``max_update_ratio``) shortened the update.
        lr, diag_shift: values used (after any NaN-guard raise).
        n_retries: non-finite attempts before this one succeeded.
        timings: seconds per phase: ``sampling``, ``local_energy``, ``jacobian``, ``solve``.
    """

    step: int
    energy: Stats
    acceptance: float
    update_norm: float
    lr: float
    diag_shift: float
    n_retries: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    update_capped: bool = False


class VMC:
    """Ground-state optimisation of ``model`` for ``hamiltonian``; iterate `run` for steps.

    Args:
        hamiltonian: follows the operator contract.
        model: ``(B, N) -> log ψ (B,)`` with real parameters.
        sampler: a `MetropolisSampler`, or an `ExactSampler` for full-sum mode.
        settings: `OptimizerSettings`.
        chunk_size: samples per forward pass in local energies and log-derivatives.
        local_energy_dtype: precision of the network copy that evaluates the connected
            configurations in the steps' local energies (None: the model itself). The
            samples' log ψ, the ratios' sums, gradients and S stay in the model's dtype.
    """

    def __init__(
        self,
        hamiltonian,
        model,
        sampler,
        settings: OptimizerSettings,
        *,
        chunk_size=None,
        local_energy_dtype: torch.dtype | None = None,
    ):
        self.hamiltonian, self.model, self.sampler = hamiltonian, model, sampler
        self.settings = settings
        self.chunk_size = chunk_size
        if local_energy_dtype is not None and isinstance(sampler, ExactSampler):
            raise ValueError(
                f"sampler.local_energy_dtype={local_energy_dtype} needs Monte Carlo samples; "
                "the full sum's local energies come from one sparse product, not the network"
            )
        self._local_energy_network = NetworkCopy(
            local_energy_dtype, key="sampler.local_energy_dtype"
        )
        self.step_count = 0
        # fraction of a wall-clock budget spent, set by whoever keeps the clock; schedules
        # then run over n_iter or the budget, whichever ends first (None: steps only)
        self.budget_progress: float | None = None
        self.adam = Adam() if settings.method == "adam" else None
        self._last_good: tuple[torch.Tensor, dict | None] | None = None  # before last update
        self._last_energy: float | None = None
        self._average: tuple[torch.Tensor, int] | None = None  # (mean θ, count)
        self._recent_norms: list[float] = []  # lengths of the last applied updates

    def run(self, n_iter: int | None = None) -> Iterator[StepResult]:
        """Yields one `StepResult` per step, ``n_iter`` steps (default ``settings.n_iter``)."""
        for _ in range(self.settings.n_iter if n_iter is None else n_iter):
            yield self.step()

    def step(self) -> StepResult:
        """Returns the result of one guarded step; raises `NonFiniteEnergyError`."""
        for n_retries in range(self.settings.max_retries + 1):
            result = self._attempt(boost=10.0**n_retries)
            if result is not None:
                result.n_retries = n_retries
                self.step_count += 1
                return result
        raise NonFiniteEnergyError(self.step_count, self._last_energy, self.settings.max_retries)

    def _attempt(self, boost: float) -> StepResult | None:
        timings = {}
        start = time.perf_counter()
        samples = self.sampler.sample(self.model)
        timings["sampling"] = _lap(start)
        if not bool(torch.isfinite(samples.log_psi).all()):
            self._undo_last_update()
            return None
        start = time.perf_counter()
        e_loc = sample_local_energy(
            self.hamiltonian,
            self.model,
            self.sampler,
            samples,
            self.chunk_size,
            network=self._local_energy_network(self.model),
        )
        stats = sample_statistics(e_loc, samples)
        timings["local_energy"] = _lap(start)
        if not math.isfinite(abs(stats.mean)):
            self._undo_last_update()
            return None
        lr, diag_shift = self._hyperparameters(boost)
        theta, adam_before = parameter_vector(self.model), _copy_state(self.adam)
        update = self._update(samples, e_loc, diag_shift, timings)
        if not bool(torch.isfinite(update).all()):
            if adam_before is not None:
                self.adam.load_state_dict(adam_before)
            return None  # nothing applied
        step, capped = self._within_trust_bound(lr * update)
        if not bool(torch.isfinite(theta - step).all()):  # a finite step that overflows θ
            self._recent_norms.pop()
            if adam_before is not None:
                self.adam.load_state_dict(adam_before)
            return None
        self._last_good = (theta, adam_before)
        self._add_to_average(theta)  # θ whose energy was just measured finite
        set_parameter_vector(self.model, theta - step)
        self._last_energy = stats.mean.real
        return StepResult(
            step=self.step_count,
            energy=stats,
            acceptance=samples.acceptance,
            update_norm=self._recent_norms[-1],
            lr=lr,
            diag_shift=diag_shift,
            timings=timings,
            update_capped=capped,
        )

    def _within_trust_bound(self, step: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Returns ``step`` shortened to ``max_update_ratio`` times the median length of the
        recent updates when it is longer (once ``UPDATE_MIN_HISTORY`` are known), and whether
        it was; records the applied length."""
        length, capped = float(step.norm()), False
        ratio, recent = self.settings.max_update_ratio, self._recent_norms
        if ratio is not None and len(recent) >= UPDATE_MIN_HISTORY:
            bound = ratio * float(np.median(recent))
            if length > bound:
                step, length, capped = step * (bound / length), bound, True
        recent.append(length)
        del recent[:-UPDATE_WINDOW]
        return step, capped

    def progress(self) -> float:
        """Returns the fraction of the run done: of ``n_iter`` steps or of the budget."""
        return max(self.step_count / self.settings.n_iter, self.budget_progress or 0.0)

    def _add_to_average(self, theta: torch.Tensor) -> None:
        start = self.settings.average_from
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
        lr = self.settings.lr_at(self.step_count, self.budget_progress)
        diag_shift = self.settings.diag_shift_at(self.step_count, self.budget_progress)
        if self.adam is not None:
            return lr / boost, diag_shift
        return lr, diag_shift * boost

    def _update(self, samples: Samples, e_loc, diag_shift, timings) -> torch.Tensor:
        """Returns the direction ``g`` (apply ``θ ← θ − η g``), float64 ``(P,)``."""
        x, weights = samples.x.reshape(-1, samples.x.shape[-1]), samples.weights
        e_loc = e_loc.reshape(-1)
        width = self.settings.clip_local_energy
        if weights is None:
            importance = samples.log_importance
            if importance is not None:
                importance = importance_weights(importance).reshape(-1)
            if width is not None:
                e_loc = clip_local_energy(e_loc, width, importance)
            x, e_loc, weights = _distinct_samples(x, e_loc, importance)
        else:
            weights = weights.reshape(-1)
        start = time.perf_counter()
        jac = log_derivatives(self.model, x, self.chunk_size)  # (N_s, P)
        timings["jacobian"] = _lap(start)
        start = time.perf_counter()
        if self.adam is None:
            update = natural_gradient(
                jac, e_loc, diag_shift=diag_shift, weights=weights, method=self.settings.method
            )
        else:
            update = self.adam.direction(energy_gradient(jac, e_loc, weights))
        timings["solve"] = _lap(start)
        # every rank solved the same system; rank 0's answer keeps the parameters equal
        # on all ranks even where rounding differs between them
        return broadcast_from_root(update)

    def _undo_last_update(self):
        if self._last_good is None:
            return
        theta, adam_state = self._last_good
        set_parameter_vector(self.model, theta)
        if adam_state is not None:
            self.adam.load_state_dict(adam_state)

    def state_dict(self) -> dict:
        """Returns the step counter, Adam moments and last good state, for checkpoints."""
        return {
            "step": self.step_count,
            "adam": _copy_state(self.adam),
            "last_energy": self._last_energy,
            "last_good": self._last_good,
            "average": self._average,
            "recent_norms": list(self._recent_norms),
        }

    def load_state_dict(self, state: dict):
        """Restores `state_dict`'s values; ValueError when they are not of its shapes (a
        checkpoint read from a file is data anyone may have written)."""
        _check_state(state, parameter_vector(self.model).shape)
        self.step_count = int(state["step"])
        if state.get("adam") is not None and self.adam is not None:
            self.adam.load_state_dict(state["adam"])
        self._last_energy = state.get("last_energy")
        self._last_good = state.get("last_good")
        self._average = state.get("average")
        self._recent_norms = list(state.get("recent_norms") or [])


def _check_state(state: dict, n_params: torch.Size) -> None:
    """Raises ValueError unless ``state`` has the types and shapes `VMC.state_dict` gives."""

    def vector(value) -> bool:
        return isinstance(value, torch.Tensor) and value.shape == n_params

    def adam(value) -> bool:
        keys = {"step", "m", "v", "betas", "eps"}
        return value is None or (isinstance(value, dict) and keys <= set(value))

    step, last_good, average = state.get("step"), state.get("last_good"), state.get("average")
    checks = {
        "step": isinstance(step, int) and step >= 0,
        "adam": adam(state.get("adam")),
        "last_energy": state.get("last_energy") is None
        or isinstance(state.get("last_energy"), float),
        "last_good": last_good is None
        or (
            isinstance(last_good, tuple)
            and len(last_good) == 2
            and vector(last_good[0])
            and adam(last_good[1])
        ),
        "average": average is None
        or (
            isinstance(average, tuple)
            and len(average) == 2
            and vector(average[0])
            and isinstance(average[1], int)
        ),
        # None or absent: a checkpoint from before the trust bound
        "recent_norms": isinstance(state.get("recent_norms") or [], list)
        and all(isinstance(v, float) for v in state.get("recent_norms") or []),
    }
    wrong = [key for key, ok in checks.items() if not ok]
    if wrong:
        raise ValueError(
            f"optimizer state {wrong} is not what a VMC of {n_params.numel()} parameters keeps"
        )


def optimize(
    hamiltonian, model, sampler, settings: OptimizerSettings, n_iter=None, *, chunk_size=None
):
    """Yields a `StepResult` per step; shorthand for ``VMC(...).run(n_iter)``."""
    yield from VMC(hamiltonian, model, sampler, settings, chunk_size=chunk_size).run(n_iter)


def n_batches(sampler, n_samples: int) -> int:
    """Returns the calls of ``sampler`` that `draw_samples` makes for ``n_samples`` samples
    (one for the exact sampler, which returns the whole sector)."""
    return 1 if isinstance(sampler, ExactSampler) else math.ceil(n_samples / sampler.n_samples)


def draw_samples(
    sampler, model, n_samples: int | None = None, n_discard: int | None = None
) -> Samples:
    """Returns at least ``n_samples`` samples of ``|ψ|²``, joined along each chain.

    Draws ``ceil(n_samples / sampler.n_samples)`` batches: the first after ``n_discard``
    sweeps per chain (None: the sampler's ``n_discard``), the later ones continuing the
    chains without discarding. The exact sampler returns the whole sector once.
    """
    n_samples = sampler.n_samples if n_samples is None else n_samples
    batches = [
        sampler.sample(model, n_discard=n_discard if b == 0 else 0)
        for b in range(n_batches(sampler, n_samples))
    ]
    if len(batches) == 1:
        return batches[0]
    return Samples(
        x=torch.cat([s.x for s in batches], dim=1),
        log_psi=torch.cat([s.log_psi for s in batches], dim=1),
        weights=None,
        acceptance=sum(s.acceptance for s in batches) / len(batches),
        log_importance=None
        if batches[0].log_importance is None
        else torch.cat([s.log_importance for s in batches], dim=1),
    )


def final_estimate(
    hamiltonian, model, sampler, *, n_samples: int | None = None, chunk_size=None
) -> Stats:
    """Returns the energy `Stats` of the current parameters from ``n_samples`` samples."""
    samples = draw_samples(sampler, model, n_samples)
    e_loc = sample_local_energy(hamiltonian, model, sampler, samples, chunk_size)
    return sample_statistics(e_loc, samples)


def sample_statistics(e_loc: torch.Tensor, samples: Samples) -> Stats:
    """Returns the `Stats` of local energies: exact sums for the full sum, importance-
    weighted for samples of ``|ψ|^p`` (p ≠ 2), plain Monte Carlo otherwise."""
    if samples.log_importance is not None:
        return importance_statistics(e_loc, importance_weights(samples.log_importance))
    return statistics(e_loc, samples.weights)


def sample_local_energy(
    hamiltonian, model, sampler, samples: Samples, chunk_size=None, *, network=None
):
    """Returns the local energies of ``samples`` drawn by ``sampler``.

    The whole sector (exact sampler) takes one sparse matvec; Monte Carlo samples go
    through ``local_energy`` and ``network`` (default ``model``; e.g. its float32 copy),
    which evaluates the connected configurations only: the denominators ``ψ(x)`` are the
    samples' own ``log ψ``. Rounding in a float32 ``log ψ(x)`` would scale every term of
    ``E_loc(x)`` alike, while the numerators' errors partly average out over the terms.
    """
    if isinstance(sampler, ExactSampler):
        return sampler.local_energy(hamiltonian, samples.log_psi)
    network = model if network is None else network
    return local_energy(hamiltonian, network, samples.x, samples.log_psi, chunk_size)


def _distinct_samples(x: torch.Tensor, e_loc: torch.Tensor, importance=None):
    """Returns the distinct configurations of Monte Carlo samples, their local energies and
    weights ``count / N_s``: the same S and F as the ``N_s`` rows of equal weight ``1/N_s``
    (a repeated row adds its outer product ``count`` times), at one log-derivative and one
    kernel row per distinct configuration. A Mott insulator's samples repeat the uniform
    filling most of the time (~100 distinct of 1,024 at U = 10 on 12 sites).

    With ``importance``, the samples' normalised importance weights ``(N_s,)``, a distinct
    configuration weighs the sum of its samples' weights instead.
    """
    rows = distinct_rows(x)
    if importance is not None:
        weights = torch.zeros(rows.n_distinct, dtype=torch.float64, device=x.device)
        weights.index_add_(0, rows.inverse, importance.to(torch.float64))
        return rows.x, e_loc[rows.first], weights
    n_samples = reduce_sum(torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device))
    weights = rows.counts.to(torch.float64) / n_samples
    return rows.x, e_loc[rows.first], weights


def _lap(start: float) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _copy_state(adam: Adam | None) -> dict | None:
    if adam is None:
        return None
    state = adam.state_dict()
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
