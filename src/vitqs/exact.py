"""Exact diagonalization in the conserved sector, and exact expectation values.

The ground state comes from Lanczos (``scipy.sparse.linalg.eigsh``) on the sparse matrix of
the sector, or from a dense ``eigh`` when the sector is tiny. The sector dimension is computed
before anything is built, and a sector above ``max_dim`` is refused. Results are cached on
disk, keyed by every parameter of the Hamiltonian, so a repeated query is instant.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse.linalg as sla

DEFAULT_MAX_DIM = 5_000_000
_DENSE_BELOW = 400  # eigh beats Lanczos (and eigsh needs k < dim) on tiny sectors
_CACHE_FORMAT = 1


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
        hit = _read_cache(path, return_vector)
        if hit is not None:
            return hit
    start = time.perf_counter()
    energy, vector = _lowest_eigenpair(hamiltonian.to_sparse())
    result = GroundState(energy, dim, time.perf_counter() - start, vector)
    if use_cache:
        _write_cache(path, result, hamiltonian)
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


def _read_cache(path: Path, need_vector: bool) -> GroundState | None:
    try:
        with np.load(path) as data:
            if need_vector and "vector" not in data:
                return None
            vector = data["vector"] if need_vector else None
            return GroundState(
                float(data["energy"]), int(data["dimension"]), float(data["seconds"]), vector, True
            )
    except (OSError, KeyError, ValueError):
        return None  # absent or unreadable: solve again


def _write_cache(path: Path, result: GroundState, hamiltonian) -> None:
    # write to a temporary file, then rename: a crash never leaves a half-written entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(
        tmp,
        energy=result.energy,
        dimension=result.dimension,
        seconds=result.seconds,
        vector=result.vector,
        description=json.dumps(hamiltonian.describe(), sort_keys=True),
    )
    os.replace(tmp, path)


def expectation(matrix, vector: np.ndarray) -> float:
    """Returns ⟨v|A|v⟩ / ⟨v|v⟩ for a (sparse or dense) Hermitian matrix and a sector vector."""
    vector = np.asarray(vector)
    return float(np.real(np.vdot(vector, matrix @ vector) / np.vdot(vector, vector)))
