"""Exact diagonalization in the conserved sector, and exact expectation values.

The ground state comes from Lanczos (``scipy.sparse.linalg.eigsh``) on the sparse matrix of
the sector, or from a dense ``eigh`` when the sector is tiny. The sector dimension is computed
before anything is built, and a sector above ``max_dim`` is refused. Results are cached on
disk, keyed by every parameter of the Hamiltonian, so a repeated query is instant.

A cache entry is trusted only as far as it checks out: its format version, the Hamiltonian's
description, the sector's dimension and the vector's length must be this Hamiltonian's, and
the stored vector must be an eigenvector of the stored energy (its local energies
``(Hv)(x)/v(x)`` at a few of its largest sampled components equal the energy, as they do for
an exact eigenstate), and of the *lowest* one: a short Lanczos run from a random start must
find no Ritz value below it (an excited eigenvector passes the first check). An entry that
disagrees in anything, or does not load, is solved again and replaced; entries are written
atomically under a fresh name. The second check builds the sparse matrix, the larger part of
a solve on big sectors (13 s of ~25 s for 2.7 M states): the cache saves the iterations.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse.linalg as sla
import torch

from vitqs import files
from vitqs.config import ExactConfig
from vitqs.physics.lanczos import lowest_ritz_value

DEFAULT_MAX_DIM = ExactConfig.max_dim  # exact.max_dim
_DENSE_BELOW = 400  # eigh beats Lanczos (and eigsh needs k < dim) on tiny sectors
_CACHE_FORMAT = 2  # 2: entries carry their format, description and checked vector
# The eigenvector check: this many random states, of which the largest components are tested
_CHECK_STATES, _CHECK_LARGEST = 256, 16
# |E_loc(x) − E| allowed at those components, relative to max(1, |E|): Lanczos at tol 1e-12
# leaves ~1e-11 there (chains of 16, Bose-Hubbard L = 12), a changed digit shows far above
_CHECK_TOLERANCE = 1e-8


class SectorTooLargeError(ValueError):
    """The sector is larger than the exact-diagonalization limit."""


@dataclass
class GroundState:
    """The exact ground state of a Hamiltonian in its sector.

    Attributes:
        energy: the ground-state energy (total, not per site).
        dimension: the sector dimension.
        seconds: wall time of the solve that produced it (kept when read from the cache).
        vector: the normalised ground-state vector in ``hilbert.all_states()`` order, or None.
        cached: whether the result came from the disk cache.
    """

    energy: float
    dimension: int
    seconds: float
    vector: np.ndarray | None = None
    cached: bool = False

    def energy_per_site(self, n_sites: int) -> float:
        return self.energy / n_sites


def default_cache_dir() -> Path:
    """Returns the ED cache folder: ``$VITQS_CACHE_DIR`` or ``~/.cache/vitqs/ed``."""
    env = os.environ.get("VITQS_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "vitqs" / "ed"


def cache_key(hamiltonian) -> str:
    """Returns a hash of the Hamiltonian's full description (every parameter that matters)."""
    text = json.dumps({"format": _CACHE_FORMAT, **hamiltonian.describe()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def sector_fits(hilbert, max_dim: int) -> bool:
    """Returns whether the sector has at most ``max_dim`` states, without huge integers."""
    if hilbert.log_dimension() > np.log(max_dim) + 1.0:
        return False
    return hilbert.dimension <= max_dim


def check_dimension(hamiltonian, max_dim: int = DEFAULT_MAX_DIM) -> int:
    """Returns the sector dimension, or raises SectorTooLargeError above ``max_dim``."""
    # a sector with 10^30 states must be refused without counting it exactly first
    log_dim = hamiltonian.hilbert.log_dimension()
    if log_dim > np.log(max_dim) + 1.0:
        # beyond ~1e9 states the sparse matrix (~37 elements a row, 12 bytes each) outgrows
        # any one machine's memory: raising the bound cannot help
        remedy = "raise exact.max_dim or use" if log_dim < np.log(1e9) else "ED needs"
        raise SectorTooLargeError(
            f"the sector has about 10^{log_dim / np.log(10):.0f} states, above "
            f"exact.max_dim={max_dim:,}; {remedy} a smaller lattice"
        )
    dim = hamiltonian.hilbert.dimension
    if dim > max_dim:
        raise SectorTooLargeError(
            f"the sector has {dim:,} states, above exact.max_dim={max_dim:,}; "
            "raise exact.max_dim or use a smaller lattice"
        )
    return dim


def ground_state(
    hamiltonian,
    *,
    max_dim: int = DEFAULT_MAX_DIM,
    return_vector: bool = False,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
) -> GroundState:
    """Returns the exact ground state of ``hamiltonian`` in its sector.

    Args:
        hamiltonian: a ``Heisenberg`` or ``BoseHubbard`` (anything with ``hilbert``,
            ``to_sparse()`` and ``describe()``).
        max_dim: refuse sectors larger than this (``SectorTooLargeError``).
        return_vector: also return the ground-state vector (stored in the cache too).
        cache_dir: cache folder; default ``default_cache_dir()``.
        use_cache: read and write the disk cache.
    """
    dim = check_dimension(hamiltonian, max_dim)
    path = Path(cache_dir or default_cache_dir()) / f"{cache_key(hamiltonian)}.npz"
    if use_cache:
        hit = _read_cache(path, hamiltonian, dim)
        if hit is not None:
            if not return_vector:
                hit.vector = None
            return hit
    start = time.perf_counter()
    energy, vector = _lowest_eigenpair(hamiltonian.to_sparse())
    result = GroundState(energy, dim, time.perf_counter() - start, vector)
    if use_cache:
        _keep_in_cache(path, result, hamiltonian)
    if not return_vector:
        result.vector = None
    return result


def _lowest_eigenpair(matrix) -> tuple[float, np.ndarray]:
    dim = matrix.shape[0]
    if dim < _DENSE_BELOW:
        values, vectors = np.linalg.eigh(matrix.toarray())
        return float(values[0]), vectors[:, 0]
    # a fixed random start vector makes the result reproducible and, with probability one,
    # overlaps the ground state
    start = np.random.default_rng(0).normal(size=dim)
    values, vectors = sla.eigsh(matrix, k=1, which="SA", v0=start, tol=1e-12)
    return float(values[0]), vectors[:, 0]


def _read_cache(path: Path, hamiltonian, dim: int) -> GroundState | None:
    """Returns the cached ground state at ``path`` if it is this Hamiltonian's and checks
    out (see the module docstring), else None: the caller solves again and replaces it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            entry = {key: data[key] for key in data.files}
        fmt, description = int(entry["format"]), str(entry["description"])
        energy, vector = float(entry["energy"]), np.asarray(entry["vector"])
        if (
            fmt != _CACHE_FORMAT
            or description != _description(hamiltonian)
            or int(entry["dimension"]) != dim
            or vector.shape != (dim,)
            or not np.isfinite(energy)
            or not np.isfinite(vector).all()
            or not is_eigenvector(hamiltonian, vector, energy)
            or not is_lowest(hamiltonian.to_sparse(), energy)
        ):
            return None
        return GroundState(energy, dim, float(entry["seconds"]), vector, True)
    except (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile):
        return None  # absent, truncated, or not an entry of ours: solve again


def _description(hamiltonian) -> str:
    return json.dumps(hamiltonian.describe(), sort_keys=True)


def is_eigenvector(hamiltonian, vector: np.ndarray, energy: float) -> bool:
    """Returns whether ``vector`` (``all_states()`` order) is an eigenvector of
    ``hamiltonian`` with eigenvalue ``energy``, tested where it is largest among a few
    hundred random states: there ``E_loc(x) = (Hv)(x)/v(x)`` must equal ``energy``. Costs a
    few hundred rows of H, not the sparse matrix."""
    hilbert = hamiltonian.hilbert
    generator = torch.Generator().manual_seed(0)
    states = hilbert.random_states(min(_CHECK_STATES, len(vector)), generator)  # (S, N)
    index = hilbert.state_index(states)
    largest = np.argsort(-np.abs(vector[index]))[:_CHECK_LARGEST]
    states, index = states[largest], index[largest]
    if not np.all(np.abs(vector[index]) > 0):
        return False
    x_conn, mels = hamiltonian.get_conn_padded(states.to(torch.float64))  # (S, K, N), (S, K)
    conn_index = hilbert.state_index(x_conn.reshape(-1, hilbert.n_sites)).reshape(mels.shape)
    h_vector = (mels.numpy() * vector[conn_index]).sum(axis=1)
    local_energy = h_vector / vector[index]
    return bool(np.all(np.abs(local_energy - energy) <= _CHECK_TOLERANCE * max(1.0, abs(energy))))


# Lanczos steps of the check that a cached energy is the lowest: a Ritz value below an
# excited level shows within a few steps unless the gap is far below the bandwidth / steps².
_LOWEST_CHECK_STEPS = 24


def is_lowest(matrix, energy: float, n_steps: int = _LOWEST_CHECK_STEPS) -> bool:
    """Returns whether ``n_steps`` of Lanczos on the Hermitian ``matrix`` from a random
    start (seeded) find no Ritz value below ``energy`` (beyond rounding). Ritz values never
    fall below the lowest eigenvalue: one below ``energy`` proves it is not the lowest."""
    return lowest_ritz_value(matrix, n_steps) >= energy - _CHECK_TOLERANCE * max(1.0, abs(energy))


def _keep_in_cache(path: Path, result: GroundState, hamiltonian) -> None:
    """Writes the cache entry; a cache that cannot be written (a full disk, a folder that
    cannot be made) costs the next run a new solve, not this run its result: a warning."""
    try:
        _write_cache(path, result, hamiltonian)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        warnings.warn(
            f"ED cache: could not write {path} ({reason}); the result is used but not "
            "kept (set VITQS_CACHE_DIR, or pass --no-cache)",
            RuntimeWarning,
            stacklevel=3,
        )


def _write_cache(path: Path, result: GroundState, hamiltonian) -> None:
    """Writes the entry whole or not at all (`files.write_atomic`): a crash never leaves
    half an entry, and a name planted in the cache folder (a link to elsewhere) is never
    written through."""
    entry = io.BytesIO()
    np.savez(
        entry,
        format=_CACHE_FORMAT,
        energy=result.energy,
        dimension=result.dimension,
        seconds=result.seconds,
        vector=result.vector,
        description=_description(hamiltonian),
    )
    files.write_atomic(path, entry.getvalue(), mode=0o600)  # a cache of one's own


def expectation(matrix, vector: np.ndarray) -> float:
    """Returns ⟨v|A|v⟩ / ⟨v|v⟩ for a (sparse or dense) Hermitian matrix and a sector vector."""
    vector = np.asarray(vector)
    return float(np.real(np.vdot(vector, matrix @ vector) / np.vdot(vector, vector)))
