"""The symmetry sectors a ground state may lie in, listed without diagonalising anything.

A sector is a crystal momentum k, a one-dimensional representation χ of its little group
(the rotations and reflections that keep k) and, for spins at S^z = 0, the eigenvalue of
global spin inversion. Momenta that a rotation or reflection maps onto each other carry the
same levels, so one per star is listed. These are the candidates `vitqs.sector_search`
trains and compares; on a lattice small enough `physics.symmetry.ground_state_sector` says
which one ED's ground state is in.

A level whose states span a higher-dimensional representation of the little group (a
degenerate level) is in none of these sectors: a ground state there is reported as
degenerate by ED and is not a candidate here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from vitqs.models.symmetrize import little_space_group
from vitqs.physics.symmetry import generators


@dataclass(frozen=True)
class Sector:
    """A symmetry sector, in the keys of ``model.sector``: ``momentum`` (one integer per
    axis), ``point_characters`` (±1 per element of the little group, identity first) and
    ``spin_flip`` (0 where the Hamiltonian has no spin inversion symmetry)."""

    momentum: tuple[int, ...]
    point_characters: tuple[int, ...]
    spin_flip: int

    def label(self) -> str:
        chi = "".join("+" if c > 0 else "-" for c in self.point_characters)
        flip = {1: " flip +1", -1: " flip -1"}.get(self.spin_flip, "")
        return f"k={list(self.momentum)} chi={chi}{flip}"

    def keys(self) -> dict:
        """Returns the value of `model.sector` that selects this sector."""
        return {
            "momentum": list(self.momentum),
            "point_characters": list(self.point_characters),
            "spin_flip": self.spin_flip,
        }


def momenta(lattice) -> list[tuple[int, ...]]:
    """Returns every crystal momentum ``(n_x[, n_y])``: ``0 ≤ n_i < L_i`` along a periodic
    axis, 0 along an open one (where momentum is no quantum number)."""
    axes = zip(lattice.shape, lattice.pbc, strict=True)
    ranges = [range(n) if periodic else range(1) for n, periodic in axes]
    return [tuple(int(n) for n in k) for k in itertools.product(*ranges)]


def stars(lattice) -> list[tuple[int, ...]]:
    """Returns one momentum per star: per set of momenta that the point group maps onto
    each other (the smallest of each, in `momenta`'s order)."""
    all_k = momenta(lattice)
    phases = np.array([lattice.translation_phases(k) for k in all_k])
    conjugations = _conjugations(lattice)
    seen, representatives = set(), []
    for index, k in enumerate(all_k):
        if index in seen:
            continue
        representatives.append(k)
        for rows in conjugations:
            image = phases[index][rows]
            match = np.all(np.isclose(np.cos(phases - image), 1.0), axis=1)
            seen.update(np.flatnonzero(match).tolist())
    return representatives


def _conjugations(lattice) -> list[np.ndarray]:
    """Returns, per point-group element P, the row of ``P T_t P⁻¹`` among the translations
    for each translation row ``t`` (as `Lattice.little_group` computes it)."""
    row_of = {tuple(t): i for i, t in enumerate(lattice.translations)}
    found = []
    for p in lattice.point_group():
        inverse = np.argsort(p)
        rows = [row_of.get(tuple(inverse[t[p]])) for t in lattice.translations]
        if all(row is not None for row in rows):
            found.append(np.array(rows, dtype=np.int64))
    return found


def characters(lattice, momentum) -> list[tuple[int, ...]]:
    """Returns every one-dimensional representation of the little group at ``momentum`` with
    real characters: the sign patterns χ_P (identity first, +1) for which ``e^{ik·a} χ_P``
    multiplies as the little space group does (the test `little_space_group` makes, on a
    product table built once), all +1 first."""
    group, phases = little_space_group(lattice, list(momentum))  # χ_P = 1: e^{ik·a} alone
    n_points = len(lattice.little_group(list(momentum)))
    row_of = {tuple(g): i for i, g in enumerate(group)}
    gens = generators(group)
    # product[j, i]: the row of g_i after generator j, as `_check_representation` takes it
    product = np.array([[row_of.get(tuple(group[h][g]), -1) for g in group] for h in gens])
    if (product < 0).any():  # the elements do not close: no sector to offer
        return []
    found = []
    for signs in itertools.product((1, -1), repeat=n_points - 1):
        chi = np.array((1, *signs), dtype=float)
        values = phases * np.tile(chi, len(group) // n_points)  # row t·n_P + p
        expected = values[None, :] * values[gens][:, None]
        if np.all(np.abs(values[product] - expected) < 1e-9):
            found.append((1, *signs))
    return found


def candidates(lattice, spin_flip: bool) -> list[Sector]:
    """Returns the sectors to try: every star's momentum with each representation of its
    little group, and with ``spin_flip`` (spins at S^z = 0) each eigenvalue ±1."""
    flips = (1, -1) if spin_flip else (0,)
    return [
        Sector(k, chi, flip)
        for k in stars(lattice)
        for chi in characters(lattice, k)
        for flip in flips
    ]


def same_sector(lattice, sector: Sector, found: dict) -> bool:
    """Returns whether ``sector`` is the sector `ground_state_sector` ``found`` (ED's), up to
    the point group: its momentum in the star of ED's, the same characters where the
    momenta are equal, the same spin inversion. False where ED found a degenerate level."""
    if found.get("momentum") is None or found.get("point_characters") is None:
        return False
    flip = found.get("spin_flip") or 0
    if sector.spin_flip != flip:
        return False
    exact_k = tuple(found["momentum"])
    if sector.momentum == exact_k:
        return sector.point_characters == tuple(int(c) for c in found["point_characters"])
    star = next(k for k in stars(lattice) if _in_star(lattice, exact_k, k))
    return star == sector.momentum and _characters_of_star(lattice, sector, found)


def _in_star(lattice, k, representative) -> bool:
    target = lattice.translation_phases(list(k))
    base = lattice.translation_phases(list(representative))
    return any(
        np.all(np.isclose(np.cos(base[rows] - target), 1.0)) for rows in _conjugations(lattice)
    )


def _characters_of_star(lattice, sector: Sector, found: dict) -> bool:
    """Characters at two momenta of one star are of conjugate little groups; compared only
    by whether both are all +1 (the case every test system meets), else not decided."""
    trivial = all(c == 1 for c in sector.point_characters)
    return trivial == all(int(c) == 1 for c in found["point_characters"])
