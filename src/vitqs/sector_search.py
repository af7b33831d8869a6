"""The ground state's symmetry sector, and the sign prior its network learns best with, found
without ED: short runs of the config's own network, projected on each candidate sector
(`models.sectors.candidates`: one momentum per star, each real one-dimensional
representation of its little group, each spin inversion eigenvalue), compared by energy.

Successive halving: every candidate runs a first round; each round keeps the better half by
the mean energy of its last quarter of steps (at least three), and the survivors run twice as
long in the next, from where they stopped, until one is left. A variational energy is an
upper bound in every sector, so the sector whose state gets lowest holds the ground state
unless the lowest level of another sector is within the noise of the short runs; the margin
to the runner-up, in its combined standard errors, says how far apart the short runs' late
energies are, not how far they are from converged: a sector slow to learn can lose to one
whose lowest level lies above. So the search also says whether it is *settled*: a
candidate dropped while its energy was still falling, over its last quarter of steps, by
more than it lay behind the cut (and by more than twice that fall's standard error) might
have passed the cut with more steps, and the search says which one and by how much. On the
kagome 2×3 (the defaults' search, seed 1) all five dropped candidates were, the ground
state's sector among them (docs/new_system.md, section 3); on the rings and the ladder of
the tests, whose trials converge within their rounds, none. ED, where it exists, checks the choice
(`physics.symmetry.ground_state_sector`); it never makes it.

The sign prior (``model.sign_prior: search``, `search_sign_prior`) is raced the same way: one
short run per prior the lattice takes (none and each stripe pattern), kept by energy. Here a
short race errs the safe way: the prior that matches the ground state's signs is the one the
network learns fastest with (the triangular 6x4, two seeds: after 100 steps stripes_x 0.8 %
above E_0, stripes_y and stripes_xy near the excited singlet 3 % above, none 3.3 % and 1.0 %;
docs/new_system.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from vitqs.build import build_hamiltonian, build_vmc
from vitqs.config import FIXED_SIGN_PRIORS, Config, ConfigError, HeisenbergConfig, from_dict
from vitqs.distributed import agree_max
from vitqs.errors import first_line
from vitqs.extrapolation import stage_extrapolation
from vitqs.models.sectors import Sector, candidates
from vitqs.models.symmetrize import little_space_group
from vitqs.physics import exact
from vitqs.physics.symmetry import lowest_levels
from vitqs.vmc.driver import NonFiniteEnergyError

# Steps of the first round when no time is given (each later round doubles them), and the
# least a trial makes in a round when one is: at 20 a 6-site ring's sector of k = 0 and odd
# reflection, whose lowest level a short run reaches at once, beat the ground state's at k = π
# by 2.3 σ; at 50 the choice is right with a margin of hundreds of σ.
FIRST_STEPS = 50
# The least a sector's trial makes in a round. A trial of momentum π carrying its stripes
# (`momentum_prior`) starts slower than one at k = 0, and leads only later: on the kagome
# 2×3 ED's sector's trial was cut after 50 steps on seed 1 (−6.38 over steps 25–50, k = [0, 0]
# −7.10) and after 75 on seed 2 (fourth, 0.048 behind the third); with rounds of 75 the search
# chose it on seeds 0, 1 and 5, with rounds of 100 on seeds 1 and 2 (from step ~100–150 on it
# leads; results/history/accuracy_notes.md).
SECTOR_STEPS = 100


@dataclass(frozen=True)
class SignPrior:
    """A candidate of the sign-prior race, in the config's key ``model.sign_prior``."""

    name: str

    def label(self) -> str:
        return f"sign_prior={self.name}"

    def keys(self) -> dict:
        return {"sign_prior": self.name}


@dataclass
class Trial:
    """One candidate's short run (a `Sector` or a `SignPrior`): its energies so far, or why
    it was not run."""

    candidate: Sector | SignPrior
    energies: list[float] = field(default_factory=list)
    variances: list[float] = field(default_factory=list)
    refused: str = ""
    vmc: object = None
    rounds: int = 0
    stalled: str = ""  # why it takes no more steps (its energies still count)
    cut: float | None = None  # the last survivor's score when this trial was dropped
    # the trial's model.sign_prior (`momentum_prior` for a sector); None where refused
    sign_prior: str | None = None

    def score(self) -> tuple[float, float]:
        """Returns the mean energy of the last quarter of the steps (at least three) and its
        standard error; (inf, inf) before any step."""
        if not self.energies:
            return math.inf, math.inf
        tail = np.array(_late(self.energies))
        error = tail.std(ddof=1) / math.sqrt(len(tail)) if len(tail) > 1 else math.inf
        return float(tail.mean()), float(error)

    def fall(self) -> tuple[float, float]:
        """Returns how far the energy fell over the trial's last quarter of steps: the mean
        of the as many steps before it minus the score, and its standard error; (NaN, NaN)
        with fewer steps than two such windows."""
        n = len(_late(self.energies))
        if n == 0 or len(self.energies) < 2 * n:  # none at all: a candidate left out
            return math.nan, math.nan
        before = np.array(self.energies[-2 * n : -n])
        score, error = self.score()
        before_error = before.std(ddof=1) / math.sqrt(n)
        return float(before.mean() - score), float(math.hypot(error, before_error))

    def behind(self) -> float:
        """Returns how far the trial's score lay above the cut it was dropped at (NaN if it
        was not dropped)."""
        return math.nan if self.cut is None else self.score()[0] - self.cut

    def unsettled(self) -> bool:
        """Returns whether the trial was dropped while its energy still fell, over its last
        quarter of steps, by more than it lay behind the cut and by more than twice the
        fall's standard error: with more steps it might have passed the cut."""
        if self.cut is None:
            return False
        fall, error = self.fall()
        return fall > self.behind() and fall > 2 * error

    def zero_variance(self) -> tuple[float, float]:
        """Returns the energy at zero variance of the trial's last half of the steps and its
        error (`extrapolation.stage_extrapolation`; NaN with too few steps): where a
        sector's short run stands against that sector's lowest level, recorded beside the
        score (the search ranks by the score)."""
        return stage_extrapolation(self.energies, self.variances)


@dataclass
class SearchResult:
    """The trials, best first (refused ones last), and the chosen candidate with its margin:
    (runner-up's score − the best's) / their combined error, inf with a single candidate.
    `rows` gives each trial's summary and its energy and variance at every step."""

    trials: list[Trial]
    chosen: Sector | SignPrior
    margin_sigma: float
    seconds: float

    def unsettled(self) -> list[Trial]:
        """Returns the trials dropped while still falling faster than their distance to the
        cut (`Trial.unsettled`): where a longer search might choose otherwise."""
        return [trial for trial in self.trials if trial.unsettled()]

    def settled_text(self) -> str:
        """Returns one line on whether the choice is settled, naming the dropped candidate
        that fell most beyond its distance to the cut where it is not."""
        unsettled = self.unsettled()
        if not unsettled:
            return "settled: no candidate was dropped while still falling past the cut"
        worst = max(unsettled, key=lambda t: t.fall()[0] - t.behind())
        steps = len(_late(worst.energies))
        many = (
            f"{len(unsettled)} dropped candidates were"
            if len(unsettled) > 1
            else "a dropped candidate was"
        )
        return (
            f"not settled: {many} still falling past the cut, e.g. "
            f"{worst.candidate.label()} by {worst.fall()[0]:.3g} over its last {steps} steps, "
            f"{worst.behind():.3g} behind it; a longer search may choose otherwise"
        )

    def rows(self) -> list[dict]:
        rows = []
        for trial in self.trials:
            energy, error = trial.score()
            late = _late(trial.variances)
            zero, zero_error = trial.zero_variance()
            fall, fall_error = trial.fall()
            rows.append(
                {
                    "candidate": trial.candidate.label(),
                    **trial.candidate.keys(),
                    "sign_prior": trial.sign_prior,
                    "energy": None if math.isinf(energy) else energy,
                    "energy_error": None if math.isinf(error) else error,
                    "variance": float(np.mean(late)) if late else None,
                    "zero_variance": _finite_or_none(zero),
                    "zero_variance_error": _finite_or_none(zero_error),
                    "steps": len(trial.energies),
                    "rounds": trial.rounds,
                    # how far its energy fell over its last quarter, and where it was cut
                    "fall": _finite_or_none(fall),
                    "fall_error": _finite_or_none(fall_error),
                    "cut": trial.cut,
                    "unsettled": trial.unsettled(),
                    "refused": trial.refused,
                    # the race itself, step by step: how sure the choice is can be read
                    # off the curves, and another rule tried on them
                    "energies": [float(e) for e in trial.energies],
                    "variances": [float(v) for v in trial.variances],
                }
            )
        return rows


def trial_config(config: Config, sector: Sector) -> Config:
    """Returns ``config`` projected on ``sector`` for a short run: the space-group average
    on its momentum and characters (and spin inversion), with the sign prior that carries
    the sector's momentum (`momentum_prior`), no budget, no reference, and steps as many as
    asked (schedules then stay near their start), local energies in float32 unless the config
    sets their precision (as the kagome 2×3's measured search did), and half the config's
    samples a step (`_half_the_samples`)."""
    data = config.to_dict()
    data["model"].update(
        sector=sector.keys(), symmetrize="space_group", sign_prior=momentum_prior(config, sector)
    )
    _half_the_samples(data["sampler"])
    return _short_run(data)


def _half_the_samples(sampler: dict) -> None:
    """Halves a Metropolis sampler's samples a step (a multiple of its chains, one sample a
    chain at least). A trial's step at half the samples costs about half (1.4 against 2.7 s
    on the kagome 2×3, one thread) and made the same progress per step in ED's sector (seed
    1: −7.871 and −8.000 after 200 and 300 steps, against −7.873 and −7.996 with 1,024);
    with a quarter (256) the steps were noisier and the kagome 2×3's search chose k = [0, 0],
    7.2 σ ahead, where ED's [1, 0] had won at 1.2 σ (results/history/accuracy_notes.md)."""
    if sampler["kind"] != "metropolis":
        return
    chains = sampler["n_chains"]
    sampler["n_samples"] = max(chains, sampler["n_samples"] // 2 // chains * chains)


# the sign prior whose marks alternate along the axes where the momentum is π
_PRIOR_OF_HALF_AXES = {(1,): "stripes_x", (1, 0): "stripes_x", (0, 1): "stripes_y"}
_PRIOR_OF_HALF_AXES[(1, 1)] = "stripes_xy"


def momentum_prior(config: Config, sector: Sector) -> str:
    """Returns the ``model.sign_prior`` a sector's trial, and the run in that sector, carry:
    the config's own where it sets one, else the stripes that carry the sector's momentum.

    A network at its start is near a constant, and a constant projected on a momentum k ≠ 0
    nearly cancels: the trial starts from the noise of the start and learns its sector last.
    A prior of −1 per up spin on the cells of odd n_x (`stripes_x`) changes sign under a shift
    by one cell when the up spins are odd in number: times a constant it is a state of
    momentum π along x, so the trial starts in its sector. On the kagome 2×3 (9 up spins), the
    ground state's sector k = [1, 0] (π along x) took its trial 300 to more than 400 steps to
    reach without it, passing the sector's second singlet 0.26 above (seeds 1 and 5), and
    100 to 175 steps with `stripes_x` (results/history/accuracy_notes.md). Only momenta of 0
    or π along every axis with an odd number of up spins have such a prior; elsewhere
    ``none`` (the trial as before). Spins with a complex ψ only (a prior is a sign)."""
    model = config.model
    if model.sign_prior != "none" or model.positive:
        return model.sign_prior
    if not isinstance(config.hamiltonian, HeisenbergConfig):
        return "none"
    lattice = build_hamiltonian(config).lattice
    n_up = round(lattice.n_sites / 2 + config.hamiltonian.total_sz)
    momentum = sector.momentum
    half = tuple(int(2 * n == extent) for n, extent in zip(momentum, lattice.shape, strict=True))
    carried = all(n == 0 or h for n, h in zip(momentum, half, strict=True))
    if n_up % 2 == 0 or not any(half) or not carried:
        return "none"
    return _PRIOR_OF_HALF_AXES[half]


def prior_config(config: Config, prior: SignPrior) -> Config:
    """Returns ``config`` with the sign prior ``prior``, as a short run (`trial_config`'s)."""
    data = config.to_dict()
    data["model"].update(prior.keys())
    return _short_run(data)


def _short_run(data: dict) -> Config:
    """Returns the config of a race's trial: local energies in float32 unless the config sets
    their precision, no budget, no reference, steps as many as asked."""
    sampler = data["sampler"]
    if sampler["kind"] == "metropolis" and sampler["local_energy_dtype"] is None:
        # sectors' short runs lie 1e-3 (relative) apart or more; float32 moves a step's
        # energy by ~1e-6 and makes the local energies of the space-group average, most of
        # a trial's step, ~2x cheaper
        sampler["local_energy_dtype"] = "float32"
    data["optimizer"]["n_iter"] = 10**9
    data["budget"] = None
    data["exact"]["enabled"] = False
    return from_dict(data)


def search(
    config: Config,
    *,
    seconds: float | None = None,
    first_steps: int = SECTOR_STEPS,
    say=None,
):
    """Returns the `SearchResult` of successive halving over the candidate sectors.

    ``seconds``: the wall-clock time the whole search may take, split evenly over its rounds
    and within a round over its survivors, though every trial makes ``first_steps`` steps a
    round at least (fewer say nothing about a sector: it may take longer, and ``say``, a
    callable taking one line, is told so once the first trial's steps give the pace); None:
    rounds of ``first_steps`` steps, doubling.
    """
    sectors = candidates_of(config)
    return _race(config, sectors, trial_config, "sector", seconds, first_steps, say)


def search_sign_prior(
    config: Config,
    *,
    seconds: float | None = None,
    first_steps: int = FIRST_STEPS,
    say=None,
):
    """Returns the `SearchResult` of successive halving over the sign priors
    (``model.sign_prior``): none and each stripe pattern, those the lattice refuses (an odd
    periodic extent along the stripes) left out as refused; ``seconds``, ``first_steps`` and
    ``say`` as `search`'s."""
    priors = [SignPrior(name) for name in FIXED_SIGN_PRIORS]
    return _race(config, priors, prior_config, "sign prior", seconds, first_steps, say)


def _race(config, candidates, configure, what, seconds, first_steps, say):
    """Returns the `SearchResult` of successive halving over ``candidates``, each run as
    ``configure(config, candidate)``; ``what`` names them in messages."""
    start = time.perf_counter()
    trials = [Trial(candidate) for candidate in candidates]
    for trial in trials:
        try:
            short_run = configure(config, trial.candidate)
            trial.sign_prior = short_run.model.sign_prior
            # short trials: a compile of the chains would not pay back
            trial.vmc = build_vmc(short_run, compile_chains=False)
        except ConfigError as err:  # the network cannot carry it, or the sector is empty
            trial.refused = str(err)
    alive = [t for t in trials if not t.refused]
    if not alive:
        raise ConfigError(
            f"{what} search: the network takes none of the {len(trials)} candidates "
            f"(the first: {trials[0].refused})"
        )
    n_rounds = _halvings(len(alive))
    steps = first_steps
    for round_index in range(n_rounds):
        left = None if seconds is None else seconds - (time.perf_counter() - start)
        share = None if left is None else left / (n_rounds - round_index) / len(alive)
        for trial in alive:
            if not trial.stalled:
                began = time.perf_counter()
                _advance(trial, steps, share, least=first_steps)
                if trial is alive[0] and round_index == 0 and seconds is not None and say:
                    _tell_pace(trial, began, len(alive), n_rounds, seconds, what, say)
            trial.rounds += 1
        alive = [t for t in alive if not t.refused]
        if not alive:
            raise ConfigError(f"{what} search: every candidate's energy became non-finite")
        alive.sort(key=lambda t: t.score()[0])
        kept = math.ceil(len(alive) / 2)
        for dropped in alive[kept:]:
            dropped.cut = alive[kept - 1].score()[0]
        alive = alive[:kept]
        steps *= 2
    ranked = sorted(trials, key=lambda t: (bool(t.refused), -t.rounds, t.score()[0]))
    best = ranked[0]
    return SearchResult(ranked, best.candidate, _margin(ranked), time.perf_counter() - start)


def candidates_of(config: Config) -> list[Sector]:
    """Returns the candidate sectors of the config's lattice; spin inversion for spins at
    S^z = 0."""
    hamiltonian = build_hamiltonian(config)
    spins = isinstance(config.hamiltonian, HeisenbergConfig)
    return candidates(hamiltonian.lattice, spin_flip=spins and config.hamiltonian.total_sz == 0)


def exact_levels(config: Config, n_levels: int = 1) -> list[tuple[Sector, list[float]]]:
    """Returns each candidate sector (`candidates_of`) with its ``n_levels`` lowest exact
    levels, ascending, by Lanczos on the sector's projection of the Hamiltonian's matrix
    (`physics.symmetry.lowest_levels`; fewer where the sector holds fewer states, none where
    it holds no state): what a search's short runs are racing towards, the gaps that decide
    how long they must run, and the levels above on which a short run may stall. Where ED
    fits (``exact.max_dim``) only: `exact.SectorTooLargeError` otherwise."""
    hamiltonian = build_hamiltonian(config)
    exact.check_dimension(hamiltonian, config.exact.max_dim)
    matrix = hamiltonian.to_sparse()
    levels = []
    for sector in candidates_of(config):
        group, characters = little_space_group(
            hamiltonian.lattice, list(sector.momentum), list(sector.point_characters)
        )
        found = lowest_levels(
            matrix, hamiltonian.hilbert, group, characters, sector.spin_flip, n_levels
        )
        levels.append((sector, found))
    return levels


def _tell_pace(trial: Trial, began: float, n_alive: int, n_rounds: int, seconds, what, say):
    """Says, when the rounds' least steps at the first trial's pace need more than
    ``seconds``, how long the search will take: longer than its share of a budget, the
    steps after it get less."""
    per_step = (time.perf_counter() - began) / max(len(trial.energies), 1)
    steps = len(trial.energies)
    needed = 0.0
    alive = n_alive
    for _ in range(n_rounds):
        needed += alive * steps * per_step
        alive = math.ceil(alive / 2)
    if needed > seconds:
        say(
            f"{what} search: {n_alive} candidates at {per_step:.2g} s a step and "
            f"{steps} steps a round at least need ~{needed:.0f} s, more than the {seconds:g} s "
            "given it; the search takes them (a shorter one says little about a candidate)"
        )


def _halvings(n: int) -> int:
    """Returns the rounds that keeping the better half (rounded up) takes from ``n`` to one
    (one round at least: a single candidate is still run and scored)."""
    rounds = 0
    while n > 1:
        n, rounds = math.ceil(n / 2), rounds + 1
    return max(rounds, 1)


def _advance(trial: Trial, steps: int, seconds: float | None, least: int) -> None:
    """Runs ``steps`` more steps of the trial, or as many as ``seconds`` allows (``least``
    at least); a trial whose energy or update stays non-finite drops out, saying so."""
    start = time.perf_counter()
    try:
        for done, result in enumerate(trial.vmc.run(n_iter=steps if seconds is None else None)):
            trial.energies.append(result.energy.mean.real)
            trial.variances.append(result.energy.variance)
            if seconds is not None and done + 1 >= least:
                # every rank stops at the same step: their collectives stay paired
                if agree_max(time.perf_counter() - start) >= seconds:
                    break
    except NonFiniteEnergyError as err:
        if not trial.energies:  # nothing to compare: the projection gave no finite state
            trial.refused = f"dropped: {first_line(err)}"
        else:  # an exact eigenstate of a small sector can stall SR: its energy stands
            trial.stalled = first_line(err)


def _late(values: list[float]) -> list[float]:
    """Returns the last quarter of a trial's per-step values, three at least: what it is
    scored on."""
    return values[-max(3, len(values) // 4) :]


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _margin(ranked: list[Trial]) -> float:
    finished = [t for t in ranked if not t.refused and t.rounds == ranked[0].rounds]
    if len(finished) < 2:
        contenders = [t for t in ranked if not t.refused]
        if len(contenders) < 2:
            return math.inf
        finished = contenders[:2]
    (e1, s1), (e2, s2) = finished[0].score(), finished[1].score()
    scale = math.hypot(s1, s2)
    if not math.isfinite(scale):
        return math.inf
    if scale == 0.0:  # exact sums in sectors of one state: energies without noise
        return math.inf if e2 > e1 else 0.0
    return (e2 - e1) / scale
