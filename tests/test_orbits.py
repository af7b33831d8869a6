"""Full sums over symmetry orbits: the orbits themselves, which symmetries a model has, and
sums over one state per orbit equal to the sums over the whole sector (energy, variance,
natural gradient, a whole run)."""

import numpy as np
import pytest
import torch
from helpers import ComplexRBM, tiny_bose_hubbard, tiny_heisenberg, widen_head

from vitqs import build, results
from vitqs.config import ModelConfig, from_dict
from vitqs.models import Jastrow, Symmetrized, ViT, build_model, invariances
from vitqs.models.symmetrize import coset_translations
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.physics.symmetry import sector_orbits
from vitqs.runner import run_config
from vitqs.vmc.estimators import statistics
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.sr import log_derivatives, natural_gradient


def _orbits_by_hand(hilbert, translations, spin_flip):
    """Returns {frozenset of sector indices: character of each member relative to the
    smallest}, or None for an orbit with ψ = 0, by applying every group element."""
    states = hilbert.all_states()
    index = {tuple(s): i for i, s in enumerate(states)}
    found = {}
    for start in range(len(states)):
        images = {}
        for perm in translations:
            for sign, character in ((1, 1), (-1, spin_flip)) if spin_flip else ((1, 1),):
                image = index[tuple(sign * states[start][perm])]
                images.setdefault(image, set()).add(character)
        orbit = frozenset(images)
        if orbit not in found:
            found[orbit] = min(orbit)
    return found


@pytest.mark.parametrize("spin_flip", [0, 1, -1])
def test_orbits_of_a_ring_match_the_group_applied_by_hand(spin_flip):
    hilbert = Heisenberg(Lattice((8,))).hilbert
    translations = Lattice((8,)).translations
    orbits = sector_orbits(hilbert, translations, spin_flip)
    by_hand = _orbits_by_hand(hilbert, translations, spin_flip)
    # every state is in exactly one orbit; the kept orbits are those whose representative
    # is not mapped onto itself with character -1
    members = {}
    for state, label in enumerate(orbits.orbit):
        members.setdefault(label, set()).add(state)
    vanishing = members.pop(-1, set())
    assert {frozenset(m) for m in members.values()} | (
        {frozenset(o) for o in by_hand if o <= vanishing}
    ) == set(by_hand)
    assert sorted(len(m) for m in members.values()) == sorted(orbits.sizes)
    assert orbits.sizes.sum() + len(vanishing) == hilbert.dimension
    for label, rep in enumerate(orbits.representatives):
        assert rep == min(members[label])
    if spin_flip == -1:
        # the Néel states are each other's spin inversion and translation by one site:
        # ψ(Néel) = -ψ(Néel) in the odd sector
        neel = hilbert.state_index(np.array([[1, -1] * 4]))[0]
        assert orbits.orbit[neel] == -1
    else:
        assert len(vanishing) == 0
    assert len(orbits.representatives) == len(members)


def test_character_relates_each_state_to_its_representative():
    lattice = Lattice((4, 4))
    hamiltonian = Heisenberg(lattice, J2=0.5)
    model = _symmetric_vit(lattice, spin_flip=-1)
    sampler = ExactSampler(hamiltonian.hilbert, symmetry=invariances(model, lattice))
    x = torch.as_tensor(hamiltonian.hilbert.all_states(), dtype=torch.float64)
    with torch.no_grad():
        psi = torch.exp(model(x)).numpy()
    orbits = sampler.orbits
    kept = orbits.orbit >= 0
    rep_psi = psi[orbits.representatives][orbits.orbit[kept]]
    np.testing.assert_allclose(psi[kept], orbits.character[kept] * rep_psi, atol=1e-12)
    assert np.abs(psi[~kept]).max() < 1e-12 * np.abs(psi).max()


def _symmetric_vit(lattice, spin_flip=1):
    """Returns a small ViT averaged over translations (one shift per patch coset), as
    ``model.symmetrize: translations`` builds it, with the given spin-inversion parity."""
    torch.manual_seed(5)
    vit = ViT(lattice.shape, 2, d_model=8, heads=2, layers=1, head_init_std=0.5).double()
    return Symmetrized(vit, coset_translations(vit, lattice), spin_flip=spin_flip)


def test_invariances_of_each_model_kind():
    lattice = Lattice((4, 4))
    vit = ViT(lattice.shape, 2, d_model=8, heads=2, layers=1).double()
    translations, flip = invariances(vit, lattice)
    assert len(translations) == 4 and flip == 0  # shifts by whole 2x2 patches
    translations, flip = invariances(_symmetric_vit(lattice, spin_flip=-1), lattice)
    assert len(translations) == 16 and flip == -1
    assert len(invariances(Symmetrized(vit, lattice.translations[:1], 1), lattice)[0]) == 4
    assert len(invariances(Jastrow(lattice.shape, True).double(), lattice)[0]) == 16
    assert len(invariances(vit, Lattice((4, 4), pbc=False))[0]) == 1
    # and each model is invariant under what it claims: the sampler's own check passes
    hilbert = Heisenberg(lattice).hilbert
    for model in (vit, _symmetric_vit(lattice, -1), Jastrow(lattice.shape, True).double()):
        ExactSampler(hilbert, symmetry=invariances(model, lattice)).check_symmetry(model)


def test_a_model_without_the_symmetry_is_refused():
    hamiltonian = Heisenberg(Lattice((8,)))
    sampler = ExactSampler(hamiltonian.hilbert, symmetry=(Lattice((8,)).translations, 0))
    with pytest.raises(ValueError, match="not invariant under the symmetry group it claims"):
        sampler.check_symmetry(ComplexRBM(8, seed=2))


def _built(lattice, hilbert, **options):
    """Returns the model `build_model` makes of a small ViT config with ``options``."""
    torch.manual_seed(6)
    settings = {"d_model": 8, "heads": 2, "layers": 1, **options}
    return widen_head(build_model(ModelConfig(**settings), lattice, hilbert), 5.0)


@pytest.mark.parametrize("shape", [(4, 4), (3, 3), (6, 2), (8,)])
def test_space_group_is_a_group_of_the_lattice_s_bonds(shape):
    lattice = Lattice(shape)
    group = lattice.space_group()
    # on the 6x2 the reflection y -> -y moves no site: 2 point-group elements, not 4
    expected = {(4, 4): 16 * 8, (3, 3): 9 * 8, (6, 2): 12 * 2, (8,): 8 * 2}[shape]
    elements = {tuple(g) for g in group}
    assert len(elements) == len(group) == expected
    assert all(tuple(a[b]) in elements for a in group for b in group)  # closed
    for order in (1, 2):
        bonds = {frozenset(b) for b in lattice.bonds(order).tolist()}
        for g in group:
            assert {frozenset((int(g[i]), int(g[j]))) for i, j in lattice.bonds(order)} == bonds


def test_a_space_group_average_is_invariant_under_the_space_group():
    lattice = Lattice((4, 4))
    hilbert = Heisenberg(lattice).hilbert
    model = _built(
        lattice, hilbert, patch_size=2, symmetrize="space_group", sector={"spin_flip": 1}
    )
    assert model.translations.shape[0] == 4 * 8  # shifts inside a patch, each rotation
    group, flip = invariances(model, lattice)
    assert len(group) == 128 and flip == 1
    x = torch.as_tensor(hilbert.all_states()[::97], dtype=torch.float64)
    with torch.no_grad():
        log_psi = model(x)
        for g in group:
            torch.testing.assert_close(model(x[:, g]), log_psi, rtol=0, atol=1e-10)


def _boson_vit(lattice, n_particles=6, symmetrize="none"):
    hilbert = BoseHubbard(lattice, n_particles=n_particles).hilbert
    options = {"embedding": "onehot", "jastrow": True, "symmetrize": symmetrize}
    return _built(lattice, hilbert, patch_size=1, **options)


SYSTEMS = {
    # frustrated 6x2 magnet (924 states: the full-sector kernel of minsr stays small), ψ
    # averaged over translations, even / odd under spin inversion
    "j1j2_even": (lambda: Heisenberg(Lattice((6, 2)), J2=0.5), lambda lat: _symmetric_vit(lat)),
    "j1j2_odd": (
        lambda: Heisenberg(Lattice((6, 2)), J2=0.5),
        lambda lat: _symmetric_vit(lat, spin_flip=-1),
    ),
    # at k = (π, 0) (model.sector: {momentum: [3, 0]}): the sums run over orbits of the
    # shifts of phase 1
    "j1j2_momentum": (
        lambda: Heisenberg(Lattice((6, 2)), J2=0.5),
        lambda lat: _built(
            lat,
            Heisenberg(lat).hilbert,
            symmetrize="translations",
            sector={"momentum": [3, 0], "spin_flip": 1},
        ),
    ),
    # bosons: a translation-invariant ViT with one-site patches and a Jastrow factor
    "bose_hubbard": (lambda: BoseHubbard(Lattice((6,)), U=3.0, n_particles=6), _boson_vit),
    # bosons on the 3x3, ψ averaged over rotations and reflections: 72 symmetries
    "bose_hubbard_space_group": (
        lambda: BoseHubbard(Lattice((3, 3)), U=3.0, n_particles=3),
        lambda lat: _boson_vit(lat, n_particles=3, symmetrize="space_group"),
    ),
}


@pytest.mark.parametrize("system", list(SYSTEMS))
@pytest.mark.parametrize("method", ["sr", "minsr"])
def test_sums_over_orbits_equal_the_sums_over_the_sector(system, method):
    make_hamiltonian, make_model = SYSTEMS[system]
    hamiltonian = make_hamiltonian()
    torch.manual_seed(1)
    model = make_model(hamiltonian.lattice)
    full = ExactSampler(hamiltonian.hilbert)
    reduced = ExactSampler(hamiltonian.hilbert, symmetry=invariances(model, hamiltonian.lattice))
    reduced.check_symmetry(model)
    assert reduced.n_samples < full.n_samples
    sums = []
    for sampler in (full, reduced):
        samples = sampler.sample(model)
        e_loc = sampler.local_energy(hamiltonian, model, samples)
        stats = statistics(e_loc, samples.weights)
        jac = log_derivatives(model, samples.x[0])
        update = natural_gradient(
            jac, e_loc.reshape(-1), diag_shift=1e-3, weights=samples.weights[0], method=method
        )
        sums.append((stats.mean, stats.variance, update))
    (e_full, var_full, g_full), (e_red, var_red, g_red) = sums
    assert abs(e_red - e_full) < 1e-11 * abs(e_full)
    assert var_red == pytest.approx(var_full, rel=1e-9)
    torch.testing.assert_close(g_red, g_full, rtol=1e-8, atol=1e-10 * float(g_full.norm()))


@pytest.mark.parametrize("make", [tiny_heisenberg, tiny_bose_hubbard])
def test_a_run_over_orbits_follows_the_run_over_the_sector(make, tmp_path, monkeypatch):
    # the same steps, so the same energies at every step and the same final observables
    # (measured over every state in both runs). The run over every state: a build that
    # finds no symmetry in the model, the sum a model without any would take
    sections = {"sampler": {"kind": "full_sum"}, "optimizer": {"n_iter": 5}}
    if make is tiny_heisenberg:
        # −1: the singlet's sector on 6 sites without the sign rule (+1 is refused)
        sections["model"] = {"symmetrize": "translations", "sector": {"spin_flip": -1}}
        sections["hamiltonian"] = {"J2": 0.5, "sign_rule": False}
    runs = []
    for reduce in (False, True):
        data = make(tmp_path / f"out{reduce}", **sections)
        with monkeypatch.context() as patch:
            if not reduce:
                patch.setattr(build, "invariances", lambda model, lattice: None)
            summary = run_config(from_dict(data), progress=False)
        runs.append((summary, results.read_results(summary["results_file"])))
    (full, full_record), (reduced, reduced_record) = runs
    assert reduced_record.history[0]["n_samples"] < full_record.history[0]["n_samples"]
    np.testing.assert_allclose(
        [row["energy"] for row in reduced_record.history],
        [row["energy"] for row in full_record.history],
        rtol=1e-9,
    )
    assert reduced["energy"] == pytest.approx(full["energy"], rel=1e-9)
    assert reduced_record.final["n_samples"] == full_record.final["n_samples"]
    for name, value in full_record.observables.items():
        np.testing.assert_allclose(reduced_record.observables[name], value, atol=1e-9)


@pytest.mark.parametrize("spin_flip", [0, -1])
def test_final_space_group_average_of_a_trained_model(spin_flip):
    # symmetrize_space_group on a model trained with model.symmetrize: translations (and a
    # spin-flip sector) is the model that model.symmetrize: space_group builds from the
    # same network: invariant under the whole group, its spin-inversion parity kept
    from vitqs.models import final_symmetrized

    lattice = Lattice((4, 4))
    hilbert = Heisenberg(lattice).hilbert
    trained = _built(
        lattice, hilbert, patch_size=2, symmetrize="translations", sector={"spin_flip": spin_flip}
    )
    final = final_symmetrized(trained, "space_group", lattice)
    built = _built(
        lattice, hilbert, patch_size=2, symmetrize="space_group", sector={"spin_flip": spin_flip}
    )
    built.model.load_state_dict(trained.model.state_dict())
    x = torch.as_tensor(hilbert.all_states()[::89], dtype=torch.float64)
    with torch.no_grad():
        log_psi = final(x)
        scale = log_psi.real.max()  # compare ψ, not log ψ: an odd state vanishes where
        psi = torch.exp(log_psi - scale)  # −x is a symmetry image of x, and its log is noise
        torch.testing.assert_close(torch.exp(built(x) - scale), psi, rtol=0, atol=1e-12)
        for g in lattice.space_group()[::7]:
            torch.testing.assert_close(torch.exp(final(x[:, g]) - scale), psi, rtol=0, atol=1e-10)
        if spin_flip:  # ψ(−x) = −ψ(x)
            torch.testing.assert_close(torch.exp(final(-x) - scale), -psi, rtol=0, atol=1e-10)
    assert final_symmetrized(final, "space_group", lattice) is final  # already averaged
    assert final_symmetrized(trained, "none", lattice) is trained
    with pytest.raises(ValueError, match="final.symmetrize='all'"):
        final_symmetrized(trained, "all", lattice)


@pytest.mark.parametrize(
    "lattice",
    [
        Lattice((4, 4)),
        Lattice((6,)),
        Lattice((2, 3), kind="kagome"),
        Lattice((3, 3), kind="honeycomb"),
    ],
)
def test_a_few_generators_make_the_whole_space_group(lattice):
    # the sector check applies only the generators to a vector: they must generate it all
    from vitqs.physics.symmetry import _closure, generators

    group = lattice.space_group()
    chosen = generators(group)
    assert 1 <= len(chosen) <= 4
    identity = {tuple(range(lattice.n_sites))}
    assert _closure(identity, [tuple(group[i]) for i in chosen]) == {tuple(g) for g in group}
