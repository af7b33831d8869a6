"""The measured recipes: what a config leaves out comes from the recipe of its problem's class.

A config names the lattice and the Hamiltonian (and a budget); the ``model``, ``sampler``,
``optimizer`` and ``final`` sections it leaves out are taken from the recipe of its class,
chosen from the Hamiltonian:

- ``sign_rule``: spins whose Hamiltonian carries the Marshall sign rule (an unfrustrated
  bipartite antiferromagnet): ψ positive in the rotated basis. Measured on the chain of 16,
  the square 4×4 and 6×6, the 2-leg ladder and the honeycomb (results/history/accuracy_notes.md).
- ``frustrated``: spins without a sign rule (frustrated ones, J2 > 0, triangular, kagome, and
  any Heisenberg model whose config leaves ``sign_rule`` off): ψ averaged over the
  translations and projected on the singlet's spin inversion, the chains on the bare network
  at |φ|^1.25, SPRING momentum, cosine learning rate. Measured on the J1-J2 4×4 (2.3e-6) and
  the J1-J2 chain of 20. On the triangular lattice the run races the sign priors first
  (``model.sign_prior: search``): the lattice recipe's stripes_x had been read off ED.
- ``bosons``: Bose-Hubbard: one-hot patches, a Jastrow factor, a positive ψ (hopping
  J ≥ 0), the chains at |ψ|^1.25, the cosine learning rate. Its parts measured on the chains
  of 8 and 12 across the Mott transition; the whole on the chain of 12 at U = 3.3 and the
  3×3 at U = 16.7 (results/accuracy.md's defaults table).

A section the config writes is taken as written, its unset keys from the schema's defaults:
a recipe is a whole section, never mixed key by key with the user's (a written ``sampler``
with only ``n_samples`` is the schema's sampler with those samples). The run prints the class
and the sections the recipe gave, and for each written section the recipe's values it left
behind; the results file keeps both (``recipe``). The schema (`vitqs.config`) builds the
sections; this module holds data and rules only.

The symmetry sector: spins without a sign rule on one-cell patches (kagome, honeycomb, odd
extents), whose network can carry any momentum, search for it as the run starts
(``model.sector: search``, `vitqs.sector_search`): nothing short of ED says where their ground
state lies. Elsewhere the recipe claims the crystal momentum k = 0 (on a chain without the
sign rule, the Marshall sign's k), trivial point-group characters and the singlet's spin
inversion, unless the config says otherwise: wider patches carry only the momenta of
whole-patch shifts, and a search over the J1-J2 4x4's 12 carried sectors needs ~26 minutes
for its first round (measured: docs/new_system.md, section 0).
"""

from __future__ import annotations

import copy

# the sections a recipe may give
SECTIONS = ("model", "sampler", "optimizer", "final")

CLASSES = {
    "sign_rule": "spins with a sign rule",
    "frustrated": "spins without a sign rule",
    "bosons": "bosons",
}

# lattices whose measured recipes took one-cell patches (2 and 3 sites a cell)
_ONE_CELL_PATCHES = ("honeycomb", "kagome")
# lattices whose runs race the sign priors first (`model.sign_prior: search`): without a
# bipartition there is no Marshall sign, and the triangular 6x4 without a prior stalls in
# an excited singlet 3 % above E_0 (docs/new_system.md)
_PRIOR_SEARCH = ("triangular",)
# lattices whose final projection was measured over the whole space group
_SPACE_GROUP_FINAL = ("triangular", "honeycomb", "kagome", "ladder")

_MODEL = {"d_model": 16, "heads": 4, "layers": 2, "translation_invariant": True}
_SCHEDULES = {
    "lr": {"schedule": "cosine", "start": 0.05, "end": 0.002},
    "diag_shift": {"schedule": "exponential", "start": 1.0e-3, "end": 1.0e-4},
}


def problem_class(hamiltonian) -> str:
    """Returns the class of a validated Hamiltonian section: ``sign_rule``, ``frustrated``
    or ``bosons``."""
    if hamiltonian.kind == "bose_hubbard":
        return "bosons"
    return "sign_rule" if hamiltonian.sign_rule else "frustrated"


def patch_size(lattice) -> int:
    """Returns the recipe's patch: 2 cells a side where every patched extent is even (a
    ladder is patched along its legs only), else 1; one-cell patches on lattices of several
    sites a cell."""
    kind = lattice.resolved_kind
    if kind in _ONE_CELL_PATCHES:
        return 1
    extents = lattice.shape[:1] if kind == "ladder" else lattice.shape
    return 2 if all(extent % 2 == 0 and extent >= 4 for extent in extents) else 1


def recipe(lattice, hamiltonian, model=None) -> dict:
    """Returns the recipe of a validated lattice and Hamiltonian: ``{section: data}``, its
    sampler fitted to ``model``, a section the config wrote (its chains run on the bare
    network only where that model has one: a symmetrization or a spin inversion)."""
    kind, written_model = problem_class(hamiltonian), model
    model = {**_MODEL, "patch_size": patch_size(lattice)}
    sampler = {"kind": "metropolis", "n_samples": 1024, "n_chains": 128, "n_discard": 4}
    optimizer = {"method": "auto", **copy.deepcopy(_SCHEDULES), "momentum": 0.9}
    final = {"n_discard": 16, "symmetrize": _final_projection(lattice)}
    if kind == "sign_rule":
        model["positive"] = True
        sampler["n_discard"] = 8
        # and the common schedules: a constant lr 0.05 and shift 1e-4 (a 300-s choice on the
        # chain of 16) missed on the 6x6's seed 1 (3,600 s) at 1.5e-4, the schedules 8.7e-5
    elif kind == "frustrated":
        model["symmetrize"] = "translations"
        if model["patch_size"] == 1:
            # one-cell patches: a translation-invariant network is k = 0 alone; the average
            # over the translations projects on any k (the kagome 2x3's measured recipe).
            # Such a network can take any sector, and nothing says which holds the ground
            # state (the kagome 2x3's is at k = (π, 0), odd under a reflection): the run
            # finds it (sector_search), spin inversion included
            model |= {"translation_invariant": False, "sector": "search"}
        else:
            model |= _claimed_sector(lattice, hamiltonian)
            if lattice.resolved_kind in _PRIOR_SEARCH:
                model["sign_prior"] = "search"
        sampler |= {"bare_chains": True, "machine_pow": 1.25}
    else:
        # hopping J ≥ 0 makes H stoquastic: the ground state is positive. |ψ|^1.25 samples
        # a Mott insulator's peaked |ψ|² more evenly: on the 3x3 at U = 16.7 hop acceptance
        # 0.09 -> 0.27, 300 s to 1.8e-5 against 2.9e-4 on |ψ|² (results/accuracy.md)
        model |= {"embedding": "onehot", "jastrow": True, "positive": hamiltonian.J >= 0}
        sampler |= {"n_discard": 8, "machine_pow": 1.25}
        optimizer |= {"momentum": None}
    if kind == "frustrated" and written_model is not None and written_model.symmetrize == "none":
        if not written_model.spin_flip:
            # |φ|^1.25 came with the bare chains: without a bare network, neither applies
            for key in ("bare_chains", "machine_pow"):
                sampler.pop(key, None)
    return {"model": model, "sampler": sampler, "optimizer": optimizer, "final": final}


def _claimed_sector(lattice, hamiltonian) -> dict:
    """Returns the ``model.sector`` the recipe claims for a network of wider patches: the
    singlet's spin inversion and, on a ring, the Marshall sign's momentum."""
    sector = {}
    flip = _singlet_flip(hamiltonian, lattice.n_sites)
    if flip:
        sector["spin_flip"] = flip
    momentum = _marshall_momentum(lattice, hamiltonian)
    if momentum:
        sector["momentum"] = momentum
    return {"sector": sector} if sector else {}


def _final_projection(lattice) -> str:
    return "space_group" if lattice.resolved_kind in _SPACE_GROUP_FINAL else "translations"


def _marshall_momentum(lattice, hamiltonian) -> list | None:
    """Returns the crystal momentum the Marshall sign gives the ground state of a periodic
    chain without the sign rule (J2 < J1/2): a shift by one site exchanges the sublattices and
    multiplies the Marshall sign by (−1)^(N/2), so k = π where L ≡ 2 (mod 4) (the ring of 6 is
    at k = π). None elsewhere: k = 0 (on an even square, (−1)^(N/2) = +1 for every shift)."""
    if lattice.resolved_kind != "chain" or lattice.pbc is False or lattice.pbc == [False]:
        return None
    (length,) = lattice.shape
    if length % 4 != 2 or hamiltonian.total_sz != 0 or not 0 <= hamiltonian.J2 < hamiltonian.J1 / 2:
        return None
    return [length // 2]


def singlet_spin_flip(n_sites: int, sign_rule: bool) -> int:
    """Returns the eigenvalue of global spin inversion on a singlet of ``n_sites`` spins at
    S^z = 0: ``(−1)^(N/2)``, and +1 in the basis of the Marshall sign rule, whose rotation of
    the N/2 spins of one sublattice multiplies it by ``(−1)^(N/2)``."""
    return 1 if sign_rule else (-1) ** (n_sites // 2)


def _singlet_flip(hamiltonian, n_sites: int) -> int:
    """Returns the spin inversion of the singlet ground state of an antiferromagnet at
    S^z = 0 (J1 > 0, J2 ≥ 0), 0 where that rule does not apply."""
    if hamiltonian.total_sz != 0 or n_sites % 2 or hamiltonian.J1 <= 0 or hamiltonian.J2 < 0:
        return 0
    return singlet_spin_flip(n_sites, hamiltonian.sign_rule)
