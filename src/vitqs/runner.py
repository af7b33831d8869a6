"""A run: a validated config in, a finished (or resumable) results file out.

``run_config`` drives the VMC generator with the
results file, checkpoints, signals and a progress bar around it; the physics stays in ``vmc``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from vitqs import checkpoint, distributed, files, results, sector_search, workfile
from vitqs.build import build_vmc, exact_ground_state, final_network, ground_state_outside
from vitqs.config import (
    FIXED_SIGN_PRIORS,
    Config,
    ConfigError,
    final_open_ended,
    final_samples,
    not_taken_lines,
    recipe_followed,
)
from vitqs.errors import first_line
from vitqs.extrapolation import stage_extrapolation
from vitqs.models import invariances
from vitqs.physics import exact
from vitqs.physics.observables import observables_of_vector
from vitqs.physics.operators import Heisenberg
from vitqs.physics.reference import EXACT_DIAGONALIZATION, reference_energy
from vitqs.physics.symmetry import ground_state_sector
from vitqs.vmc import observables
from vitqs.vmc.callbacks import ChainsFrozen, FrozenChains
from vitqs.vmc.driver import (
    VMC,
    NonFiniteEnergyError,
)
from vitqs.vmc.measurement import measure
from vitqs.vmc.reliability import Verdict, judge_final
from vitqs.vmc.sr import set_parameter_vector


class RunInterrupted(RuntimeError):
    """SIGINT or SIGTERM arrived; a checkpoint was written. ``signal_number`` says which."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number


class RunStopped(RuntimeError):
    """The run cannot continue (a non-finite energy after every retry, frozen chains, a
    failed write, a lost rank): the results file says ``interrupted`` and keeps its last good
    checkpoint. ``resumable`` says whether there is a checkpoint to resume from."""

    def __init__(self, message: str, resumable: bool):
        super().__init__(message)
        self.resumable = resumable


class _Signalled(BaseException):
    """A signal during the final measurement, which has no step boundary to wait for."""

    def __init__(self, signal_number: int):
        super().__init__(signal_number)
        self.signal_number = signal_number


# ---- building blocks ----------------------------------------------------------------------


# ---- a whole run --------------------------------------------------------------------------


@dataclass
class Run:
    """What the shell keeps of a run while it goes: the loop (`VMC`, which holds the
    Hamiltonian, the model and the sampler) and the results file it writes."""

    config: Config
    vmc: VMC
    record: results.RunRecord
    path: Path  # the file the run writes: target, or its pending replacement
    target: Path | None = None  # <output.dir>/<name>.h5, where the finished run lands
    use_cache: bool = True  # the ED cache
    saved_step: int | None = None  # the checkpoint step the file on disk holds
    frozen: FrozenChains | None = None  # counts the frozen steps at the end

    def __post_init__(self):
        self.saved_step = self.record.checkpoint_step if self.record.checkpoint else None


def config_yaml(config: Config) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def run_config(
    config: Config,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    initial_parameters: dict | None = None,
    use_cache: bool = True,
) -> dict:
    """Optimizes the config's model, writes ``<output.dir>/<name>.h5`` and returns the summary.

    Args:
        config: a validated config.
        resume: continue from the checkpoint in the existing results file.
        overwrite: replace an existing results file, once the new run has finished (until
            then it runs in ``.<name>.h5.pending`` beside it, which ``resume`` continues).
        progress: show a tqdm bar on stderr.
        initial_parameters: a model ``state_dict`` to start from (warm start in sweeps).
        use_cache: read and write the ED cache (``--no-cache``: solve again).

    Raises:
        ConfigError: bad combinations, an existing file without overwrite/resume, a resume
            whose config changed in a way that matters.
        RunInterrupted: SIGINT / SIGTERM; the checkpoint was written first.
        RunStopped: the run could not continue; the file keeps its last good checkpoint.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    start = time.perf_counter()
    distributed.on_root(lambda: workfile.check_output_dir(config.output.dir))
    followed = None if resume else recipe_followed(config)  # a resumed file keeps its own
    searched, prior_searched = "", ""
    if config.model.sector == "search":
        if resume:  # the sector its steps were made in
            config = _sector_searched_before(config)
        else:
            config, initial_parameters, searched = _search_sector(
                config, initial_parameters, overwrite
            )
    elif config.model.sign_prior == "search":
        if resume:  # the prior its steps were made with
            config = _prior_searched_before(config)
        else:
            config, initial_parameters, prior_searched = _search_sign_prior(
                config, initial_parameters, overwrite
            )
    with contextlib.ExitStack() as claim:  # holds the results file's lock until the end
        run = _prepare(
            config,
            resume=resume,
            overwrite=overwrite,
            initial_parameters=initial_parameters,
            claim=claim,
            use_cache=use_cache,
        )
        if searched:
            run.record.sector_search = searched
        if prior_searched:
            run.record.sign_prior_search = prior_searched
        if followed is not None:
            run.record.recipe = json.dumps(followed)
            _say_recipe(config.name, followed)
        distributed.share_parameters(run.vmc.model)  # every rank starts from rank 0's parameters
        with _Signals() as signals:
            _optimize(run, signals, progress and distributed.is_root(), start)
            finished = _finish(run, signals, start)
    distributed.barrier()  # rank 0 has written the file that every rank may read next
    return finished


def _say_recipe(name: str, followed: dict) -> None:
    """Prints the problem's class and the sections of the config that are its recipe's
    (`config.recipe_followed`), and a line for each written section that leaves recipe values
    behind, once the config has been built: a refused one prints one line."""
    if not distributed.is_root():
        return
    if followed["sections"]:
        taken = ", ".join(followed["sections"])
        print(f"{name}: {followed['name']}; as its recipe: {taken}", file=sys.stderr)
    advice = "a written section replaces the recipe's: write those keys to keep them"
    for line in not_taken_lines(followed):
        print(f"{name}: {line} ({advice})", file=sys.stderr)


# The share of a budget the sector search (`model.sector: search`) takes; without a budget
# its rounds are of `sector_search.SECTOR_STEPS` steps, doubling.
SEARCH_SHARE = 0.1


def _search_sector(config: Config, initial_parameters, overwrite: bool):
    """Returns the config in the sector the search chose (``model.sector``: its momentum,
    characters and spin inversion), whose steps go on as the winner's trial ran
    (`_as_its_trial`), measured over the space group unless ``final.symmetrize`` says
    otherwise, the winner's parameters to start from, and the search as the results file
    keeps it (JSON)."""
    seconds, say = _before_a_race(config, initial_parameters, overwrite, "model.sector")
    found = sector_search.search(config, seconds=seconds, say=say)
    chosen = found.chosen
    model, sampler = _as_its_trial(config, chosen)
    measured = config.final.symmetrize if config.final.symmetrize != "none" else "space_group"
    if chosen.keys().get("point_characters") is not None:  # a sector of the space group
        measured = "space_group"
    final = dataclasses.replace(config.final, symmetrize=measured)
    winner, kept = _race_outcome(config.name, found, "sector search", chosen.label())
    if distributed.is_root():
        print(
            f"{config.name}: the steps go on as its trial ran: averaged over the "
            f"{model.symmetrize.replace('_', ' ')}, {sampler.n_samples} samples a step, "
            f"sign prior {model.sign_prior}",
            file=sys.stderr,
        )
    return dataclasses.replace(config, model=model, sampler=sampler, final=final), winner, kept


def _as_its_trial(config: Config, chosen):
    """Returns the model and sampler sections of the steps after a sector search: the
    winner's trial's (`sector_search.trial_config`), its network average, samples a step and
    sign prior, with the config's precision. The trial's network was trained as its average
    over the space group: averaged over the translations alone, as the steps were before, it
    is another state, 0.16 higher on the kagome 2×3 (seed 2: the trial ended at −8.032, the
    run's first 25 steps averaged −7.873 and came back to −8.00 only after ~100 of its 401),
    and at half the samples a step over the space group costs about what a step over the
    translations at the config's samples did (results/history/accuracy_notes.md)."""
    trial = sector_search.trial_config(config, chosen)  # its model: the config's in the sector
    return trial.model, dataclasses.replace(config.sampler, n_samples=trial.sampler.n_samples)


def _race_outcome(name: str, found, what: str, chosen: str):
    """Says what a search chose and returns the winner's parameters and the search as the
    results file keeps it (JSON)."""
    if distributed.is_root():
        print(
            f"{name}: {what} chose {chosen} out of {len(found.trials)} candidates, "
            f"{found.margin_sigma:.3g} σ below the runner-up ({found.seconds:.1f} s); "
            f"{found.settled_text()}",
            file=sys.stderr,
        )
    kept = {
        "chosen": found.chosen.keys(),
        "margin_sigma": found.margin_sigma if math.isfinite(found.margin_sigma) else None,
        "settled": not found.unsettled(),
        "seconds": found.seconds,
        "trials": [{**row, "refused": row["refused"][:200]} for row in found.rows()],
    }
    return found.trials[0].vmc.model.state_dict(), json.dumps(kept)


def _before_a_race(config: Config, initial_parameters, overwrite: bool, key: str):
    """Returns the seconds a search (`key`: search) may take and where it says things;
    refuses a warm start and, unless ``overwrite``, an existing results file, before it."""
    if initial_parameters is not None:
        raise ConfigError(
            f"{key}=search starts every candidate from a random state; a sweep's "
            f"warm_start gives one: set warm_start: false, or {key} to a value"
        )
    target = results.results_path(config.output.dir, config.name)
    if not overwrite:  # refused now, not after the search
        distributed.on_root(lambda: workfile.refuse_existing(target))
    seconds = None if config.budget is None else SEARCH_SHARE * config.budget
    say = (lambda line: print(line, file=sys.stderr)) if distributed.is_root() else None
    return seconds, say


def _search_sign_prior(config: Config, initial_parameters, overwrite: bool):
    """Returns the config with the sign prior the race chose, the winner's parameters to
    start from, and the race as the results file keeps it (JSON)."""
    seconds, say = _before_a_race(config, initial_parameters, overwrite, "model.sign_prior")
    found = sector_search.search_sign_prior(config, seconds=seconds, say=say)
    winner, kept = _race_outcome(config.name, found, "sign prior search", found.chosen.name)
    model = dataclasses.replace(config.model, sign_prior=found.chosen.name)
    return dataclasses.replace(config, model=model), winner, kept


def _prior_searched_before(config: Config) -> Config:
    """Returns the config with the sign prior its results file's race chose (a resume of a
    ``model.sign_prior: search`` run continues with it)."""
    record, path = _record_to_resume(config)
    stored = (checkpoint.stored_config(record) or {}).get("model") or {}
    prior = stored.get("sign_prior") if isinstance(stored, dict) else None
    if not record.sign_prior_search or prior not in FIXED_SIGN_PRIORS:
        raise ConfigError(f"--resume: '{path}' holds no sign prior search to continue")
    return dataclasses.replace(config, model=dataclasses.replace(config.model, sign_prior=prior))


def _record_to_resume(config: Config):
    """Returns the results record a resume continues (its pending file first) and its path."""
    target = results.results_path(config.output.dir, config.name)
    pending = workfile.pending_path(target)
    path = pending if pending.exists() else target
    try:
        return results.read_results(path), path
    except (OSError, results.ResultsError) as err:
        raise ConfigError(f"--resume: {first_line(err)}") from None


def _sector_searched_before(config: Config) -> Config:
    """Returns the config in the sector its results file's search chose (a resume of a
    ``model.sector: search`` run continues there)."""
    record, path = _record_to_resume(config)
    written = checkpoint.stored_config(record) or {}
    stored = written.get("model") or {}
    if not record.sector_search or not isinstance(stored, dict) or stored.get("sector") == "search":
        raise ConfigError(f"--resume: '{path}' holds no sector search to continue")
    model = dataclasses.replace(
        config.model,
        sector=stored.get("sector"),
        symmetrize=stored.get("symmetrize"),
        sign_prior=stored.get("sign_prior", config.model.sign_prior),
    )
    sampled = written.get("sampler") or {}
    samples = sampled.get("n_samples") if isinstance(sampled, dict) else None
    sampler = config.sampler
    if type(samples) is int and samples > 0:  # the trial's samples its steps went on at
        sampler = dataclasses.replace(sampler, n_samples=samples)
    final = config.final
    if final.symmetrize == "none":  # as the search set it (final.* may change on a resume)
        final = dataclasses.replace(final, symmetrize="space_group")
    return dataclasses.replace(config, model=model, sampler=sampler, final=final)


def _prepare(config, *, resume, overwrite, initial_parameters, claim, use_cache) -> Run:
    target = results.results_path(config.output.dir, config.name)
    vmc = build_vmc(config)  # a config refused here has touched no file
    hamiltonian, model, sampler = vmc.hamiltonian, vmc.model, vmc.sampler
    _check_exact_fits(config, hamiltonian)
    if not resume:  # where a new run starts from: read (and refused) before any file is made
        if initial_parameters is not None:
            try:
                model.load_state_dict(initial_parameters)
            except RuntimeError as err:  # a warm start across points whose models differ
                raise ConfigError(
                    f"warm_start: the previous point's parameters do not fit this model.* "
                    f"({first_line(err)})"
                ) from None
        elif config.model.init_from is not None:
            distributed.agree_on_file(config.model.init_from, "model.init_from")
            checkpoint.start_from_results(config, model, sampler)
    # the lock comes before any look at the file and before ED: no second run can start on
    # this name between our look and our first write
    claim.enter_context(workfile.sole_writer(target))
    path = distributed.on_root(
        lambda: workfile.working_path(target, resume=resume, overwrite=overwrite)
    )
    if resume:
        distributed.agree_on_file(path, "--resume")
        run = _restore(config, path, vmc, use_cache)
    else:
        record = _new_record(config, hamiltonian, model, use_cache)
        record.initial_state = initial_state(config, initial_parameters)
        run = Run(config, vmc, record, path)
        _write(run, first=True)  # claims the name; replaced atomically from now on
    run.target, run.use_cache = target, use_cache
    run.record.compiled_chains = sampler.compiled
    return run


def initial_state(config: Config, initial_parameters: dict | None) -> str:
    """Returns where a new run's parameters start, as its record keeps it: ``previous
    point`` (a sweep's warm start), ``init_from`` (``model.init_from``) or ``seed``."""
    if initial_parameters is not None:
        return "previous point"
    return "init_from" if config.model.init_from is not None else "seed"


def _check_exact_fits(config: Config, hamiltonian) -> None:
    """Refuses ``exact.enabled: true`` above ``exact.max_dim`` before any file is made."""
    if config.exact.enabled is True:
        try:
            exact.check_dimension(hamiltonian, config.exact.max_dim)
        except exact.SectorTooLargeError as err:
            raise ConfigError(str(err)) from None


def _write(run: Run, *, first: bool = False) -> None:
    """Writes the run's record (rank 0: one file for all ranks). A write that fails (a full
    disk, a quota, an I/O error) stops the run: the file keeps what it held before."""
    if not distributed.is_root():
        return
    try:
        results.write_results(run.path, run.record)
    except OSError as err:
        if first:
            raise ConfigError(f"cannot write '{run.path}': {_os_reason(err)}") from None
        kept = "its last checkpoint" if run.saved_step is not None else "no checkpoint yet"
        at = f" (step {run.saved_step})" if run.saved_step is not None else ""
        raise RunStopped(
            f"stopped after step {len(run.record.history)}: writing '{run.path}' failed "
            f"({_os_reason(err)}); the file keeps {kept}{at}",
            resumable=run.saved_step is not None,
        ) from None
    if run.record.checkpoint is not None:
        run.saved_step = run.record.checkpoint_step


def _os_reason(err: OSError) -> str:
    return err.strerror or first_line(err)


def _new_record(config: Config, hamiltonian, model, use_cache: bool) -> results.RunRecord:
    record = results.RunRecord(
        name=config.name,
        seed=config.seed,
        config_yaml=config_yaml(config),
        n_sites=hamiltonian.n_sites,
        n_params=sum(p.numel() for p in model.parameters()),
        e_inf=hamiltonian.infinite_temperature_energy(),
    )
    record.exact, vector = _exact_reference(config, hamiltonian, use_cache)
    if vector is not None:
        _warn_outside_sector(config, hamiltonian, model, vector)
    return record


_MODEL_KEYS = "model.symmetrize / sector / translation_invariant"


def _warn_outside_sector(config: Config, hamiltonian, model, vector) -> None:
    """Warns (stderr) when the exact ground state ``vector`` lies outside the sector the
    trained model or the final measurement's ψ is confined to: the run would end above
    E_exact by at least that sector's gap, whatever its budget (the kagome 2x3's ground state
    is at k = (π, 0))."""
    measured = final_network(config, model, hamiltonian.lattice)
    seen = set()
    for keys, psi in (
        (_MODEL_KEYS, model),
        ("final.symmetrize / spin_flip", measured),
    ):
        why = ground_state_outside(hamiltonian, psi, vector)
        if why is None or why in seen:
            continue
        seen.add(why)
        sector = ground_state_sector(hamiltonian, vector)
        print(
            f"vitqs run: warning: the exact ground state (momentum {sector['momentum']}, spin "
            f"inversion {sector['spin_flip']}) lies outside the sector of {keys}: {why}; the "
            "energy cannot come below that sector's lowest state (`vitqs ed` reports the "
            "ground state's sector; model.sector gives it)",
            file=sys.stderr,
        )


def _exact_reference(config: Config, hamiltonian, use_cache: bool = True):
    """Returns ``(group, vector)``: the record's ``exact`` group — exact diagonalization where
    ``exact.*`` lets it run, else (``exact.enabled: auto`` past ``exact.max_dim``) the
    Bethe-ansatz or published energy of `physics.reference`, else None — and the exact ground
    state's vector (None without ED). Raises ConfigError when ``exact.enabled: true`` and the
    sector is above ``exact.max_dim``."""
    # rank 0 alone writes the record: the others need not diagonalize
    if not distributed.is_root() or config.exact.enabled is False:
        return None, None
    start = time.perf_counter()
    solved = exact_ground_state(config, hamiltonian, use_cache=use_cache, return_vector=True)
    vector = None
    if solved is not None:
        energy, dimension, seconds = solved.energy, solved.dimension, solved.seconds
        method, vector = EXACT_DIAGONALIZATION, solved.vector
    else:
        found = reference_energy(hamiltonian)
        if found is None:
            return None, None
        energy, dimension, method = found.energy, 0, found.method
        seconds = time.perf_counter() - start
    return {
        "energy": energy,
        "energy_per_site": energy / hamiltonian.n_sites,
        "dimension": dimension,
        "seconds": seconds,
        "reference": method,
    }, vector


def _restore(config, path, vmc: VMC, use_cache) -> Run:
    hamiltonian = vmc.hamiltonian
    try:
        record = results.read_results(path)
    except results.ResultsError as err:
        raise ConfigError(f"--resume: {err}") from None
    record.e_inf = hamiltonian.infinite_temperature_energy()  # files before it lack e_inf
    earlier, current = checkpoint.stored_config(record) or {}, config.to_dict()
    changed = checkpoint.changed_keys(earlier, current)
    if changed:
        raise ConfigError(
            f"--resume: the config changed since '{path}' was written ({', '.join(changed)}); "
            "start a new run (another name, or --overwrite)"
        )
    measured_anew = any(earlier.get(key) != current[key] for key in ("final", "exact"))
    if record.status == "finished" and _done(vmc, record) and not measured_anew:
        raise ConfigError(
            f"--resume: '{path}' is already finished; raise optimizer.n_iter or budget to go "
            "on, or change final.* to measure it again"
        )
    if record.checkpoint is None:
        raise ConfigError(
            f"--resume: '{path}' holds no checkpoint yet; start it again with --overwrite"
        )
    if earlier.get("exact") != current["exact"]:
        # exact.* may change on a resume: settle the reference (or refuse) before any step
        record.exact, _ = _exact_reference(config, hamiltonian, use_cache)
    # the loop's clock goes on from the checkpoint's
    vmc.seconds_before = checkpoint.load_state(record.checkpoint, f"--resume: '{path}'", vmc)
    # steps after the checkpoint (a run stopped by a failure) are done again
    record.history = record.history[: record.checkpoint_step]
    record.status, record.final, record.failure = "running", None, ""
    record.lanczos = None  # of the state measured before: a new final state comes
    record.observables, record.config_yaml = {}, config_yaml(config)
    return Run(config, vmc, record, path)


def _done(vmc: VMC, record: results.RunRecord) -> bool:
    """Returns whether a finished run has no step left: its steps done, or its budget's
    share for them spent."""
    if vmc.n_steps is not None and len(record.history) >= vmc.n_steps:
        return True
    spent = (record.final or {}).get("seconds", 0.0)
    return vmc.max_seconds is not None and spent >= vmc.max_seconds


def _checkpoint(run: Run, seconds: float) -> None:
    """Writes the state to resume from; on every rank (the sampler gathers all chains)."""
    state = checkpoint.state_of(run.vmc, seconds)
    if distributed.is_root():
        run.record.set_checkpoint(state)
        _write(run)


def _optimize(run: Run, signals: _Signals, progress: bool, start: float) -> None:
    bar = _ProgressBar(run, progress)
    run.frozen = FrozenChains(_frozen_limit(run))
    watchers = [
        _RecordHistory(run),
        run.frozen,
        bar,
        _Checkpoints(run, signals, start),
    ]
    if run.record.initial_state == "init_from" and run.vmc.step_count == 0:
        watchers.append(_CarriedState(run, bar))
    try:
        for _ in run.vmc.run(callbacks=watchers, started=start):
            pass
    except (NonFiniteEnergyError, ChainsFrozen) as err:
        _stop(run, str(err))
    except RuntimeError as err:
        if not distributed.is_collective_failure(err):
            raise
        timeout = run.config.distributed.timeout
        _stop(
            run,
            f"rank {distributed.rank()}: a collective with the other ranks failed "
            f"({first_line(err, 200)}); a rank stopped, or none answered within "
            f"distributed.timeout={timeout:g} s",
            status="interrupted",
        )
    except KeyboardInterrupt:  # a second Ctrl-C: stop inside the step
        _interrupted(run, signal.SIGINT)
    finally:
        bar.close()


# ---- what watches the loop: callbacks of VMC.run ------------------------------------------


class _RecordHistory:
    """Appends each step's row to the record's history."""

    def __init__(self, run: Run):
        self.record = run.record

    def __call__(self, vmc: VMC, result) -> bool:
        self.record.append_history(results.HistoryRow.of(result))
        return False


class _CarriedState:
    """Warns once, after the first step of a run started from ``model.init_from``, when its
    energy lies above the infinite-temperature energy (the mean over every state, what a
    state without structure gets): the state carried over lost what it had learned (one of
    five trained J1-J2 6×6 states started the 8×8 at E = +23.2, the others near −13, and
    that run collapsed)."""

    def __init__(self, run: Run, bar: _ProgressBar):
        self.run, self.bar = run, bar

    def __call__(self, vmc: VMC, result) -> bool:
        if vmc.step_count != 1 or result.anneal_fraction < 1.0:
            return False
        energy = result.energy
        infinite = vmc.hamiltonian.infinite_temperature_energy()
        if energy.mean.real - 3 * energy.error_of_mean > infinite and distributed.is_root():
            self.bar.write(
                f"vitqs run: warning: step 0's energy {energy.mean.real:+.6g} ± "
                f"{energy.error_of_mean:.1e} lies above the infinite-temperature energy "
                f"{infinite:.6g}: the state carried from model.init_from="
                f"'{self.run.config.model.init_from}' kept nothing of what it learned there; "
                "start from another trained state, or from the seed"
            )
        return False


class _Checkpoints:
    """Checkpoints every ``output.checkpoint_every`` steps, and after a signal any rank
    received, which then stops the run (all ranks stop together)."""

    def __init__(self, run: Run, signals: _Signals, start: float):
        self.run, self.signals, self.start = run, signals, start

    def __call__(self, vmc: VMC, result) -> bool:
        signal_number = distributed.agree_signal(self.signals.received)
        if vmc.step_count % self.run.config.output.checkpoint_every == 0 or signal_number:
            _checkpoint(self.run, vmc.seconds_before + time.perf_counter() - self.start)
        if signal_number:
            _interrupted(self.run, signal_number)
        return False


class _ProgressBar:
    """A tqdm bar on stderr (rank 0) named with the run and the threads it computes on, with
    the last energy, its relative error and the acceptance; above it, once, a machine already
    busy (at a terminal), and what compiling the chains' network cost (`build.compiled_chains`)."""

    def __init__(self, run: Run, show: bool):
        from tqdm import tqdm  # the bar is the shell's business; imported where it is used

        self.show, self.compile_told = show, False
        record = run.record
        self.exact_energy = record.exact["energy"] if record.exact else None
        threads = torch.get_num_threads()
        self.bar = tqdm(
            total=run.vmc.n_steps,  # None under a budget: the bar counts steps
            initial=len(record.history),
            disable=not show,
            desc=f"{run.config.name} ({threads} thread{'s' if threads > 1 else ''})",
            dynamic_ncols=True,
            leave=True,
        )
        warning = busy_machine(threads) if show and sys.stderr.isatty() else None
        if warning:
            self.write(f"vitqs run: warning: {warning}")

    def __call__(self, vmc: VMC, result) -> bool:
        if self.show and not self.compile_told:
            self._tell_compile(vmc, result.step)
        self.bar.set_postfix_str(_progress_text(result, self.exact_energy), refresh=False)
        self.bar.update(1)
        return False

    def _tell_compile(self, vmc: VMC, step: int) -> None:
        """Writes, once, what the first compiled graphs cost (nothing before them)."""
        seconds = vmc.compile_seconds
        if seconds:
            self.compile_told = True
            what = "chains and log-derivatives" if vmc.compiles_log_derivatives else "chains"
            self.write(
                f"compiled {what}: their first compiled graphs took {seconds:.1f} s "
                f"(tracing and compiling; step {step} includes it)"
            )

    def write(self, line: str) -> None:
        """Writes ``line`` to stderr above the bar (which stays at the bottom)."""
        self.bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def busy_machine(threads: int, load: float | None = None, cores: int | None = None) -> str | None:
    """Returns why a run of ``threads`` threads will share its cores, or None: when the
    load average of the last minute (``load``; the system's if None) is already more than
    the ``cores`` (the process's, if None) leave for it. Two jobs with torch's default threads
    on 2 cores once made the quickstart 12x slower (58 s alone, 705 s beside another)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # a platform without a load average
            return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        cores = cores or os.cpu_count() or 1
    if load + threads <= cores + 0.5:
        return None
    return (
        f"the machine is busy (load {load:.1f} on {cores} cores) and this run computes on "
        f"{threads} threads: they will share cores and may run several times slower (set "
        "threads to fit what is free, or run one job at a time)"
    )


def _stop(run: Run, cause: str, *, status: str = "failed", resumable: bool = True):
    """The one way out of a run that cannot continue: the file says ``status`` — ``failed``
    (its ``failure`` says why) or ``interrupted`` (a lost rank: nothing wrong with the run) —
    and keeps the last good checkpoint (the history keeps the steps after it, for
    diagnosis); raises RunStopped with a line naming the step and the cause. ``resumable``
    False: going on from the checkpoint cannot help (a collapsed final state)."""
    step = len(run.record.history)
    if run.saved_step is None:
        kept = f"'{run.path}' holds no checkpoint yet, so start again with --overwrite"
    else:
        kept = f"'{run.path}' keeps the checkpoint of step {run.saved_step}"
    message = f"stopped after step {step}: {cause.rstrip('.')}; {kept}"
    run.record.status = status
    run.record.failure = " ".join(message.split()) if status == "failed" else ""
    _write(run)
    raise RunStopped(message, resumable=resumable and run.saved_step is not None)


def _frozen_limit(run: Run) -> int | None:
    """Returns ``sampler.max_frozen_steps``, or None where zero acceptance is no failure: a
    sector of one state, where no proposal can land anywhere else."""
    if exact.sector_fits(run.vmc.hamiltonian.hilbert, 1):
        return None
    return run.config.sampler.max_frozen_steps


def _progress_text(result, exact_energy) -> str:
    energy = result.energy
    text = f"E={energy.mean.real:.6f}±{energy.error_of_mean:.1e}"
    if result.anneal_fraction < 1.0:  # not yet the hamiltonian whose exact energy is known
        text += f" anneal={result.anneal_fraction:.2f}"
    elif exact_energy is not None:
        text += f" rel={results.relative_error(energy.mean.real, exact_energy):+.1e}"
    if not math.isnan(result.acceptance):
        text += f" acc={result.acceptance:.2f}"
    return text


def _interrupted(run: Run, signal_number: int):
    run.record.status = "interrupted"
    _write(run)
    name = signal.Signals(signal_number).name
    replacing = ""
    if run.target is not None and run.path != run.target:
        replacing = f"; '{run.target}' keeps the run it replaces until this one finishes"
    raise RunInterrupted(
        f"{name} received: stopped after step {len(run.record.history)}; '{run.path}' keeps "
        f"the checkpoint of step {run.saved_step}{replacing}",
        signal_number,
    )


class _Signals:
    """SIGINT / SIGTERM for the whole run (main thread only). During the steps a signal sets
    ``received``, which the loop reads after each step (a second signal stops inside the
    step, as KeyboardInterrupt); once `measuring` is called, a signal raises at once: the
    final measurement has no step boundary to wait for, and a scheduler's SIGTERM must
    leave a resumable file. One handler from start to end leaves no moment unguarded."""

    def __init__(self):
        self.received: int | None = None
        self._raise_now: bool | None = False
        self._previous = {}
        self._previous_hook = None  # sys.unraisablehook before `measuring`

    def _handle(self, signum, frame):
        if self._raise_now is None:  # writing the interrupted file: let it land whole
            return
        if self._raise_now:
            # kept as well: Python prints and drops an exception raised while it runs a
            # weakref callback or a __del__, where a handler can find itself (measured:
            # 2 of 6 SIGTERMs in a tiny run's final measurement); `check` raises it again
            self.received = signum
            raise _Signalled(signum)
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def measuring(self) -> None:
        """From now on a signal raises; one that came since the last step raises now."""
        self._raise_now = True
        # a raise Python drops (see `_handle`) would print "Exception ignored in ..." with a
        # traceback: the signal is kept, so that report says nothing a user needs
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        if self.received is not None:
            raise _Signalled(self.received)

    def _unraisable(self, unraisable) -> None:
        if not isinstance(unraisable.exc_value, _Signalled):
            self._previous_hook(unraisable)

    def check(self) -> None:
        """Raises for a signal since `measuring` whose raise was dropped (see `_handle`)."""
        if self._raise_now and self.received is not None:
            raise _Signalled(self.received)

    def hold(self) -> None:
        """Ignores further signals (while the interrupted state is written)."""
        self._raise_now = None

    def __enter__(self):
        with contextlib.suppress(ValueError):  # not the main thread: keep default handlers
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        if self._previous_hook is not None:
            sys.unraisablehook = self._previous_hook
        return False


# ---- the end of a run ---------------------------------------------------------------------


def _finish(run: Run, signals: _Signals, start: float) -> dict:
    """Checkpoints the last step, measures the final state and writes the finished file; a
    signal meanwhile leaves it ``interrupted`` with that checkpoint, which resumes here."""
    try:
        signals.measuring()
        # every iteration is done: checkpoint, so an interrupted final measurement resumes here
        _checkpoint(run, run.vmc.seconds_before + time.perf_counter() - start)
        verdict = _measure_final(run, start)
        signals.check()  # a signal whose raise was dropped: the file must not say finished
        if not math.isfinite(run.record.final["energy"]):
            run.record.final, run.record.observables = None, {}
            _stop(run, "the final measurement gave a non-finite energy")
        if verdict.failure is not None:  # a collapsed state is no result, whatever it reads
            run.record.final, run.record.observables = None, {}
            _stop(
                run,
                f"{verdict.failure} (start again with a smaller optimizer.lr or a larger "
                "optimizer.diag_shift, with --overwrite)",
                resumable=False,
            )
        run.record.status = "finished"
        _checkpoint(run, run.record.final["seconds"])  # keeps the final parameters too
        _land(run)
    except _Signalled as signalled:
        signals.hold()
        run.record.final, run.record.observables = None, {}
        _interrupted(run, signalled.signal_number)
    return summary(run.record, run.target)


def _land(run: Run) -> None:
    """Moves a finished replacement (``--overwrite``) over the run it replaces."""
    if distributed.is_root() and run.path != run.target:
        try:
            files.refuse_link(run.target)  # a link planted there is not replaced silently
            files.replace_durably(run.path, run.target)
        except OSError as err:
            raise RunStopped(
                f"the run finished in '{run.path}', but it cannot replace '{run.target}' "
                f"({_os_reason(err)}); move it there by hand",
                resumable=False,
            ) from None
        run.path = run.target


def _measure_final(run: Run, start: float) -> Verdict:
    """Measures the final state into the record; returns the `Verdict` on the measurement
    (a collapse is a failure, a genuine zero variance a note in the record). Under a
    budget the energy's samples take what is left of it but a fifth, which the observables
    take (`_observables_fitted`)."""
    config, record, vmc = run.config, run.record, run.vmc
    averaged = vmc.averaged_parameters()
    if averaged is not None:  # the final state is the mean of the late iterates
        set_parameter_vector(vmc.model, averaged[0])
    final = config.final
    lattice = vmc.hamiltonian.lattice
    model = final_network(config, vmc.model, lattice)
    # the final energy and observables are measured on |ψ|² itself, whatever
    # sampler.machine_pow the steps used, and over every state of the sector
    sampler = vmc.sampler.measuring()
    left = _seconds_left(config, vmc, start)
    measured = measure(
        sampler,
        vmc.hamiltonian,
        model,
        final_samples(config),
        final.n_discard if final_open_ended(config) else final_discard(config, sampler),
        chunk_size=config.sampler.chunk_size,
        deadline=None if left is None else time.perf_counter() + ENERGY_SHARE * left,
        target_error=final.target_error,
    )
    samples, energy = measured.samples, measured.energy
    verdict = judge_final(
        vmc.hamiltonian,
        model,
        energy,
        samples.acceptance,
        run.frozen.n_frozen if run.frozen is not None else 0,
        sweep_size=getattr(sampler, "sweep_size", 1),
        chunk_size=config.sampler.chunk_size,
        can_sum=distributed.world_size() == 1,
    )
    wanted = final.n_samples_observables
    if left is not None and not sampler.exact:
        wanted = _observables_fitted(run, model, samples, sampler, start, wanted)
    observed = observables.first_of_each_chain(samples, wanted)
    record.observables = _observables(run, model, observed, sampler)
    record.final = results.FinalRow.of(
        energy,
        record,
        seconds=vmc.seconds_before + time.perf_counter() - start,
        n_discard=measured.n_discard,
        acceptance=samples.acceptance,
        note=verdict.note,
        stopped_by=measured.stopped_by,
        extrapolated=_stages_extrapolated(record),
    )
    return verdict


def _stages_extrapolated(record: results.RunRecord) -> tuple[float, float]:
    """Returns the zero-variance energy from the run's own late steps and its error."""
    history = record.history_arrays()
    return stage_extrapolation(
        history["energy"], history["variance"], history.get("anneal_fraction")
    )


# Of the time a budget leaves the final measurement, the energy's samples take this share;
# the observables (a connected configuration per pair: costlier a sample than the energy)
# the rest, but a margin for the full-sum check and the file.
ENERGY_SHARE = 0.8
_MARGIN = 0.02  # of the budget


def _seconds_left(config: Config, vmc: VMC, start: float) -> float | None:
    """Returns the seconds the budget leaves the final measurement (its margin for writing
    the file kept back), or None without a budget."""
    if config.budget is None:
        return None
    spent = distributed.agree_max(vmc.seconds_before + time.perf_counter() - start)
    return max(config.budget * (1 - _MARGIN) - spent, 0.0)


def _observables_fitted(run, model, samples, sampler, start, wanted: int | None) -> int:
    """Returns the samples the observables can take before the budget's margin: timed on
    one sample per chain, then as many as the time left holds (at most ``wanted``)."""
    config, vmc = run.config, run.vmc
    probe = time.perf_counter()
    # the sampled part only: the exact ground state's observables cost the same at any count
    _sampled_observables(run, model, observables.first_of_each_chain(samples, 1), sampler)
    per_sweep = distributed.agree_max(time.perf_counter() - probe)
    left = _seconds_left(config, vmc, start) or 0.0
    n_chains = samples.n_chains * distributed.world_size()
    fits = max(int(left / max(per_sweep, 1e-9)), 1) * n_chains
    return fits if wanted is None else min(wanted, fits)


def final_discard(config: Config, sampler) -> int:
    """Returns the sweeps per chain before a final measurement of `final_samples` keeps
    samples: ``final.n_discard``, or by default as many as each chain then keeps, at least
    ``sampler.n_discard`` (`Sampler.discard_before`); 0 for an exact sum."""
    return sampler.discard_before(final_samples(config), config.final.n_discard)


def _observables(run: Run, model, samples, sampler) -> dict:
    """Returns the sampled observables of the final state and the exact ground state's."""
    return {**_sampled_observables(run, model, samples, sampler), **_exact_observables(run)}


def _sampled_observables(run: Run, model, samples, sampler) -> dict:
    ham = run.vmc.hamiltonian
    chunk = run.config.sampler.chunk_size
    invariant = _translation_invariant(model, ham.lattice)
    vector = sampler.amplitudes(samples)
    if vector is not None:  # every state's amplitude is known: direct sums
        measured = observables_of_vector(ham, vector, invariant)
    elif isinstance(ham, Heisenberg):
        measured = observables.spin_observables(
            ham, model, samples, chunk_size=chunk, translation_invariant=invariant
        )
    else:
        measured = observables.boson_observables(
            ham, model, samples, chunk_size=chunk, translation_invariant=invariant
        )
    values = {}
    for name, estimate in measured.items():
        values[name] = np.asarray(estimate.mean)
        if estimate.error is not None:
            values[f"{name}_error"] = np.asarray(estimate.error)
    return values


def _translation_invariant(model, lattice) -> bool:
    """Returns whether ``model`` is invariant under every translation of a periodic lattice
    for any parameters (averaged over them, or over the space group)."""
    symmetries = {tuple(perm) for perm in invariances(model, lattice)[0]}
    return lattice.periodic and all(tuple(shift) in symmetries for shift in lattice.translations)


# Sectors up to this size also get the observables of the exact ground state: on state codes
# they cost less than the diagonalisation (7-11 s for the 1,352,078 states of the
# Bose-Hubbard chain L = N = 12, against 23-35 s of Lanczos, on 2 CPU cores).
_EXACT_OBSERVABLES_MAX_DIM = 2_000_000


def _exact_observables(run: Run) -> dict:
    """Returns the same observables from the exact ground state, when the sector is small
    (rank 0 only: the record it writes is the one that keeps them)."""
    if not distributed.is_root() or run.record.exact is None:
        return {}  # a resumed record on another rank has rank 0's exact group: no second ED
    if results.reference_of(run.record) != EXACT_DIAGONALIZATION:
        return {}  # a Bethe-ansatz or published energy: no state to measure
    if run.record.exact["dimension"] > _EXACT_OBSERVABLES_MAX_DIM:
        return {}
    hamiltonian = run.vmc.hamiltonian
    solved = exact_ground_state(
        run.config, hamiltonian, use_cache=run.use_cache, return_vector=True
    )
    # the ground state of a periodic lattice is translation invariant (non-degenerate)
    measured = observables_of_vector(hamiltonian, solved.vector, True)
    return {f"exact_{name}": np.asarray(estimate.mean) for name, estimate in measured.items()}


# the keys of ``vitqs run --json``, besides results_file: the summary's but the status (a
# run that returns has finished) and the size of the lattice
_JSON_FIELDS = tuple(k for k in results.SUMMARY_FIELDS if k not in ("status", "n_sites"))


def summary(record: results.RunRecord, path: Path) -> dict:
    """Returns the ``vitqs run --json`` object of a finished record."""
    whole = results.summary(record)
    rel = whole["relative_error"]
    whole["relative_error"] = None if rel is None or math.isnan(rel) else rel
    return {**{key: whole[key] for key in _JSON_FIELDS}, "results_file": str(path)}
