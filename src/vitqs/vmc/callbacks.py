"""Callbacks of `VMC.run` that watch the physics of the loop.

A callback is called as ``callback(vmc, result)`` after every step; it returns True to end
the loop after the step, or raises to stop the run. The shell's callbacks (the results file,
checkpoints, signals, the progress bar) are in `vitqs.runner`.
"""

from __future__ import annotations

from vitqs.vmc.reliability import chains_frozen


class ChainsFrozen(RuntimeError):
    """The chains were frozen for ``sampler.max_frozen_steps`` steps in a row."""


class FrozenChains:
    """Stops a run whose chains have been frozen (`reliability.chains_frozen`: fewer than
    one accepted move per chain in 100 sweeps, none at all included) for ``max_steps`` steps
    in a row: its estimates are of a few configurations per chain, and SR cannot move a
    state whose samples are all alike (a collapsed state). The exact sum's NaN acceptance
    never counts.

    Args:
        max_steps: ``sampler.max_frozen_steps``; None: never stop.
    """

    def __init__(self, max_steps: int | None):
        self.max_steps, self.n_frozen = max_steps, 0

    def __call__(self, vmc, result) -> bool:
        frozen = chains_frozen(result.acceptance, getattr(vmc.sampler, "sweep_size", 1))
        self.n_frozen = self.n_frozen + 1 if frozen else 0
        if self.max_steps is not None and self.n_frozen >= self.max_steps:
            step, n = vmc.step_count, self.n_frozen
            accepted = "no move" if result.acceptance == 0 else "almost no move"
            raise ChainsFrozen(
                f"the sampler accepted {accepted} for {n} steps in a row (steps "
                f"{step - n + 1}-{step}, sampler.max_frozen_steps={n}, fewer than one "
                f"accepted move per chain in 100 sweeps): every chain is "
                f"frozen, so the state has collapsed onto a few configurations and the energy "
                f"and gradient no longer mean anything (go on with a larger "
                f"optimizer.diag_shift or a smaller optimizer.lr, or sampler.max_frozen_steps: "
                f"null to let it run on)"
            )
        return False
