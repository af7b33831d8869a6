"""Composition: turns a validated config into lattice, Hamiltonian and the exact reference.

Constructors below raise ``ValueError`` for combinations the config checks cannot see alone
(a sign rule on a non-bipartite lattice, say); ``build_*`` re-raise those as ``ConfigError``
so that the CLI reports them like every other bad value.
"""

from __future__ import annotations

import time

from vitqs import exact
from vitqs.config import BoseHubbardConfig, Config, ConfigError
from vitqs.lattice import Lattice
from vitqs.operators import BoseHubbard, Heisenberg


def build_lattice(config: Config) -> Lattice:
    """Returns the lattice of ``config.lattice``."""
    return Lattice(tuple(config.lattice.shape), pbc=config.lattice.pbc)


def build_hamiltonian(config: Config, lattice: Lattice | None = None):
    """Returns the Hamiltonian of ``config.hamiltonian`` on the config's lattice."""
    lattice = lattice or build_lattice(config)
    ham = config.hamiltonian
    try:
        if isinstance(ham, BoseHubbardConfig):
            return BoseHubbard(lattice, ham.J, ham.U, ham.mu, ham.n_particles, ham.n_max)
        return Heisenberg(lattice, ham.J1, ham.J2, ham.sign_rule, ham.total_sz)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def exact_ground_state(config: Config, hamiltonian=None, *, use_cache=True, return_vector=False):
    """Returns the exact ``GroundState`` of the config's Hamiltonian, within ``exact.max_dim``.

    Raises ConfigError when the sector is larger than ``exact.max_dim``.
    """
    hamiltonian = hamiltonian or build_hamiltonian(config)
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
    """Returns the ``vitqs ed`` summary: energy, energy per site, dimension, seconds, cached."""
    start = time.perf_counter()
    hamiltonian = build_hamiltonian(config)
    result = exact_ground_state(config, hamiltonian, use_cache=use_cache)
    return {
        "energy": result.energy,
        "energy_per_site": result.energy / hamiltonian.n_sites,
        "dimension": result.dimension,
        "seconds": time.perf_counter() - start,
        "cached": result.cached,
    }
