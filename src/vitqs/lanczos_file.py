"""``vitqs lanczos FILE``: one Lanczos step on a finished run's final state, kept in its file.

The state is the one the final measurement measured (the checkpoint's parameters under
``final.*``'s symmetrization); its samples come from the run's own chains, thermalised as the
final measurement's were, or, with ``full_sum``, every state of a small sector is summed
(no noise). The step (`vmc.lanczos_step`) lands in the results file as ``/lanczos`` beside
the variational energy: ``vitqs report`` and ``vitqs.load`` read it from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path

import torch

from vitqs import results, workfile
from vitqs.build import build_hamiltonian, build_network, build_sampler, final_network
from vitqs.checkpoint import stored_config
from vitqs.config import ConfigError, final_samples, from_dict
from vitqs.models.precision import NetworkCopy, torch_dtype
from vitqs.physics import exact
from vitqs.vmc.lanczos_step import full_sum_moments, lanczos_step, second_local_energy, step_from

# sectors summed whole by --full-sum: the two matrix-vector products of a sparse matrix
FULL_SUM_MAX = 5_000_000

# Measured (results/accuracy.md, 2026-11-29): on the J1-J2 4x4's trained state (1e-6 from E0)
# 4,096 samples gave the gain as -4.4e-7 ± 1.5e-7 where the full sum gives -8.5e-6, and the
# variance 4.3e-6 against 8.7e-5; on states of the same recipe stopped at 5.5e-4 to 2.7e-3,
# 16,384 samples missed the summed gain by 1.4σ, 2.9σ (0.78x) and 4.6σ (2.4x), the variance
# 33-41 % low each time, and 65,536 samples brought the worst back within 0.5σ. On a positive
# state of the Heisenberg 4x4 the gain agreed within 1.8σ. Near the nodes of a signed ψ the
# local energies are large where |ψ|² is small: the moments' tails are missed, and the error
# bars with them.
SIGNED_NOTE = (
    "ψ has a sign structure: near its nodes the samples miss the tails of H's moments, so "
    "the gain may be off by more than its error bar, either way, and the variances too small "
    "(J1-J2 4x4 states at 16,384 samples: gains 0.78x and 2.4x the summed ones, 2.9σ and "
    "4.6σ); check the step with --full-sum on a system small enough, or with several times "
    "the samples"
)


def lanczos_of_file(
    path: str | Path, *, n_samples: int | None = None, full_sum: bool = False
) -> dict:
    """Makes the Lanczos step of the finished run at ``path``, writes it into the file and
    returns it (keys `results.LANCZOS_FIELDS`). ``n_samples``: Monte Carlo samples (default
    as many as the run's final measurement took). ConfigError for a file that is not a
    finished run, or a sector too large to sum."""
    path = Path(path)
    start = time.perf_counter()
    with workfile.sole_writer(path):  # no run writes the file meanwhile
        try:
            record = results.read_results(path)
        except results.ResultsError as err:
            raise ConfigError(str(err)) from None
        if record.status != "finished":
            raise ConfigError(
                f"'{path}' is {record.status}: a Lanczos step is made on a finished run's "
                "final state"
            )
        config = from_dict(stored_config(record) or {}, default_name=record.name)
        if not torch.cuda.is_available():  # a file of a GPU run, read on a CPU
            config.device = "cpu"
        hamiltonian = build_hamiltonian(config)
        model = build_network(config, hamiltonian)
        model.load_state_dict(results.load_checkpoint(record)["model"])
        measured = final_network(config, model, hamiltonian.lattice)
        with torch.no_grad():
            if full_sum:
                step = _full_sum_step(hamiltonian, measured, config.sampler.chunk_size)
            else:
                step = _sampled_step(config, hamiltonian, model, measured, record, n_samples)
        row = {**step, "seconds": time.perf_counter() - start}
        exact_energy = record.exact["energy"] if record.exact else None
        row["relative_error"] = results.relative_error(row["energy"], exact_energy)
        if not full_sum:
            row |= _on_final(record.final, row["gain"], row["gain_error"], exact_energy)
            if not getattr(measured, "positive", False):
                row["note"] = SIGNED_NOTE
        record.lanczos = row
        results.write_results(path, record)
    return row


def _sampled_step(config, hamiltonian, model, measured, record, n_samples) -> dict:
    sampler = build_sampler(config, hamiltonian, model)
    chains = (results.load_checkpoint(record).get("sampler") or {}).get("chains")
    if chains is not None:
        with contextlib.suppress(ValueError):  # chains of another sector: random ones
            sampler.start_chains(chains)
    sampler = sampler.measuring()
    if n_samples is None:  # as many as the final measurement took
        n_samples = int((record.final or {}).get("n_samples") or final_samples(config))
    discard = sampler.discard_before(n_samples, config.final.n_discard)
    samples = sampler.draw(measured, n_samples, discard)
    x = samples.x.reshape(-1, hamiltonian.n_sites)
    # the connected configurations' amplitudes in the precision the run's own local
    # energies took (sampler.local_energy_dtype): they are the step's cost
    connected = NetworkCopy(torch_dtype(config.sampler.local_energy_dtype))(measured)
    e_loc, l2 = second_local_energy(
        hamiltonian, measured, x, samples.log_psi.reshape(-1), config.sampler.chunk_size, connected
    )
    shape = samples.x.shape[:2]
    weights = samples.weights
    step = lanczos_step(e_loc.reshape(shape), l2.reshape(shape), weights)
    return dataclasses.asdict(step) | {"full_sum": 0}


def _on_final(final: dict | None, gain: float, gain_error: float, exact_energy) -> dict:
    """Returns ψ₁'s energy as the run's final measurement of ψ plus the step's gain, with the
    two independent errors combined: the final measurement usually took many more samples
    than the step can afford (each needs the local energies of its connected
    configurations), and the gain, measured on the step's own samples, is far surer than
    either of its two energies."""
    energy, error = (final or {}).get("energy"), (final or {}).get("energy_error")
    if energy is None or error is None or not math.isfinite(energy + error):
        return {}
    on_final = energy + gain
    return {
        "final_plus_gain": on_final,
        "final_plus_gain_error": math.hypot(error, gain_error),
        "final_plus_gain_relative_error": results.relative_error(on_final, exact_energy),
    }


def _full_sum_step(hamiltonian, measured, chunk_size) -> dict:
    if not exact.sector_fits(hamiltonian.hilbert, FULL_SUM_MAX):
        raise ConfigError(
            f"--full-sum sums every state of the sector, at most {FULL_SUM_MAX:,}; this one "
            f"has about 10^{hamiltonian.hilbert.log_dimension() / 2.302585:.1f}"
        )
    moments = full_sum_moments(hamiltonian, measured, chunk_size)
    step = step_from(moments, int(hamiltonian.hilbert.dimension))
    return dataclasses.asdict(step) | {"full_sum": 1}
