"""Lattices with a basis: site order, bonds by neighbour order, translations and the point
group, all from the geometry.

A lattice is a Bravais lattice of unit cells (vectors ``a_1``, ``a_2``, as NetKet builds them)
with ``n_basis`` sites per cell at fixed offsets. ``shape`` counts unit cells per axis. Sites
are numbered cell by cell, row-major over cells (x fastest), then by basis index inside a
cell: site ``b`` of cell ``(x, y)`` is ``n_basis · (x + Lx · y) + b`` (a chain is ``Ly = 1``,
and chain / square / triangular / ladder have one site per cell, so there site ``(x, y)`` is
``x + Lx · y``). A ladder ``[L, legs]`` is the square lattice of ``L × legs`` sites with open
boundaries across the legs: its order-1 bonds are the legs (along x) and the rungs (along y).

Bonds of order k join the sites at the k-th shortest distance of the infinite lattice, found
through the periodic boundaries along periodic axes. Each unordered bond appears once; a bond
that a small periodic lattice produces twice, or that already is a bond of a lower order, is
kept only once, at its lowest order. This is the edge set of NetKet's lattices with
``max_neighbor_order=2`` (checked in tests/test_lattice_kinds.py) wherever the two orders do
not share a bond; NetKet keeps a bond in both orders where a periodic extent of 2 makes them
coincide (and warns that such an axis is not really periodic).

Symmetries come from the geometry too: the translations by whole cells along periodic axes,
and a point group found by trying every linear map of the cell lattice with entries in
{−1, 0, 1} that is a rotation or reflection of real space and maps the sites and the periodic
boundaries onto themselves.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from vitqs.config import LATTICE_KINDS, LatticeConfig, default_lattice_kind, pbc_per_axis

_HALF_ROOT3 = np.sqrt(3.0) / 2
# (Bravais vectors as rows, basis offsets as rows) per kind: NetKet's geometry, so positions
# and distances agree with its lattices site for site
_GEOMETRY = {
    "chain": ([[1.0]], [[0.0]]),
    "square": ([[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0]]),
    "ladder": ([[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0]]),
    "triangular": ([[1.0, 0.0], [0.5, _HALF_ROOT3]], [[0.0, 0.0]]),
    "honeycomb": (
        [[1.0, 0.0], [0.5, _HALF_ROOT3]],
        [[0.5, _HALF_ROOT3 / 3], [1.0, 2 * _HALF_ROOT3 / 3]],
    ),
    "kagome": (
        [[1.0, 0.0], [0.5, _HALF_ROOT3]],
        [[0.5, 0.0], [0.25, _HALF_ROOT3 / 2], [0.75, _HALF_ROOT3 / 2]],
    ),
}
_TWO_DIMENSIONAL = ("square", "ladder", "triangular", "honeycomb", "kagome")
_ATOL = 1e-6  # positions and distances are O(1): this tells equal from different
_REACH = 3  # cell offsets searched for the neighbours of orders 1 and 2 (any kind here)


@dataclass(frozen=True)
class Lattice:
    """A lattice of ``shape`` unit cells of one of `config.LATTICE_KINDS`, periodic or open.

    Args:
        shape: cells along each axis, x first (a ladder: ``[L, legs]``).
        pbc: periodic boundary conditions, for every axis or one bool per axis. A ladder's
            single bool is along its legs; across them it is open.
        kind: chain, square, triangular, honeycomb, kagome or ladder; None for a chain or a
            square by the length of ``shape``.
    """

    shape: tuple[int, ...]
    pbc: bool | tuple[bool, ...] = LatticeConfig.pbc
    kind: str | None = None
    _bond_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        shape = tuple(int(s) for s in self.shape)
        kind = default_lattice_kind(shape) if self.kind is None else str(self.kind)
        if kind not in LATTICE_KINDS:
            raise ValueError(f"lattice.kind={kind!r} is not one of {list(LATTICE_KINDS)}")
        dims = 1 if kind == "chain" else 2
        if len(shape) != dims:
            what = "1 entry, [L]" if dims == 1 else "2 entries, [Lx, Ly]"
            if kind == "ladder":
                what = "2 entries, [L, legs]"
            raise ValueError(f"lattice.shape={list(shape)} must have {what} for kind={kind}")
        if any(s < 1 for s in shape):
            raise ValueError(f"lattice.shape={list(shape)} must hold positive extents")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "pbc", pbc_per_axis(self.pbc, dims, kind))

    # ---------------------------------------------------------------- geometry
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def periodic(self) -> bool:
        """Returns whether every axis is periodic."""
        return all(self.pbc)

    @property
    def n_basis(self) -> int:
        """Returns the number of sites per unit cell."""
        return len(_GEOMETRY[self.kind][1])

    @property
    def n_cells(self) -> int:
        return int(np.prod(self.shape))

    @property
    def n_sites(self) -> int:
        return self.n_cells * self.n_basis

    @property
    def extent(self) -> tuple[int, int]:
        """Returns the cells ``(Lx, Ly)``, with ``Ly = 1`` for a chain."""
        return (self.shape[0], self.shape[1] if self.ndim == 2 else 1)

    @property
    def vectors(self) -> np.ndarray:
        """Returns the Bravais vectors as rows ``(ndim, space_dim)``."""
        return np.asarray(_GEOMETRY[self.kind][0], dtype=np.float64)

    @property
    def offsets(self) -> np.ndarray:
        """Returns the basis sites' offsets inside a cell as rows ``(n_basis, space_dim)``."""
        return np.asarray(_GEOMETRY[self.kind][1], dtype=np.float64)

    @cached_property
    def coords(self) -> np.ndarray:
        """Returns the integer cell coordinates ``(n_sites, ndim)`` of each site's cell."""
        lx, _ = self.extent
        cell = np.arange(self.n_sites) // self.n_basis
        xy = np.stack([cell % lx, cell // lx], axis=1)
        return xy[:, : self.ndim]

    @cached_property
    def basis_index(self) -> np.ndarray:
        """Returns each site's index inside its cell ``(n_sites,)``."""
        return np.arange(self.n_sites) % self.n_basis

    @cached_property
    def positions(self) -> np.ndarray:
        """Returns the real-space positions ``(n_sites, space_dim)``, NetKet's geometry."""
        return self.coords @ self.vectors + self.offsets[self.basis_index]

    def site_index(self, coords: np.ndarray, basis=0) -> np.ndarray:
        """Returns the site of cell coordinates ``(..., ndim)`` and basis index ``basis``,
        wrapped along periodic axes; coordinates outside an open axis give -1."""
        coords = np.asarray(coords)
        inside = np.ones(coords.shape[:-1], dtype=bool)
        wrapped = []
        for axis, length in enumerate(self.shape):
            c = coords[..., axis]
            if self.pbc[axis]:
                c = c % length
            else:
                inside &= (c >= 0) & (c < length)
            wrapped.append(c)
        x, y = wrapped[0], (wrapped[1] if self.ndim == 2 else np.zeros_like(wrapped[0]))
        site = self.n_basis * (x + self.extent[0] * y) + basis
        return np.where(inside, site, -1)

    # ---------------------------------------------------------------- bonds
    @cached_property
    def _neighbour_shells(self) -> list[list[tuple[int, int, tuple[int, ...]]]]:
        """Returns, per neighbour order 1, 2, the ``(b, b', cell offset)`` of the infinite
        lattice's bonds at that order's distance, from basis site ``b`` to ``b'``."""
        found = []
        offsets = itertools.product(range(-_REACH, _REACH + 1), repeat=self.ndim)
        for dc in offsets:
            for b, b2 in itertools.product(range(self.n_basis), repeat=2):
                d = np.asarray(dc) @ self.vectors + self.offsets[b2] - self.offsets[b]
                distance = float(np.linalg.norm(d))
                if distance > _ATOL:
                    found.append((distance, b, b2, tuple(int(c) for c in dc)))
        distances = sorted({round(d / _ATOL) for d, *_ in found})[:2]
        return [[(b, b2, dc) for d, b, b2, dc in found if round(d / _ATOL) == r] for r in distances]

    def neighbour_distance(self, order: int) -> float:
        """Returns the bond length of neighbour ``order`` (1 or 2) on the infinite lattice."""
        b, b2, dc = self._neighbour_shells[order - 1][0]
        return float(
            np.linalg.norm(np.asarray(dc) @ self.vectors + self.offsets[b2] - self.offsets[b])
        )

    def bonds(self, order: int = 1) -> np.ndarray:
        """Returns the bonds of one neighbour order as ``(n_bonds, 2)`` int64, ``i < j`` per row.

        Each unordered bond appears once, and never in two orders (the lowest order wins).
        """
        if order not in (1, 2):
            raise ValueError(f"neighbour order {order} is not supported; use 1 or 2")
        if order not in self._bond_cache:
            seen = {tuple(b) for lower in range(1, order) for b in self.bonds(lower).tolist()}
            self._bond_cache[order] = self._bonds_of_shell(self._neighbour_shells[order - 1], seen)
        return self._bond_cache[order]

    def _bonds_of_shell(self, shell, seen: set) -> np.ndarray:
        n = self.n_sites
        cells = np.arange(0, n, self.n_basis)  # the first site of every cell
        cell_coords = self.coords[cells]
        pairs = []
        for b, b2, dc in shell:
            sites = cells + b
            targets = self.site_index(cell_coords + np.asarray(dc), b2)
            valid = (targets >= 0) & (targets != sites)
            lo, hi = np.minimum(sites, targets)[valid], np.maximum(sites, targets)[valid]
            pairs.append(lo * n + hi)  # one integer per unordered edge
        codes = np.unique(np.concatenate(pairs)) if pairs else np.zeros(0, dtype=np.int64)
        if seen:
            lower = np.array([i * n + j for i, j in seen], dtype=np.int64)
            codes = codes[~np.isin(codes, lower)]
        return np.stack([codes // n, codes % n], axis=1).astype(np.int64).reshape(-1, 2)

    def ladder_bonds(self) -> tuple[np.ndarray, np.ndarray]:
        """Returns the order-1 bonds split into legs (along x) and rungs (across the legs)."""
        bonds = self.bonds(1)
        same_y = self.coords[bonds[:, 0], -1] == self.coords[bonds[:, 1], -1]
        return bonds[same_y], bonds[~same_y]

    # ---------------------------------------------------------------- symmetries
    @cached_property
    def translation_shifts(self) -> np.ndarray:
        """Returns the cell shift ``(n_translations, 2)`` of each row of `translations`."""
        lx, ly = self.extent
        periodic = self.pbc + (False,) * (2 - self.ndim)
        xs = range(lx) if periodic[0] else range(1)
        ys = range(ly) if periodic[1] else range(1)
        return np.array([(dx, dy) for dy in ys for dx in xs], dtype=np.int64)

    @cached_property
    def translations(self) -> np.ndarray:
        """Returns the translation group as permutations ``(n_translations, n_sites)``.

        Row ``t`` is a permutation ``perm`` with ``(T_t x)[i] = x[perm[i]]``: the configuration
        shifted by whole cells, `translation_shifts` ``[t]``, along the periodic axes. Row 0 is
        the identity; an open lattice has only the identity.
        """
        perms = [
            self.site_index(self.coords - shift[: self.ndim], self.basis_index)
            for shift in self.translation_shifts
        ]
        return np.stack(perms).astype(np.int64)

    def translation_phases(self, momentum) -> np.ndarray:
        """Returns ``k · a_t`` ``(n_translations,)`` for each row of `translations`, with the
        crystal momentum given as integers ``momentum = [n_x, n_y]`` (one per axis):
        ``k · a = 2π Σ_i n_i a_i / L_i`` for the shift ``a`` of `translation_shifts`.

        A state of that momentum has ``ψ(T_t x) = exp(i k · a_t) ψ(x)``.
        """
        n = np.zeros(2, dtype=np.int64)
        n[: len(momentum)] = momentum
        return 2 * np.pi * (self.translation_shifts * n / np.array(self.extent)).sum(axis=1)

    def point_group(self) -> np.ndarray:
        """Returns one rotation or reflection per coset of the translations, as permutations
        ``(n_P, n_sites)`` in the convention of `translations`; row 0 is the identity.

        Found from the geometry: every integer map of cell coordinates (entries −1, 0, 1) that
        is orthogonal in real space, applied about site 0 and followed by the shift that takes
        site 0 to each site of the first periodic cell, is kept when it maps every site onto a
        site and the periodic boundaries onto themselves. About site 0 on chain and square
        (the reflection of a chain, C4v of an ``L × L`` square, the axis reflections of a
        rectangle); the hexagonal lattices get C6v where the torus allows it (a honeycomb's
        rotations by 60° are about a hexagon's centre, so they move site 0 to the other
        sublattice). Together with the translations they make the lattice's space group.
        """
        found = {}
        for image in self._point_candidates():
            found.setdefault(tuple(image), None)
        return np.array(list(found), dtype=np.int64)

    def _point_candidates(self):
        identity = np.arange(self.n_sites)
        yield identity
        origin = self.positions[0]
        targets = self._first_cell_sites()
        for m in _integer_maps(self.ndim):
            rotation = self._real_space(m)
            if rotation is None or not self._keeps_boundaries(m):
                continue
            moved = (self.positions - origin) @ rotation.T
            for s in targets:
                image = self._site_at(moved + self.positions[s])
                if image is not None:
                    # image[i] = g(i); the permutation convention wants x'[i] = x[g⁻¹(i)]
                    perm = np.empty_like(image)
                    perm[image] = identity
                    yield perm

    def _first_cell_sites(self) -> np.ndarray:
        """Returns the sites whose cell has coordinate 0 along every periodic axis."""
        mask = np.ones(self.n_sites, dtype=bool)
        for axis in range(self.ndim):
            if self.pbc[axis]:
                mask &= self.coords[:, axis] == 0
        return np.flatnonzero(mask)

    def _real_space(self, m: np.ndarray) -> np.ndarray | None:
        """Returns the orthogonal R with ``R a_i = Σ_j m_ij a_j``, or None if there is none."""
        a = self.vectors
        if a.shape[0] != a.shape[1]:  # pragma: no cover - every kind has a square basis
            return None
        r_t = np.linalg.solve(a, m @ a)  # rows: a_i R^T = (m a)_i
        rotation = r_t.T
        if not np.allclose(rotation @ rotation.T, np.eye(len(a)), atol=_ATOL):
            return None
        return rotation

    def _keeps_boundaries(self, m: np.ndarray) -> bool:
        """Returns whether ``m`` maps each periodic cell vector ``L_i e_i`` onto the periodic
        cell lattice (else the map is not defined on the torus)."""
        for axis, length in enumerate(self.shape):
            if not self.pbc[axis]:
                continue
            image = length * m[axis]
            for j, lj in enumerate(self.shape):
                if (self.pbc[j] and image[j] % lj) or (not self.pbc[j] and image[j]):
                    return False
        return True

    def _site_at(self, positions: np.ndarray) -> np.ndarray | None:
        """Returns the site at each position ``(n, space_dim)``, periodically wrapped, or None
        if some position holds no site or two positions land on one site."""
        inverse = np.linalg.inv(self.vectors)
        sites = np.full(len(positions), -1)
        for b, offset in enumerate(self.offsets):
            fractional = (positions - offset) @ inverse
            cells = np.round(fractional)
            on_lattice = np.all(np.abs(fractional - cells) < _ATOL, axis=1)
            index = self.site_index(cells.astype(np.int64), b)
            hit = on_lattice & (index >= 0)
            sites[hit] = index[hit]
        if np.any(sites < 0) or len(np.unique(sites)) != len(sites):
            return None
        return sites

    def little_group(self, momentum=None) -> np.ndarray:
        """Returns the rows of `point_group` that keep the crystal momentum ``momentum``
        (integers, as `translation_phases`; None: k = 0) up to a reciprocal lattice vector,
        row 0 first: the little co-group of k, all of the point group at k = 0.

        ``P`` keeps k when ``P T_a P⁻¹`` has the phase of ``T_a`` for every translation: then
        ``P`` maps a state of momentum k to one of momentum k, and a state of that sector can
        be an eigenvector of ``P``.
        """
        points = self.point_group()
        if momentum is None or not any(momentum):
            return np.arange(len(points))
        phases = self.translation_phases(momentum)
        row_of = {tuple(t): i for i, t in enumerate(self.translations)}
        kept = []
        for index, p in enumerate(points):
            inverse = np.argsort(p)
            # (g x)[i] = x[g[i]]: the permutation of P T P⁻¹ is P⁻¹[T[P]]
            rows = [row_of.get(tuple(inverse[t[p]])) for t in self.translations]
            if all(
                row is not None and np.isclose(np.cos(phases[row] - phase), 1.0)
                for row, phase in zip(rows, phases, strict=True)
            ):
                kept.append(index)
        return np.array(kept, dtype=np.int64)

    def space_group(self) -> np.ndarray:
        """Returns every translation after every point-group operation ``(n_T · n_P, n_sites)``:
        row ``t · n_P + p`` maps ``x`` to ``T_t (P_p x)``."""
        translations, points = self.translations, self.point_group()
        return np.stack([p[t] for t in translations for p in points])

    # ---------------------------------------------------------------- sublattices
    @cached_property
    def _two_colouring(self) -> np.ndarray | None:
        """Returns ±1 per site with opposite signs across every order-1 bond (site 0: +1 in
        its connected part), or None when the bonds have an odd loop."""
        n = self.n_sites
        neighbours = [[] for _ in range(n)]
        for i, j in self.bonds(1).tolist():
            neighbours[i].append(j)
            neighbours[j].append(i)
        colour = np.zeros(n, dtype=np.int64)
        for start in range(n):
            if colour[start]:
                continue
            colour[start], stack = 1, [start]
            while stack:
                i = stack.pop()
                for j in neighbours[i]:
                    if colour[j] == 0:
                        colour[j] = -colour[i]
                        stack.append(j)
                    elif colour[j] == colour[i]:
                        return None
        return colour

    def is_bipartite(self) -> bool:
        """Returns whether the nearest-neighbour bonds join two sublattices."""
        return self._two_colouring is not None

    @cached_property
    def sublattice_sign(self) -> np.ndarray:
        """Returns the Marshall sublattice sign per site: ±1 on the two sublattices of a
        bipartite lattice, ``(-1)^(x+y)`` of the cell otherwise."""
        if self._two_colouring is not None:
            return self._two_colouring
        return np.where(self.coords.sum(axis=1) % 2 == 0, 1, -1).astype(np.int64)

    # ---------------------------------------------------------------- momenta
    def momenta(self) -> np.ndarray:
        """Returns the momenta ``(n_cells, space_dim)`` of the cell lattice,
        ``q = 2π Σ_i (n_i / L_i) b_i`` (``b_i`` reciprocal to the Bravais vectors), n_x fastest."""
        grids = [np.arange(n) / n for n in self.shape]
        mesh = np.meshgrid(*grids, indexing="xy")
        fractions = np.stack([m.reshape(-1) for m in mesh], axis=1)  # (n_q, ndim)
        reciprocal = np.linalg.inv(self.vectors).T  # rows b_i with a_i · b_j = δ_ij
        return 2 * np.pi * fractions @ reciprocal

    def describe(self) -> dict:
        """Returns a JSON-ready description used in cache keys and results files (chain and
        square lattices keep the description they had before lattice kinds existed)."""
        pbc = self.pbc[0] if len(set(self.pbc)) == 1 else list(self.pbc)
        out = {"shape": list(self.shape), "pbc": pbc}
        if self.kind != default_lattice_kind(self.shape):
            out["kind"] = self.kind
        return out


def _integer_maps(ndim: int):
    """Yields the integer matrices with entries in {−1, 0, 1} and determinant ±1, identity
    excluded: the candidates for rotations and reflections of any of the kinds."""
    for entries in itertools.product((-1, 0, 1), repeat=ndim * ndim):
        m = np.array(entries, dtype=np.int64).reshape(ndim, ndim)
        if abs(round(np.linalg.det(m))) == 1 and not np.array_equal(m, np.eye(ndim)):
            yield m
