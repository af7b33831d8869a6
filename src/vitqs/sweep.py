"""Parameter sweeps: a base config plus a grid over dotted keys, one run per point.

A sweep file names its base config (relative to itself), overrides applied to it at every
point (``set``, dotted keys), the grid, and whether each point starts from the previous
point's parameters (``warm_start``). Each point is an ordinary run
written to ``<output.dir>/<sweep name>/<point name>.h5``; a finished point is read back, not
run again, so an interrupted sweep resumes at the first unfinished point. The summary table
(``summary.csv``, ``summary.md``) and figures land in the same folder.
"""

from __future__ import annotations

import copy
import csv
import difflib
import io
import itertools
import math
from pathlib import Path

import numpy as np

from vitqs import distributed, results
from vitqs.checkpoint import checkpoint_parameters, config_changes, stored_config
from vitqs.config import (
    ConfigError,
    from_dict,
    keys_with,
    n_steps,
    plain_file_name_problem,
)
from vitqs.distributed import is_root
from vitqs.extrapolation import ZERO_VARIANCE_TITLE, write_zero_variance
from vitqs.plots import plot_sweep
from vitqs.report import markdown_table
from vitqs.runner import initial_state, run_config
from vitqs.workfile import pending_path
from vitqs.yamlfile import read_yaml, set_dotted

_SWEEP_KEYS = ("base", "name", "set", "sweep", "warm_start")
# the searches a run makes from random starts, which a warm start would skip, and where a
# recipe makes them (`recipes.recipe`)
_SEARCHES = {
    "model.sector": "on one-cell patches",
    "model.sign_prior": "on the triangular lattice",
}


def load_sweep(path: str | Path) -> dict:
    """Returns the validated sweep spec: base config data, name, grid, warm_start."""
    path = Path(path)
    spec = read_yaml(path)
    if not isinstance(spec, dict):
        raise ConfigError(f"sweep file '{path}' must be a mapping with keys {list(_SWEEP_KEYS)}")
    for key in spec:
        if key not in _SWEEP_KEYS:
            close = difflib.get_close_matches(str(key), _SWEEP_KEYS, n=1)
            hint = (
                f"; did you mean '{close[0]}'?" if close else f"; allowed: {', '.join(_SWEEP_KEYS)}"
            )
            raise ConfigError(f"unknown key '{key}' in sweep file '{path}'{hint}")
    if "base" not in spec or "sweep" not in spec:
        raise ConfigError(f"sweep file '{path}' needs 'base' (a config file) and 'sweep' (a grid)")
    grid = spec["sweep"]
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(
            "sweep must map dotted keys to lists of values, e.g. hamiltonian.U: [2, 5]"
        )
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep.{key}={values!r} must be a non-empty list of values")
    overrides = spec.get("set") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"set={overrides!r} must map dotted keys to values, e.g. budget: 150")
    warm = spec.get("warm_start", False)
    if not isinstance(warm, bool):
        raise ConfigError(f"warm_start={warm!r} must be true or false")
    base = (path.parent / str(spec["base"])).resolve()
    name = spec.get("name", path.stem)
    problem = "it must be a string" if not isinstance(name, str) else plain_file_name_problem(name)
    if problem:
        raise ConfigError(
            f"name={name!r:.60} must be a plain folder name: {problem} (the sweep's points are "
            "written to <output.dir>/<name>/)"
        )
    return {
        "base": read_yaml(base),
        "base_path": base,
        "name": name,
        "grid": grid,
        "set": overrides,
        "warm_start": warm,
    }


def grid_points(grid: dict) -> list[dict]:
    """Returns every combination of the grid's values, first key slowest."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]


def _point_name(point: dict) -> str:
    return "_".join(f"{key.split('.')[-1]}={value}" for key, value in point.items())


def point_configs(spec: dict) -> list:
    """Returns the validated config of every point (all checked before anything runs)."""
    configs = []
    for point in grid_points(spec["grid"]):
        problem = plain_file_name_problem(_point_name(point))
        if problem:
            raise ConfigError(
                f"sweep point {_point_name(point)[:60]!r}: the grid's values name the point's "
                f"results file, and {problem}"
            )
        data = copy.deepcopy(spec["base"])
        for key, value in {**spec.get("set", {}), **point}.items():
            set_dotted(data, key, value)
        config = from_dict(data, default_name=_point_name(point))
        searched = [
            (key, where)
            for key, where in _SEARCHES.items()
            if getattr(config.model, key.split(".")[1]) == "search"
        ]
        if spec["warm_start"] and configs and searched:
            key, where = searched[0]
            raise ConfigError(
                f"sweep point {_point_name(point)[:60]!r}: {key}=search (written, or the "
                f"recipe of frustrated spins {where}) starts every candidate from a random "
                "state, and warm_start: true would start it from the previous point; set "
                f"warm_start: false, or {key} to a value"
            )
        config.name = _point_name(point)
        config.output.dir = str(Path(config.output.dir) / spec["name"])
        configs.append((point, config))
    return configs


def run_sweep(path: str | Path, *, progress: bool = True, use_cache: bool = True) -> dict:
    """Runs (or resumes) a sweep; returns rows, table paths and figure paths. ``use_cache``:
    read and write the ED cache."""
    spec = load_sweep(path)
    configs = point_configs(spec)
    rows, records, previous = [], [], None
    for point, config in configs:
        warm = previous if spec["warm_start"] else None
        record = _run_point(config, warm, progress, use_cache)
        rows.append(_row(point, record))
        records.append(record)
        previous = _final_parameters(record)
    out_dir = Path(configs[0][1].output.dir)
    if not is_root():  # under torchrun rank 0 writes the tables and figures
        return {"name": spec["name"], "rows": rows, "tables": [], "figures": []}
    tables = _write_tables(rows, out_dir)
    parameter = list(spec["grid"])[0].split(".")[-1]
    figures = plot_sweep(rows, parameter, out_dir) if len(spec["grid"]) == 1 else []
    # points on one system (a sweep over the network or the budget): extrapolate them
    extrapolated, more = write_zero_variance(records, out_dir)
    if extrapolated:
        tables.append(out_dir / "zero_variance.md")
        text = f"{ZERO_VARIANCE_TITLE}\n\n{extrapolated}"
        results.write_text_atomic(tables[-1], text)
        figures += more
    return {"name": spec["name"], "rows": rows, "tables": tables, "figures": figures}


def _run_point(config, warm_parameters, progress, use_cache):
    path = results.results_path(config.output.dir, config.name)
    start = initial_state(config, warm_parameters)
    action = distributed.on_root(lambda: _point_action(path, config, start))
    if action == "resume":
        run_config(config, resume=True, progress=progress, use_cache=use_cache)
    elif action == "run":
        run_config(
            config,
            overwrite=True,
            progress=progress,
            initial_parameters=warm_parameters,
            use_cache=use_cache,
        )
    return results.read_results(path)


def _point_action(path, config, start: str) -> str:
    """Returns what to do with a point: ``reuse`` its finished file, ``resume`` it, or
    ``run`` it; raises ConfigError where its file cannot be this config's result, or was
    started otherwise than ``start`` (`run.initial_state`: a change of warm_start).

    An interrupted replacement of the point (``.<name>.h5.pending``, a point run again
    beside an unfinished file) is resumed: its checkpoint is what the message promised."""
    pending = pending_path(path)
    if pending.exists():
        record = _point_record(pending, config, start)
        return "resume" if record.checkpoint is not None else "run"
    if not path.exists():
        return "run"
    record = _point_record(path, config, start)
    if record.status != "finished":
        return "resume" if record.checkpoint is not None else "run"
    differ = config_changes(record, config, ignoring=keys_with("runtime"))
    action = _settle_finished(record, config, differ)
    if action is None:
        raise ConfigError(
            f"'{path}' is this point finished with other {', '.join(differ)}; put them back, "
            "or delete the file to run the point again"
        )
    return action


def _point_record(path, config, start: str):
    """Returns the record of a point's file when it is this config's, started as ``start``;
    ConfigError otherwise (and for a file that does not read: it is never overwritten)."""
    try:
        record = results.read_results(path)
    except results.ResultsError as err:  # never overwrite what cannot be read: it may be
        raise ConfigError(  # a newer vitqs's file, or the disk failed for a moment
            f"{err}; the sweep does not overwrite it: move it away or delete it to run the "
            "point again"
        ) from None
    changed = config_changes(record, config)
    if changed:  # a finished point would be read back as if it were this config's
        raise ConfigError(
            f"'{path}' holds a run of another config ({', '.join(changed)}); "
            "give the sweep another name or output.dir, or delete the file to run it again"
        )
    if record.initial_state and record.initial_state != start:
        raise ConfigError(
            f"'{path}' started from its {record.initial_state}, and this sweep starts the "
            f"point from its {start} (warm_start changed?); put warm_start back, or give the "
            "sweep another name, or delete the file to run the point again"
        )
    return record


def _settle_finished(record, config, differ: list[str]) -> str | None:
    """Returns ``reuse`` for a finished point whose differences change nothing it computed,
    ``resume`` for ones a resume settles (more steps or budget: it goes on; another final
    measurement or exact reference: it measures anew), None for the others."""
    stored = stored_config(record)  # read back by config_changes already
    stored = stored if isinstance(stored, dict) else {}
    earlier = stored.get("optimizer") if isinstance(stored.get("optimizer"), dict) else {}
    steps, budget = n_steps(config), config.budget
    spent = (record.final or {}).get("seconds", math.inf)  # steps and final measurement
    if steps is not None and len(record.history) >= steps and (budget is None or spent < budget):
        # every step was done, within the budget asked for now: it would not end the run
        differ = [key for key in differ if key != "budget"]
    action = "reuse"
    for key in differ:
        if key.startswith(("final.", "exact.")):
            action = "resume"
            continue
        if key in ("optimizer.n_iter", "budget"):
            before = stored.get("budget") if key == "budget" else earlier.get("n_iter")
            now = config.budget if key == "budget" else config.optimizer.n_iter
            if now is None or (isinstance(before, (int, float)) and now > before):
                action = "resume"  # more steps or time: it goes on
                continue
        return None
    return action


def _final_parameters(record) -> dict | None:
    if record.checkpoint is None:
        return None
    return checkpoint_parameters(record)


def _row(point: dict, record) -> dict:
    n = record.n_sites
    final = record.final or {}
    exact = record.exact
    row = {key.split(".")[-1]: value for key, value in point.items()}
    row.update(
        energy=final.get("energy"),
        energy_error=final.get("energy_error"),
        energy_per_site=final.get("energy", math.nan) / n,
        energy_error_per_site=final.get("energy_error", math.nan) / n,
        exact_energy=exact["energy"] if exact else None,
        exact_energy_per_site=exact["energy"] / n if exact else None,
        reference=results.reference_of(record),
        relative_error=final.get("relative_error"),
        v_score=final.get("v_score"),
        seconds=final.get("seconds"),
    )
    obs = record.observables
    if "condensate_fraction" in obs:
        row["condensate_fraction"] = float(np.real(obs["condensate_fraction"]))
        if "condensate_fraction_error" in obs:
            row["condensate_fraction_error"] = float(obs["condensate_fraction_error"])
        if "condensate_fraction_max_eigenvalue" in obs:  # the biased estimate, for comparison
            largest = obs["condensate_fraction_max_eigenvalue"]
            row["condensate_fraction_max_eigenvalue"] = float(np.real(largest))
        if "exact_condensate_fraction" in obs:
            row["exact_condensate_fraction"] = float(np.real(obs["exact_condensate_fraction"]))
    if "structure_factor" in obs:
        row["structure_factor_peak"] = float(np.max(np.real(obs["structure_factor"])))
        if "exact_structure_factor" in obs:
            peak = np.max(np.real(obs["exact_structure_factor"]))
            row["exact_structure_factor_peak"] = float(peak)
    return row


def _write_tables(rows: list[dict], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    paths = [out_dir / "summary.csv", out_dir / "summary.md"]
    results.write_text_atomic(paths[0], buffer.getvalue())
    results.write_text_atomic(paths[1], markdown_table(rows, columns) + "\n")
    return paths
