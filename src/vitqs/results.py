"""The results file of one run: an HDF5 file written whole and atomically, and read back.

A run keeps a ``RunRecord`` in memory and calls ``write_results`` at every checkpoint, on
SIGINT/SIGTERM and at the end. Each write builds the complete file under a fresh temporary
name in the same folder and moves it over ``<path>`` with ``os.replace``, so a crash or
SIGKILL at any moment leaves either the previous complete file or the new one, and a reader
can open the file while the run goes on.

A results file holds data only. Reading one executes nothing from it: no pickle (the
checkpoint is an HDF5 tree of tensors and numbers, `vitqs.h5tree`), no links to other files or
objects, no dataset larger than `h5tree.MAX_LEAF_BYTES`; a file that is not what it claims is
refused with a one-line `ResultsError` naming it.

Layout (format_version 2)::

    /                     attrs: format="vitqs-results", format_version, name, status,
                                 created, updated, seed, config_yaml, versions_json,
                                 conventions, n_sites, n_params, e_inf; failure (a failed
                                 run's reason), initial_state (seed | previous point |
                                 init_from; both absent in older files), sector_search
                                 (JSON: the choice and table of model.sector: search),
                                 sign_prior_search (the same, of model.sign_prior: search),
                                 recipe (JSON: the class and the sections from its recipe),
                                 compiled_chains (1 when the chains' network was compiled)
    /history/<field>      1-D, one entry per iteration, resizable; fields = HISTORY_FIELDS
    /exact                attrs EXACT_FIELDS                       (only with an exact reference)
    /final                attrs FINAL_FIELDS                       (only once the run finished;
                          acceptance: the final chains'; note: only where the numbers need one)
    /final/observables/<name>   one dataset per observable, real or complex, plus <name>_error
    /lanczos              attrs LANCZOS_FIELDS        (only after ``vitqs lanczos`` on the file)
    /checkpoint           attr step: the state after that many history rows
    /checkpoint/state     the checkpoint dict as an `h5tree` (model parameters, optimizer
                          state, chains, generator states, seconds)

The history may run past the checkpoint's step: a run stopped by a failure keeps the rows of
the steps after its last good checkpoint, for diagnosis; a resume starts from the checkpoint
and drops them. Format 1 (before 2026-11) stored the checkpoint as the bytes of
``torch.save``; those load with ``torch.load(weights_only=True)``, which unpickles tensors and
plain containers only.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import platform
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from vitqs import __version__, files, h5tree
from vitqs.errors import first_line
from vitqs.physics.reference import EXACT_DIAGONALIZATION

FORMAT = "vitqs-results"
FORMAT_VERSION = 2  # 2: the checkpoint is an h5tree; 1: torch.save bytes (read, not written)

# running: being written (or its writer died: `workfile.is_being_written` tells); interrupted:
# stopped by a signal or a failed write, resumable as it is; failed: stopped because the run
# could not go on or its result would not mean anything (``failure`` says why); finished.
STATUSES = ("running", "interrupted", "failed", "finished")


@dataclass
class HistoryRow:
    """One row of ``/history``: what one step measured. Its fields are the history columns."""

    step: int
    energy: float
    energy_error: float
    variance: float
    r_hat: float
    tau: float
    acceptance: float
    lr: float
    diag_shift: float
    update_norm: float
    seconds_sampling: float
    seconds_local_energy: float
    seconds_jacobian: float
    seconds_solve: float
    seconds_total: float
    n_samples: float
    anneal_fraction: float  # 1: the step's hamiltonian is the config's (optimizer.anneal)

    @classmethod
    def of(cls, result) -> dict[str, float]:
        """Returns the row of a step's result (`vmc.driver.StepResult`), as a dict."""
        energy, timings = result.energy, result.timings
        return dataclasses.asdict(
            cls(
                step=result.step,
                energy=energy.mean.real,
                energy_error=energy.error_of_mean,
                variance=energy.variance,
                r_hat=energy.r_hat,
                tau=energy.tau_corr,
                acceptance=result.acceptance,
                lr=result.lr,
                diag_shift=result.diag_shift,
                update_norm=result.update_norm,
                seconds_sampling=timings.get("sampling", math.nan),
                seconds_local_energy=timings.get("local_energy", math.nan),
                seconds_jacobian=timings.get("jacobian", math.nan),
                seconds_solve=timings.get("solve", math.nan),
                seconds_total=sum(timings.values()),
                n_samples=energy.n_samples,
                anneal_fraction=result.anneal_fraction,
            )
        )


HISTORY_FIELDS = tuple(f.name for f in dataclasses.fields(HistoryRow))
_INT_HISTORY_FIELDS = ("step",)
# columns added after format 1 was first written: a file without them reads as NaN
_LATER_HISTORY_FIELDS = ("n_samples", "anneal_fraction")

# ``reference``: how the energy was obtained (`physics.reference`: "exact diagonalization",
# "Bethe ansatz" or "published: <citation>"); files before it hold ED energies only.
# ``dimension``: the diagonalized sector's size, 0 for a reference that is not a diagonalization
EXACT_FIELDS = ("energy", "energy_per_site", "dimension", "seconds", "reference")
# integer attrs cannot fall back to NaN, so they are required when the group is written
_INT_ATTRS = ("dimension", "n_samples", "full_sum")
_TEXT_ATTRS = ("reference", "note", "stopped_by")

CONVENTIONS = (
    "S = sigma/2; H_heis = J1 sum_<ij> S_i.S_j + J2 sum_<<ij>> S_i.S_j; "
    "H_bh = -J sum_<ij> (b_i^dag b_j + h.c.) + (U/2) sum_i n_i (n_i - 1) - mu sum_i n_i; "
    "sites row-major, site (x, y) = x + Lx*y; energies are totals unless named per_site; "
    "relative_error = (E - E_exact)/|E_exact|, signed; "
    "v_score = N Var(E)/(E - E_inf)^2 with N = n_sites and E_inf = Tr H/dim (attr e_inf; "
    "0 for Heisenberg, over the fixed-N sector for Bose-Hubbard; Wu et al., Science 2024)"
)

_HISTORY_CHUNK = 1024  # entries per chunk: a few kB per column, one chunk for most runs


class ResultsError(ValueError):
    """A results file is missing, unreadable, foreign, too new or inconsistent."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def runtime_versions() -> dict[str, str]:
    """Returns the versions of vitqs, torch, numpy, python, h5py, the platform string and the
    CUDA device that would run (its name, or "none"): a timing means little without it."""
    return {
        "vitqs": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "h5py": h5py.__version__,
        "platform": platform.platform(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }


class History:
    """The rows of ``/history``, held as one array per column: a long run (10^5 steps) costs
    its numbers, not a dict per row, and a file read back costs what it stores.

    Reads like the list of rows it stands for: ``len``, iteration and ``history[i]`` give
    rows as dicts (keys ``HISTORY_FIELDS``), a slice gives a `History`, ``append`` adds a row
    (a missing value is NaN), and it equals a list of the same rows.
    """

    def __init__(self, rows=None, *, columns: dict[str, np.ndarray] | None = None):
        self._columns = columns if columns is not None else _columns_of([])
        self._rows: list[dict] = []  # appended since the columns were last joined
        for row in rows or []:
            self.append(row)

    def append(self, row: dict) -> None:
        """Appends a row; ResultsError for a key not in HISTORY_FIELDS or without ``step``."""
        _check_keys(row, HISTORY_FIELDS, "history row")
        if "step" not in row:
            raise ResultsError(f"history row {row} has no 'step'")
        self._rows.append(dict(row))

    def arrays(self) -> dict[str, np.ndarray]:
        """Returns one 1-D array per field of HISTORY_FIELDS (int64 step, float64 others)."""
        if self._rows:
            more = _columns_of(self._rows)
            self._columns = {k: np.concatenate([v, more[k]]) for k, v in self._columns.items()}
            self._rows = []
        return self._columns

    def __len__(self) -> int:
        return len(self._columns["step"]) + len(self._rows)

    def __getitem__(self, index):
        columns = self.arrays()
        if isinstance(index, slice):
            return History(columns={k: v[index].copy() for k, v in columns.items()})
        return {name: column[index].item() for name, column in columns.items()}

    def __iter__(self):
        columns = self.arrays()
        for i in range(len(self)):
            yield {name: column[i].item() for name, column in columns.items()}

    def __eq__(self, other) -> bool:
        if isinstance(other, (History, list)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"History({len(self)} rows)"


def _columns_of(rows: list[dict]) -> dict[str, np.ndarray]:
    return {name: _history_column(rows, name) for name in HISTORY_FIELDS}


@dataclass
class RunRecord:
    """Everything a results file holds, in memory.

    ``history`` is a `History`: rows, each a dict with keys from ``HISTORY_FIELDS`` (missing
    values are written as NaN); a list of such rows is taken as one. ``exact`` and ``final``
    are dicts with keys from ``EXACT_FIELDS`` and ``FINAL_FIELDS`` or None. ``observables``
    maps a name to an array or scalar and is written under ``final`` (so it needs ``final``).
    ``checkpoint`` holds the checkpoint dict (`set_checkpoint`), the state after
    ``checkpoint_step`` steps; the history may hold more rows than that (the steps of a
    failed run after its last good checkpoint).
    """

    name: str
    status: str = "running"
    seed: int = 0
    config_yaml: str = ""
    n_sites: int = 0
    n_params: int = 0
    e_inf: float = math.nan  # Tr H / dim, the V-score's origin (NaN: a file written before it)
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    versions: dict[str, str] = field(default_factory=runtime_versions)
    conventions: str = CONVENTIONS
    history: History = field(default_factory=History)
    exact: dict[str, float] | None = None
    final: dict[str, float] | None = None
    observables: dict[str, Any] = field(default_factory=dict)
    lanczos: dict[str, float] | None = None  # keys LANCZOS_FIELDS: a Lanczos step, if made
    checkpoint: dict | None = None
    checkpoint_step: int | None = None
    failure: str = ""  # why a ``failed`` run stopped, one line ("" otherwise)
    # where the parameters started: "seed" (random), "previous point" (a sweep's warm
    # start), "init_from" (model.init_from); "" in files written before it was kept
    initial_state: str = ""
    # ``model.sector: search``: the search's choice, margin, seconds and table, as JSON text
    sector_search: str = ""
    # ``model.sign_prior: search``: the race's choice, margin, seconds and table, as JSON text
    sign_prior_search: str = ""
    # the recipe the config followed (`config.recipe_followed`: class, name, sections), JSON text
    recipe: str = ""
    # whether the chains' network went through torch.compile (`build.compiled_chains`)
    compiled_chains: bool = False

    def __setattr__(self, name, value):
        if name == "history" and not isinstance(value, History):
            value = History(value)  # rows given as a list
        super().__setattr__(name, value)

    def append_history(self, row: dict[str, float]) -> None:
        """Appends one iteration's row; raises ResultsError on a key not in HISTORY_FIELDS."""
        self.history.append(row)

    def set_checkpoint(self, checkpoint_dict: dict) -> None:
        """Stores a copy of ``checkpoint_dict`` (tensors on CPU) as the state after
        ``len(history)`` steps; raises ResultsError for a value an h5tree cannot hold."""
        self.checkpoint = _detached(checkpoint_dict)
        self.checkpoint_step = len(self.history)

    def history_arrays(self) -> dict[str, np.ndarray]:
        """Returns one 1-D array per field of HISTORY_FIELDS (int64 step, float64 others)."""
        return self.history.arrays()


@dataclass
class FinalRow:
    """The attrs of ``/final``: the final measurement of the trained state."""

    energy: float
    energy_error: float
    variance: float
    v_score: float
    tau: float
    r_hat: float
    n_samples: int
    relative_error: float
    seconds: float
    seconds_per_iter: float
    n_discard: int  # thermalisation sweeps per chain before the kept samples (0: a full sum)
    acceptance: float  # of the final measurement's chains (NaN: a full sum)
    note: str | None = None  # what a reader must know to trust the numbers (a zero variance)
    # what ended the measurement (`vmc.measurement.STOPPED_BY`); None: files before issue 52
    stopped_by: str | None = None
    # the zero-variance energy from the run's own late steps (`extrapolation.
    # stage_extrapolation`) and its error; NaN: too few steps (or files before issue 52)
    extrapolated: float = math.nan
    extrapolated_error: float = math.nan

    @classmethod
    def of(
        cls,
        energy,
        record: RunRecord,
        *,
        seconds: float,
        n_discard: int,
        acceptance: float = math.nan,
        note: str | None = None,
        stopped_by: str | None = None,
        extrapolated: tuple[float, float] = (math.nan, math.nan),
    ) -> dict[str, float]:
        """Returns the final group of ``record`` measured as the `Stats` ``energy``, as a
        dict: V-score and relative error from the record's ``e_inf`` and exact energy, the
        median seconds of its steps."""
        exact_energy = record.exact["energy"] if record.exact else None
        iter_seconds = record.history_arrays()["seconds_total"][1:].tolist()
        mean = energy.mean.real
        return dataclasses.asdict(
            cls(
                energy=mean,
                energy_error=energy.error_of_mean,
                variance=energy.variance,
                v_score=v_score(mean, energy.variance, record.n_sites, record.e_inf),
                tau=energy.tau_corr,
                r_hat=energy.r_hat,
                n_samples=int(energy.n_samples),
                relative_error=relative_error(mean, exact_energy),
                seconds=seconds,
                seconds_per_iter=statistics.median(iter_seconds) if iter_seconds else math.nan,
                n_discard=n_discard,
                acceptance=acceptance,
                note=note,
                stopped_by=stopped_by,
                extrapolated=extrapolated[0],
                extrapolated_error=extrapolated[1],
            )
        )


FINAL_FIELDS = tuple(f.name for f in dataclasses.fields(FinalRow))

# ``/lanczos``: one Lanczos step on the final state (`vmc.lanczos_step`, ``vitqs lanczos``):
# ψ₁ = (1 + αH)ψ's energy, error and variance, α, ψ's own from the same samples, their
# zero-variance extrapolation, the samples (or states summed over: ``full_sum`` 1), seconds;
# the gain E₁ − E₀ and its error, and (Monte Carlo only) ψ₁'s energy as the final
# measurement's plus the gain (`lanczos_file`; files before 2026-11-29 have neither); the split
# R̂ of the step's chains and a note where it says they disagree (a step without R̂ came from
# samples of |ψ|², and its note said that a signed ψ's may err)
LANCZOS_FIELDS = (
    "energy",
    "energy_error",
    "variance",
    "alpha",
    "energy_0",
    "energy_0_error",
    "variance_0",
    "extrapolated",
    "n_samples",
    "full_sum",
    "relative_error",
    "seconds",
    "gain",
    "gain_error",
    "final_plus_gain",
    "final_plus_gain_error",
    "final_plus_gain_relative_error",
    "r_hat",
    "note",
)


def _check_keys(values: dict, allowed: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ResultsError(f"{what} has unknown keys {unknown}; allowed: {list(allowed)}")


def _history_column(rows: list[dict], name: str) -> np.ndarray:
    if name in _INT_HISTORY_FIELDS:
        return np.array([int(row[name]) for row in rows], dtype=np.int64)
    values = [row.get(name) for row in rows]
    return np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)


# ---- small physics helpers shared by the run and the tables ---------------------------------


def relative_error(energy: float, exact_energy: float | None) -> float:
    """Returns the signed ``(E − E_exact) / |E_exact|``, or NaN when there is no exact energy.

    Signed: an estimate below the exact ground-state energy (which only noise can give) reads
    negative, not as an error of the same size above it.
    """
    if exact_energy is None or not math.isfinite(exact_energy) or exact_energy == 0:
        return math.nan
    return (energy - exact_energy) / abs(exact_energy)


def v_score(energy: float, variance: float, n_sites: int, e_inf: float) -> float:
    """Returns the V-score ``N Var(E) / (E − E∞)²`` (Wu et al., Science 386, 296 (2024);
    netket's ``VScore``), with ``E∞ = Tr H / dim`` the energy at infinite temperature;
    NaN when ``E = E∞`` or ``E∞`` is unknown."""
    if not math.isfinite(e_inf) or energy == e_inf:
        return math.nan
    return n_sites * variance / (energy - e_inf) ** 2


def results_path(output_dir: str | Path, name: str) -> Path:
    """Returns ``<output_dir>/<name>.h5``; raises ResultsError for a name that is not a plain
    file name (empty, with a path separator, or starting with a dot)."""
    if not name or name.startswith(".") or "/" in name or os.sep in name:
        raise ResultsError(f"run name {name!r} must be a plain file name (output.name)")
    return Path(output_dir) / f"{name}.h5"


# ---- checkpoints -----------------------------------------------------------------------------


def _detached(value):
    """Returns a copy of a checkpoint tree with its tensors cloned to the CPU: the record keeps
    the state of the moment, whatever the run does to its tensors next."""
    if isinstance(value, dict):
        return {key: _detached(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(item) for item in value)
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if value is None or isinstance(value, (bool, int, float, str, np.number, np.bool_)):
        return value
    raise ResultsError(f"a checkpoint cannot hold values of type {type(value).__name__}")


def load_checkpoint(record: RunRecord) -> dict:
    """Returns the checkpoint dict stored in ``record`` (tensors on CPU).

    Raises ResultsError when the record has no checkpoint.
    """
    if record.checkpoint is None:
        raise ResultsError(f"run {record.name!r} has no checkpoint to resume from")
    return record.checkpoint


# ---- writing ---------------------------------------------------------------------------------


def write_results(path: str | Path, record: RunRecord) -> Path:
    """Writes ``record`` to ``path`` atomically and returns the path.

    The whole file is written through `files.write_atomic`: under a fresh temporary name,
    then moved over ``path``; on any error the temporary file is removed and ``path`` keeps
    its previous content, and a ``path`` that is a symbolic link is refused (OSError). Sets
    ``record.updated`` to now. Creates the parent folder. Raises
    ResultsError for an inconsistent record (unknown status or keys, a checkpoint step past
    the history, observables without final), and OSError, with the system's reason
    (``No space left on device``, ``File too large``...), when the disk refuses the write.
    """
    _check_record(record)
    record.updated = _now()
    image = _hdf5_image(record)
    return files.write_atomic(path, image)


def _hdf5_image(record: RunRecord) -> bytes:
    """Returns the bytes of the results file, built in memory: the disk then sees one plain
    write, whose failure (a full disk, a quota) is an ordinary OSError, where HDF5 writing
    to a file that fails leaves its library with a file it cannot close."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        _write_file(f, record)
    return buffer.getvalue()


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Writes ``text`` to ``path`` whole or not at all (`files.write_atomic`): a reader (or
    a crash) sees the old file or the new one, never half of one. Creates the parent
    folder."""
    return files.write_atomic(path, text.encode())


def _check_record(record: RunRecord) -> None:
    if record.status not in STATUSES:
        raise ResultsError(f"status {record.status!r} must be one of {list(STATUSES)}")
    groups = (("exact", EXACT_FIELDS), ("final", FINAL_FIELDS), ("lanczos", LANCZOS_FIELDS))
    for group, allowed in groups:
        values = getattr(record, group)
        if values is not None:
            _check_keys(values, allowed, group)
            missing = [k for k in _INT_ATTRS if k in allowed and values.get(k) is None]
            if missing:
                raise ResultsError(f"{group} needs integer values for {missing}")
    if record.observables and record.final is None:
        raise ResultsError("observables are written under 'final'; set record.final first")
    bad_names = [name for name in record.observables if not name or "/" in name]
    if bad_names:  # a slash would make HDF5 create nested groups instead of one dataset
        raise ResultsError(f"observable names {bad_names} must be non-empty and without '/'")
    if record.checkpoint is not None and not 0 <= record.checkpoint_step <= len(record.history):
        raise ResultsError(
            f"checkpoint is for step {record.checkpoint_step} but history has "
            f"{len(record.history)} rows; it must be one of them"
        )


def _write_file(f: h5py.File, record: RunRecord) -> None:
    _write_root_attrs(f, record)
    _write_history(f.create_group("history"), record)
    if record.exact is not None:
        _write_attrs(f.create_group("exact"), record.exact, EXACT_FIELDS)
    if record.final is not None:
        _write_final(f.create_group("final"), record)
    if record.lanczos is not None:
        _write_attrs(f.create_group("lanczos"), record.lanczos, LANCZOS_FIELDS)
    if record.checkpoint is not None:
        _write_checkpoint(f.create_group("checkpoint"), record)


def _write_root_attrs(f: h5py.File, record: RunRecord) -> None:
    f.attrs["format"] = FORMAT
    f.attrs["format_version"] = FORMAT_VERSION
    f.attrs["name"] = record.name
    f.attrs["status"] = record.status
    f.attrs["created"] = record.created
    f.attrs["updated"] = record.updated
    f.attrs["seed"] = int(record.seed)
    f.attrs["config_yaml"] = record.config_yaml
    f.attrs["versions_json"] = json.dumps(record.versions, sort_keys=True)
    f.attrs["conventions"] = record.conventions
    f.attrs["n_sites"] = int(record.n_sites)
    f.attrs["n_params"] = int(record.n_params)
    f.attrs["e_inf"] = float(record.e_inf)
    if record.failure:
        f.attrs["failure"] = record.failure
    if record.initial_state:
        f.attrs["initial_state"] = record.initial_state
    if record.sector_search:
        f.attrs["sector_search"] = record.sector_search
    if record.sign_prior_search:
        f.attrs["sign_prior_search"] = record.sign_prior_search
    if record.recipe:
        f.attrs["recipe"] = record.recipe
    if record.compiled_chains:
        f.attrs["compiled_chains"] = 1


def _write_history(group: h5py.Group, record: RunRecord) -> None:
    for name, column in record.history_arrays().items():
        group.create_dataset(name, data=column, maxshape=(None,), chunks=(_HISTORY_CHUNK,))


def _write_attrs(group: h5py.Group, values: dict, fields: tuple[str, ...]) -> None:
    for key in fields:
        value = values.get(key)
        if key in _INT_ATTRS:
            group.attrs[key] = int(value)
        elif key in _TEXT_ATTRS:
            if value is not None:  # absent: what files before the attribute say
                group.attrs[key] = str(value)
        else:
            group.attrs[key] = math.nan if value is None else float(value)


def _write_final(group: h5py.Group, record: RunRecord) -> None:
    _write_attrs(group, record.final, FINAL_FIELDS)
    observables = group.create_group("observables")
    for name, value in record.observables.items():
        observables.create_dataset(name, data=np.asarray(value))


def _write_checkpoint(group: h5py.Group, record: RunRecord) -> None:
    try:
        h5tree.write_tree(group, "state", record.checkpoint)
    except h5tree.TreeError as err:
        raise ResultsError(f"checkpoint: {err}") from None
    group.attrs["step"] = int(record.checkpoint_step)


# ---- reading ---------------------------------------------------------------------------------


def read_results(path: str | Path) -> RunRecord:
    """Returns the RunRecord stored at ``path``.

    Raises ResultsError, with a one-line message naming the file, when the file is missing,
    is not HDF5 or is truncated, is not a vitqs results file, has a newer format_version than
    this vitqs reads, or holds anything else than the layout above: attributes of the wrong
    type, links, datasets too large to read, history columns of unequal length, a checkpoint
    that is not plain data.
    """
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"{path}: no such results file")
    try:
        with h5py.File(path, "r") as f:
            return _read_file(f, path)
    except ResultsError:
        raise
    except h5tree.TreeError as err:
        raise ResultsError(f"{path}: the checkpoint is not plain data ({err})") from None
    except (OSError, KeyError, ValueError, TypeError, AttributeError, RuntimeError) as err:
        # h5py reports truncated and non-HDF5 files as OSError, damaged objects as KeyError
        raise ResultsError(
            f"{path}: not a readable HDF5 results file ({first_line(err)})"
        ) from None


def _read_file(f: h5py.File, path: Path) -> RunRecord:
    version = _check_format(f, path)
    attrs = _Attrs(f, path)
    record = RunRecord(
        name=attrs.text("name"),
        status=attrs.text("status"),
        seed=attrs.integer("seed"),
        config_yaml=attrs.text("config_yaml"),
        n_sites=attrs.integer("n_sites"),
        n_params=attrs.integer("n_params"),
        e_inf=attrs.number("e_inf") if "e_inf" in f.attrs else math.nan,
        created=attrs.text("created"),
        updated=attrs.text("updated"),
        versions=_versions(attrs.text("versions_json"), path),
        conventions=attrs.text("conventions"),
        history=_read_history(_group(f, "history", path), path),
        failure=attrs.text("failure") if "failure" in f.attrs else "",
        initial_state=attrs.text("initial_state") if "initial_state" in f.attrs else "",
        sector_search=attrs.text("sector_search") if "sector_search" in f.attrs else "",
        sign_prior_search=(
            attrs.text("sign_prior_search") if "sign_prior_search" in f.attrs else ""
        ),
        recipe=attrs.text("recipe") if "recipe" in f.attrs else "",
        compiled_chains=bool(attrs.integer("compiled_chains"))
        if "compiled_chains" in f.attrs
        else False,
    )
    if record.status not in STATUSES:
        raise ResultsError(f"{path}: status {record.status!r} is not one of {list(STATUSES)}")
    if "exact" in f:
        record.exact = _Attrs(_group(f, "exact", path), path).fields(EXACT_FIELDS)
    if "final" in f:
        final = _group(f, "final", path)
        record.final = _Attrs(final, path).fields(FINAL_FIELDS)
        record.observables = _read_observables(final, path)
    if "lanczos" in f:
        record.lanczos = _Attrs(_group(f, "lanczos", path), path).fields(LANCZOS_FIELDS)
    if "checkpoint" in f:
        _read_checkpoint(_group(f, "checkpoint", path), record, path, version)
    return record


def _check_format(f: h5py.File, path: Path) -> int:
    if _decoded(f.attrs.get("format")) != FORMAT:
        raise ResultsError(f"{path} is not a vitqs results file (no format={FORMAT!r} attr)")
    version = f.attrs.get("format_version")
    if not isinstance(version, (int, np.integer)) or isinstance(version, (bool, np.bool_)):
        raise ResultsError(f"{path} has an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise ResultsError(
            f"{path} has format_version {version}, newer than the {FORMAT_VERSION} this vitqs "
            "reads; upgrade vitqs"
        )
    if version < 1:
        raise ResultsError(f"{path} has an invalid format_version {version}")
    return int(version)


def _decoded(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _group(parent: h5py.Group, name: str, path: Path) -> h5py.Group:
    """Returns the group ``name`` of ``parent``, refusing a link to elsewhere or a dataset."""
    link = parent.get(name, getlink=True)
    if not isinstance(link, h5py.HardLink):
        raise ResultsError(f"{path}: '{name}' is a {type(link).__name__}, not a plain group")
    group = parent[name]
    if not isinstance(group, h5py.Group):
        raise ResultsError(f"{path}: '{name}' must be a group")
    return group


def _dataset(group: h5py.Group, name: str, path: Path, *, kinds="iuf") -> np.ndarray:
    """Returns the numbers of the dataset ``name`` of ``group``: a plain link, of a numeric
    dtype among ``kinds``, no larger than h5tree.MAX_LEAF_BYTES."""
    where = f"{path}: '{group.name}/{name}'"
    if not isinstance(group.get(name, getlink=True), h5py.HardLink):
        raise ResultsError(f"{where} is a link, not a plain dataset")
    dataset = group[name]
    if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in kinds:
        raise ResultsError(f"{where} must be a dataset of numbers")
    size = int(np.prod(dataset.shape, dtype=np.float64)) * dataset.dtype.itemsize
    if size > h5tree.MAX_LEAF_BYTES:
        raise ResultsError(f"{where} holds {size:,} bytes, more than vitqs reads")
    problem = h5tree.stored_here(dataset)
    if problem is not None:
        raise ResultsError(f"{where}: {problem}; a results file is read for its own data only")
    return dataset[()]


class _Attrs:
    """Typed reads of an HDF5 object's attributes: a value of another type than the layout
    says is a ResultsError naming the file and the attribute, not a crash further on."""

    def __init__(self, obj, path: Path):
        self.attrs, self.where = obj.attrs, f"{path}: attribute '{obj.name.rstrip('/')}/"

    def _get(self, key):
        if key not in self.attrs:
            raise ResultsError(f"{self.where}{key}' is missing")
        return self.attrs[key]

    def text(self, key) -> str:
        value = _decoded(self._get(key))
        if not isinstance(value, str):
            raise ResultsError(f"{self.where}{key}' must be a string, not {value!r:.40}")
        return value

    def integer(self, key) -> int:
        value = self._get(key)
        if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
            raise ResultsError(f"{self.where}{key}' must be an integer, not {value!r:.40}")
        return int(value)

    def number(self, key) -> float:
        value = self._get(key)
        ok = isinstance(value, (int, float, np.integer, np.floating))
        if not ok or isinstance(value, (bool, np.bool_)):
            raise ResultsError(f"{self.where}{key}' must be a number, not {value!r:.40}")
        return float(value)

    def fields(self, names: tuple[str, ...]) -> dict:
        """Returns the attributes among ``names`` that are present, integers as int."""
        read = {}
        for key in names:
            if key in self.attrs:
                if key in _INT_ATTRS:
                    read[key] = self.integer(key)
                elif key in _TEXT_ATTRS:
                    read[key] = self.text(key)
                else:
                    read[key] = self.number(key)
        return read


def _versions(text: str, path: Path) -> dict[str, str]:
    try:
        versions = json.loads(text)
    except ValueError:
        raise ResultsError(f"{path}: attribute 'versions_json' is not JSON") from None
    if not isinstance(versions, dict):
        raise ResultsError(f"{path}: attribute 'versions_json' must be a JSON object")
    return {str(key): str(value) for key, value in versions.items()}


def _read_history(group: h5py.Group, path: Path) -> History:
    missing = [
        name for name in HISTORY_FIELDS if name not in group and name not in _LATER_HISTORY_FIELDS
    ]
    if missing:
        raise ResultsError(f"{path}: history lacks columns {missing}")
    columns = {
        name: _dataset(group, name, path, kinds="iu" if name in _INT_HISTORY_FIELDS else "iuf")
        for name in HISTORY_FIELDS
        if name in group
    }
    if any(column.ndim != 1 for column in columns.values()):
        raise ResultsError(f"{path}: history columns must be 1-D")
    lengths = {name: len(column) for name, column in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ResultsError(f"{path}: history columns have unequal lengths {lengths}")
    n_rows = lengths["step"]
    typed = {}
    for name in HISTORY_FIELDS:
        dtype = np.int64 if name in _INT_HISTORY_FIELDS else np.float64
        column = columns.get(name)
        typed[name] = (
            np.full(n_rows, math.nan) if column is None else column.astype(dtype, copy=False)
        )
    return History(columns=typed)


def _read_observables(final: h5py.Group, path: Path) -> dict[str, np.ndarray]:
    if "observables" not in final:
        return {}
    group = _group(final, "observables", path)
    return {name: _dataset(group, name, path, kinds="iufcb") for name in group}


def _read_checkpoint(group: h5py.Group, record: RunRecord, path: Path, version: int) -> None:
    step = _Attrs(group, path).integer("step")
    if not 0 <= step <= len(record.history):
        raise ResultsError(
            f"{path}: checkpoint step {step} does not match {len(record.history)} history rows"
        )
    if version == 1:
        state = _legacy_checkpoint(_dataset(group, "state", path, kinds="u"), path)
    else:
        if not isinstance(group.get("state", getlink=True), h5py.HardLink):
            raise ResultsError(f"{path}: 'checkpoint/state' is a link, not plain data")
        state = h5tree.read_tree(group["state"])
    if not isinstance(state, dict):
        raise ResultsError(f"{path}: the checkpoint must be a mapping")
    record.checkpoint, record.checkpoint_step = state, step


def _legacy_checkpoint(payload: np.ndarray, path: Path) -> dict:
    """Returns the checkpoint of a format-1 file, the bytes of ``torch.save``. Unpickled with
    ``weights_only=True``: tensors, numbers and plain containers, never a callable (torch
    before 2.6 let a crafted file through that door, CVE-2025-32434: vitqs needs 2.6)."""
    try:
        return torch.load(io.BytesIO(payload.tobytes()), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises unpickling, runtime and zip errors alike
        raise ResultsError(
            f"{path}: the checkpoint does not load as plain data ({first_line(err)})"
        ) from None


# ---- tables ----------------------------------------------------------------------------------


def summary(record: RunRecord) -> dict[str, Any]:
    """Returns the one summary of a record that every table and ``--json`` reads from.

    Keys: ``name, status, n_sites, n_params, n_iter`` (steps done), ``energy,
    energy_error, variance, exact_energy, reference`` (how ``exact_energy`` was obtained),
    ``relative_error, v_score, seconds, seconds_per_iter, note`` (the final measurement's,
    where its numbers need one). A finished run reports its
    ``final`` values; an unfinished one its last history row, with relative error and V-score
    computed from it. Values not known are None (or NaN, where a measurement gave none).
    """
    history = record.history_arrays()
    exact_energy = record.exact.get("energy") if record.exact else None
    row = {
        "name": record.name,
        "status": record.status,
        "n_sites": record.n_sites,
        "n_params": record.n_params,
        "n_iter": len(record.history),
        "exact_energy": exact_energy,
        "reference": reference_of(record),
        "seconds": float(np.nansum(history["seconds_total"])),
    }
    if record.final is not None:
        final = record.final
        for key in ("energy", "energy_error", "variance", "relative_error", "v_score"):
            row[key] = final.get(key)
        row.update(
            seconds=final.get("seconds", row["seconds"]),
            seconds_per_iter=final.get("seconds_per_iter"),
            note=final.get("note"),
            final_samples=final.get("n_samples"),
            stopped_by=final.get("stopped_by"),
            extrapolated_energy=final.get("extrapolated"),
            extrapolated_error=final.get("extrapolated_error"),
        )
    elif record.history:
        energy, variance = history["energy"][-1], history["variance"][-1]
        row.update(
            energy=float(energy),
            energy_error=float(history["energy_error"][-1]),
            variance=float(variance),
            relative_error=relative_error(energy, exact_energy),
            v_score=v_score(energy, variance, record.n_sites, record.e_inf),
        )
    return {key: row.get(key) for key in SUMMARY_FIELDS}


# how the final measurement ended and the run's own extrapolation (issue 52)
FINAL_DETAILS = ("final_samples", "stopped_by", "extrapolated_energy", "extrapolated_error")
SUMMARY_FIELDS = (
    "name",
    "status",
    "n_sites",
    "n_params",
    "n_iter",
    "energy",
    "energy_error",
    "variance",
    "exact_energy",
    "reference",
    "relative_error",
    "v_score",
    "seconds",
    "seconds_per_iter",
    "note",
    *FINAL_DETAILS,
)


def reference_of(record: RunRecord) -> str | None:
    """Returns how the record's reference energy was obtained (`physics.reference`: exact
    diagonalization, Bethe ansatz or a published value), None without one. Files written
    before the ``reference`` attribute hold exact diagonalizations."""
    if not record.exact:
        return None
    return record.exact.get("reference") or EXACT_DIAGONALIZATION


# the columns of the report table (`vitqs report`), a selection of the summary's: the rest is
# left to the notes and the --json line
_DETAILS = ("variance", "seconds_per_iter", "note", *FINAL_DETAILS)
SUMMARY_COLUMNS = tuple(key for key in SUMMARY_FIELDS if key not in _DETAILS)


def summary_row(record: RunRecord) -> dict[str, Any]:
    """Returns the report table's row of ``record``: its `summary` in `SUMMARY_COLUMNS`,
    None where a value is NaN."""
    whole = summary(record)
    return {key: _none_if_nan(whole[key]) for key in SUMMARY_COLUMNS}


def _none_if_nan(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
