"""Chain and square lattices: site order, bonds by neighbour order, translations and the
point group.

Sites are numbered row-major: site ``(x, y)`` of an ``Lx × Ly`` lattice is ``x + Lx * y``
(a chain is the case ``Ly = 1``). Bonds of neighbour order 1 are built from the lattice
vectors ``+x`` (and ``+y``), those of order 2 from ``+x+y`` and ``+x−y`` on the square lattice
and ``+2x`` on the chain. Each unordered bond appears once; a bond that a small periodic
lattice produces twice, or that already is a bond of a lower order, is kept only once, at its
lowest order. This is the edge set of NetKet's ``Hypercube(max_neighbor_order=2)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from vitqs.config import LatticeConfig

# Lattice vectors whose bonds make up each neighbour order, per dimension.
_BOND_VECTORS = {
    1: {1: [(1,)], 2: [(2,)]},
    2: {1: [(1, 0), (0, 1)], 2: [(1, 1), (1, -1)]},
}


@dataclass(frozen=True)
class Lattice:
    """A chain ``shape=(L,)`` or a square lattice ``shape=(Lx, Ly)``, periodic or open.

    Args:
        shape: extent along each axis, x first.
        pbc: periodic boundary conditions along every axis.
    """

    shape: tuple[int, ...]
    pbc: bool = LatticeConfig.pbc
    _bond_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        shape = tuple(int(s) for s in self.shape)
        if len(shape) not in (1, 2):
            raise ValueError(
                f"lattice.shape={list(shape)} must have 1 (chain) or 2 (square) entries"
            )
        if any(s < 1 for s in shape):
            raise ValueError(f"lattice.shape={list(shape)} must hold positive extents")
        object.__setattr__(self, "shape", shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def n_sites(self) -> int:
        return int(np.prod(self.shape))

    @property
    def extent(self) -> tuple[int, int]:
        """Returns ``(Lx, Ly)``, with ``Ly = 1`` for a chain."""
        return (self.shape[0], self.shape[1] if self.ndim == 2 else 1)

    @cached_property
    def coords(self) -> np.ndarray:
        """Returns integer coordinates ``(n_sites, ndim)``; row ``i`` holds site i's ``(x, y)``."""
        lx, ly = self.extent
        site = np.arange(self.n_sites)
        xy = np.stack([site % lx, site // lx], axis=1)
        return xy[:, : self.ndim]

    def site_index(self, coords: np.ndarray) -> np.ndarray:
        """Returns the site index of integer coordinates ``(..., ndim)``, wrapped when periodic.

        Coordinates outside an open lattice give -1.
        """
        coords = np.asarray(coords)
        lx, ly = self.extent
        x = coords[..., 0]
        y = coords[..., 1] if self.ndim == 2 else np.zeros_like(x)
        if self.pbc:
            return (x % lx) + lx * (y % ly)
        inside = (x >= 0) & (x < lx) & (y >= 0) & (y < ly)
        return np.where(inside, x + lx * y, -1)

    def bonds(self, order: int = 1) -> np.ndarray:
        """Returns the bonds of one neighbour order as ``(n_bonds, 2)`` int64, ``i < j`` per row.

        Each unordered bond appears once, and never in two orders (the lowest order wins).
        """
        if order not in (1, 2):
            raise ValueError(f"neighbour order {order} is not supported; use 1 or 2")
        if order not in self._bond_cache:
            seen = {tuple(b) for lower in range(1, order) for b in self.bonds(lower).tolist()}
            self._bond_cache[order] = self._bonds_from_vectors(
                _BOND_VECTORS[self.ndim][order], seen
            )
        return self._bond_cache[order]

    def _bonds_from_vectors(self, vectors, seen: set) -> np.ndarray:
        n = self.n_sites
        pairs = []
        for vec in vectors:
            targets = self.site_index(self.coords + np.asarray(vec))
            sites = np.arange(n)
            valid = (targets >= 0) & (targets != sites)
            lo, hi = np.minimum(sites, targets)[valid], np.maximum(sites, targets)[valid]
            pairs.append(lo * n + hi)  # one integer per unordered edge
        codes = np.unique(np.concatenate(pairs)) if pairs else np.zeros(0, dtype=np.int64)
        if seen:
            lower = np.array([i * n + j for i, j in seen], dtype=np.int64)
            codes = codes[~np.isin(codes, lower)]
        return np.stack([codes // n, codes % n], axis=1).astype(np.int64).reshape(-1, 2)

    @cached_property
    def translations(self) -> np.ndarray:
        """Returns the translation group as permutations ``(n_translations, n_sites)``.

        Row ``t`` is a permutation ``perm`` with ``(T_t x)[i] = x[perm[i]]``: the configuration
        shifted by the vector of translation ``t``. Row 0 is the identity. An open lattice has
        only the identity.
        """
        if not self.pbc:
            return np.arange(self.n_sites)[None, :]
        lx, ly = self.extent
        perms = [
            self.site_index(self.coords - np.asarray((dx, dy)[: self.ndim]))
            for dy in range(ly)
            for dx in range(lx)
        ]
        return np.stack(perms).astype(np.int64)

    def point_group(self) -> np.ndarray:
        """Returns the rotations and reflections about site 0 as permutations ``(n_P, n_sites)``,
        in the convention of `translations`; row 0 is the identity.

        A chain has the reflection ``x → −x`` (2 elements); a square ``L × L`` lattice the 8 of
        the square's symmetry group (C4v); a rectangle ``Lx ≠ Ly`` the 4 reflections of axes.
        Together with the translations they make the lattice's space group. An open lattice
        has only the identity (its reflections fix the centre, not site 0).
        """
        if not self.pbc:
            return np.arange(self.n_sites)[None, :]
        if self.ndim == 1:
            matrices = [np.eye(1, dtype=np.int64), -np.eye(1, dtype=np.int64)]
        else:
            axes = [np.diag([sx, sy]) for sx in (1, -1) for sy in (1, -1)]
            swap = np.array([[0, 1], [1, 0]])
            square = self.shape[0] == self.shape[1]
            matrices = axes + ([a @ swap for a in axes] if square else [])
        perms = [tuple(self.site_index(self.coords @ m.T)) for m in matrices]
        # on a 2-wide lattice a reflection can be the identity: keep each permutation once
        return np.array(list(dict.fromkeys(perms)), dtype=np.int64)

    def space_group(self) -> np.ndarray:
        """Returns every translation after every point-group operation ``(n_T · n_P, n_sites)``:
        row ``t · n_P + p`` maps ``x`` to ``T_t (P_p x)``."""
        translations, points = self.translations, self.point_group()
        return np.stack([p[t] for t in translations for p in points])

    def is_bipartite(self) -> bool:
        """Returns whether the nearest-neighbour bonds join two sublattices (x + y even / odd)."""
        parity = self.coords.sum(axis=1) % 2
        b = self.bonds(1)
        return bool(np.all(parity[b[:, 0]] != parity[b[:, 1]]))

    @cached_property
    def sublattice_sign(self) -> np.ndarray:
        """Returns ``(-1)^(x+y)`` per site, the Marshall sublattice sign."""
        return np.where(self.coords.sum(axis=1) % 2 == 0, 1, -1).astype(np.int64)

    def describe(self) -> dict:
        """Returns a JSON-ready description used in cache keys and results files."""
        return {"shape": list(self.shape), "pbc": self.pbc}
