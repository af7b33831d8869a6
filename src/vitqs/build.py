"""Builders: a validated config in, the objects of a run out.

``build_*`` turn config sections into objects; constructors raise ``ValueError`` for
combinations the per-key checks cannot see (a sign rule on a non-bipartite lattice, a patch
size that does not divide the lattice) and ``build_*`` re-raise those as ``ConfigError`` so the
CLI reports them like every other bad value.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import torch

from vitqs import distributed
from vitqs.config import (
    BoseHubbardConfig,
    Config,
    ConfigError,
    HeisenbergConfig,
    n_steps,
    optimisation_seconds,
)
from vitqs.models import build_model, final_symmetrized, invariances, sector_characters
from vitqs.models.chains import ChainNetwork
from vitqs.models.precision import torch_dtype
from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.physics.symmetry import (
    generators,
    ground_state_sector,
    vector_characters,
)
from vitqs.vmc.driver import VMC
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.sampler import MetropolisSampler

_FULL_SUM_MAX_DIM = 200_000


def build_lattice(config: Config) -> Lattice:
    """Returns the lattice of ``config.lattice``."""
    cfg = config.lattice
    return Lattice(tuple(cfg.shape), pbc=cfg.pbc, kind=cfg.kind)


def build_hamiltonian(config: Config, lattice: Lattice | None = None):
    """Returns the Hamiltonian of ``config.hamiltonian`` on the config's lattice."""
    return hamiltonian_of(config.hamiltonian, lattice or build_lattice(config))


def hamiltonian_of(ham: HeisenbergConfig | BoseHubbardConfig, lattice: Lattice):
    """Returns the Hamiltonian a ``hamiltonian`` section describes on ``lattice``."""
    try:
        if isinstance(ham, BoseHubbardConfig):
            return BoseHubbard(
                lattice, J=ham.J, U=ham.U, n_particles=ham.n_particles, n_max=ham.n_max
            )
        return Heisenberg(
            lattice, ham.J1, ham.J2, ham.sign_rule, ham.total_sz, ham.J_leg, ham.J_rung
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def resolve_device(name: str) -> torch.device:
    """Returns the torch device for ``config.device`` (auto: CUDA when present)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but no CUDA device is available; use auto or cpu")
    return distributed.local_device(torch.device(name))  # under torchrun: this rank's GPU


def build_network(config: Config, hamiltonian) -> torch.nn.Module:
    """Returns the model of ``config.model`` on the config's device and dtype; ConfigError
    for one too large for the machine (`check_model_fits`), before anything is allocated."""
    device = resolve_device(config.device)
    check_model_fits(config, device)
    try:
        model = build_model(config.model, hamiltonian.lattice, hamiltonian.hilbert)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return model.to(device=device, dtype=torch_dtype(config.dtype))


# Bytes a step needs per parameter, at the least: the log-derivatives of every sample
# (complex128, one row per sample), and a few vectors of parameters (the model, its float32
# copy, gradients, the update, the last good state).
_JACOBIAN_BYTES, _VECTOR_BYTES = 16, 64


def check_model_fits(config: Config, device: torch.device) -> None:
    """Raises ConfigError when ``config.model`` has so many parameters that one step needs
    more memory than ``device`` has in all: ``model.layers: 1e9`` would otherwise allocate
    until the machine ran out. Counted before anything is allocated, as a lower bound: a
    model refused here could never run; one let through may still not fit."""
    cfg = config.model
    # every encoder block holds at least the attention's value and output projections
    n_params = cfg.layers * 2 * cfg.d_model**2
    rows = config.sampler.n_samples if config.sampler.kind == "metropolis" else 1
    need = n_params * (_JACOBIAN_BYTES * rows + _VECTOR_BYTES)
    have = _device_memory(device)
    if have is not None and need > have:
        raise ConfigError(
            f"model.layers={cfg.layers}, model.d_model={cfg.d_model}: at least "
            f"{n_params:.3g} parameters, whose log-derivatives over sampler.n_samples={rows} "
            f"need {need / 2**30:.3g} GiB, more than the {have / 2**30:.3g} GiB of {device}; "
            "lower model.layers, model.d_model or sampler.n_samples"
        )


def _device_memory(device: torch.device) -> int | None:
    """Returns the bytes of memory of ``device`` in all (None where it cannot tell)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# Compiled chains pay back their compile within a run of ten minutes. On an H200 (the
# copy's forward pass compiled, 15-26 s) after 60-160 steps: sampling 0.74 -> 0.30 s (J1-J2
# 6x6, 8 copies) and 0.38 -> 0.22 s (10x10) a step. On 2 CPU cores (whole Metropolis steps
# compiled, `vmc/compiled_sweep.py`, 14-17 s) the recipes' steps took 0.53 -> 0.48 s
# (Bose-Hubbard chain 12), 0.75 -> 0.70 s (J1-J2 chain 20) and 0.70 -> 0.49 s (Heisenberg
# 6x6), their sampling 1.5-2.3x faster (results/performance.md). Without a budget a CPU run
# does not compile: its steps give no time to weigh the compile against.
COMPILE_FROM_SECONDS = 600
COMPILE_FROM_STEPS = 200  # on CUDA, without a budget


def compiled_chains(config: Config, device: torch.device) -> bool:
    """Returns whether the chains run compiled: Metropolis chains in a run long
    enough to pay the compile back, a budget of `COMPILE_FROM_SECONDS` or more (on CUDA,
    without a budget, `COMPILE_FROM_STEPS` steps or more)."""
    if config.sampler.kind != "metropolis":
        return False
    if config.budget is not None:
        return config.budget >= COMPILE_FROM_SECONDS
    steps = n_steps(config)
    return device.type == "cuda" and steps is not None and steps >= COMPILE_FROM_STEPS


def build_sampler(config: Config, hamiltonian, model=None, *, compile_chains: bool | None = None):
    """Returns a Metropolis sampler, or the exact (full-sum) sampler when asked for; the
    latter sums over the orbits of ``model``'s symmetries. ``compile_chains``: whether the
    chains' network is compiled (None: `compiled_chains` decides)."""
    cfg = config.sampler
    if cfg.kind == "full_sum":
        if not exact.sector_fits(hamiltonian.hilbert, _FULL_SUM_MAX_DIM):
            raise ConfigError(
                f"sampler.kind=full_sum needs a sector of at most {_FULL_SUM_MAX_DIM:,} states; "
                f"this one has about 10^{hamiltonian.hilbert.log_dimension() / 2.302585:.1f}"
            )
        symmetry = None if model is None else invariances(model, hamiltonian.lattice)
        try:
            sampler = ExactSampler(hamiltonian.hilbert, cfg.chunk_size, symmetry=symmetry)
            sampler.check_symmetry(model)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        return sampler
    if compile_chains is None:
        compile_chains = compiled_chains(config, resolve_device(config.device))
    try:
        return MetropolisSampler(
            hamiltonian,
            n_samples=cfg.n_samples,
            n_chains=cfg.n_chains,
            n_discard=cfg.n_discard,
            seed=config.seed + 1,
            chains=ChainNetwork(
                torch_dtype(cfg.dtype), compile=compile_chains, bare=cfg.bare_chains
            ),
            machine_pow=cfg.machine_pow,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def final_network(config: Config, model, lattice):
    """Returns ``model`` as the final measurement samples it: under ``final.symmetrize`` and
    ``final.spin_flip``, on the momentum and point characters of ``model.sector``."""
    final = config.final
    try:
        return final_symmetrized(
            model,
            final.symmetrize,
            lattice,
            final.spin_flip,
            config.model.momentum,
            config.model.point_characters,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def build_vmc(config: Config, *, compile_chains: bool | None = None) -> VMC:
    """Returns the VMC driver of a config: Hamiltonian, model (seeded), sampler, optimizer;
    ``compile_chains`` as `build_sampler`'s."""
    torch.manual_seed(config.seed)
    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    check_sector_not_empty(hamiltonian, model, "model.symmetrize / model.sector")
    final = config.final
    if final.symmetrize != "none" or final.spin_flip:  # refused now, not after the steps
        measured = final_network(config, model, hamiltonian.lattice)
        check_sector_not_empty(hamiltonian, measured, "final.symmetrize / final.spin_flip")
    sampler = build_sampler(config, hamiltonian, model, compile_chains=compile_chains)
    annealed = config.optimizer.anneal is not None
    return VMC(
        hamiltonian,
        model,
        sampler,
        config.optimizer,
        chunk_size=config.sampler.chunk_size,
        local_energy_dtype=torch_dtype(config.sampler.local_energy_dtype),
        anneal=Anneal(config, hamiltonian) if annealed else None,
        max_seconds=optimisation_seconds(config),
    )


# Sectors up to this size are checked for a symmetry projection that leaves no state.
_SECTOR_CHECK_MAX_DIM = 50_000


def check_sector_not_empty(hamiltonian, model, keys: str) -> None:
    """Raises ConfigError when ``model``'s symmetry projection vanishes on every state of the
    sector: every basis state is fixed by some symmetry of character ≠ 1 (spin inversion −1
    with the 4×2 square's space group; odd spin inversion and an odd reflection at k = π on
    the ring of 8), so ψ would be 0 everywhere, the sampler would wander on rounding noise
    and report a meaningless energy. Checked on sectors up to ``_SECTOR_CHECK_MAX_DIM``
    states (larger ones have room for every sector seen so far)."""
    perms, characters, spin_flip = sector_characters(model, hamiltonian.lattice)
    trivial = np.allclose(characters, 1.0) and spin_flip >= 0
    if trivial or hamiltonian.hilbert.dimension > _SECTOR_CHECK_MAX_DIM:
        return  # characters all +1: the symmetric combination of any state survives
    if _projected_states(hamiltonian.hilbert, perms, characters, spin_flip) == 0:
        raise ConfigError(
            f"{keys}: the projection on this sector (characters of the model's "
            f"{len(perms)} lattice symmetries, spin inversion {spin_flip:+d}) leaves no state "
            f"of the sector ({hamiltonian.hilbert.dimension} states on {hamiltonian.n_sites} "
            "sites): ψ would vanish everywhere; choose another spin_flip, momentum or "
            "point_characters, or fewer symmetries"
        )


def _projected_states(hilbert, perms, characters, spin_flip: int) -> int:
    """Returns how many basis states the projection keeps: a state survives unless an
    element that fixes it has a character ≠ 1 (then the terms of its orbit cancel)."""
    states = hilbert.all_states()
    killed = np.zeros(len(states), dtype=bool)
    flips = ((1, 1.0),) + (((-1, float(spin_flip)),) if spin_flip else ())
    for perm, char in zip(perms, characters, strict=True):
        for sign, flip_char in flips:
            if abs(char * flip_char - 1) > 1e-9:
                killed |= (sign * states[:, perm] == states).all(axis=1)
    return int((~killed).sum())


def ground_state_outside(hamiltonian, model, vector) -> str | None:
    """Returns what puts the exact ground state ``vector`` outside the symmetry sector that
    ``model`` lies in for every value of its parameters (its projections, a translation-
    invariant ViT's shifts by whole patches), or None when it lies inside or its level is
    degenerate. Such a model's energy stays above the lowest state of its own sector.

    Only the generators of the model's group are applied to the vector: a character of the
    group is fixed by its values on them.
    """
    lattice = hamiltonian.lattice
    perms, characters, spin_flip = sector_characters(model, lattice)
    chosen = generators(perms)
    expected = list(characters[chosen]) + ([spin_flip] if spin_flip else [])
    found = vector_characters(hamiltonian.hilbert, vector, perms[chosen], bool(spin_flip))
    if np.any(np.abs(np.abs(found) - 1) > 1e-6):
        return None  # a degenerate level: no single sector to compare with
    for index, (got, want) in enumerate(zip(found, expected, strict=True)):
        if abs(got - want) < 1e-6:
            continue
        if index == len(chosen):
            what = "spin inversion"
        else:
            shift = _shift_of(lattice, perms[chosen[index]])
            what = "a rotation or reflection" if shift is None else f"the shift by {shift} cells"
        return f"under {what} the ground state takes the factor {_factor(got)}, ψ {_factor(want)}"
    return None


def _shift_of(lattice, perm) -> list | None:
    rows = np.flatnonzero((lattice.translations == perm).all(axis=1))
    return None if len(rows) == 0 else lattice.translation_shifts[rows[0]].tolist()[: lattice.ndim]


def _factor(value: complex) -> str:
    if abs(value.imag) < 1e-6:
        return f"{value.real:+.0f}"
    return f"exp({np.angle(value) / np.pi:+.3f}iπ)"


def exact_ground_state(config: Config, hamiltonian=None, *, use_cache=True, return_vector=False):
    """Returns the exact ``GroundState``, or None when ``exact.enabled`` rules it out.

    Raises ConfigError when ``exact.enabled: true`` and the sector exceeds ``exact.max_dim``.
    """
    hamiltonian = hamiltonian or build_hamiltonian(config)
    enabled = config.exact.enabled
    if enabled is False:
        return None
    if enabled == "auto" and not exact.sector_fits(hamiltonian.hilbert, config.exact.max_dim):
        return None
    try:
        return exact.ground_state(
            hamiltonian,
            max_dim=config.exact.max_dim,
            use_cache=use_cache,
            return_vector=return_vector,
        )
    except exact.SectorTooLargeError as err:
        raise ConfigError(str(err)) from None


def run_exact(config: Config, *, use_cache=True) -> dict:
    """Returns the ``vitqs ed`` summary: energy, energy per site, dimension, seconds, cached,
    the lattice (kind, shape, pbc per axis, sites) and the ground state's symmetry sector
    (`physics.symmetry.ground_state_sector`)."""
    start = time.perf_counter()
    hamiltonian = build_hamiltonian(config)
    try:
        result = exact.ground_state(
            hamiltonian, max_dim=config.exact.max_dim, use_cache=use_cache, return_vector=True
        )
    except exact.SectorTooLargeError as err:
        raise ConfigError(str(err)) from None
    return {
        "energy": result.energy,
        "energy_per_site": result.energy / hamiltonian.n_sites,
        "dimension": result.dimension,
        "seconds": time.perf_counter() - start,
        "cached": result.cached,
        "lattice": {
            "kind": hamiltonian.lattice.kind,
            "shape": list(hamiltonian.lattice.shape),
            "pbc": list(hamiltonian.lattice.pbc),
            "n_sites": hamiltonian.lattice.n_sites,
        },
        "sector": ground_state_sector(hamiltonian, result.vector),
    }


class Anneal:
    """``optimizer.anneal``: the couplings the steps optimise move linearly from the values of
    its ``from`` to the hamiltonian section's over the first ``until`` of the run,
    then stay there. Starting where the ground state is easy to reach (the superfluid, which
    the sampler mixes through; the unfrustrated magnet) and following it into the hard phase
    is a sweep's warm start inside one run and one budget.

    Called with the fraction of the run done, it returns the Hamiltonian to optimise and how
    far along the path it lies (1: the target).
    """

    def __init__(self, config: Config, target):
        self.optimizer, self.end, self.target = config.optimizer, config.hamiltonian, target

    def __call__(self, progress: float) -> tuple[object, float]:
        path = self.optimizer.anneal
        if path is None or progress >= path["until"]:
            return self.target, 1.0
        fraction = progress / path["until"]
        couplings = {
            name: start + fraction * (getattr(self.end, name) - start)
            for name, start in path["from"].items()
        }
        hamiltonian = hamiltonian_of(
            dataclasses.replace(self.end, **couplings), self.target.lattice
        )
        # the couplings move, the sector does not: the target's Hilbert space keeps its state
        # index tables, which take longer to rebuild than a full-sum step (0.37 s against
        # 0.26 s on the 3x3's 24,310 states)
        hamiltonian.hilbert = self.target.hilbert
        return hamiltonian, fraction
