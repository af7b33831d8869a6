"""Repeated final measurements of a trained state: is the Monte Carlo energy biased by chains
that have not forgotten the distribution the steps sampled?

For a finished results file whose sector can be enumerated, each repetition puts the run's
chains back into the steps' distribution (the last iterate's ``|ψ|^machine_pow``, a number of
sweeps from the checkpoint's chains, seeded per repetition), then measures the final state
(averaged parameters, the final symmetrization, ``|ψ|²``) as ``vitqs run`` does, once with
each thermalisation of the list ``--discards``. The enumerated energy of the same final
state is the truth; per discard it prints the mean of ``z = (E_MC − E_enum)/σ`` over the
repetitions with its standard error, and the mean signed relative error.

    python scripts/final_bias.py results/benchmarks/bose_hubbard_chain12_U10.h5 \\
        --repeats 20 --discards 2 32
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

from vitqs import results
from vitqs.build import build_network, build_sampler
from vitqs.config import final_samples
from vitqs.report import enumerable_run, enumerated_energy, final_model
from vitqs.runner import final_discard
from vitqs.vmc.driver import last_good_parameters
from vitqs.vmc.estimators import sample_statistics
from vitqs.vmc.sr import set_parameter_vector


def repeated_finals(
    path: Path, repeats: int, discards: list[int], steps_sweeps: int, n_samples=None
) -> dict:
    """Returns ``{discard: [(E, σ), …]}`` over ``repeats`` repetitions of ``n_samples`` final
    samples (None: the run's ``final.n_samples``), and the enumerated energy and the run's
    own default discard for that many."""
    run = enumerable_run(path, max_dim=2_000_000, symmetrize=None)
    if run is None:
        raise SystemExit(f"{path}: not a finished run with an enumerable sector")
    record, config, hamiltonian = run
    if n_samples is not None:
        config.final.n_samples = n_samples
    state = results.load_checkpoint(record)
    enumerated = enumerated_energy(config, hamiltonian, state["model"])
    measured_model = final_model(config, hamiltonian, state["model"])
    last = build_network(config, hamiltonian).cpu()
    last.load_state_dict(state["model"])
    vmc_state = state.get("vmc") or {}
    theta_last = last_good_parameters(vmc_state)
    if theta_last is not None:  # averaged runs keep the last iterate apart
        set_parameter_vector(last, theta_last)
    measured = {d: [] for d in discards}
    default = None
    for repeat in range(repeats):
        for discard in discards:
            config.seed = record.seed + 1000 * (repeat + 1)  # the sampler is seeded seed + 1
            sampler = build_sampler(config, hamiltonian, last)
            sampler.start_chains(state["sampler"]["chains"])  # the generator: its own seed
            with torch.no_grad():
                sampler.sample(last, n_discard=steps_sweeps)  # back in the steps' distribution
                plain = sampler.of_psi_squared()
                default = final_discard(config, plain)
                samples = plain.draw(measured_model, final_samples(config), discard)
                e_loc = plain.local_energy(
                    hamiltonian, measured_model, samples, config.sampler.chunk_size
                )
                energy = sample_statistics(e_loc, samples)
            measured[discard].append((energy.mean.real, energy.error_of_mean))
    return {"enumerated": enumerated, "default": default, "measured": measured}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_file", type=Path)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--discards", type=int, nargs="+", default=[2, 32])
    parser.add_argument("--steps-sweeps", type=int, default=20, help="sweeps in |ψ|^p first")
    parser.add_argument("--n-samples", type=int, default=None, help="final samples (the run's)")
    args = parser.parse_args(argv)
    found = repeated_finals(
        args.results_file, args.repeats, args.discards, args.steps_sweeps, args.n_samples
    )
    exact = found["enumerated"]
    print(
        f"enumerated energy of the final state: {exact:.10f}; run default discard "
        f"{found['default']}"
    )
    print(
        "| discard | repeats | mean z ± its error | mean (E − E_enum)/|E_enum| | mean σ/|E_enum| |"
    )
    print("|---|---|---|---|---|")
    for discard, values in found["measured"].items():
        energies, errors = np.array(values).T
        z = (energies - exact) / errors
        print(
            f"| {discard} | {len(z)} | {z.mean():+.2f} ± {z.std(ddof=1) / math.sqrt(len(z)):.2f} "
            f"| {np.mean(energies - exact) / abs(exact):+.2e} | {errors.mean() / abs(exact):.1e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
