"""``vitqs lanczos FILE``: one Lanczos step on a finished run's final state, kept in its file.

The state is the one the final measurement measured (the checkpoint's parameters under
``final.*``'s symmetrization); its samples come from chains of g² (`vmc.lanczos_step`, with
the final measurement's energy and variance) started where the run's chains ended and
thermalised for half of each chain, or, with ``full_sum``, every state of a small sector is
summed (no noise). The step (`vmc.lanczos_step`) lands in the results file as ``/lanczos`` beside
the variational energy: ``vitqs report`` and ``vitqs.load`` read it from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vitqs import results, workfile
from vitqs.build import build_hamiltonian, build_network, final_network
from vitqs.checkpoint import stored_config
from vitqs.config import ConfigError, final_samples, from_dict
from vitqs.models.precision import NetworkCopy, torch_dtype
from vitqs.physics import exact
from vitqs.vmc.estimators import evaluate_log_psi, split_r_hat
from vitqs.vmc.lanczos_step import (
    GuidedState,
    full_sum_moments,
    krylov_terms,
    sampled_step,
    second_local_energy,
    step_from,
)
from vitqs.vmc.sampler import MetropolisSampler

# sectors summed whole by --full-sum: the two matrix-vector products of a sparse matrix
FULL_SUM_MAX = 5_000_000

# The chains of g² (vmc.lanczos_step) must reach wherever (H − E)ψ lives. Measured
# (results/accuracy.md, 2026-11-29), the split R̂ of the samples' local energies over 128
# chains of 32 samples: 1.05-1.31 in 15 steps on five 4x4 states 1e-6 to 6.5e-3 from E0,
# whose gains came out within 1.9σ of the summed ones but one (2.8σ); 3.3-3.8 in three steps
# on the J1-J2 recipe's state 1e-6 from E0, whose variance sits on one orbit of 16
# configurations the chains reach rarely (variance 85 % low, the gain 44-54σ off).
R_HAT_LIMIT = 1.5
R_HAT_NOTE = (
    "the chains of the step's samples disagree (split R̂ {r_hat:.2f} > 1.5 of the local "
    "energies): they have not all reached where (H − E)ψ lives, and the step may be off by "
    "more than its error bar; take more samples, or --full-sum on a system small enough"
)


def lanczos_of_file(
    path: str | Path,
    *,
    n_samples: int | None = None,
    full_sum: bool = False,
    progress: Callable[[str], None] | None = None,
    threads: int | None = None,
) -> dict:
    """Makes the Lanczos step of the finished run at ``path``, writes it into the file and
    returns it (keys `results.LANCZOS_FIELDS`). ``n_samples``: Monte Carlo samples (default
    as many as the run's final measurement took). ``progress``: called with a line at each
    stage of a Monte Carlo step and every tenth of its samples' H²ψ (a step on an 8×8
    lattice takes tens of minutes). ``threads``: torch threads (default the run's own
    ``threads``, as `vitqs run` set them; torch's own where that is null). ConfigError for
    a file that is not a finished run, or a sector too large to sum."""
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
        if threads or config.threads:
            torch.set_num_threads(threads or config.threads)
        hamiltonian = build_hamiltonian(config)
        model = build_network(config, hamiltonian)
        model.load_state_dict(results.load_checkpoint(record)["model"])
        measured = final_network(config, model, hamiltonian.lattice)
        with torch.no_grad():
            if full_sum:
                step = _full_sum_step(hamiltonian, measured, config.sampler.chunk_size)
            else:
                step = _sampled_step(config, hamiltonian, measured, record, n_samples, progress)
        row = {**step, "seconds": time.perf_counter() - start}
        exact_energy = record.exact["energy"] if record.exact else None
        row["relative_error"] = results.relative_error(row["energy"], exact_energy)
        if not full_sum:
            row |= _on_final(record.final, row["gain"], row["gain_error"], exact_energy)
        record.lanczos = row
        results.write_results(path, record)
    return row


def _sampled_step(config, hamiltonian, measured, record, n_samples, progress=None) -> dict:
    """Returns the step measured on samples of g² (`vmc.lanczos_step`), whose E and σ² are
    the final measurement's, from chains that start where the run's ended."""
    say = progress or (lambda line: None)
    final = record.final or {}
    energy, variance = final.get("energy"), final.get("variance")
    if energy is None or not variance or not math.isfinite(energy + variance):
        raise ConfigError(f"'{record.name}' has no final energy and variance to guide the step")
    # the connected configurations' amplitudes in the precision the run's own local
    # energies took (sampler.local_energy_dtype): they are the step's cost
    connected = NetworkCopy(torch_dtype(config.sampler.local_energy_dtype))(measured)
    chunk = config.sampler.chunk_size
    guide = GuidedState(hamiltonian, connected, energy, variance, chunk)
    sampler = MetropolisSampler(
        hamiltonian,
        n_samples=config.sampler.n_samples,
        n_chains=config.sampler.n_chains,
        n_discard=config.sampler.n_discard,
        seed=config.seed + 2,
        sector_table=False,
    )
    chains = (results.load_checkpoint(record).get("sampler") or {}).get("chains")
    if chains is not None:
        with contextlib.suppress(ValueError):  # chains of another sector: random ones
            sampler.start_chains(chains)
    if n_samples is None:  # as many as the final measurement took
        n_samples = int(final.get("n_samples") or final_samples(config))
    # g² is not the |ψ|^p the run's chains come from: half of every chain is thrown away
    start = time.perf_counter()
    # the chains draw whole batches of sampler.n_samples: the step takes what they drew
    drawn = sampler.n_batches(n_samples) * sampler.n_samples
    say(f"sampling g²: {drawn} samples in {sampler.n_chains} chains, half of each discarded")
    samples = sampler.draw(guide, n_samples, sampler.discard_before(n_samples))
    x = samples.x.reshape(-1, hamiltonian.n_sites)
    say(
        f"sampled in {time.perf_counter() - start:.0f} s (acceptance {samples.acceptance:.2f}); "
        f"H²ψ at the {len(x)} samples: up to {hamiltonian.max_conn}² amplitudes each"
    )
    log_psi = evaluate_log_psi(measured, x, chunk)
    tenths = _every_tenth(say, time.perf_counter())
    e_loc, l2 = second_local_energy(hamiltonian, measured, x, log_psi, chunk, connected, tenths)
    # the weights |ψ|²/g² from the model's own E_L: the chains' float32 ones differ by ~1e-7
    terms = krylov_terms(e_loc, l2, energy, variance, guide.spread(e_loc))
    step = sampled_step(terms.reshape(*samples.x.shape[:2], 4, 4), energy, variance)
    r_hat = split_r_hat(e_loc.real.reshape(samples.x.shape[:2]).to(torch.float64))
    row = dataclasses.asdict(step) | {"full_sum": 0, "r_hat": r_hat}
    if not r_hat <= R_HAT_LIMIT:
        row["note"] = R_HAT_NOTE.format(r_hat=r_hat)
    return row


def _every_tenth(say: Callable[[str], None], start: float) -> Callable[[int, int], None]:
    """Returns a ``(done, total)`` callback that says each tenth of the samples done (at
    most ten lines; fewer where a chunk of samples spans several tenths)."""
    said = [0]

    def tell(done: int, total: int) -> None:
        tenth = 10 * done // total
        if tenth > said[0]:
            said[0] = tenth
            say(f"H²ψ: {done}/{total} samples, {time.perf_counter() - start:.0f} s")

    return tell


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
