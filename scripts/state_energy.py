"""The exact energy of a trained state, by enumeration of its sector: no sampling noise.

A Monte Carlo final energy carries an error bar; at relative errors of 1e-5 that bar (from
8,192 samples) is as large as the error itself, and an estimate can land below the exact
ground-state energy. For sectors small enough to enumerate, this script loads the final
parameters from each results file, applies the same final symmetrization as the run, and
computes ``<ψ|H|ψ>/<ψ|ψ>`` as a full sum over the sector (one sparse matrix-vector product),
which is variational: never below the ground state.

    python scripts/state_energy.py results/benchmarks/*.h5 [--max-dim 2000000]
        [--symmetrize none|translations|space_group] [--by-probability] [--levels K]

``--symmetrize`` replaces the run's ``final.symmetrize``: what another final average would
have given the same trained parameters.

``--by-probability`` also shows where the state is wrong: against the exact ground state φ
(ED), per decade of the exact probability ``|φ(x)|²``, how many states, their weight in φ
and in ψ, the samples a step of ``|ψ|²`` sampling draws there (``sampler.n_samples`` times
the weight in φ), and
their share of the distance ``Σ_x |ψ(x) − e^{iα} φ(x)|² = 2 (1 − |⟨φ|ψ⟩|)`` (both
normalised, α the overlap's phase), which is the infidelity ``1 − |⟨φ|ψ⟩|²`` to first order.
A share far from where the samples are says that sampling, not the ansatz, limits the state.

``--levels K`` also shows which exact levels the state is made of: the K lowest levels it
has weight in (Lanczos from ψ), each with its energy, gap to the ground state, symmetry
sector (`vitqs ed`'s, of ψ's part in the level) and weight in ψ, ψ's weight in the exact
ground state, and the weight left above them. A state stuck in an excited level of its own
symmetry sector shows there, and so does the sector (momentum, spin inversion, point
characters) of the levels a projection would remove.

Prints one markdown row per file: name, sector dimension, Monte Carlo final energy ± error,
the enumerated energy, the exact ground-state energy, and both relative errors. The sums are
``vitqs.report``'s (``state_energy``, ``by_probability``, ``by_level``); this is their command
line.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

from vitqs import results
from vitqs.config import SYMMETRIZE
from vitqs.report import LOWEST_DECADE, by_level, by_probability, state_energy


def _print_by_probability(table: dict) -> None:
    print(f"\n{table['name']}: infidelity {table['infidelity']:.3e}")
    print(
        "| exact \\|φ\\|² | states | weight in φ | weight in ψ | samples per step of \\|φ\\|² "
        "| share |"
    )
    print("|---|---|---|---|---|---|")
    for decade, states, exact_weight, model_weight, per_step, distance in table["rows"]:
        span = f"< 1e{decade + 1}" if decade == LOWEST_DECADE else f"1e{decade}..1e{decade + 1}"
        print(
            f"| {span} | {states:,} | {exact_weight:.3e} | "
            f"{model_weight:.3e} | {per_step:.3g} | {distance / table['distance']:.1%} |"
        )


def _print_by_level(table: dict) -> None:
    print(
        f"\n{table['name']}: weight in the exact levels (ground state {table['ground_weight']:.4f})"
    )
    print(
        "| E | (E − E_0)/\\|E_0\\| | momentum | spin inversion | point characters | weight in ψ |"
    )
    print("|---|---|---|---|---|---|")
    for energy, gap, sector, weight in table["rows"]:
        print(
            f"| {energy:.8f} | {gap:.3e} | {sector['momentum']} | {sector['spin_flip']} "
            f"| {sector['point_characters']} | {weight:.4f} |"
        )
    print(f"| above | | | | | {table['above']:.4f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--max-dim", type=int, default=2_000_000)
    parser.add_argument(
        "--symmetrize",
        choices=SYMMETRIZE,
        help="replace the run's final.symmetrize",
    )
    parser.add_argument(
        "--by-probability",
        action="store_true",
        help="also show the state's distance to the ED ground state per decade of |φ|²",
    )
    parser.add_argument(
        "--levels",
        type=int,
        metavar="K",
        help="also show the state's weight in the K lowest exact levels it has weight in",
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
    if args.levels:
        for table in _each_result(functools.partial(by_level, n_levels=args.levels), args):
            _print_by_level(table)
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
