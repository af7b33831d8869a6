"""vitqs from Python: run a config, or load a results file, and get the numbers back.

The same code path as ``vitqs run``: the config is validated by `config.from_dict`, the run
is `run.run_config` (its results file, checkpoints, ED reference and final measurement), and
what comes back is read from the file it wrote, so a notebook sees exactly what ``vitqs
report`` and ``--json`` see. Bad input raises `ConfigError` (the CLI's one-line error); a run
that cannot go on raises `run.RunStopped` or `run.RunInterrupted` with the file kept.

    import vitqs
    r = vitqs.run("configs/quickstart.yaml", optimizer={"n_iter": 5})
    r.energy, r.energy_error, r.relative_error, r.history["energy"]
    same = vitqs.load(r.path)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitqs import results
from vitqs.config import Config, ConfigError, from_dict
from vitqs.yamlfile import read_yaml


@dataclass
class Result:
    """A run as its results file holds it.

    Attributes:
        path: the results file.
        name, status: the run's name, and ``finished`` (or ``running``, ``interrupted``,
            ``failed`` for a file read back by `load`).
        energy, energy_error, variance, v_score: the final Monte Carlo measurement (for an
            unfinished file, the last step's), total energies as everywhere in vitqs.
        exact_energy, reference, relative_error: the reference energy, how it was obtained
            (exact diagonalization, Bethe ansatz, published) and ``(E − E_ref)/|E_ref|``;
            None without one.
        n_sites, n_params, n_iter, seconds: the system, the model, steps done, wall time.
        note: the final measurement's note (why a zero variance is genuine), or None.
        lanczos: the file's Lanczos step (``vitqs lanczos``; keys
            `results.LANCZOS_FIELDS`), or None.
        history: one 1-D numpy array per column of the history (``energy``,
            ``energy_error``, ``variance``, ``acceptance``, ``lr``, ...), one entry a step.
        observables: the final observables by name (numpy arrays), ``<name>_error`` beside.
        config: the validated `Config` the run used (from the file).
        record: the whole `results.RunRecord`.
    """

    path: Path
    name: str
    status: str
    energy: float | None
    energy_error: float | None
    variance: float | None
    v_score: float | None
    exact_energy: float | None
    reference: str | None
    relative_error: float | None
    n_sites: int
    n_params: int
    n_iter: int
    seconds: float | None
    note: str | None
    lanczos: dict | None
    history: dict[str, np.ndarray]
    observables: dict[str, np.ndarray]
    config: Config
    record: results.RunRecord

    @cached_property
    def model(self) -> torch.nn.Module:
        """The trained network with the parameters of the file's checkpoint (the final state
        of a finished run), on the CPU, as ``model.*`` built it (the final measurement's
        symmetrization, ``final.*``, is `vitqs.build.final_network` of it)."""
        from vitqs.build import build_hamiltonian, build_network

        state = results.load_checkpoint(self.record)["model"]
        config = copy.deepcopy(self.config)
        config.device = "cpu"
        model = build_network(config, build_hamiltonian(config))
        model.load_state_dict(state)
        return model

    def __repr__(self) -> str:
        energy = "—" if self.energy is None else f"{self.energy:.10g} ± {self.energy_error:.2g}"
        return f"Result({self.name!r}, {self.status}, E = {energy}, file {str(self.path)!r})"


def run(
    config: str | Path | dict | Config,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    use_cache: bool = True,
    **overrides: Any,
) -> Result:
    """Runs a config and returns its `Result`, read from the results file it wrote.

    Args:
        config: a YAML file's path, its data as a dict, or a `Config`.
        resume, overwrite: as ``vitqs run --resume`` / ``--overwrite``.
        progress: show the progress bar (stderr).
        use_cache: read and write the ED cache (``--no-cache``: False).
        **overrides: values over the config's, by section (``optimizer={"n_iter": 5}``,
            ``output={"dir": "runs"}``) or top-level key (``seed=3``, ``name="a"``);
            a section's mapping is merged key by key, like ``--set``.

    Raises:
        ConfigError: bad input, or an existing results file without resume / overwrite.
        vitqs.runner.RunStopped, vitqs.runner.RunInterrupted: the run could not go on, or a
            signal stopped it; the results file keeps its last checkpoint.
    """
    from vitqs.runner import run_config  # torch-heavy: loaded when a run is asked for

    validated = _config_of(config, overrides)
    summary = run_config(
        validated, resume=resume, overwrite=overwrite, progress=progress, use_cache=use_cache
    )
    return load(summary["results_file"])


def load(path: str | Path) -> Result:
    """Returns the `Result` of a results file. Raises `results.ResultsError` for a file that
    is missing or not a vitqs results file, with a one-line message naming it."""
    from vitqs.checkpoint import stored_config

    path = Path(path)
    record = results.read_results(path)
    summary = results.summary(record)
    observables = {name: np.asarray(value) for name, value in record.observables.items()}
    return Result(
        path=path,
        name=record.name,
        status=record.status,
        energy=summary["energy"],
        energy_error=summary["energy_error"],
        variance=summary["variance"],
        v_score=summary["v_score"],
        exact_energy=summary["exact_energy"],
        reference=summary["reference"],
        relative_error=_none_if_nan(summary["relative_error"]),
        n_sites=record.n_sites,
        n_params=record.n_params,
        n_iter=summary["n_iter"],
        seconds=summary["seconds"],
        note=summary["note"],
        lanczos=record.lanczos,
        history=record.history_arrays(),
        observables=observables,
        config=from_dict(stored_config(record) or {}, default_name=record.name),
        record=record,
    )


def _config_of(config, overrides: dict) -> Config:
    """Returns the validated config of a path, a dict or a Config, with ``overrides``."""
    if isinstance(config, Config):
        data, name = config.to_dict(), config.name
    elif isinstance(config, dict):
        data, name = copy.deepcopy(config), None
    elif isinstance(config, (str, Path)):
        data, name = read_yaml(config), Path(config).stem
    else:
        raise ConfigError(
            f"vitqs.run takes a config file's path, its data as a dict or a Config, not "
            f"{type(config).__name__}"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping of sections, got {type(data).__name__}")
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return from_dict(data, default_name=name)


def _none_if_nan(value):
    return None if isinstance(value, float) and value != value else value
