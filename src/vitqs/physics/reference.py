"""Reference ground-state energies beyond exact diagonalization's reach.

A run compares its energy with exact diagonalization where the sector fits (`exact`); past
that, with the best exact or published energy that exists for its Hamiltonian, and says which:

- the Heisenberg chain (J2 = 0, periodic, even L, S^z = 0): the Bethe ansatz, solved by the
  tool itself for any L (`bethe`);
- published exact diagonalizations of larger square lattices (`PUBLISHED`), quantum Monte
  Carlo of the unfrustrated 8×8 and 10×10 (exact to its error bar), and past them the best
  published energy (the 8×8 and 10×10 J1-J2 at J2 = 0.5), each with its citation, which says
  when the energy is not exact.

A `Reference` names its method; ``None`` means no reference exists, and a run then reports no
relative error rather than one against something weaker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vitqs.physics.bethe import heisenberg_chain_energy

EXACT_DIAGONALIZATION = "exact diagonalization"
BETHE_ANSATZ = "Bethe ansatz"


@dataclass(frozen=True)
class Reference:
    """A reference ground-state energy (total, not per site) and where it comes from.

    Attributes:
        energy: the ground-state energy of the whole lattice.
        method: `EXACT_DIAGONALIZATION`, `BETHE_ANSATZ` or ``published: <citation>``.
    """

    energy: float
    method: str


@dataclass(frozen=True)
class _Published:
    shape: tuple[int, ...]
    J2_over_J1: float
    energy_per_site: float  # for J1 = 1
    source: str


# Square lattices, periodic, S^z = 0, J1 > 0; energies per site for J1 = 1 (the sign rule is
# a change of basis and leaves them unchanged).
PUBLISHED = (
    _Published(
        (6, 6),
        0.0,
        -0.678872,
        "ED, Schulz, Ziman & Poilblanc, J. Phys. I France 6, 675 (1996)",
    ),
    _Published(
        (6, 6),
        0.5,
        -0.503810,
        "ED, Schulz, Ziman & Poilblanc, J. Phys. I France 6, 675 (1996)",
    ),
    # past ED the Heisenberg square lattice (J2 = 0) has no sign problem: quantum Monte Carlo
    # (stochastic series expansion) gives its ground-state energy to statistical error alone
    # (Sandvik's 2026 table, T -> 0 at beta/L = 32 and 64, agrees with his 1997 -0.673487(4)
    # and -0.671549(4), PRB 56, 11678, within their error bars)
    _Published(
        (8, 8),
        0.0,
        -0.67349005,
        "QMC (stochastic series expansion), Sandvik, arXiv:2601.20189 (2026), Table I, "
        "-0.67349005(2)",
    ),
    _Published(
        (10, 10),
        0.0,
        -0.67155266,
        "QMC (stochastic series expansion), Sandvik, arXiv:2601.20189 (2026), Table I, "
        "-0.67155266(2)",
    ),
    # past ED no exact energy exists: the best published estimate, an extrapolation of
    # variational energies with Lanczos steps to zero variance (not exact, not a bound; the
    # best variational bound is RBM+PP's -0.498963(2), Nomura & Imada, PRX 11, 031034 (2021))
    _Published(
        (8, 8),
        0.5,
        -0.49906,
        "extrapolated, not exact: Hu, Becca, Parola & Sorella, PRB 88, 060402(R) (2013), "
        "-0.49906(1)",
    ),
    # the 10×10: the lowest variational energy published, an upper bound (not exact; 2.4e-6
    # below the lowest peer-reviewed one, CNN, Chen & Heyl, Nat. Phys. 20, 1476 (2024),
    # -0.4976921(4)); a run below it is below a bound, not wrong
    _Published(
        (10, 10),
        0.5,
        -0.4976939,
        "best variational energy, not exact: CNN-MPS, Fan et al., arXiv:2603.14425 (2026), "
        "-0.4976939(2)",
    ),
)


def reference_energy(hamiltonian) -> Reference | None:
    """Returns the reference of a Heisenberg J1-J2 Hamiltonian past ED (Bethe ansatz or
    published), or None: for Bose-Hubbard, open boundaries, a sector other than S^z = 0, a
    ferromagnetic or zero J1, or a lattice nobody has published."""
    lattice, hilbert = getattr(hamiltonian, "lattice", None), getattr(hamiltonian, "hilbert", None)
    J1, J2 = getattr(hamiltonian, "J1", None), getattr(hamiltonian, "J2", None)
    if J1 is None or J2 is None or not lattice.periodic or not J1 > 0:
        return None
    if getattr(hilbert, "total_sz", None) != 0.0:
        return None
    n_sites = lattice.n_sites
    if lattice.kind == "chain" and J2 == 0.0 and n_sites % 2 == 0 and n_sites >= 4:
        # L = 2 is left out: the formula counts the ring's bond twice, the lattice once
        return Reference(heisenberg_chain_energy(n_sites, J1), BETHE_ANSATZ)
    for entry in PUBLISHED:
        same_ratio = math.isclose(J2 / J1, entry.J2_over_J1, rel_tol=0, abs_tol=1e-12)
        if lattice.kind == "square" and lattice.shape == entry.shape and same_ratio:
            return Reference(entry.energy_per_site * J1 * n_sites, f"published: {entry.source}")
    return None
