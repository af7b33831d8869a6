"""model.sign_prior: search (issue 52): the run races short runs of every sign prior the
lattice takes, keeps the one whose energy gets lowest, trains on with it, and keeps the race
in its results file."""

import json

import pytest
from helpers import assert_one_line_error, run_main, tiny_heisenberg, write_config

from vitqs import results
from vitqs.build import build_hamiltonian
from vitqs.checkpoint import stored_config
from vitqs.config import from_dict
from vitqs.physics import exact
from vitqs.sector_search import search_sign_prior


def _square_4x2(tmp_path, **model) -> dict:
    """The Heisenberg square 4x2 without the sign rule (70 states, summed exactly): a prior
    along x carries the Marshall sign, `none` leaves the network every sign to learn."""
    data = tiny_heisenberg(tmp_path / "out")
    data["lattice"] = {"shape": [4, 2], "pbc": True}
    data["hamiltonian"] = {"kind": "heisenberg", "J1": 1.0}
    data["model"].update({"patch_size": 2, **model})
    data["sampler"] = {"kind": "full_sum"}
    data["optimizer"] = {"lr": 0.05}
    return data


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("seed", [2, 3])
def test_the_race_keeps_a_prior_that_reaches_the_ground_state_and_drops_none_first(tmp_path, seed):
    config = from_dict({**_square_4x2(tmp_path), "seed": seed})
    found = search_sign_prior(config, first_steps=30)
    rows = {row["candidate"]: row for row in found.rows()}
    assert set(rows) == {
        f"sign_prior={p}" for p in ("none", "stripes_x", "stripes_y", "stripes_xy")
    }
    e0 = exact.ground_state(build_hamiltonian(config), use_cache=False).energy
    winner = rows[found.chosen.label()]
    assert found.chosen.name != "none" and winner["rounds"] == 2
    assert abs(winner["energy"] - e0) < 1e-4 * abs(e0)
    # without a prior the network learns the signs slowest: out after the first round
    assert rows["sign_prior=none"]["rounds"] == 1
    assert rows["sign_prior=none"]["energy"] > winner["energy"] + 0.1
    # the winner is the lowest of the last round
    last = [row for row in found.rows() if row["rounds"] == 2]
    assert winner["energy"] == min(row["energy"] for row in last)


def test_priors_the_lattice_refuses_are_left_out_with_its_reason(tmp_path):
    data = _square_4x2(tmp_path, patch_size=1)
    data["lattice"] = {"kind": "triangular", "shape": [4, 3], "pbc": True}
    found = search_sign_prior(from_dict(data), first_steps=3)
    refused = {row["candidate"]: row["refused"] for row in found.rows() if row["refused"]}
    assert set(refused) == {"sign_prior=stripes_y", "sign_prior=stripes_xy"}
    assert all("periodic extent 3 is odd" in why for why in refused.values())
    assert found.chosen.name in ("none", "stripes_x")


@pytest.mark.usefixtures("single_thread")
def test_a_run_races_the_priors_keeps_the_race_and_resumes_with_its_choice(tmp_path, capsys):
    data = _square_4x2(tmp_path, sign_prior="search")
    data["budget"] = 10.0
    del data["final"]["n_samples"]
    path = write_config(tmp_path / "square.yaml", data)
    code, out, err = run_main(capsys, "run", path, "--quiet", "--json")
    assert code == 0, err
    assert "sign prior search chose" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["seconds"] <= 10.0 * 1.05
    record = results.read_results(summary["results_file"])
    kept = json.loads(record.sign_prior_search)
    chosen = kept["chosen"]["sign_prior"]
    assert stored_config(record)["model"]["sign_prior"] == chosen != "search"
    assert len(kept["trials"]) == 4 and kept["trials"][0]["candidate"] == f"sign_prior={chosen}"
    assert abs(summary["relative_error"]) < 1e-3
    code, out, _ = run_main(capsys, "report", summary["results_file"])
    assert f"sign prior search: {chosen} out of 4 candidates" in out

    data["budget"] = 13.0  # a resume goes on with the prior found, without racing again
    write_config(path, data)
    code, _, err = run_main(capsys, "run", path, "--resume", "--quiet")
    assert code == 0, err
    assert "sign prior search chose" not in err
    after = results.read_results(summary["results_file"])
    assert len(after.history) > len(record.history)
    assert after.sign_prior_search == record.sign_prior_search


def test_the_command_races_the_priors_alone(tmp_path, capsys):
    path = write_config(tmp_path / "square.yaml", _square_4x2(tmp_path))
    code, out, err = run_main(
        capsys, "sectors", path, "--sign-prior", "--first-steps", "5", "--json"
    )
    assert code == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    assert f"chosen  sign_prior={data['chosen']['sign_prior']}" in out
    assert f"model.sign_prior: {data['chosen']['sign_prior']}" in out  # as a config takes it
    assert len(data["trials"]) == 4 and data["ed_agrees"] is None


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ({"sign_prior": "search", "sector": "search", "patch_size": 1}, "model.sector=search"),
        ({"sign_prior": "search", "init_from": "earlier.h5"}, "model.init_from"),
    ],
)
def test_a_prior_search_with_another_start_is_refused(tmp_path, capsys, model, named):
    data = _square_4x2(tmp_path)
    data["model"].update(model)
    path = write_config(tmp_path / "square.yaml", data)
    code, _, err = run_main(capsys, "run", path, "--quiet")
    assert_one_line_error(code, err, "model.sign_prior", named)
