"""The exact energy of a trained state, by enumeration of its sector: no sampling noise.

A Monte Carlo final energy carries an error bar; at relative errors of 1e-5 that bar (from
8,192 samples) is as large as the error itself, and an estimate can land below the exact
ground-state energy. For sectors small enough to enumerate, this script loads the final
parameters from each results file, applies the same final symmetrization as the run, and
computes ``<ψ|H|ψ>/<ψ|ψ>`` as a full sum over the sector (one sparse matrix-vector product),
which is variational: never below the ground state.

    python scripts/state_energy.py results/benchmarks/*.h5 [--max-dim 2000000]
        [--symmetrize none|translations|space_group] [--by-probability]

``--symmetrize`` replaces the run's ``final.symmetrize``: what another final average would
have given the same trained parameters.

``--by-probability`` also shows where the state is wrong: against the exact ground state φ
(ED), per decade of the exact probability ``|φ(x)|²``, how many states, their weight in φ
and in ψ, the samples a step of ``|ψ|²`` sampling draws there (``sampler.n_samples`` times
the weight in φ), and
their share of the distance ``Σ_x |ψ(x) − e^{iα} φ(x)|² = 2 (1 − |⟨φ|ψ⟩|)`` (both
normalised, α the overlap's phase), which is the infidelity ``1 − |⟨φ|ψ⟩|²`` to first order.
A share far from where the samples are says that sampling, not the ansatz, limits the state.

Prints one markdown row per file: name, sector dimension, Monte Carlo final energy ± error,
the enumerated energy, the exact ground-state energy, and both relative errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from vitqs import results
from vitqs.build import build_hamiltonian, build_network
from vitqs.config import from_dict
from vitqs.models.symmetrize import FINAL_SYMMETRIZE, final_symmetrized
from vitqs.physics import exact
from vitqs.vmc.driver import final_estimate
from vitqs.vmc.sampler import ExactSampler
from vitqs.vmc.sr import set_parameter_vector


def state_energy(path: Path, max_dim: int, symmetrize: str | None = None) -> dict | None:
    """Returns the enumerated energy of the run's final state, or None if not applicable.

    ``symmetrize`` replaces the run's ``final.symmetrize`` (None: the run's own).

    With ``optimizer.average_from`` the final state is the mean of the late iterates; the
    row then also gives the energy of the last iterate measured in the loop, to show what
    the averaging bought (``last_iterate_relative_error``).
    """
    run = _enumerable_run(path, max_dim, symmetrize)
    if run is None:
        return None
    record, config, hamiltonian = run
    state = results.load_checkpoint(record)
    exact = record.exact["energy"]
    energy = _enumerated_energy(config, hamiltonian, state["model"])
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
    if vmc_state.get("average") is not None and vmc_state.get("last_good") is not None:
        last = _enumerated_energy(config, hamiltonian, state["model"], vmc_state["last_good"][0])
        row["last_iterate_relative_error"] = (last - exact) / abs(exact)
    return row


def _enumerable_run(path: Path, max_dim: int, symmetrize: str | None):
    """Returns (record, config, Hamiltonian) of a finished run with an exact energy whose
    sector has at most ``max_dim`` states, its final.symmetrize replaced by ``symmetrize``
    if given; None otherwise."""
    record = results.read_results(path)
    if record.status != "finished" or record.exact is None:
        return None
    config = from_dict(yaml.safe_load(record.config_yaml))
    if symmetrize is not None:
        config.final.symmetrize = symmetrize
    hamiltonian = build_hamiltonian(config)
    if hamiltonian.hilbert.dimension > max_dim:
        return None
    return record, config, hamiltonian


def _enumerated_energy(config, hamiltonian, model_state: dict, theta=None) -> float:
    """Returns ⟨ψ|H|ψ⟩/⟨ψ|ψ⟩ summed over the sector, for the checkpoint's model (with the
    parameter vector ``theta`` in place of its own, if given), symmetrized as the run was."""
    model = _final_model(config, hamiltonian, model_state, theta)
    with torch.no_grad():  # the exact sampler's weights make this a full sum, not an estimate
        energy = final_estimate(hamiltonian, model, ExactSampler(hamiltonian.hilbert))
    return energy.mean.real


def _final_model(config, hamiltonian, model_state: dict, theta=None):
    model = build_network(config, hamiltonian).cpu()
    model.load_state_dict(model_state)
    if theta is not None:
        set_parameter_vector(model, theta)
    return final_symmetrized(
        model, config.final.symmetrize, hamiltonian.lattice, config.final.spin_flip
    )


def by_probability(path: Path, max_dim: int, symmetrize: str | None = None) -> dict | None:
    """Returns the run's final state against the exact ground state, per decade of ``|φ|²``:
    ``rows`` of (decade, states, exact weight, model weight, samples per step, distance),
    the ``infidelity`` and the total ``distance``; None if not applicable (as `state_energy`)."""
    run = _enumerable_run(path, max_dim, symmetrize)
    if run is None:
        return None
    record, config, hamiltonian = run
    model = _final_model(config, hamiltonian, results.load_checkpoint(record)["model"])
    with torch.no_grad():
        log_psi = ExactSampler(hamiltonian.hilbert).sample(model).log_psi.reshape(-1).numpy()
    phi = exact.ground_state(hamiltonian, max_dim=max_dim, return_vector=True).vector
    table = infidelity_by_probability(log_psi, phi, config.sampler.n_samples)
    return {"name": record.name, **table}


_LOWEST_DECADE = -30  # |φ|² below 1e-29 (or 0) share one row


def infidelity_by_probability(log_psi: np.ndarray, phi: np.ndarray, n_samples: int) -> dict:
    """Returns ψ = exp(log_psi) against φ over the same basis, per decade of ``|φ(x)|²``
    (see the module's ``--by-probability``)."""
    psi = np.exp(log_psi - log_psi.real.max())
    psi /= np.linalg.norm(psi)
    phi = phi / np.linalg.norm(phi)
    overlap = np.vdot(phi, psi)
    distance = np.abs(psi - overlap / abs(overlap) * phi) ** 2
    weight = np.abs(phi) ** 2
    with np.errstate(divide="ignore"):
        decade = np.floor(np.log10(weight)).clip(min=_LOWEST_DECADE).astype(int)
    rows = []
    for d in sorted(set(decade.tolist()), reverse=True):
        inside = decade == d
        exact_weight = float(weight[inside].sum())
        rows.append(
            (d, int(inside.sum()), exact_weight, float((np.abs(psi[inside]) ** 2).sum()),
             n_samples * exact_weight, float(distance[inside].sum()))
        )  # fmt: skip
    return {"rows": rows, "infidelity": 1 - abs(overlap) ** 2, "distance": float(distance.sum())}


def _print_by_probability(table: dict) -> None:
    print(f"\n{table['name']}: infidelity {table['infidelity']:.3e}")
    print(
        "| exact \\|φ\\|² | states | weight in φ | weight in ψ | samples per step of \\|φ\\|² "
        "| share |"
    )
    print("|---|---|---|---|---|---|")
    for decade, states, exact_weight, model_weight, per_step, distance in table["rows"]:
        span = f"< 1e{decade + 1}" if decade == _LOWEST_DECADE else f"1e{decade}..1e{decade + 1}"
        print(
            f"| {span} | {states:,} | {exact_weight:.3e} | "
            f"{model_weight:.3e} | {per_step:.3g} | {distance / table['distance']:.1%} |"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--max-dim", type=int, default=2_000_000)
    parser.add_argument(
        "--symmetrize",
        choices=FINAL_SYMMETRIZE,
        help="replace the run's final.symmetrize",
    )
    parser.add_argument(
        "--by-probability",
        action="store_true",
        help="also show the state's distance to the ED ground state per decade of |φ|²",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        "| run | states | E (Monte Carlo) | E (enumerated) | E_exact | rel. error MC | "
        "rel. error enumerated |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in _each_result(state_energy, args):
        print(
            f"| {row['name']} | {row['dimension']:,} | {row['monte_carlo']:.6f} ± "
            f"{row['monte_carlo_error']:.1e} | {row['enumerated']:.8f} | {row['exact']:.8f} | "
            f"{row['mc_relative_error']:.1e} | {row['relative_error']:.2e} |",
            flush=True,
        )
        if "last_iterate_relative_error" in row:
            last = row["last_iterate_relative_error"]
            print(f"| {row['name']}, last iterate (not averaged) | | | | | | {last:.2e} |")
    if args.by_probability:
        for table in _each_result(by_probability, args):
            _print_by_probability(table)
    return 0


def _each_result(measure, args):
    """Yields ``measure(path, max_dim, symmetrize)`` of each file where it applies; a file
    that is no readable results file is named on stderr and skipped."""
    for path in args.files:
        try:
            result = measure(path, args.max_dim, args.symmetrize)
        except results.ResultsError as err:
            print(f"{path}: {err}", file=sys.stderr)
            continue
        if result is not None:
            yield result


if __name__ == "__main__":
    sys.exit(main())
