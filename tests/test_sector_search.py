"""The ground state's symmetry sector found without ED (issue 52): the candidate sectors
hold ED's, and short runs compared by energy pick it on systems whose ground state is not in
the trivial sector."""

import json
import math
import time

import numpy as np
import pytest
from helpers import assert_one_line_error, run_main, tiny_heisenberg, write_config

from vitqs import results
from vitqs.build import build_hamiltonian
from vitqs.checkpoint import stored_config
from vitqs.config import from_dict
from vitqs.models.build import sign_prior_sites
from vitqs.models.sectors import Sector, candidates, characters, same_sector, stars
from vitqs.models.symmetrize import little_space_group
from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg
from vitqs.physics.symmetry import ground_state_sector
from vitqs.report import sector_search_text, sign_prior_search_text
from vitqs.sector_search import (
    SearchResult,
    Trial,
    _margin,
    exact_levels,
    momentum_prior,
    search,
    trial_config,
)

# (lattice, J2): ground states at k = π, in odd reflection sectors, at a zone-boundary
# momentum of a triangular cluster, and the kagome 2×3's [1, 0] with odd reflection
SYSTEMS = {
    "ring 6": (Lattice((6,)), 0.0),
    "ring 10": (Lattice((10,)), 0.0),
    "J1-J2 ring 8, J2 = 0.7": (Lattice((8,)), 0.7),
    "ladder 3x2": (Lattice((3, 2), kind="ladder"), 0.0),
    "square 4x4, J2 = 0.5": (Lattice((4, 4)), 0.5),
    "triangular 4x3": (Lattice((4, 3), kind="triangular"), 0.0),
    "kagome 2x3": (Lattice((2, 3), kind="kagome"), 0.0),
}


@pytest.mark.parametrize("name", SYSTEMS)
def test_the_candidates_hold_eds_sector_once(name):
    lattice, j2 = SYSTEMS[name]
    hamiltonian = Heisenberg(lattice, J2=j2)
    vector = exact.ground_state(hamiltonian, return_vector=True, use_cache=False).vector
    found = ground_state_sector(hamiltonian, vector)
    hits = [s for s in candidates(lattice, spin_flip=True) if same_sector(lattice, s, found)]
    assert len(hits) == 1, (found, [s.label() for s in hits])


def test_stars_and_characters_count_what_the_groups_have():
    # a ring of 8: k and -k in one star (0..4); the reflection's two characters at k = 0 and
    # π, none but the identity elsewhere
    ring = Lattice((8,))
    assert stars(ring) == [(0,), (1,), (2,), (3,), (4,)]
    assert characters(ring, (0,)) == [(1, 1), (1, -1)] == characters(ring, (4,))
    assert characters(ring, (1,)) == [(1,)]
    # C4v at the square's Γ: four one-dimensional representations (E is two-dimensional)
    assert len(characters(Lattice((4, 4)), (0, 0))) == 4


def _ring_config(tmp_path, length, j2=0.0, sampler=None, lattice=None):
    data = tiny_heisenberg(tmp_path / "out")
    data["lattice"] = lattice or {"shape": [length], "pbc": True}
    data["hamiltonian"] = {"kind": "heisenberg", "J1": 1.0, "J2": j2}  # no sign rule
    # one-site patches without translation invariance: every momentum can be carried
    data["model"].update(patch_size=1, translation_invariant=False, d_model=16)
    data["sampler"] = sampler or {"kind": "full_sum"}
    data["optimizer"] = {"lr": 0.05}
    return data


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(
    "system",
    [
        ("ring 6, k = π, spin inversion -1", dict(length=6)),
        ("J1-J2 ring 8, k = π, odd reflection", dict(length=8, j2=0.7)),
        (
            "ladder 3x2, odd reflections",
            dict(length=None, lattice={"kind": "ladder", "shape": [3, 2], "pbc": [True, False]}),
        ),
        (
            "ring 6 by Monte Carlo",
            dict(length=6, sampler={"n_samples": 256, "n_chains": 32, "n_discard": 2}),
        ),
    ],
    ids=lambda system: system[0],
)
def test_short_runs_find_eds_sector_where_the_ground_state_is_not_trivial(tmp_path, system):
    config = from_dict(_ring_config(tmp_path, **system[1]))
    found = search(config, first_steps=50)
    hamiltonian = build_hamiltonian(config)
    vector = exact.ground_state(hamiltonian, return_vector=True, use_cache=False).vector
    sector = ground_state_sector(hamiltonian, vector)
    trivial = all(c == 1 for c in sector["point_characters"]) and not any(sector["momentum"])
    assert not (trivial and sector["spin_flip"] in (None, 1))  # a system worth the test
    assert same_sector(hamiltonian.lattice, found.chosen, sector), found.rows()
    assert found.margin_sigma > 3
    # these trials converge within their rounds: none was dropped while still falling
    assert not found.unsettled(), found.settled_text()


def test_the_margin_between_noiseless_trials_is_infinite_or_zero():
    # exact sums in sectors of one state give the same energy every step: no standard error
    sector = Sector((0,), (1,), 0)
    low, high = Trial(sector, energies=[-2.0] * 8), Trial(sector, energies=[-1.0] * 8)
    for trial in (low, high):
        trial.rounds = 1
    assert _margin([low, high]) == math.inf
    assert _margin([low, Trial(sector, energies=[-2.0] * 8, rounds=1)]) == 0.0
    noisy = Trial(sector, energies=[-1.0, -1.1] * 4, rounds=1)
    assert 0 < _margin([low, noisy]) < math.inf


def test_a_candidate_dropped_while_still_falling_past_the_cut_leaves_the_search_unsettled():
    # 16 steps: the last quarter (4 steps) against the 4 before it
    sector, other = Sector((1,), (1,), -1), Sector((0,), (1,), -1)
    falling = list(np.linspace(-1.0, -1.8, 16))  # fell 0.21 over its last 4 steps
    variances = list(np.linspace(0.5, 0.1, 16))
    winner = Trial(other, energies=[-1.8, -1.9] * 8, variances=variances, rounds=2)
    dropped = Trial(sector, falling, variances, rounds=1, cut=winner.score()[0])
    fall, error = dropped.fall()
    assert fall == pytest.approx(np.mean(falling[-8:-4]) - np.mean(falling[-4:]))
    assert fall > 2 * error and dropped.score()[0] - dropped.cut < fall
    found = SearchResult([winner, dropped], other, _margin([winner, dropped]), 1.0)
    assert found.unsettled() == [dropped]
    text = found.settled_text()
    assert text.startswith("not settled") and sector.label() in text and "0.213" in text
    assert found.rows()[1]["unsettled"] and found.rows()[1]["fall"] == pytest.approx(fall)
    # far enough behind, or flat: the cut stands
    for settled in (
        Trial(sector, energies=falling, rounds=1, cut=-3.0),
        Trial(sector, energies=[-1.0, -1.1] * 8, rounds=1, cut=winner.score()[0]),
    ):
        found = SearchResult([winner, settled], other, 1.0, 1.0)
        assert not found.unsettled() and found.settled_text().startswith("settled")
    assert not winner.unsettled()  # never cut


def test_report_says_a_search_whose_record_is_not_settled():
    kept = {
        "chosen": {"momentum": [0, 0], "point_characters": [1, 1], "spin_flip": -1},
        "margin_sigma": 5.2,
        "seconds": 1176.0,
        "trials": [{}, {}],
    }
    assert "(5.2 σ below the runner-up, 1176 s)" in sector_search_text(json.dumps(kept))
    for settled, said in ((False, ", not settled, "), (True, "runner-up, 1176")):
        assert said in sector_search_text(json.dumps({**kept, "settled": settled}))
    prior = {"chosen": {"sign_prior": "stripes_x"}, "margin_sigma": 32.9, "seconds": 643.0}
    text = sign_prior_search_text(json.dumps({**prior, "trials": [{}] * 4, "settled": False}))
    assert "stripes_x out of 4 candidates (32.9 σ below the runner-up, not settled" in text


def test_a_trial_takes_half_the_samples_and_float32_local_energies_unless_the_config_says(
    tmp_path,
):
    (sector,) = [s for s in candidates(Lattice((6,)), spin_flip=True) if s.spin_flip == -1][:1]
    sampled = {"n_samples": 256, "n_chains": 32, "n_discard": 2}
    config = from_dict(_ring_config(tmp_path, 6, sampler=sampled))
    trial = trial_config(config, sector)
    assert trial.sampler.local_energy_dtype == "float32"
    # half the samples a step, a multiple of the chains, one a chain at least
    assert trial.sampler.n_samples == 128 and trial.sampler.n_chains == 32
    few = from_dict(_ring_config(tmp_path, 6, sampler={**sampled, "n_samples": 32}))
    assert trial_config(few, sector).sampler.n_samples == 32
    odd = from_dict(_ring_config(tmp_path, 6, sampler={**sampled, "n_samples": 96}))
    assert trial_config(odd, sector).sampler.n_samples == 32
    assert trial.model.symmetrize == "space_group" and trial.budget is None
    written = from_dict(
        _ring_config(tmp_path, 6, sampler={**sampled, "local_energy_dtype": "float64"})
    )
    assert trial_config(written, sector).sampler.local_energy_dtype == "float64"
    summed = trial_config(from_dict(_ring_config(tmp_path, 6)), sector)  # a full sum: none
    assert summed.sampler.local_energy_dtype is None


@pytest.mark.parametrize(
    ("lattice", "total_sz", "momentum", "prior"),
    [
        ({"kind": "kagome", "shape": [2, 3]}, 0, [1, 0], "stripes_x"),  # 9 up spins
        ({"kind": "kagome", "shape": [2, 3]}, 0, [0, 0], "none"),
        ({"kind": "kagome", "shape": [2, 3]}, 0, [0, 1], "none"),  # 2π/3: no stripes carry it
        ({"kind": "kagome", "shape": [2, 3]}, 0, [1, 1], "none"),  # (π, 2π/3): only in part
        ({"kind": "kagome", "shape": [2, 2]}, 1, [1, 1], "stripes_xy"),  # 7 up spins
        ({"kind": "kagome", "shape": [2, 2]}, 1, [0, 1], "stripes_y"),
        ({"shape": [6]}, 0, [3], "stripes_x"),  # 3 up spins
        ({"shape": [8]}, 0, [4], "none"),  # 4 up spins: the stripes' sign is even under shifts
        ({"shape": [6]}, 1, [3], "none"),  # 4 up spins
    ],
)
def test_a_trial_carries_the_stripes_whose_shifts_give_its_momentum(
    tmp_path, lattice, total_sz, momentum, prior
):
    data = _ring_config(tmp_path, None, lattice={**lattice, "pbc": True})
    data["hamiltonian"]["total_sz"] = total_sz
    config = from_dict(data)
    sector = Sector(tuple(momentum), (1,), 0)
    assert momentum_prior(config, sector) == prior
    assert trial_config(config, sector).model.sign_prior == prior
    if prior == "none":
        return
    # the prior's sign times a constant is a state of that momentum: ψ(T_t x) = e^{ik·a_t} ψ(x)
    # for every translation (an odd number of up spins moves between marked and unmarked)
    trial = trial_config(config, sector)
    hamiltonian = build_hamiltonian(trial)
    lat = hamiltonian.lattice
    marked = sign_prior_sites(trial.model, lat, hamiltonian.hilbert)
    phases = np.exp(1j * lat.translation_phases(momentum))
    rng = np.random.default_rng(0)
    n_up = round(lat.n_sites / 2 + total_sz)
    for _ in range(5):
        up = np.zeros(lat.n_sites, dtype=bool)
        up[rng.choice(lat.n_sites, n_up, replace=False)] = True
        sign = (-1) ** int(np.sum(up & marked))
        shifted = [(-1) ** int(np.sum(up[perm] & marked)) for perm in lat.translations]
        np.testing.assert_allclose(shifted, phases * sign, atol=1e-12)


def test_a_written_sign_prior_is_the_trials_own(tmp_path):
    data = _ring_config(tmp_path, 6)
    data["model"]["sign_prior"] = "stripes_x"
    config = from_dict(data)
    for sector in candidates(Lattice((6,)), spin_flip=True):
        if sector.spin_flip == -1:  # the singlet's (the other is refused)
            assert trial_config(config, sector).model.sign_prior == "stripes_x"
    # a positive ψ has no sign to carry
    data["model"].update(sign_prior="none", positive=True)
    data["hamiltonian"].update(J1=-1.0)  # a ferromagnet: positive in the S^z basis
    assert momentum_prior(from_dict(data), Sector((3,), (1, 1), 0)) == "none"


@pytest.mark.usefixtures("single_thread")
def test_a_timed_search_keeps_to_its_seconds(tmp_path):
    config = from_dict(_ring_config(tmp_path, 6))
    start = time.perf_counter()
    # 50 steps a round at least, which 4 s can hold here (the default 100 take ~5 s)
    found = search(config, seconds=4.0, first_steps=50)
    took = time.perf_counter() - start
    # building the candidates comes first; the rounds share what is left, a step at least
    assert took <= 4.0 * 1.25 and found.seconds == pytest.approx(took, rel=0.05)
    assert found.chosen.momentum == (3,)


def test_the_command_prints_its_choice_and_eds_check(tmp_path, capsys):
    path = write_config(tmp_path / "ring6.yaml", _ring_config(tmp_path, 6))
    code, out, err = run_main(capsys, "sectors", path, "--first-steps", "50", "--json")
    assert code == 0, err
    assert "chosen  k=[3] chi=++ flip -1" in out and ": agrees" in out
    assert "settled: no candidate was dropped while still falling" in out
    # as a config takes it
    assert "model.sector: {momentum: [3], point_characters: [1, 1], spin_flip: -1}" in out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["chosen"] == {"momentum": [3], "point_characters": [1, 1], "spin_flip": -1}
    assert data["ed_agrees"] is True and data["settled"] is True
    # the winner's short run extrapolated to zero variance: its sector's lowest level, ED's
    winner = data["trials"][0]
    config = from_dict(_ring_config(tmp_path, 6))
    e0 = exact.ground_state(build_hamiltonian(config), use_cache=False).energy
    assert winner["variance"] < 1e-6 and abs(winner["zero_variance"] - e0) < 1e-6  # 2e-11
    # every step of the race is kept, and the score is read off it
    for row in data["trials"]:
        n = row["steps"]
        assert len(row["energies"]) == len(row["variances"]) == n
        if n:
            assert np.mean(row["energies"][-max(3, n // 4) :]) == pytest.approx(row["energy"])
    code, _, err = run_main(capsys, "sectors", path, "--seconds", "0")
    assert_one_line_error(code, err, "--seconds=0")


@pytest.mark.usefixtures("single_thread")
def test_a_run_searches_its_sector_within_its_budget_and_resumes_there(tmp_path, capsys):
    data = _ring_config(tmp_path, 6, sampler={"n_samples": 256, "n_chains": 32, "n_discard": 2})
    data["model"]["sector"] = "search"
    data["budget"] = 20.0  # the search's 100-step rounds take ~11-13 s of it
    del data["final"]["n_samples"]  # optimizer holds lr alone: the budget ends the steps
    path = write_config(tmp_path / "ring6.yaml", data)
    code, out, err = run_main(capsys, "run", path, "--quiet", "--json")
    assert code == 0, err
    assert "sector search chose k=[3] chi=++ flip -1" in err
    assert "; settled: no candidate was dropped while still falling" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["seconds"] <= 20.0 * 1.05
    assert abs(summary["relative_error"]) < 1e-3  # trained in the ground state's sector
    record = results.read_results(summary["results_file"])
    stored = stored_config(record)["model"]
    assert stored["sector"] == {"momentum": [3], "point_characters": [1, 1], "spin_flip": -1}
    assert stored["sign_prior"] == "stripes_x"  # as the winner's trial: k = π with 3 up spins
    # the steps went on as the trial ran: over the space group, at half the samples
    assert stored["symmetrize"] == "space_group"
    assert stored_config(record)["sampler"]["n_samples"] == 128
    assert len(record.history) > 0
    assert "the steps go on as its trial ran: averaged over the space group, 128 samples" in err
    kept = json.loads(record.sector_search)
    priors = {row["candidate"]: row["sign_prior"] for row in kept["trials"]}
    assert priors["k=[3] chi=++ flip -1"] == "stripes_x"
    assert priors["k=[0] chi=++ flip -1"] == "none"
    flip_refused = [row for row in kept["trials"] if "projects out" in row["refused"]]
    assert len(flip_refused) == 6 and all(row["sign_prior"] is None for row in flip_refused)
    assert kept["chosen"] == {"momentum": [3], "point_characters": [1, 1], "spin_flip": -1}
    assert len(kept["trials"]) == 12
    assert kept["settled"] == all(not row["unsettled"] for row in kept["trials"])
    code, out, _ = run_main(capsys, "report", summary["results_file"])
    assert "sector search: momentum [3]" in out

    # a larger budget goes on in the sector found, without searching again
    data["budget"] = 24.0
    write_config(path, data)
    code, _, err = run_main(capsys, "run", path, "--resume", "--quiet")
    assert code == 0, err
    assert "sector search chose" not in err
    after = results.read_results(summary["results_file"])
    assert len(after.history) > len(record.history)
    assert after.sector_search == record.sector_search
    assert stored_config(after)["model"]["sign_prior"] == "stripes_x"
    assert stored_config(after)["sampler"]["n_samples"] == 128


def test_a_searched_sector_cannot_also_be_given(tmp_path, capsys):
    # one value: a config that searches and gives a momentum in the keys of before issue 51
    # is told the two values it may mean
    data = _ring_config(tmp_path, 6)
    data["model"].update(sector="search", momentum=[3])
    path = write_config(tmp_path / "ring6.yaml", data)
    code, _, err = run_main(capsys, "run", path, "--quiet")
    assert_one_line_error(
        code, err, "write model.sector: search (the run finds it) or model.sector: {momentum: [3]}"
    )


def test_a_search_given_too_little_time_says_how_long_it_needs(tmp_path, capsys):
    # 50 steps a round at least: 0.05 s cannot hold them, and the search says so, then
    # takes them (and still finds the sector)
    path = write_config(tmp_path / "ring6.yaml", _ring_config(tmp_path, 6))
    code, out, err = run_main(capsys, "sectors", path, "--seconds", "0.05")
    assert code == 0, err
    assert "sector search: 4 candidates at" in err and "more than the 0.05 s given it" in err
    assert "chosen  k=[3] chi=++ flip -1" in out


# the exact levels' two paths: a sector small enough for the dense projection, and Lanczos
_LEVEL_LATTICES = [
    {"shape": [8], "pbc": True},  # 70 states: the dense path
    {"kind": "kagome", "shape": [2, 2], "pbc": True},  # 924 states: Lanczos
]


@pytest.mark.parametrize("lattice", _LEVEL_LATTICES, ids=["J1-J2 ring 8", "kagome 2x2"])
def test_each_candidate_sectors_exact_level_is_an_eigenvalue_and_eds_sector_holds_e0(
    tmp_path, lattice
):
    config = from_dict(_ring_config(tmp_path, None, j2=0.7, lattice=lattice))
    hamiltonian = build_hamiltonian(config)
    matrix = hamiltonian.to_sparse().toarray()
    spectrum = np.linalg.eigvalsh(matrix)
    e0 = spectrum[0]
    ground = ground_state_sector(hamiltonian, np.linalg.eigh(matrix)[1][:, 0])
    levels = exact_levels(config)
    assert len(levels) == len(candidates(hamiltonian.lattice, spin_flip=True))
    found = [lowest[0] for _, lowest in levels if lowest]
    assert min(found) == pytest.approx(e0, abs=1e-9)
    for sector, lowest in levels:
        if not lowest:
            continue
        (level,) = lowest
        assert np.min(np.abs(spectrum - level)) < 1e-9, sector.label()  # a level of H
        assert level > e0 - 1e-9
        if same_sector(hamiltonian.lattice, sector, ground):
            assert level == pytest.approx(e0, abs=1e-9)
        else:  # a ground state that is not degenerate lies in one sector only
            assert level > e0 + 1e-6, sector.label()


@pytest.mark.parametrize("lattice", _LEVEL_LATTICES, ids=["J1-J2 ring 8", "kagome 2x2"])
def test_each_sectors_next_levels_are_those_of_h_restricted_to_the_sector(tmp_path, lattice):
    config = from_dict(_ring_config(tmp_path, None, j2=0.7, lattice=lattice))
    hamiltonian = build_hamiltonian(config)
    matrix = hamiltonian.to_sparse().toarray()
    states = hamiltonian.hilbert.all_states()
    flipped = hamiltonian.hilbert.state_index(-states)
    for sector, levels in exact_levels(config, n_levels=3):
        group, chi = little_space_group(
            hamiltonian.lattice, list(sector.momentum), list(sector.point_characters)
        )
        # the sector's projector as a dense matrix, and H on an orthonormal basis of its range
        projector = np.zeros(matrix.shape, dtype=complex)
        for perm, character in zip(np.asarray(group), chi, strict=True):
            image = hamiltonian.hilbert.state_index(states[:, perm])  # (g v)[i] = v[image[i]]
            projector[np.arange(len(states)), image] += np.conj(character) / len(group)
        projector = (projector + sector.spin_flip * projector[:, flipped]) / 2
        weights, vectors = np.linalg.eigh((projector + projector.conj().T) / 2)
        basis = vectors[:, weights > 0.5]
        exact_levels_there = np.linalg.eigvalsh(basis.conj().T @ matrix @ basis)[:3]
        assert len(levels) == len(exact_levels_there), sector.label()
        np.testing.assert_allclose(levels, exact_levels_there, atol=1e-8, err_msg=sector.label())


def test_ed_prints_each_candidate_sectors_lowest_level(tmp_path, capsys):
    path = write_config(tmp_path / "ring6.yaml", _ring_config(tmp_path, 6))
    code, out, err = run_main(capsys, "ed", path, "--sectors", "--json")
    assert code == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    rows = {row["sector"]: row["energy"] for row in data["sector_levels"]}
    assert rows["k=[3] chi=++ flip -1"] == pytest.approx(data["energy"], abs=1e-10)
    assert "k=[3] chi=++ flip -1" in out and "above E_0" in out
    # the next levels too: the ground state's sector holds a second level above it
    code, out, err = run_main(capsys, "ed", path, "--sectors", "--levels", "2", "--json")
    assert code == 0, err
    assert "next levels above E_0" in out
    data = json.loads(out.strip().splitlines()[-1])
    row = {row["sector"]: row for row in data["sector_levels"]}["k=[3] chi=++ flip -1"]
    assert row["levels"][0] == pytest.approx(data["energy"], abs=1e-10) == row["energy"]
    assert len(row["levels"]) == 2 and row["levels"][1] > row["levels"][0] + 1e-6
    code, _, err = run_main(capsys, "ed", path, "--sectors", "--levels", "0")
    assert_one_line_error(code, err, "--levels=0")
    code, _, err = run_main(capsys, "ed", path, "--levels", "3")
    assert_one_line_error(code, err, "add --sectors")


def test_exact_levels_refuse_a_sector_above_exact_max_dim(tmp_path):
    data = _ring_config(tmp_path, 8)
    data["exact"] = {"max_dim": 10}  # the ring of 8 at S^z = 0 has 70 states
    with pytest.raises(exact.SectorTooLargeError, match="max_dim=10"):
        exact_levels(from_dict(data))
