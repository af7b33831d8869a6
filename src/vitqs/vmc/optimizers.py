"""How the parameters move besides the natural gradient: schedules of a value over the run.

A `Schedule` is the value: the loop asks it for the learning rate or the diagonal shift at
each step (``optimizer.lr`` and ``diag_shift``: a number, or ``{schedule, start, end}``),
over ``n_iter`` steps or, when ahead, the fraction of a wall-clock budget spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vitqs.config import SCHEDULES


# ----------------------------------------------------------------- schedules
@dataclass(frozen=True)
class Schedule:
    """A value per step: ``constant``, or from ``initial`` to ``final`` over ``n_steps``.

    With ``t = min(step, n_steps)/n_steps``: exponential ``initial·(final/initial)^t``;
    cosine ``final + (initial − final)(1 + cos πt)/2``. After ``n_steps`` it stays at final.
    """

    initial: float
    final: float | None = None
    kind: str = "constant"
    n_steps: int | None = 1

    @classmethod
    def of(cls, value, n_steps: int | None) -> Schedule:
        """Returns the schedule of a config value (``optimizer.lr`` or ``diag_shift``): a
        number, constant, or ``{schedule, start, end}``, over ``n_steps`` steps (None: over
        a wall-clock budget only, through ``progress``)."""
        if isinstance(value, dict):
            return cls(value["start"], value["end"], value["schedule"], n_steps)
        return cls(value, None, "constant", n_steps)

    def __post_init__(self):
        if self.kind not in ("constant", *SCHEDULES):
            raise ValueError(
                f"schedule kind {self.kind!r} is not one of {['constant', *SCHEDULES]}"
            )
        if self.kind != "constant" and self.final is None:
            raise ValueError(f"a {self.kind} schedule from {self.initial} needs a final value")
        if self.kind == "exponential" and not (self.initial > 0 and self.final > 0):
            raise ValueError(
                f"an exponential schedule needs positive values, got {self.initial} -> {self.final}"
            )
        if self.n_steps is not None and self.n_steps < 1:
            raise ValueError(f"schedule n_steps={self.n_steps} must be >= 1")

    def __call__(self, step: int, progress: float | None = None) -> float:
        """Returns the value at ``step``, or further on when ``progress`` (a fraction of the
        run already done by another measure, e.g. of a wall-clock budget) is ahead."""
        if self.kind == "constant":
            return float(self.initial)
        t = 0.0 if self.n_steps is None else min(step, self.n_steps) / self.n_steps
        if progress is not None:
            t = min(max(t, float(progress)), 1.0)
        if self.kind == "exponential":
            return float(self.initial * (self.final / self.initial) ** t)
        return float(self.final + (self.initial - self.final) * 0.5 * (1 + math.cos(math.pi * t)))
