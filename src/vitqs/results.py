"""The results file of one run: an HDF5 file written whole and atomically, and read back.

A run keeps a ``RunRecord`` in memory and calls ``write_results`` at every checkpoint, on
SIGINT/SIGTERM and at the end. Each write builds the complete file as ``<path>.tmp`` in the
same folder and moves it over ``<path>`` with ``os.replace``, so a crash or SIGKILL at any
moment leaves either the previous complete file or the new one, and a reader can open the
file while the run goes on.

Layout (format_version 1)::

    /                     attrs: format="vitqs-results", format_version, name, status,
                                 created, updated, seed, config_yaml, versions_json,
                                 conventions, n_sites, n_params
    /history/<field>      1-D, one entry per iteration, resizable; fields = HISTORY_FIELDS
    /exact                attrs EXACT_FIELDS                       (only with an exact reference)
    /final                attrs FINAL_FIELDS                       (only once the run finished)
    /final/observables/<name>   one dataset per observable, real or complex, plus <name>_error
    /checkpoint/state     uint8 bytes of torch.save(checkpoint_dict); attr step = len(history)
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from vitqs import __version__

FORMAT = "vitqs-results"
FORMAT_VERSION = 1

STATUSES = ("running", "interrupted", "finished")

HISTORY_FIELDS = (
    "step",
    "energy",
    "energy_error",
    "variance",
    "r_hat",
    "tau",
    "acceptance",
    "lr",
    "diag_shift",
    "update_norm",
    "seconds_sampling",
    "seconds_local_energy",
    "seconds_jacobian",
    "seconds_solve",
    "seconds_total",
    "n_samples",
    "anneal_fraction",  # 1: the step's hamiltonian is the config's (optimizer.anneal_from)
    "update_capped",  # 1: the trust bound shortened the step (optimizer.max_update_ratio)
)
_INT_HISTORY_FIELDS = ("step",)
# columns added after format 1 was first written: a file without them reads as NaN
_LATER_HISTORY_FIELDS = ("n_samples", "anneal_fraction", "update_capped")

EXACT_FIELDS = ("energy", "energy_per_site", "dimension", "seconds")
FINAL_FIELDS = (
    "energy",
    "energy_error",
    "variance",
    "v_score",
    "tau",
    "r_hat",
    "n_samples",
    "relative_error",
    "seconds",
    "seconds_per_iter",
)
# integer attrs cannot fall back to NaN, so they are required when the group is written
_INT_ATTRS = ("dimension", "n_samples")

CONVENTIONS = (
    "S = sigma/2; H_heis = J1 sum_<ij> S_i.S_j + J2 sum_<<ij>> S_i.S_j; "
    "H_bh = -J sum_<ij> (b_i^dag b_j + h.c.) + (U/2) sum_i n_i (n_i - 1) - mu sum_i n_i; "
    "sites row-major, site (x, y) = x + Lx*y; energies are totals unless named per_site; "
    "relative_error = |E - E_exact|/|E_exact|; v_score = N Var(E)/E^2 with N = n_sites"
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


@dataclass
class RunRecord:
    """Everything a results file holds, in memory.

    ``history`` is a list of rows, each a dict with keys from ``HISTORY_FIELDS`` (missing
    values are written as NaN). ``exact`` and ``final`` are dicts with keys from
    ``EXACT_FIELDS`` and ``FINAL_FIELDS`` or None. ``observables`` maps a name to an array or
    scalar and is written under ``final`` (so it needs ``final``). ``checkpoint`` holds the
    bytes of ``checkpoint_bytes(...)``; ``checkpoint_step`` must equal ``len(history)``.
    """

    name: str
    status: str = "running"
    seed: int = 0
    config_yaml: str = ""
    n_sites: int = 0
    n_params: int = 0
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    versions: dict[str, str] = field(default_factory=runtime_versions)
    conventions: str = CONVENTIONS
    history: list[dict[str, float]] = field(default_factory=list)
    exact: dict[str, float] | None = None
    final: dict[str, float] | None = None
    observables: dict[str, Any] = field(default_factory=dict)
    checkpoint: bytes | None = None
    checkpoint_step: int | None = None

    def append_history(self, row: dict[str, float]) -> None:
        """Appends one iteration's row; raises ResultsError on a key not in HISTORY_FIELDS."""
        _check_keys(row, HISTORY_FIELDS, "history row")
        self.history.append(dict(row))

    def set_checkpoint(self, checkpoint_dict: dict) -> None:
        """Stores ``checkpoint_dict`` serialised, as the state after ``len(history)`` steps."""
        self.checkpoint = checkpoint_bytes(checkpoint_dict)
        self.checkpoint_step = len(self.history)

    def history_arrays(self) -> dict[str, np.ndarray]:
        """Returns one 1-D array per field of HISTORY_FIELDS (int64 step, float64 others)."""
        return {name: _history_column(self.history, name) for name in HISTORY_FIELDS}


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
    """Returns |E - E_exact| / |E_exact|, or NaN when there is no exact energy."""
    if exact_energy is None or not math.isfinite(exact_energy) or exact_energy == 0:
        return math.nan
    return abs(energy - exact_energy) / abs(exact_energy)


def v_score(energy: float, variance: float, n_sites: int) -> float:
    """Returns the V-score N Var(E) / E^2 (Wu et al., Science 2024); NaN when E = 0."""
    if energy == 0:
        return math.nan
    return n_sites * variance / energy**2


def results_path(output_dir: str | Path, name: str) -> Path:
    """Returns ``<output_dir>/<name>.h5``; raises ResultsError for a name that is not a plain
    file name (empty, with a path separator, or starting with a dot)."""
    if not name or name.startswith(".") or "/" in name or os.sep in name:
        raise ResultsError(f"run name {name!r} must be a plain file name (output.name)")
    return Path(output_dir) / f"{name}.h5"


# ---- checkpoints -----------------------------------------------------------------------------


def checkpoint_bytes(checkpoint_dict: dict) -> bytes:
    """Returns the bytes of ``torch.save(checkpoint_dict)``."""
    buffer = io.BytesIO()
    torch.save(checkpoint_dict, buffer)
    return buffer.getvalue()


def load_checkpoint(record: RunRecord) -> dict:
    """Returns the checkpoint dict stored in ``record`` (tensors on CPU).

    Raises ResultsError when the record has no checkpoint or its bytes do not load.
    """
    if record.checkpoint is None:
        raise ResultsError(f"run {record.name!r} has no checkpoint to resume from")
    try:
        # weights_only=False: the dict holds RNG states and optimizer state that we wrote
        return torch.load(io.BytesIO(record.checkpoint), map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises pickle, runtime and zip errors alike
        raise ResultsError(f"run {record.name!r}: checkpoint does not load ({err})") from err


# ---- writing ---------------------------------------------------------------------------------


def write_results(path: str | Path, record: RunRecord) -> Path:
    """Writes ``record`` to ``path`` atomically and returns the path.

    The whole file is written to ``<path>.tmp`` and moved over ``path`` with ``os.replace``;
    on any error the tmp file is removed and ``path`` keeps its previous content. Sets
    ``record.updated`` to now. Creates the parent folder. Raises ResultsError for an
    inconsistent record (unknown status or keys, checkpoint step != history length,
    observables without final).
    """
    _check_record(record)
    record.updated = _now()
    with _replacing(path) as tmp:
        with h5py.File(tmp, "w") as f:
            _write_file(f, record)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Writes ``text`` to ``path`` through ``<path>.tmp`` and ``os.replace``: a reader (or a
    crash) sees the old file or the new one, never half of one. Creates the parent folder."""
    with _replacing(path) as tmp:
        tmp.write_text(text)
    return Path(path)


@contextlib.contextmanager
def _replacing(path: str | Path):
    """Yields ``<path>.tmp`` to write; then syncs it and moves it over ``path``. On any error
    the tmp file is removed and ``path`` keeps its previous content."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())  # the data must be on disk before the rename makes it visible
        os.replace(tmp, path)
    except BaseException:  # also KeyboardInterrupt: never leave a half file behind
        tmp.unlink(missing_ok=True)
        raise


def _check_record(record: RunRecord) -> None:
    if record.status not in STATUSES:
        raise ResultsError(f"status {record.status!r} must be one of {list(STATUSES)}")
    for row in record.history:
        _check_keys(row, HISTORY_FIELDS, "history row")
        if "step" not in row:
            raise ResultsError(f"history row {row} has no 'step'")
    for group, allowed in (("exact", EXACT_FIELDS), ("final", FINAL_FIELDS)):
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
    if record.checkpoint is not None and record.checkpoint_step != len(record.history):
        raise ResultsError(
            f"checkpoint is for step {record.checkpoint_step} but history has "
            f"{len(record.history)} rows; they must match"
        )


def _write_file(f: h5py.File, record: RunRecord) -> None:
    _write_root_attrs(f, record)
    _write_history(f.create_group("history"), record)
    if record.exact is not None:
        _write_attrs(f.create_group("exact"), record.exact, EXACT_FIELDS)
    if record.final is not None:
        _write_final(f.create_group("final"), record)
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


def _write_history(group: h5py.Group, record: RunRecord) -> None:
    for name, column in record.history_arrays().items():
        group.create_dataset(name, data=column, maxshape=(None,), chunks=(_HISTORY_CHUNK,))


def _write_attrs(group: h5py.Group, values: dict, fields: tuple[str, ...]) -> None:
    for key in fields:
        value = values.get(key)
        if key in _INT_ATTRS:
            group.attrs[key] = int(value)
        else:
            group.attrs[key] = math.nan if value is None else float(value)


def _write_final(group: h5py.Group, record: RunRecord) -> None:
    _write_attrs(group, record.final, FINAL_FIELDS)
    observables = group.create_group("observables")
    for name, value in record.observables.items():
        observables.create_dataset(name, data=np.asarray(value))


def _write_checkpoint(group: h5py.Group, record: RunRecord) -> None:
    group.create_dataset("state", data=np.frombuffer(record.checkpoint, dtype=np.uint8))
    group.attrs["step"] = int(record.checkpoint_step)


# ---- reading ---------------------------------------------------------------------------------


def read_results(path: str | Path) -> RunRecord:
    """Returns the RunRecord stored at ``path``.

    Raises ResultsError, with a one-line message naming the file, when the file is missing,
    is not HDF5 or is truncated, is not a vitqs results file, has a newer format_version than
    this vitqs reads, or has history columns of unequal length.
    """
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"{path}: no such results file")
    try:
        with h5py.File(path, "r") as f:
            return _read_file(f, path)
    except ResultsError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as err:
        # h5py reports truncated and non-HDF5 files as OSError, damaged objects as KeyError
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ResultsError(f"{path}: not a readable HDF5 results file ({reason})") from err


def _read_file(f: h5py.File, path: Path) -> RunRecord:
    _check_format(f, path)
    attrs = f.attrs
    record = RunRecord(
        name=str(attrs["name"]),
        status=str(attrs["status"]),
        seed=int(attrs["seed"]),
        config_yaml=str(attrs["config_yaml"]),
        n_sites=int(attrs["n_sites"]),
        n_params=int(attrs["n_params"]),
        created=str(attrs["created"]),
        updated=str(attrs["updated"]),
        versions=json.loads(attrs["versions_json"]),
        conventions=str(attrs["conventions"]),
        history=_read_history(f["history"], path),
    )
    if "exact" in f:
        record.exact = _read_attrs(f["exact"], EXACT_FIELDS)
    if "final" in f:
        record.final = _read_attrs(f["final"], FINAL_FIELDS)
        record.observables = {k: v[()] for k, v in f["final/observables"].items()}
    if "checkpoint" in f:
        _read_checkpoint(f["checkpoint"], record, path)
    return record


def _check_format(f: h5py.File, path: Path) -> None:
    if f.attrs.get("format") != FORMAT:
        raise ResultsError(f"{path} is not a vitqs results file (no format={FORMAT!r} attr)")
    version = int(f.attrs.get("format_version", -1))
    if version > FORMAT_VERSION:
        raise ResultsError(
            f"{path} has format_version {version}, newer than the {FORMAT_VERSION} this vitqs "
            "reads; upgrade vitqs"
        )
    if version < 1:
        raise ResultsError(f"{path} has an invalid format_version {version}")


def _read_history(group: h5py.Group, path: Path) -> list[dict[str, float]]:
    missing = [
        name for name in HISTORY_FIELDS if name not in group and name not in _LATER_HISTORY_FIELDS
    ]
    if missing:
        raise ResultsError(f"{path}: history lacks columns {missing}")
    n_rows = len(group["step"])
    columns = {
        name: group[name][()] if name in group else np.full(n_rows, math.nan)
        for name in HISTORY_FIELDS
    }
    lengths = {name: len(column) for name, column in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ResultsError(f"{path}: history columns have unequal lengths {lengths}")
    n_steps = lengths["step"]
    return [{name: columns[name][i].item() for name in HISTORY_FIELDS} for i in range(n_steps)]


def _read_attrs(group: h5py.Group, fields: tuple[str, ...]) -> dict[str, float]:
    return {key: group.attrs[key].item() for key in fields if key in group.attrs}


def _read_checkpoint(group: h5py.Group, record: RunRecord, path: Path) -> None:
    record.checkpoint = group["state"][()].tobytes()
    record.checkpoint_step = int(group.attrs["step"])
    if record.checkpoint_step != len(record.history):
        raise ResultsError(
            f"{path}: checkpoint step {record.checkpoint_step} does not match "
            f"{len(record.history)} history rows"
        )


# ---- tables ----------------------------------------------------------------------------------

SUMMARY_COLUMNS = (
    "name",
    "status",
    "n_sites",
    "n_params",
    "iterations",
    "energy",
    "energy_error",
    "exact_energy",
    "relative_error",
    "v_score",
    "seconds",
)


def summary_row(record: RunRecord) -> dict[str, Any]:
    """Returns one table row (keys SUMMARY_COLUMNS) for ``record``.

    A finished run reports its ``final`` values; an unfinished one its last history row, with
    relative error and V-score computed from it. Values not known are None.
    """
    history = record.history_arrays()
    exact_energy = record.exact.get("energy") if record.exact else None
    row = {
        "name": record.name,
        "status": record.status,
        "n_sites": record.n_sites,
        "n_params": record.n_params,
        "iterations": len(record.history),
        "exact_energy": exact_energy,
        "seconds": float(np.nansum(history["seconds_total"])),
    }
    if record.final is not None:
        final = record.final
        row.update({k: final.get(k) for k in ("energy", "energy_error", "relative_error")})
        row.update(v_score=final.get("v_score"), seconds=final.get("seconds", row["seconds"]))
    elif record.history:
        energy, variance = history["energy"][-1], history["variance"][-1]
        row.update(
            energy=float(energy),
            energy_error=float(history["energy_error"][-1]),
            relative_error=relative_error(energy, exact_energy),
            v_score=v_score(energy, variance, record.n_sites),
        )
    return {key: _none_if_nan(row.get(key)) for key in SUMMARY_COLUMNS}


def _none_if_nan(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
