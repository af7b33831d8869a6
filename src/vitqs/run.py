"""A run: a validated config in, a finished (or resumable) results file out.

``run_config`` drives the VMC generator with the
results file, checkpoints, signals and a progress bar around it; the physics stays in ``vmc``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import signal
import statistics as pystats
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from vitqs import distributed, results
from vitqs.build import Anneal, build_vmc, exact_ground_state
from vitqs.config import Config, ConfigError, from_dict, keys_with, parse_yaml
from vitqs.errors import first_line
from vitqs.models import final_symmetrized, invariances, load_network_state
from vitqs.physics import exact
from vitqs.physics.observables import observables_of_vector
from vitqs.physics.operators import Heisenberg
from vitqs.vmc import observables
from vitqs.vmc.driver import (
    VMC,
    NonFiniteEnergyError,
    draw_samples,
    n_batches,
    sample_local_energy,
)
from vitqs.vmc.estimators import statistics
from vitqs.vmc.sampler import ExactSampler, MetropolisSampler
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
    """Everything a run holds while it goes."""

    config: Config
    hamiltonian: object
    model: torch.nn.Module
    sampler: object
    vmc: VMC
    record: results.RunRecord
    path: Path  # the file the run writes: target, or its pending replacement
    seconds_before: float = 0.0  # wall time of earlier invocations (resume)
    anneal: Anneal = field(init=False)  # the hamiltonian each step optimises
    target: Path | None = None  # <output.dir>/<name>.h5, where the finished run lands
    use_cache: bool = True  # the ED cache
    saved_step: int | None = None  # the checkpoint step the file on disk holds

    def __post_init__(self):
        self.anneal = Anneal(self.config, self.hamiltonian)
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
    distributed.on_root(lambda: _check_output_dir(config.output.dir))
    with contextlib.ExitStack() as claim:  # holds the results file's lock until the end
        run = _prepare(
            config,
            resume=resume,
            overwrite=overwrite,
            initial_parameters=initial_parameters,
            claim=claim,
            use_cache=use_cache,
        )
        distributed.share_parameters(run.model)  # every rank starts from rank 0's parameters
        with _Signals() as signals:
            _optimize(run, signals, progress and distributed.is_root(), start)
            finished = _finish(run, signals, start)
    distributed.barrier()  # rank 0 has written the file that every rank may read next
    return finished


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
            start_from_results(config, model, sampler)
    # the lock comes before any look at the file and before ED: no second run can start on
    # this name between our look and our first write
    claim.enter_context(_sole_writer(target))
    path = distributed.on_root(lambda: _working_path(target, resume=resume, overwrite=overwrite))
    if resume:
        run = _restore(config, path, hamiltonian, model, sampler, vmc, use_cache)
    else:
        record = _new_record(config, hamiltonian, model, use_cache)
        run = Run(config, hamiltonian, model, sampler, vmc, record, path)
        _write(run, first=True)  # claims the name; replaced atomically from now on
    run.target, run.use_cache = target, use_cache
    return run


def _pending_path(target: Path) -> Path:
    """Returns where an ``--overwrite`` run writes until it finishes: the finished run it
    replaces stays in ``target`` meanwhile, so an interrupted replacement loses nothing."""
    return target.with_name(f".{target.name}.pending")


def _working_path(target: Path, *, resume: bool, overwrite: bool) -> Path:
    """Returns the file this run writes, or raises ConfigError (rank 0 decides)."""
    pending = _pending_path(target)
    if resume:
        if pending.exists():  # an --overwrite run that was interrupted
            return pending
        if not target.exists():
            raise ConfigError(f"--resume: there is no results file '{target}' to resume")
        return target
    if overwrite:
        pending.unlink(missing_ok=True)  # an earlier replacement, abandoned: start anew
        return pending if target.exists() else target
    if target.exists():
        raise ConfigError(
            f"results file '{target}' exists; "
            "pass --resume to continue it or --overwrite to replace it"
        )
    if pending.exists():
        raise ConfigError(
            f"an --overwrite run of '{target}' was interrupted ('{pending}'); pass --resume to "
            "continue it or --overwrite to start the replacement again"
        )
    return target


def _check_exact_fits(config: Config, hamiltonian) -> None:
    """Refuses ``exact.enabled: true`` above ``exact.max_dim`` before any file is made."""
    if config.exact.enabled is True:
        try:
            exact.check_dimension(hamiltonian, config.exact.max_dim)
        except exact.SectorTooLargeError as err:
            raise ConfigError(str(err)) from None


def _check_output_dir(output_dir) -> None:
    """Raises ConfigError unless ``output.dir`` is, or can be made, a writable folder: found
    before ED and the steps, not when the first file is due. Creates nothing (a refused
    config leaves no trace)."""
    existing = Path(output_dir).absolute()
    while not existing.exists():  # the nearest existing ancestor decides
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"output.dir='{output_dir}': '{existing}' is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"output.dir='{output_dir}': '{existing}' is not writable")


@contextlib.contextmanager
def _sole_writer(path: Path):
    """Holds an exclusive lock on ``.<name>.h5.lock`` beside the results file (rank 0), from
    the run's first write or its resume to its end, so that a second ``vitqs run`` on the same
    file, a ``--resume`` or an ``--overwrite``, is refused instead of writing over a run in
    progress. The kernel drops the lock when the process ends, however it ends; a clean end
    also removes the file."""
    if not distributed.is_root():
        yield
        return
    lock = path.with_name(f".{path.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_NOFOLLOW: a symbolic link planted under the lock's name is refused, not followed
        descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise ConfigError(f"cannot create the lock file '{lock}': {err.strerror}") from None
    with os.fdopen(descriptor, "w") as handle:
        if not _lock(handle, lock):
            raise ConfigError(
                f"'{path}' is being written by another vitqs process; "
                "let it finish or stop it (Ctrl-C / SIGTERM checkpoints it) first"
            )
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)  # still held: a later run locks a new file


def _lock(handle, lock: Path) -> bool:
    """Returns whether this process now holds ``lock`` alone; True also on a file system
    without locks (run unguarded rather than not at all)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    try:
        # a lock on a file that another run removed in between guards nothing
        return os.fstat(handle.fileno()).st_ino == os.stat(lock).st_ino
    except FileNotFoundError:
        return False


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


def start_from_results(config: Config, model, sampler) -> None:
    """``model.init_from``: loads the parameters of another run's checkpoint into ``model`` and
    starts ``sampler``'s chains from its chains when they are states of this sector."""
    where = f"model.init_from='{config.model.init_from}'"
    try:
        record = results.read_results(config.model.init_from)
    except results.ResultsError as err:
        raise ConfigError(f"{where}: {err}") from None
    if record.checkpoint is None:
        raise ConfigError(f"{where}: the run holds no checkpoint yet; name a run that has one")
    state = _checked_state(record.checkpoint, where)
    try:
        load_network_state(model, state["model"])
    except (RuntimeError, TypeError, ValueError, KeyError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or ["?"]
        reason = _model_differences(record, config) or lines[-1]
        raise ConfigError(
            f"{where}: its parameters do not fit this model ({reason}); model.* must be "
            "that run's, except symmetrize and spin_flip"
        ) from None
    chains = state["sampler"].get("chains")
    if isinstance(chains, torch.Tensor) and not isinstance(sampler, ExactSampler):
        with contextlib.suppress(ValueError):  # another sector: random chains, as usual
            sampler.start_chains(chains)  # checks the chains against the sector itself


def _model_differences(record: results.RunRecord, config: Config) -> str:
    """Returns the model keys whose values differ between ``record``'s run and ``config``."""
    earlier = (_stored_config(record) or {}).get("model", {})
    if not isinstance(earlier, dict):
        return ""
    now = dataclasses.asdict(config.model)
    free = keys_with("free_across_init")
    differ = [
        f"model.{key}={now[key]} here, {earlier[key]} there"
        for key in now
        if key in earlier and earlier[key] != now[key] and f"model.{key}" not in free
    ]
    return "; ".join(differ)


# The checkpoint's top level, and what each entry must be: a results file is data that
# anyone may have written, so its shape is checked before any of it is used.
_CHECKPOINT_ENTRIES = {
    "model": dict,
    "vmc": dict,
    "sampler": dict,
    "torch_rng": torch.Tensor,
    "seconds": float,
}


def _checked_state(state: dict, where: str) -> dict:
    """Returns the checkpoint dict ``state`` when its entries have the types a checkpoint
    of ours has; ConfigError naming ``where`` otherwise."""
    for key, kind in _CHECKPOINT_ENTRIES.items():
        value = state.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if not isinstance(value, kind):
            raise ConfigError(
                f"{where}: the checkpoint's '{key}' is {type(value).__name__}, not "
                f"{kind.__name__}; the file is not a vitqs checkpoint"
            )
    if not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
        raise ConfigError(f"{where}: the checkpoint's model parameters are not all tensors")
    return state


def checkpoint_parameters(record: results.RunRecord) -> dict:
    """Returns the model parameters of ``record``'s checkpoint (a sweep's warm start)."""
    return _checked_state(results.load_checkpoint(record), f"'{record.name}'")["model"]


def _load_state(state: dict, where: str, run_parts) -> float:
    """Loads a checkpoint into (model, vmc, sampler) and torch's generator; returns its
    seconds. Whatever does not fit is a ConfigError naming ``where``, not a traceback."""
    model, vmc, sampler = run_parts
    state = _checked_state(state, where)
    try:
        model.load_state_dict(state["model"])
        vmc.load_state_dict(state["vmc"])
        sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["torch_rng"])
    except (RuntimeError, TypeError, ValueError, KeyError, IndexError) as err:
        raise ConfigError(
            f"{where}: the checkpoint does not fit this run ({first_line(err)})"
        ) from None
    return float(state["seconds"])


def _stored_config(record: results.RunRecord) -> dict | None:
    """Returns the config a results file says it ran, parsed like a config file."""
    try:
        data = parse_yaml(record.config_yaml)
    except (ConfigError, yaml.YAMLError, RecursionError):
        raise ConfigError(f"run {record.name!r}: its stored config is not valid YAML") from None
    return data if isinstance(data, dict) else None


def _new_record(config: Config, hamiltonian, model, use_cache: bool) -> results.RunRecord:
    record = results.RunRecord(
        name=config.name,
        seed=config.seed,
        config_yaml=config_yaml(config),
        n_sites=hamiltonian.n_sites,
        n_params=sum(p.numel() for p in model.parameters()),
        e_inf=hamiltonian.infinite_temperature_energy(),
    )
    record.exact = _exact_reference(config, hamiltonian, use_cache)
    return record


def _exact_reference(config: Config, hamiltonian, use_cache: bool = True) -> dict | None:
    """Returns the record's ``exact`` group (None when ``exact.*`` rules ED out); raises
    ConfigError when ``exact.enabled: true`` and the sector is above ``exact.max_dim``."""
    # rank 0 alone writes the record: the others need not diagonalize
    root = distributed.is_root()
    reference = exact_ground_state(config, hamiltonian, use_cache=use_cache) if root else None
    if reference is None:
        return None
    return {
        "energy": reference.energy,
        "energy_per_site": reference.energy / hamiltonian.n_sites,
        "dimension": reference.dimension,
        "seconds": reference.seconds,
    }


def _restore(config, path, hamiltonian, model, sampler, vmc, use_cache) -> Run:
    try:
        record = results.read_results(path)
    except results.ResultsError as err:
        raise ConfigError(f"--resume: {err}") from None
    record.e_inf = hamiltonian.infinite_temperature_energy()  # files before it lack e_inf
    earlier, current = _stored_config(record) or {}, config.to_dict()
    changed = _changed_keys(earlier, current)
    if changed:
        raise ConfigError(
            f"--resume: the config changed since '{path}' was written ({', '.join(changed)}); "
            "start a new run (another name, or --overwrite)"
        )
    measured_anew = any(earlier.get(key) != current[key] for key in ("final", "exact"))
    done = len(record.history) >= config.optimizer.n_iter
    if record.status == "finished" and done and not measured_anew:
        raise ConfigError(
            f"--resume: '{path}' is already finished; raise optimizer.n_iter to go on, or "
            "change final.* to measure it again"
        )
    if record.checkpoint is None:
        raise ConfigError(
            f"--resume: '{path}' holds no checkpoint yet; start it again with --overwrite"
        )
    if earlier.get("exact") != current["exact"]:
        # exact.* may change on a resume: settle the reference (or refuse) before any step
        record.exact = _exact_reference(config, hamiltonian, use_cache)
    seconds = _load_state(record.checkpoint, f"--resume: '{path}'", (model, vmc, sampler))
    # steps after the checkpoint (a run stopped by a failure) are done again
    record.history = record.history[: record.checkpoint_step]
    record.status, record.final = "running", None
    record.observables, record.config_yaml = {}, config_yaml(config)
    return Run(config, hamiltonian, model, sampler, vmc, record, path, seconds)


def _flatten(data, prefix=""):
    if not isinstance(data, dict):
        return {prefix.rstrip("."): data}
    flat = {}
    for key, value in data.items():
        flat.update(_flatten(value, f"{prefix}{key}."))
    return flat


def config_changes(record: results.RunRecord, config: Config, *, ignoring=None) -> list[str]:
    """Returns the dotted keys whose values differ between ``record``'s run and ``config``,
    leaving out those in ``ignoring`` (default: those a resume may change, `keys_with`)."""
    return _changed_keys(_stored_config(record) or {}, config.to_dict(), ignoring)


def _changed_keys(old: dict, new: dict, ignoring=None) -> list[str]:
    ignoring = keys_with("resumable") if ignoring is None else ignoring
    old, new = _flatten(old), _flatten(new)
    keys = sorted(set(old) | set(new))
    return [k for k in keys if old.get(k) != new.get(k) and k not in ignoring]


def _checkpoint(run: Run, seconds: float) -> None:
    """Writes the state to resume from; on every rank (the sampler gathers all chains)."""
    sampler_state = run.sampler.state_dict()
    if not distributed.is_root():
        return
    run.record.set_checkpoint(
        {
            "model": run.model.state_dict(),
            "vmc": run.vmc.state_dict(),
            "sampler": sampler_state,
            "torch_rng": torch.get_rng_state(),
            "seconds": seconds,
        }
    )
    _write(run)


def _history_row(result, exact_energy, anneal_fraction: float) -> dict:
    energy = result.energy
    timings = result.timings
    return {
        "step": result.step,
        "energy": energy.mean.real,
        "energy_error": energy.error_of_mean,
        "variance": energy.variance,
        "r_hat": energy.r_hat,
        "tau": energy.tau_corr,
        "acceptance": result.acceptance,
        "lr": result.lr,
        "diag_shift": result.diag_shift,
        "update_norm": result.update_norm,
        "seconds_sampling": timings.get("sampling", math.nan),
        "seconds_local_energy": timings.get("local_energy", math.nan),
        "seconds_jacobian": timings.get("jacobian", math.nan),
        "seconds_solve": timings.get("solve", math.nan),
        "seconds_total": sum(timings.values()),
        "n_samples": energy.n_samples,
        "anneal_fraction": anneal_fraction,
        "update_capped": float(result.update_capped),
    }


def _optimize(run: Run, signals: _Signals, progress: bool, start: float) -> None:
    from tqdm import tqdm  # the bar is the shell's business; imported where it is used

    config, record = run.config, run.record
    exact_energy = record.exact["energy"] if record.exact else None
    done = len(record.history)
    bar = tqdm(
        total=config.optimizer.n_iter,
        initial=done,
        disable=not progress,
        desc=config.name,
        dynamic_ncols=True,
        leave=True,
    )
    max_seconds = config.optimizer.max_seconds
    frozen_limit = _frozen_limit(run)
    frozen_steps = 0
    loop_start = time.perf_counter()
    _follow_budget(run, done, run.seconds_before)
    try:
        for result in run.vmc.run(config.optimizer.n_iter - done):
            record.append_history(_history_row(result, exact_energy, run.anneal.fraction))
            frozen_steps = frozen_steps + 1 if result.acceptance == 0 else 0
            if frozen_limit is not None and frozen_steps >= frozen_limit:
                _frozen(run, frozen_steps)
            text = _progress_text(result, exact_energy, run.anneal.fraction)
            bar.set_postfix_str(text, refresh=False)
            bar.update(1)
            step = len(record.history)
            spent = run.seconds_before + time.perf_counter() - loop_start
            # all ranks stop together: on a signal any of them got, by the slowest clock
            signal_number, spent = distributed.agree(signals.received, spent)
            if step % config.output.checkpoint_every == 0 or signal_number:
                _checkpoint(run, run.seconds_before + time.perf_counter() - start)
            if signal_number:
                _interrupted(run, signal_number)
            if max_seconds is not None and spent >= max_seconds:
                break  # the budget is spent: measure the state reached so far
            _follow_budget(run, step, spent)
    except NonFiniteEnergyError as err:
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
        )
    except KeyboardInterrupt:  # a second Ctrl-C: stop inside the step
        _interrupted(run, signal.SIGINT)
    finally:
        bar.close()


def _stop(run: Run, cause: str):
    """The one way out of a run that cannot continue: the file says ``interrupted`` and keeps
    the last good checkpoint (the history keeps the steps after it, for diagnosis); raises
    RunStopped with a line naming the step and the cause."""
    run.record.status = "interrupted"
    _write(run)
    step = len(run.record.history)
    if run.saved_step is None:
        kept = f"'{run.path}' holds no checkpoint yet, so start again with --overwrite"
    else:
        kept = f"'{run.path}' keeps the checkpoint of step {run.saved_step}"
    message = f"stopped after step {step}: {cause.rstrip('.')}; {kept}"
    raise RunStopped(message, resumable=run.saved_step is not None)


def _frozen_limit(run: Run) -> int | None:
    """Returns ``sampler.max_frozen_steps``, or None where zero acceptance is no failure: a
    sector of one state, where no proposal can land anywhere else."""
    if exact.sector_fits(run.hamiltonian.hilbert, 1):
        return None
    return run.config.sampler.max_frozen_steps


def _frozen(run: Run, n_steps: int):
    """Stops a run whose chains have not moved for ``n_steps`` steps: its estimates are of
    one configuration per chain, and SR cannot move a state whose samples are all alike."""
    step = len(run.record.history)
    _stop(
        run,
        f"the sampler accepted no move for {n_steps} steps in a row (steps "
        f"{step - n_steps + 1}-{step}, sampler.max_frozen_steps={n_steps}): every chain is "
        f"frozen, so the state has collapsed onto a few configurations and the energy and "
        f"gradient no longer mean anything (go on with a larger optimizer.diag_shift or a "
        f"smaller optimizer.lr, or sampler.max_frozen_steps: null to let it run on)",
    )


def _follow_budget(run: Run, step: int, seconds: float) -> None:
    """Sets what the next step needs to know about the run's progress: the fraction of
    ``max_seconds`` spent (schedules end with the budget if it ends before ``n_iter``), and
    ``sampler.n_samples_late`` once past ``late_fraction`` of ``n_iter`` or of the budget."""
    cfg, optimizer = run.config.sampler, run.config.optimizer
    if optimizer.max_seconds is not None:
        run.vmc.budget_progress = min(seconds / optimizer.max_seconds, 1.0)
    progress = run.vmc.progress()
    run.vmc.hamiltonian = run.anneal.hamiltonian_at(progress)
    if cfg.n_samples_late is not None and isinstance(run.sampler, MetropolisSampler):
        late = progress >= cfg.late_fraction
        run.sampler.set_n_samples(cfg.n_samples_late if late else cfg.n_samples)


def _progress_text(result, exact_energy, anneal_fraction: float) -> str:
    energy = result.energy
    text = f"E={energy.mean.real:.6f}±{energy.error_of_mean:.1e}"
    if anneal_fraction < 1.0:  # not yet the hamiltonian whose exact energy is known
        text += f" anneal={anneal_fraction:.2f}"
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

    def _handle(self, signum, frame):
        if self._raise_now is None:  # writing the interrupted file: let it land whole
            return
        if self._raise_now:
            raise _Signalled(signum)
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def measuring(self) -> None:
        """From now on a signal raises; one that came since the last step raises now."""
        self._raise_now = True
        if self.received is not None:
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
        return False


# ---- the end of a run ---------------------------------------------------------------------


def _finish(run: Run, signals: _Signals, start: float) -> dict:
    """Checkpoints the last step, measures the final state and writes the finished file; a
    signal meanwhile leaves it ``interrupted`` with that checkpoint, which resumes here."""
    try:
        signals.measuring()
        # every iteration is done: checkpoint, so an interrupted final measurement resumes here
        _checkpoint(run, run.seconds_before + time.perf_counter() - start)
        _measure_final(run, start)
        if not math.isfinite(run.record.final["energy"]):
            run.record.final, run.record.observables = None, {}
            _stop(run, "the final measurement gave a non-finite energy")
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
        os.replace(run.path, run.target)
        run.path = run.target


def _measure_final(run: Run, start: float) -> None:
    config, record = run.config, run.record
    averaged = run.vmc.averaged_parameters()
    if averaged is not None:  # the final state is the mean of the late iterates
        set_parameter_vector(run.model, averaged[0])
    lattice = run.hamiltonian.lattice
    model = final_symmetrized(run.model, config.final.symmetrize, lattice, config.final.spin_flip)
    # site-resolved observables need every state, not one per orbit; the final energy and
    # observables are measured on |ψ|² itself, whatever sampler.machine_pow the steps used
    if isinstance(run.sampler, ExactSampler):
        sampler, n_discard = run.sampler.unreduced(), 0
    else:
        sampler = run.sampler.of_psi_squared()
        n_discard = final_discard(config, sampler)
    samples = draw_samples(sampler, model, config.final.n_samples, n_discard)
    e_loc = sample_local_energy(run.hamiltonian, model, sampler, samples, config.sampler.chunk_size)
    energy = statistics(e_loc, samples.weights)
    exact_energy = record.exact["energy"] if record.exact else None
    seconds = run.seconds_before + time.perf_counter() - start
    iter_seconds = [row["seconds_total"] for row in record.history[1:]]
    record.final = {
        "energy": energy.mean.real,
        "energy_error": energy.error_of_mean,
        "variance": energy.variance,
        "v_score": results.v_score(
            energy.mean.real, energy.variance, run.hamiltonian.n_sites, record.e_inf
        ),
        "tau": energy.tau_corr,
        "r_hat": energy.r_hat,
        "n_samples": int(energy.n_samples),
        "relative_error": results.relative_error(energy.mean.real, exact_energy),
        "seconds": seconds,
        "seconds_per_iter": pystats.median(iter_seconds) if iter_seconds else math.nan,
        "n_discard": n_discard,
    }
    record.observables = _observables(run, model, samples, sampler)


def final_discard(config: Config, sampler) -> int:
    """Returns the sweeps per chain before the final measurement keeps samples:
    ``final.n_discard``, or by default as many as each chain then keeps (half of every final
    chain is thrown away, whatever distribution the chains came from), at least
    ``sampler.n_discard``."""
    if config.final.n_discard is not None:
        return config.final.n_discard
    kept = n_batches(sampler, config.final.n_samples) * sampler.n_per_chain  # one per sweep
    return max(sampler.n_discard, kept)


def _observables(run: Run, model, samples, sampler) -> dict:
    ham = run.hamiltonian
    chunk = run.config.sampler.chunk_size
    invariant = _translation_invariant(model, ham.lattice)
    if isinstance(sampler, ExactSampler):  # every state's amplitude is known: direct sums
        log_psi = samples.log_psi.reshape(-1).cpu().numpy().astype(np.complex128)
        vector = np.exp(log_psi - log_psi.real.max())
        measured = observables_of_vector(ham, vector, invariant)
    elif isinstance(ham, Heisenberg):
        measured = observables.spin_observables(ham, model, samples, chunk_size=chunk)
    else:
        measured = observables.boson_observables(
            ham, model, samples, chunk_size=chunk, translation_invariant=invariant
        )
    values = {}
    for name, estimate in measured.items():
        values[name] = np.asarray(estimate.mean)
        if estimate.error is not None:
            values[f"{name}_error"] = np.asarray(estimate.error)
    values.update(_exact_observables(run))
    return values


def _translation_invariant(model, lattice) -> bool:
    """Returns whether ``model`` is invariant under every translation of a periodic lattice
    for any parameters (averaged over them, or over the space group)."""
    symmetries = {tuple(perm) for perm in invariances(model, lattice)[0]}
    return lattice.pbc and all(tuple(shift) in symmetries for shift in lattice.translations)


# Sectors up to this size also get the observables of the exact ground state: on state codes
# they cost less than the diagonalisation (7-11 s for the 1,352,078 states of the
# Bose-Hubbard chain L = N = 12, against 23-35 s of Lanczos, on 2 CPU cores).
_EXACT_OBSERVABLES_MAX_DIM = 2_000_000


def _exact_observables(run: Run) -> dict:
    """Returns the same observables from the exact ground state, when the sector is small
    (rank 0 only: the record it writes is the one that keeps them)."""
    if not distributed.is_root() or run.record.exact is None:
        return {}  # a resumed record on another rank has rank 0's exact group: no second ED
    if run.record.exact["dimension"] > _EXACT_OBSERVABLES_MAX_DIM:
        return {}
    solved = exact_ground_state(
        run.config, run.hamiltonian, use_cache=run.use_cache, return_vector=True
    )
    # the ground state of a periodic lattice is translation invariant (non-degenerate)
    measured = observables_of_vector(run.hamiltonian, solved.vector, True)
    return {f"exact_{name}": np.asarray(estimate.mean) for name, estimate in measured.items()}


def summary(record: results.RunRecord, path: Path) -> dict:
    """Returns the ``vitqs run --json`` object of a finished record."""
    final, exact_ref = record.final, record.exact
    rel = final["relative_error"]
    return {
        "name": record.name,
        "energy": final["energy"],
        "energy_error": final["energy_error"],
        "variance": final["variance"],
        "v_score": final["v_score"],
        "exact_energy": exact_ref["energy"] if exact_ref else None,
        "relative_error": None if rel is None or math.isnan(rel) else rel,
        "n_params": record.n_params,
        "n_iter": len(record.history),
        "seconds": final["seconds"],
        "seconds_per_iter": final["seconds_per_iter"],
        "results_file": str(path),
    }


def load_config_dict(data: dict, name: str) -> Config:
    """Returns a validated config from plain data (used by sweeps)."""
    return from_dict(data, default_name=name)
