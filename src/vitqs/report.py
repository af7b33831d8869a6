"""What results files say: a summary table of runs, and the energy of a trained state summed
over its sector.

``report`` returns the markdown table of one results file or a folder of them (and writes each
run's figures). ``state_energy`` returns a finished run's enumerated energy ⟨ψ|H|ψ⟩/⟨ψ|ψ⟩: at
relative errors of 1e-5 the Monte Carlo error bar is as large as the error itself, while a
full sum carries no noise and is variational, never below the ground-state energy.
``by_probability`` returns where the trained state differs from the exact ground state φ, per
decade of ``|φ(x)|²``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from vitqs import results
from vitqs.build import build_hamiltonian, build_network, final_network
from vitqs.checkpoint import stored_config
from vitqs.config import from_dict, not_taken_lines
from vitqs.errors import first_line
from vitqs.extrapolation import ZERO_VARIANCE_TITLE, write_zero_variance
from vitqs.physics import exact
from vitqs.physics.lanczos import spectral_weights
from vitqs.physics.symmetry import ground_state_sector
from vitqs.plots import plot_run
from vitqs.results import SUMMARY_COLUMNS, ResultsError, read_results, summary_row
from vitqs.vmc.driver import final_estimate, last_good_parameters
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.sr import set_parameter_vector
from vitqs.workfile import is_being_written

# ---- the summary table -----------------------------------------------------------------------


def report(path: str | Path) -> tuple[str, list[Path]]:
    """Returns (markdown table, written PNGs) for one results file or every ``*.h5`` below a
    folder (recursive). For a folder, finished runs on one system (two or more) add their
    zero-variance extrapolation: a second table, and ``zero_variance.png`` in the folder.

    Figures of ``<dir>/<name>.h5`` go to ``<dir>/<name>/``. A file that does not read as a
    results file becomes a table row with status ``unreadable: <reason>``. Raises
    ResultsError when ``path`` does not exist or is a folder without results files.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.h5"))
        if not files:
            raise ResultsError(f"{path}: no results files (*.h5) in this folder or below")
    elif path.exists():
        files = [path]
    else:
        raise ResultsError(f"{path}: no such results file or folder")
    rows, pngs, records, unwritten = [], [], [], []
    for file in files:
        try:
            record = read_results(file)
        except ResultsError as err:
            rows.append(_unreadable_row(file, err))
            continue
        if record.status == "running" and not is_being_written(file):
            record.status = STOPPED  # its writer died: what the table says, not the file
        try:
            pngs += plot_run(record, file.with_suffix(""))
        except OSError as err:  # a link planted where a figure goes, a full disk
            unwritten.append(f"- {record.name}: figures not written ({first_line(err)})")
        rows.append(summary_row(record))
        records.append(record)
    text = markdown_table(rows, SUMMARY_COLUMNS) + _notes(records, unwritten)
    if path.is_dir():  # runs on one system: their zero-variance extrapolation
        extrapolated, figures = write_zero_variance(records, path)
        if extrapolated:
            text += f"\n{ZERO_VARIANCE_TITLE}\n\n{extrapolated}"
            pngs += figures
    return text, pngs


# the report's word for a file that says running with no live writer (`is_being_written`)
STOPPED = "stopped"


def _notes(records, unwritten=()) -> str:
    """Returns what the table cannot say, under it: why each failed run failed, that a
    stopped run's writer died (it resumes), each final measurement's note, and figures that
    could not be written."""
    lines = list(unwritten)
    for record in records:
        if record.status == "failed":
            lines.append(f"- {record.name}: failed: {record.failure or 'no reason recorded'}")
        elif record.status == STOPPED:
            lines.append(
                f"- {record.name}: stopped: the file says running, but no vitqs process "
                "holds it (killed, or out of memory); `vitqs run CONFIG --resume` goes on "
                f"from its checkpoint of step {record.checkpoint_step}"
                if record.checkpoint is not None
                else f"- {record.name}: stopped before its first checkpoint: start it again"
            )
        elif record.final and record.final.get("note"):
            lines.append(f"- {record.name}: {record.final['note']}")
        if record.lanczos:
            lines.append(f"- {record.name}: {lanczos_text(record.lanczos)}")
        if record.sector_search:
            lines.append(f"- {record.name}: {sector_search_text(record.sector_search)}")
        if record.sign_prior_search:
            lines.append(f"- {record.name}: {sign_prior_search_text(record.sign_prior_search)}")
        recipe = recipe_text(record.recipe) if record.recipe else ""
        if recipe:
            lines.append(f"- {record.name}: {recipe}")
    return "".join(f"{printable(line)}\n" for line in ["", *lines]) if lines else ""


def recipe_text(kept: str) -> str:
    """Returns the sections a run took from its class's recipe (its root attribute
    ``recipe``) and the recipe values its written sections left behind as one line, "" where
    it took none and left none; said unreadable rather than raised where
    it is not the JSON a run writes."""
    try:
        data = json.loads(kept)
        sections = ", ".join(str(name) for name in data["sections"])
        parts = [f"recipe of {data['name']}: {sections}"] if sections else []
        return "; ".join(parts + not_taken_lines(data))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return "recipe: its record does not read"


def sector_search_text(kept: str) -> str:
    """Returns a results file's sector search (``model.sector: search``) as one line; a text
    that is not the JSON a run writes is said to be unreadable, not raised."""
    try:
        data = json.loads(kept)
        chosen, trials = data["chosen"], data["trials"]
        margin = data["margin_sigma"]
        margin = "alone" if margin is None else f"{float(margin):.3g} σ below the runner-up"
        return (
            f"sector search: momentum {list(chosen['momentum'])}, point_characters "
            f"{list(chosen['point_characters'])}, spin_flip {chosen['spin_flip']} out of "
            f"{len(trials)} candidates ({margin}{_unsettled(data)}, "
            f"{float(data['seconds']):.0f} s)"
        )
    except (ValueError, KeyError, TypeError):
        return "sector search: its record does not read"


def sign_prior_search_text(kept: str) -> str:
    """Returns a results file's sign prior race (``model.sign_prior: search``) as one line;
    said unreadable, not raised, where it is not the JSON a run writes."""
    try:
        data = json.loads(kept)
        margin = data["margin_sigma"]
        margin = "alone" if margin is None else f"{float(margin):.3g} σ below the runner-up"
        return (
            f"sign prior search: {data['chosen']['sign_prior']} out of {len(data['trials'])} "
            f"candidates ({margin}{_unsettled(data)}, {float(data['seconds']):.0f} s)"
        )
    except (ValueError, KeyError, TypeError):
        return "sign prior search: its record does not read"


def _unsettled(data: dict) -> str:
    """Returns ", not settled" for a race whose record says a candidate was dropped while
    still falling past the cut; nothing for a settled one or a file from before the check."""
    return ", not settled" if data.get("settled") is False else ""


def lanczos_text(row: dict) -> str:
    """Returns a results file's Lanczos step (`lanczos_file`) as one line."""
    how = "a full sum" if row.get("full_sum") else f"{row.get('n_samples', 0)} samples"
    r_hat = row.get("r_hat", math.nan)  # NaN: a full sum, or a file from before the g² chains
    if not math.isnan(r_hat):
        how += f" of g², chains' R̂ {r_hat:.2f}"
    text = (
        f"one Lanczos step ({how}): E₁ = {row['energy']:.8f} ± {row['energy_error']:.1e}, "
        f"variance {row['variance']:.3e} (ψ: {row['energy_0']:.8f}, {row['variance_0']:.3e})"
    )
    relative = row.get("relative_error")
    if relative is not None and not math.isnan(relative):
        text += f", relative error {relative:+.2e}"
    if not math.isnan(row.get("final_plus_gain", math.nan)):  # NaN in a full sum's file
        text += (
            f"; final measurement + gain {row['gain']:.2e} ± {row['gain_error']:.0e}: "
            f"{row['final_plus_gain']:.8f} ± {row['final_plus_gain_error']:.1e}"
        )
        relative = row.get("final_plus_gain_relative_error")
        if relative is not None and not math.isnan(relative):
            text += f" ({relative:+.2e})"
    if row.get("note"):
        text += f"; note: {row['note']}"
    return text


def printable(text: str) -> str:
    """Returns ``text`` with every character that is not printable written as an escape:
    a name or reason read from a file never reaches the terminal as a control sequence."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))


def _unreadable_row(file: Path, err: ResultsError) -> dict:
    # the message names the file already; keep only the reason after it
    reason = str(err).removeprefix(str(file)).lstrip(": ")
    return {"name": str(file), "status": f"unreadable: {reason}"}


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Returns a GitHub markdown table of ``rows`` with ``columns``; missing values are blank."""
    lines = [
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    for row in rows:
        cells = (_format_cell(column, row.get(column)) for column in columns)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _format_cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (float, np.floating)):
        if "energy" in column and "error" not in column:
            # energies to 1e-8: relative errors of 1e-6 and below must be readable off them
            return f"{value:.8f}"
        if column == "seconds":
            return f"{value:.1f}"
        if "error" in column or column == "v_score":
            return f"{value:.2e}"
        return f"{value:.6g}"  # parameters (U = 3.3) and observables
    return printable(value).replace("|", "\\|")  # a bar inside a cell would split it


# ---- the enumerated energy of a trained state ------------------------------------------------


def state_energy(path: Path, max_dim: int, symmetrize: str | None = None) -> dict | None:
    """Returns the enumerated energy of the run's final state, or None if not applicable.

    ``symmetrize`` replaces the run's ``final.symmetrize`` (None: the run's own).

    With ``optimizer.average_from`` the final state is the mean of the late iterates; the
    row then also gives the energy of the last iterate measured in the loop, to show what
    the averaging bought (``last_iterate_relative_error``).
    """
    run = enumerable_run(path, max_dim, symmetrize)
    if run is None:
        return None
    record, config, hamiltonian = run
    state = results.load_checkpoint(record)
    exact = record.exact["energy"]
    energy = enumerated_energy(config, hamiltonian, state["model"])
    monte_carlo = record.final["energy"]
    row = {
        "name": record.name,
        "dimension": hamiltonian.hilbert.dimension,
        "monte_carlo": monte_carlo,
        "monte_carlo_error": record.final["energy_error"],
        "enumerated": energy,
        "exact": exact,
        "mc_relative_error": (monte_carlo - exact) / abs(exact),
        "relative_error": (energy - exact) / abs(exact),
    }
    vmc_state = state.get("vmc") or {}
    theta_last = last_good_parameters(vmc_state)
    if vmc_state.get("average") is not None and theta_last is not None:
        last = enumerated_energy(config, hamiltonian, state["model"], theta_last)
        row["last_iterate_relative_error"] = (last - exact) / abs(exact)
    return row


def enumerable_run(path: Path, max_dim: int, symmetrize: str | None):
    """Returns (record, config, Hamiltonian) of a finished run with an exact energy whose
    sector has at most ``max_dim`` states, its final.symmetrize replaced by ``symmetrize``
    if given; None otherwise."""
    record = results.read_results(path)
    if record.status != "finished" or record.exact is None:
        return None
    config = from_dict(stored_config(record) or {})
    if symmetrize is not None:
        config.final.symmetrize = symmetrize
    hamiltonian = build_hamiltonian(config)
    if hamiltonian.hilbert.dimension > max_dim:
        return None
    return record, config, hamiltonian


def enumerated_energy(config, hamiltonian, model_state: dict, theta=None) -> float:
    """Returns ⟨ψ|H|ψ⟩/⟨ψ|ψ⟩ summed over the sector, for the checkpoint's model (with the
    parameter vector ``theta`` in place of its own, if given), symmetrized as the run was."""
    model = final_model(config, hamiltonian, model_state, theta)
    with torch.no_grad():  # the exact sampler's weights make this a full sum, not an estimate
        energy = final_estimate(hamiltonian, model, ExactSampler(hamiltonian.hilbert))
    return energy.mean.real


def final_model(config, hamiltonian, model_state: dict, theta=None):
    """Returns the state the run's final measurement samples: the checkpoint's model (with
    the parameter vector ``theta`` in place of its own, if given) under the config's final
    symmetrization, on the CPU."""
    model = build_network(config, hamiltonian).cpu()
    model.load_state_dict(model_state)
    if theta is not None:
        set_parameter_vector(model, theta)
    return final_network(config, model, hamiltonian.lattice)


# ---- where the trained state is wrong --------------------------------------------------------


def by_probability(path: Path, max_dim: int, symmetrize: str | None = None) -> dict | None:
    """Returns the run's final state against the exact ground state, per decade of ``|φ|²``:
    ``rows`` of (decade, states, exact weight, model weight, samples per step, distance),
    the ``infidelity`` and the total ``distance``; None if not applicable (as `state_energy`)."""
    found = _final_vectors(path, max_dim, symmetrize)
    if found is None:
        return None
    record, config, _, log_psi, phi = found
    table = infidelity_by_probability(log_psi, phi, config.sampler.n_samples)
    return {"name": record.name, **table}


def _final_vectors(path: Path, max_dim: int, symmetrize: str | None):
    """Returns ``(record, config, hamiltonian, log_psi, phi)``: the run's final state's
    ``log ψ`` over its whole sector and the exact ground state ``φ`` in the same order; None
    if not applicable (as `state_energy`)."""
    run = enumerable_run(path, max_dim, symmetrize)
    if run is None:
        return None
    record, config, hamiltonian = run
    model = final_model(config, hamiltonian, results.load_checkpoint(record)["model"])
    with torch.no_grad():
        log_psi = ExactSampler(hamiltonian.hilbert).sample(model).log_psi.reshape(-1).numpy()
    phi = exact.ground_state(hamiltonian, max_dim=max_dim, return_vector=True).vector
    return record, config, hamiltonian, log_psi, phi


def by_level(path: Path, max_dim: int, symmetrize: str | None = None, n_levels: int = 8):
    """Returns the run's final state as a sum over the exact energy levels of its sector:
    ``rows`` of (energy, relative gap to the ground state, sector, weight in ψ) for the
    ``n_levels`` lowest levels ψ has weight in, ``ground_weight`` (ψ's weight in the exact
    ground state, 0 when ψ lies in another sector) and ``above`` (ψ's weight in every higher
    level). None if not applicable (as `state_energy`).

    The weights come from Lanczos started from ψ (`spectral_weights`): exact for a
    degenerate level too, where ψ's part is one vector whatever the degeneracy (a Lanczos
    from a random vector may miss copies of such a level and their weight). A level's sector
    is `physics.symmetry.ground_state_sector`'s of ψ's part in it. A state sitting mostly in
    an excited level of its own symmetry sector shows here, and which projection or sign
    structure would remove that level: the kagome 2×3's trained ViT lay 72 % in a level
    9.8e-3 above the ground state, even under the reflection its ground state is odd under.
    """
    found = _final_vectors(path, max_dim, symmetrize)
    if found is None:
        return None
    record, _, hamiltonian, log_psi, phi = found
    psi = np.exp(log_psi - log_psi.real.max())
    psi /= np.linalg.norm(psi)
    ground = float(abs(np.vdot(phi / np.linalg.norm(phi), psi)) ** 2)
    exact_energy = record.exact["energy"]
    rows = []
    for energy, weight, part in spectral_weights(hamiltonian.to_sparse(), psi)[:n_levels]:
        gap = (energy - exact_energy) / abs(exact_energy)
        rows.append((energy, gap, ground_state_sector(hamiltonian, part), weight))
    return {
        "name": record.name,
        "rows": rows,
        "ground_weight": ground,
        "above": 1.0 - sum(row[3] for row in rows),
    }


LOWEST_DECADE = -30  # |φ|² below 1e-29 (or 0) share one row


def infidelity_by_probability(log_psi: np.ndarray, phi: np.ndarray, n_samples: int) -> dict:
    """Returns ψ = exp(log_psi) against φ over the same basis, per decade of ``|φ(x)|²``.

    Both are normalised and α is the phase of ⟨φ|ψ⟩. ``rows`` holds, per decade (highest
    first, all below ``LOWEST_DECADE`` in one): the decade, the number of states, their weight
    in φ and in ψ, the samples a step of ``n_samples`` from ``|φ|²`` draws there, and their
    part of the distance ``Σ_x |ψ(x) − e^{iα} φ(x)|² = 2 (1 − |⟨φ|ψ⟩|)``. ``infidelity`` is
    ``1 − |⟨φ|ψ⟩|²`` (the distance to first order) and ``distance`` the total.
    """
    psi = np.exp(log_psi - log_psi.real.max())
    psi /= np.linalg.norm(psi)
    phi = phi / np.linalg.norm(phi)
    overlap = np.vdot(phi, psi)
    distance = np.abs(psi - overlap / abs(overlap) * phi) ** 2
    weight = np.abs(phi) ** 2
    with np.errstate(divide="ignore"):
        decade = np.floor(np.log10(weight)).clip(min=LOWEST_DECADE).astype(int)
    rows = []
    for d in sorted(set(decade.tolist()), reverse=True):
        inside = decade == d
        exact_weight = float(weight[inside].sum())
        rows.append(
            (d, int(inside.sum()), exact_weight, float((np.abs(psi[inside]) ** 2).sum()),
             n_samples * exact_weight, float(distance[inside].sum()))
        )  # fmt: skip
    return {"rows": rows, "infidelity": 1 - abs(overlap) ** 2, "distance": float(distance.sum())}
