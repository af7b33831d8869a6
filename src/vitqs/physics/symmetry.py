"""Symmetry orbits of a Hilbert-space sector.

A wave function with ``ψ(g x) = χ(g) ψ(x)`` for a group of lattice permutations (and spin
inversion) takes one value per orbit, up to the character; `sector_orbits` labels the
orbits, picks a representative of each and drops those on which the characters force
``ψ = 0``. The full-sum sampler sums over representatives, and a run refuses a symmetry
projection that leaves no orbit at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SectorOrbits:
    """The orbits of a symmetry group on a sector, for a ψ with ``ψ(g x) = χ(g) ψ(x)``.

    Attributes:
        representatives: ``(R,)`` sector index of one state per orbit (its smallest index);
            orbits where the symmetry forces ``ψ = 0`` are left out.
        sizes: ``(R,)`` number of states in each orbit.
        orbit: ``(D,)`` orbit number of every state of the sector; −1 where ``ψ = 0``.
        character: ``(D,)`` ±1 with ``ψ(x) = character[x] · ψ(representative of x)``.
    """

    representatives: np.ndarray
    sizes: np.ndarray
    orbit: np.ndarray
    character: np.ndarray


def sector_orbits(hilbert, permutations, spin_flip: int = 0) -> SectorOrbits:
    """Returns the orbits of the group ``permutations × {1, spin inversion}`` on the sector.

    Args:
        hilbert: a Hilbert space with ``all_states()`` and ``state_index``.
        permutations: ``(n_G, n_sites)`` lattice symmetries forming a group (translations,
            or the space group), ``(g x)[i] = x[perm[i]]``.
        spin_flip: ``s`` of ``ψ(−x) = s ψ(x)`` (±1), or 0 for the permutations alone.
    """
    states = hilbert.all_states()
    images, characters = [], []
    for perm in np.asarray(permutations):
        images.append(hilbert.state_index(states[:, perm]))
        characters.append(1)
        if spin_flip:
            images.append(hilbert.state_index(-states[:, perm]))
            characters.append(spin_flip)
    images, characters = np.stack(images), np.asarray(characters)[:, None]  # (G, D), (G, 1)
    smallest = images.min(axis=0)  # the same for every state of an orbit: G is a group
    reaches = images == smallest
    even, odd = (reaches & (characters == 1)).any(0), (reaches & (characters == -1)).any(0)
    # g x = r with χ(g) = +1 and h x = r with χ(h) = −1: ψ(r) = −ψ(r), the orbit has ψ = 0
    vanishes = even & odd
    labels, orbit, sizes = np.unique(smallest, return_inverse=True, return_counts=True)
    kept = ~vanishes[labels]
    renumber = np.where(kept, np.cumsum(kept) - 1, -1)
    return SectorOrbits(
        representatives=labels[kept],
        sizes=sizes[kept],
        orbit=renumber[orbit],
        character=np.where(even, 1, -1),
    )
