"""The accuracy report: rows of finished runs judged against exact energies, and the tables
of ``results/accuracy.md`` rendered from them.

A row is one finished run's results file read back (`row_from_results`; the defaults
table's `defaults_row` adds its seed and what ended its final measurement), stored as one
JSON file in a rows folder (`store_row`), so runs made one at a time, or elsewhere, still
make a whole table. A goal is judged on the final Monte Carlo estimate ``E ± σ``: met when
``|E − E_ref| + 2σ ≤ goal·|E_ref|`` (`goal_met`), and in the defaults table only when every
seed meets it and at least `MIN_SEEDS` ran. Only the blocks between ``<!-- begin NAME -->``
and ``<!-- end NAME -->`` markers are rewritten (`replace_block`): the prose around them is
kept.

``scripts/benchmark_accuracy.py`` (``vitqs bench accuracy``) runs the benchmark configs and
netket beside them, and stores and renders its rows with this module; from an installed
package, ``write_report(output, rows_dir)`` renders a report from stored rows, and
``defaults_row(path)`` reads a run of ``configs/defaults``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import textwrap
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from vitqs.errors import ConfigError

# ---- goals ----------------------------------------------------------------------------------

# The goals on the relative error, judged on the Monte Carlo estimate (`goal_met`).
GOALS = {
    "heisenberg_chain16": 1e-6,
    "heisenberg_4x4": 1e-5,
    "j1j2_4x4": 1e-4,
    "bose_hubbard_chain12_U2": 1e-5,
    "bose_hubbard_chain12_U3.3": 1e-5,
    "bose_hubbard_chain12_U5": 1e-5,
    "bose_hubbard_chain12_U10": 1e-5,
    "bose_hubbard_3x3": 1e-5,
    "j1j2_6x6": 1e-3,
}


# The defaults table (issue 52): configs with only the lattice, the Hamiltonian and a budget
# (configs/defaults/), each run with several seeds; goals on the final Monte Carlo estimate.
DEFAULT_GOALS = {
    "j1j2_4x4": 1e-4,
    "j1j2_chain20": 1e-5,
    "triangular_6x4": 1e-3,
    "kagome_2x3": 1e-3,
    "bose_hubbard_chain12": 1e-5,
    "bose_hubbard_3x3": 1e-4,
    "heisenberg_6x6": 1e-4,
}


# a goal is met when every seed run meets it, and at least this many seeds ran
MIN_SEEDS = 3


def goal_margin(energy: float, error: float, exact: float) -> float:
    """Returns ``(|E − E_exact| + 2σ) / |E_exact|``: the relative error a Monte Carlo estimate
    ``E ± σ`` vouches for at about 95 %, its distance and twice its error bar."""
    return (abs(energy - exact) + 2 * error) / abs(exact)


def goal_met(energy: float, error: float, exact: float, goal: float) -> bool:
    """Returns whether the estimate ``E ± σ`` meets a relative goal:
    ``|E − E_exact| + 2σ ≤ goal · |E_exact|``. A full sum (σ = 0) is judged the same way by
    the caller only where the goal allows one; a Monte Carlo goal does not."""
    return goal_margin(energy, error, exact) <= goal


# ---- rows -----------------------------------------------------------------------------------


def cpu_name() -> str:
    """Returns a short description of this CPU, e.g. ``x86_64, 2 cores``."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        name = found.group(1).strip() if found else name
    return f"{name} ({os.cpu_count()} cores)"


def _estimator(full_sum: bool, summed: int | None, dimension: int | None) -> str:
    """Returns the estimator cell's start: Monte Carlo, a full sum, or one over orbits."""
    if not full_sum:
        return "Monte Carlo"
    if summed is None or dimension is None or summed == dimension:
        return "full sum"
    return f"full sum over {summed:,} orbits of the {dimension:,} states"


def row_from_results(system: str, results_file: Path) -> dict:
    """Returns the table row of a finished results file, with the config stored in it: a run
    of this script, or one made elsewhere (``vitqs run`` on a GPU) and read back."""
    import torch

    from vitqs.build import build_hamiltonian
    from vitqs.checkpoint import stored_config
    from vitqs.config import from_dict
    from vitqs.physics.reference import EXACT_DIAGONALIZATION, reference_energy
    from vitqs.results import read_results, relative_error
    from vitqs.runner import summary as run_summary

    record = read_results(results_file)
    if record.status != "finished":
        raise ConfigError(f"{results_file}: the run is {record.status}, not finished")
    config = from_dict(stored_config(record) or {}, default_name=system)  # capped parser
    summary = run_summary(record, results_file)
    with h5py.File(results_file, "r") as f:
        energy = f["history/energy"][:]
        seconds = np.cumsum(f["history/seconds_total"][:])
        summed = int(f["history/n_samples"][-1]) if "history/n_samples" in f else None
    # ED's energy; past ED, the reference of `vitqs.physics.reference` (Bethe ansatz,
    # published), which the row marks as such
    ed = summary["reference"] == EXACT_DIAGONALIZATION
    exact = summary["exact_energy"] if ed else None
    model = config.model
    full_sum = config.sampler.kind == "full_sum"
    row = {
        "engine": "vitqs",
        "system": system,
        "model": describe_model(model.to_dict() if hasattr(model, "to_dict") else vars(model)),
        "n_params": summary["n_params"],
        # a full sum's samples: the states each step sums over (one per orbit when reduced)
        "n_samples": summed if full_sum and summed else config.sampler.n_samples,
        "threads": config.threads or torch.get_num_threads(),
        "estimator": _estimator(full_sum, summed, (record.exact or {}).get("dimension"))
        + _tempered(config.sampler.machine_pow)
        + _final_average(config.final.symmetrize, config.final.spin_flip)
        + _annealed(config.optimizer)
        + _averaged(config.optimizer.average_from),
        "n_iter": summary["n_iter"],
        "seconds": summary["seconds"],
        "budget_seconds": config.budget,
        "energy": summary["energy"],
        "energy_error": summary["energy_error"],
        "exact_energy": exact,
        "relative_error": summary["relative_error"],
        "v_score": summary["v_score"],
        "variance": summary["variance"],
        "e_inf": build_hamiltonian(config).infinite_temperature_energy(),
        "n_sites": config.n_sites,
        "machine": cpu_name(),
        "results_file": str(results_file),
        "curve_seconds": seconds.tolist(),
        "curve_relative_error": relative_curve(energy, exact),
    }
    gpu = record.versions.get("gpu", "none")  # files written before the key: none recorded
    if gpu != "none" and config.device != "cpu":
        row["device"], row["threads"] = gpu, config.threads  # the GPU did the work
    found = None if ed else reference_energy(build_hamiltonian(config))
    if found is not None:
        row["reference"] = {"energy": found.energy, "source": found.method}
        row["reference_relative_error"] = relative_error(summary["energy"], found.energy)
        row["curve_relative_error"] = relative_curve(energy, found.energy)
    return row


def _tempered(machine_pow: float) -> str:
    if machine_pow == 2.0:
        return ""
    return f" (steps on samples of |ψ|^{machine_pow:g}, reweighted to |ψ|²)"


def _final_average(symmetrize: str, spin_flip: int = 0) -> str:
    names = {"translations": "translation-averaged", "space_group": "space-group-averaged"}
    averages = [names[symmetrize]] if symmetrize in names else []
    if spin_flip:
        averages.append(f"projected on spin inversion {spin_flip:+d}")
    return f", final ψ {' and '.join(averages)}" if averages else ""


def _annealed(optimizer) -> str:
    if optimizer.anneal is None:
        return ""
    path = optimizer.anneal
    start = ", ".join(f"{name} = {value:g}" for name, value in path["from"].items())
    return f", H annealed from {start} over the first {path['until']:.0%} of the run"


def _averaged(average_from) -> str:
    if average_from is None:
        return ""
    return f", parameters averaged over the last {1 - average_from:.0%} of the run"


def describe_model(model: dict) -> str:
    """Returns e.g. ``vit 2L d16 h4 p2 onehot+J+T`` for a model config."""
    text = f"vit {model['layers']}L d{model['d_model']} h{model['heads']} p{model['patch_size']}"
    text += f" {model['embedding']}" + ("+Jastrow" if model["jastrow"] else "")
    text += ", ψ>0" if model.get("positive") else ""
    text += {"translations": "+transl", "space_group": "+space group"}.get(model["symmetrize"], "")
    sector = model.get("sector")
    flip = sector["spin_flip"] if isinstance(sector, dict) else 0
    text += f"+flip{flip:+d}" if flip else ""
    return text


def relative_curve(energy, exact) -> list:
    """Returns |E − E_exact|/|E_exact| of a history: the curves are drawn on log axes."""
    if exact is None:
        return []
    return (np.abs(np.asarray(energy) - exact) / abs(exact)).tolist()


# ---- tables ---------------------------------------------------------------------------------


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(value, spec)


def _row_cells(row: dict, label: str) -> list[str]:
    per_site = row["n_sites"] or 1
    energy = f"{row['energy'] / per_site:.7f} ± {row['energy_error'] / per_site:.1e}"
    exact = _fmt(None if row["exact_energy"] is None else row["exact_energy"] / per_site, ".9f")
    relative = _fmt(row["relative_error"], "+.2e")
    if row["n_sites"] is None:  # netket rows: divide by the vitqs row's site count
        energy, exact = row["_energy_text"], row["_exact_text"]
    if row.get("reference"):  # no ED: the reference past it, and the error against it, marked
        reference = row["reference"]
        exact = f"{reference['energy'] / per_site:.6f} ({reference['source']})"
        relative = f"{row['reference_relative_error']:+.2e} (vs {reference_kind(reference)})"
    return [
        label,
        row["engine"],
        row["model"],
        str(row["n_params"]),
        str(row["n_samples"]),
        str(row["n_iter"]),
        f"{row['seconds']:.0f} ({_fmt(row['budget_seconds'], '.0f')})",
        # rows stored before the column: one thread
        f"GPU: {row['device']}" if row.get("device") else str(row.get("threads", 1)),
        energy,
        exact,
        relative,
        _fmt(row.get("enumerated_relative_error"), "+.2e"),
        _fmt(row["v_score"], ".1e"),
        row["estimator"],
    ]


def _reference(row: dict) -> float | None:
    """Returns the energy a row is judged against: ED's, else the reference past ED (Bethe
    ansatz or published), else None."""
    if row.get("exact_energy") is not None:
        return row["exact_energy"]
    return row["reference"]["energy"] if row.get("reference") else None


def _full_sum(row: dict) -> bool:
    return row["estimator"].startswith("full sum")


def _judged(row: dict, goal: float) -> tuple[str, str, str]:
    """Returns the cells estimate, margin and verdict of one engine's row against ``goal``."""
    reference = _reference(row)
    if reference is None:
        return "—", "—", "no reference"
    relative = (row["energy"] - reference) / abs(reference)
    sigma = row["energy_error"] / abs(reference)
    margin = goal_margin(row["energy"], row["energy_error"], reference)
    estimate = f"{relative:+.1e} ± {sigma:.1e}"
    if _full_sum(row):  # exact sums over the sector: no Monte Carlo estimate to judge
        return estimate + " (full sum)", "—", "does not count: full sum, not Monte Carlo"
    met = goal_met(row["energy"], row["energy_error"], reference, goal)
    return estimate, f"{margin:.1e}", "**yes**" if met else "no"


def _one_seed(judged: tuple[str, str, str]) -> tuple[str, str, str]:
    """Returns the cells of a one-run row, whose goal cannot be met on one seed: its margin
    under the goal reads "on 1 seed of the 3 needed"."""
    estimate, margin, verdict = judged
    if verdict == "**yes**":
        verdict = f"under the goal on 1 seed of the {MIN_SEEDS} needed"
    return estimate, margin, verdict


def render_goals(rows: list[dict]) -> str:
    """Returns the goals table: each system's goal judged on the final Monte Carlo estimate
    ``E ± σ`` (met when ``|E − E_exact| + 2σ ≤ goal·|E_exact|``), the enumerated figure and
    the V-scores beside it; netket's estimate judged the same way."""
    header = [
        "system",
        "goal",
        "vitqs MC: (E − E_exact)/\\|E_exact\\| ± σ",
        "(\\|ΔE\\| + 2σ)/\\|E_exact\\|",
        "met on MC? (every seed, ≥ 3)",
        "vitqs enumerated",
        "vitqs V-score",
        "netket MC ± σ",
        "netket (\\|ΔE\\| + 2σ)/\\|E_exact\\|",
        "netket met?",
        "netket V-score",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        goal = GOALS.get(row["system"])
        if goal is None:
            continue
        peer = next((p for p in row.get("peers", []) if p["engine"] == "netket"), None)
        ours = _one_seed(_judged(row, goal))
        theirs = _one_seed(_judged(peer, goal)) if peer else ("—", "—", "—")
        against = f" (vs {reference_kind(row['reference'])})" if row.get("reference") else ""
        cells = [
            row["system"] + against,
            f"≤ {goal:.0e}",
            *ours,
            _fmt(row.get("enumerated_relative_error"), "+.2e"),
            _fmt(row["v_score"], ".1e"),
            *theirs,
            _fmt(peer["v_score"], ".1e") if peer else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


HEADER = [
    "system",
    "engine",
    "model",
    "params",
    "samples",
    "iters",
    "wall s (budget)",
    "threads / GPU",
    "E/N ± err",
    "E_exact/N",
    "rel. error",
    "rel. error, enumerated",
    "V-score",
    "estimator",
]


def render_table(rows: list[dict], label_key: str) -> str:
    """Returns a markdown table of rows, each netket row right after its vitqs row."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        for entry in [row, *row.get("peers", [])]:
            if entry["engine"] == "netket":
                n = row["n_sites"]
                entry["_energy_text"] = (
                    f"{entry['energy'] / n:.7f} ± {entry['energy_error'] / n:.1e}"
                )
                entry["_exact_text"] = _fmt(
                    None if entry["exact_energy"] is None else entry["exact_energy"] / n, ".9f"
                )
            # a cell's own pipes (|ψ|) would end it early: markdown takes them escaped
            cells = [cell.replace("|", "\\|") for cell in _row_cells(entry, row[label_key])]
            lines.append("| " + " | ".join(cells) + " |")
        if row.get("peer_failure"):
            failed = [row[label_key], "netket", f"did not finish: {row['peer_failure']}"]
            lines.append("| " + " | ".join(failed + [""] * (len(HEADER) - 3)) + " |")
    return "\n".join(lines)


HEADLINE = (
    "system",
    "vitqs, Monte Carlo",
    "reference",
    "(E − E_ref)/\\|E_ref\\|",
    "netket, same budget",
    "wall s (on)",
)


def render_headline(rows: list[dict]) -> str:
    """Returns README's headline table: per system the final Monte Carlo estimate per site
    with its error bar, the reference and its kind, the relative error, netket's at the same
    budget, and the run's wall time (final measurement included). Rows measured by a full
    sum are left out: the headline is what sampling reaches."""
    lines = ["| " + " | ".join(HEADLINE) + " |", "|" + "---|" * len(HEADLINE)]
    for row in rows:
        if not str(row.get("estimator", "")).startswith("Monte Carlo"):
            continue
        n = row["n_sites"]
        reference, kind = row.get("exact_energy"), "ED"
        if reference is None and isinstance(row.get("reference"), dict):  # past ED: published
            reference, kind = row["reference"]["energy"], row["reference"]["source"]
        relative = row.get("relative_error")
        if relative is None:
            relative = row.get("reference_relative_error")
        # rows stored before the threads column ran on one
        threads = row.get("threads") or 1
        where = row.get("device") or f"{threads} thread{'s' if threads > 1 else ''}"
        netket = [p for p in row.get("peers", []) if p.get("engine") == "netket"]
        cells = [
            row["system"],
            f"{row['energy'] / n:.7f} ± {row['energy_error'] / n:.1e}",
            "" if reference is None else f"{reference / n:.7f} ({kind})",
            _fmt(relative, "+.1e"),
            _fmt(netket[0]["relative_error"], "+.1e") if netket else "not run",
            f"{row['seconds']:.0f} ({where})",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_machines(rows: list[dict]) -> str:
    """Returns which CPU each row (and its netket peer) ran on, from the rows themselves:
    rows are run at different times, so the machine of the latest invocation says nothing of
    the others. A GPU row names its device in the table instead."""
    runs: dict[str, list[str]] = {}
    for row in rows:
        for entry in [row, *row.get("peers", [])]:
            if entry.get("device"):
                continue
            label = f"{row.get('label', row['system'])} ({entry['engine']})"
            runs.setdefault(entry.get("machine", "not recorded"), []).append(label)
    usual = max(runs, key=lambda name: len(runs[name]))  # the machine most rows ran on
    others = [f"{', '.join(labels)} on {name}" for name, labels in runs.items() if name != usual]
    text = f"Machine: {usual} for every CPU row"
    return text + (f" but {'; '.join(others)}." if others else ".")


def defaults_row(results_file: Path) -> dict:
    """Returns the defaults table's row of a finished run of a ``configs/defaults`` config
    (named ``defaults_<system>_s<seed>``, as ``--defaults`` runs them): `row_from_results`
    with its seed, what ended its final measurement and the recipe it followed."""
    from vitqs.results import read_results

    record = read_results(results_file)
    match = re.fullmatch(r"defaults_(.+)_s(\d+)", record.name)
    if match is None or match.group(1) not in DEFAULT_GOALS:
        raise ConfigError(
            f"--defaults: '{results_file}' holds run '{record.name}', not a run "
            f"defaults_<system>_s<seed> of {', '.join(DEFAULT_GOALS)}"
        )
    row = row_from_results(match.group(1), results_file)
    with h5py.File(results_file, "r") as f:
        final = f["final"].attrs
        row["final_samples"] = int(final["n_samples"]) if "n_samples" in final else None
        row["stopped_by"] = str(final["stopped_by"]) if "stopped_by" in final else None
    row["seed"], row["recipe"] = record.seed, json.loads(record.recipe or "{}")
    return row


class _Seed(NamedTuple):
    """One defaults run judged: its row and the cells estimate, margin and verdict."""

    row: dict
    estimate: str
    margin: str
    verdict: str

    @property
    def met(self) -> bool:
        return self.verdict == "**yes**"


def _judged_defaults(rows: list[dict]) -> list[_Seed]:
    """Returns the defaults runs in the table's order, judged: a seed meets the goal by its
    final Monte Carlo estimate within its budget."""
    judged = []
    for row in sorted(rows, key=lambda r: (list(DEFAULT_GOALS).index(r["system"]), r["seed"])):
        estimate, margin, verdict = _judged(row, DEFAULT_GOALS[row["system"]])
        if verdict == "**yes**" and row["seconds"] > row["budget_seconds"]:
            verdict = "no: over its budget"
        judged.append(_Seed(row, estimate, margin, verdict))
    return judged


def _system_verdict(met: list[bool]) -> str:
    """Returns a system's verdict from its seeds': met when every seed met and at least
    `MIN_SEEDS` ran."""
    if len(met) < MIN_SEEDS:
        return f"not yet: {len(met)} of {MIN_SEEDS} seeds run"
    return "**yes**" if all(met) else "no"


def _by_system(judged: list[_Seed]) -> dict[str, list[_Seed]]:
    systems: dict[str, list[_Seed]] = {}
    for seed in judged:
        systems.setdefault(seed.row["system"], []).append(seed)
    return systems


def render_defaults(rows: list[dict]) -> str:
    """Returns the defaults table: one line per run (every seed, a missed one included),
    judged on its final Monte Carlo estimate and its whole run's time against its budget,
    then one verdict per system: met when every seed meets the goal and at least
    `MIN_SEEDS` ran."""
    header = [
        "system",
        "goal",
        "seed",
        "budget s",
        "whole run s",
        "steps",
        "final samples (ended by)",
        "MC: (E − E_ref)/\\|E_ref\\| ± σ",
        "(\\|ΔE\\| + 2σ)/\\|E_ref\\|",
        "met?",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    judged = _judged_defaults(rows)
    for row, estimate, margin, met in judged:
        within = row["seconds"] <= row["budget_seconds"]
        cells = [
            row["system"],
            f"{DEFAULT_GOALS[row['system']]:.0e}",
            str(row["seed"]),
            f"{row['budget_seconds']:.0f}",
            f"{row['seconds']:.0f}" + ("" if within else " (over)"),
            str(row["n_iter"]),
            f"{row['final_samples']:,} ({row['stopped_by']})",
            estimate,
            margin,
            met,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| system | seeds run | seeds met | goal met? |", "|---|---|---|---|"]
    for system, seeds in _by_system(judged).items():
        met = [seed.met for seed in seeds]
        lines.append(f"| {system} | {len(met)} | {sum(met)} | {_system_verdict(met)} |")
    return "\n".join(lines)


def render_defaults_summary(rows: list[dict]) -> str:
    """Returns README's table of the defaults runs, one line a system: its goal, the seeds
    that met it of those run, the worst seed's margin ``(|ΔE| + 2σ)/|E_ref|``, the longest
    whole run against the budget, and the verdict."""
    header = ["system", "goal", "seeds met", "worst seed", "whole run s (budget)", "met?"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for system, seeds in _by_system(_judged_defaults(rows)).items():
        met = [seed.met for seed in seeds]
        runs = [seed.row for seed in seeds]
        margins = [
            goal_margin(run["energy"], run["energy_error"], _reference(run))
            for run in runs
            if _reference(run) is not None
        ]
        cells = [
            system,
            f"{DEFAULT_GOALS[system]:.0e}",
            f"{sum(met)} of {len(met)}",
            f"{max(margins):.1e}" if margins else "—",
            f"{max(run['seconds'] for run in runs):.0f} ({runs[0]['budget_seconds']:.0f})",
            _system_verdict(met),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- the report file and the stored rows -----------------------------------------------------


def replace_block(text: str, name: str, block: str) -> str:
    """Returns ``text`` with the marked block ``name`` replaced (appended if missing)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    new = f"{begin}\n{block}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: new, text)
    return text.rstrip() + "\n\n" + new + "\n"


def load_rows(rows_dir: Path, table: str) -> list[dict]:
    rows = [json.loads(p.read_text()) for p in sorted(rows_dir.glob(f"{table}__*.json"))]
    return sorted(rows, key=lambda r: r.get("order", 0))


def plot_curves(rows: list[dict], path: Path, title: str) -> None:
    """Draws relative error vs wall time, one panel per system, vitqs and netket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["curve_relative_error"]]
    if not rows:
        return
    n_cols = min(4, len(rows))
    n_rows = math.ceil(len(rows) / n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(4 * n_cols, 3.2 * n_rows), squeeze=False)
    for ax, row in zip(axes.ravel(), rows, strict=False):
        for entry in [row, *row.get("peers", [])]:
            ax.semilogy(
                entry["curve_seconds"], entry["curve_relative_error"], label=entry["engine"]
            )
        panel = row.get("label", row["system"]).split(": ", 1)[-1]
        panel += f" (vs {reference_kind(row['reference'])})" if row.get("reference") else ""
        ax.set_title(textwrap.fill(panel, 45), fontsize=8)
        ax.set_xlabel("wall time of the optimisation (s)")
        ax.set_ylabel("|E − E_exact| / |E_exact|")
        ax.legend(fontsize=8)
    for ax in axes.ravel()[len(rows) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(output: Path, rows_dir: Path, readme: Path | None = None) -> None:
    """Renders the accuracy and ablation tables and figures from the stored rows, and the
    headline table of ``readme`` (when given)."""
    text = output.read_text() if output.exists() else "# Accuracy against exact results\n"
    accuracy = load_rows(rows_dir, "accuracy")
    ablation = load_rows(rows_dir, "ablation")
    defaults = load_rows(rows_dir, "defaults")
    if defaults:
        text = replace_block(text, "defaults-table", render_defaults(defaults))
    if readme is not None and readme.exists() and (accuracy or defaults):
        page = readme.read_text()
        if defaults:
            page = replace_block(page, "defaults-summary", render_defaults_summary(defaults))
        if accuracy:
            page = replace_block(page, "headline", render_headline(accuracy))
        _write_atomic(readme, page)
    if accuracy:
        text = replace_block(text, "accuracy-table", render_table(accuracy, "system"))
        text = replace_block(text, "goals-table", render_goals(accuracy))
        plot_curves(
            accuracy, output.parent / "accuracy_vs_time.png", "vitqs vs netket, same wall time"
        )
    if ablation:
        text = replace_block(text, "ablation-table", render_table(ablation, "label"))
        plot_curves(ablation, output.parent / "ablation_vs_time.png", "Bose-Hubbard ablation")
    text = replace_block(text, "machine", render_machines([*accuracy, *ablation, *defaults]))
    _write_atomic(output, text)


def _write_atomic(path: Path, text: str) -> None:
    from vitqs.results import write_text_atomic  # here: the netket worker never loads torch

    write_text_atomic(path, text)


def row_file(rows_dir: Path, table: str, key: str) -> Path:
    return rows_dir / f"{table}__{key}.json"


def store_row(rows_dir: Path, table: str, key: str, row: dict) -> None:
    _write_atomic(row_file(rows_dir, table, key), json.dumps(row))


def enumerate_rows(rows_dir: Path, table: str, max_dim: int, systems=None) -> None:
    """Adds the enumerated (noise-free, variational) energy of each stored row's final state
    (of ``systems`` only, if given), from its results file, where the sector has at most
    ``max_dim`` states."""
    from vitqs.report import state_energy

    for path in sorted(rows_dir.glob(f"{table}__*.json")):
        row = json.loads(path.read_text())
        if systems is not None and row["system"] not in systems:
            continue
        # rows stored before results_file was recorded: an accuracy run is named after its system
        fallback = rows_dir / f"{row['system']}.h5" if table == "accuracy" else None
        results_file = row.get("results_file") or fallback
        if results_file is None or not Path(results_file).exists():
            continue
        found = state_energy(Path(results_file), max_dim)
        if found is None:
            continue
        row["enumerated_energy"] = found["enumerated"]
        row["enumerated_relative_error"] = found["relative_error"]
        if "last_iterate_relative_error" in found:  # an averaged run: what the mean bought
            row["last_iterate_relative_error"] = found["last_iterate_relative_error"]
        _write_atomic(path, json.dumps(row))
        print(f"{row['system']}: enumerated rel={found['relative_error']:.2e}", flush=True)


def reference_kind(reference: dict) -> str:
    """Returns "published" or "Bethe ansatz": what a row's reference past ED is."""
    return reference["source"].split(":")[0]


def summary_line(label: str, row: dict) -> str:
    peers = " ".join(
        f"| netket rel={_fmt(p['relative_error'], '.2e')} its={p['n_iter']}"
        for p in row.get("peers", [])
    )
    relative = _fmt(row["relative_error"], ".2e")
    if row.get("reference"):
        relative = f"{row['reference_relative_error']:.2e} (vs {reference_kind(row['reference'])})"
    return f"{label}: rel={relative} its={row['n_iter']} {row['seconds']:.0f}s {peers}"
