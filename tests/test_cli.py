"""The ``vitqs`` command line: ``ed`` and ``report`` output, and bad input of every kind
refused with exit code 2, one line on stderr naming the key, and no results file."""

import h5py
import pytest
from helpers import (
    assert_one_line_error,
    last_json,
    run_files,
    run_main,
    tiny_heisenberg,
    vitqs_process,
    write_config,
)

from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import Heisenberg

HEISENBERG_4X4 = {
    "lattice": {"shape": [4, 4], "pbc": True},
    "hamiltonian": {"kind": "heisenberg", "J1": 1.0},
}


def test_ed_json_matches_exact_ground_state_in_a_subprocess(tmp_path):
    path = write_config(tmp_path / "square.yaml", HEISENBERG_4X4)
    process = vitqs_process("ed", path, "--json")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    summary = last_json(out)
    assert {"energy", "energy_per_site", "dimension", "seconds"} <= set(summary)
    reference = exact.ground_state(Heisenberg(Lattice((4, 4)), J1=1.0))
    assert summary["energy"] == pytest.approx(reference.energy, rel=1e-10)
    assert summary["energy_per_site"] == pytest.approx(reference.energy / 16, rel=1e-10)
    assert summary["dimension"] == reference.dimension == 12870


def test_ed_set_overrides_scale_the_energy(tmp_path, capsys):
    path = write_config(tmp_path / "square.yaml", HEISENBERG_4X4)
    code, out, err = run_main(capsys, "ed", path, "--json")
    assert code == 0, err
    energy = last_json(out)["energy"]
    code, out, err = run_main(capsys, "ed", path, "--json", "--set", "hamiltonian.J1=2")
    assert code == 0, err
    assert last_json(out)["energy"] == pytest.approx(2 * energy, rel=1e-10)  # E(2J) = 2E(J)


@pytest.mark.parametrize(
    "length, momentum, spin_flip", [(6, [3], -1), (8, [0], 1)], ids=["ring6", "ring8"]
)
def test_ed_reports_the_ground_state_sector(tmp_path, capsys, length, momentum, spin_flip):
    # the Heisenberg ring without the sign rule: ground state at k = π and odd under spin
    # inversion when L/2 is odd, at k = 0 and even when it is even (Marshall, Lieb-Mattis)
    data = {
        "lattice": {"shape": [length], "pbc": True},
        "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "sign_rule": False},
    }
    code, out, err = run_main(capsys, "ed", write_config(tmp_path / "ring.yaml", data), "--json")
    assert code == 0, err
    sector = last_json(out)["sector"]
    assert sector == {
        "momentum": momentum,
        "spin_flip": spin_flip,
        "space_group_symmetric": True if momentum == [0] else None,
        # even under the reflection about a site, the little group's other element at k = 0
        # and at k = π alike
        "point_characters": [1, 1],
    }
    assert f"momentum {momentum}" in out and f"spin inversion {spin_flip:+d}" in out


def test_the_sector_ed_prints_is_one_a_model_takes(tmp_path, capsys):
    # `vitqs ed` prints the ground state's sector as model.sector takes it: given to a ViT
    # averaged over the ring of 6's space group, the projection holds the exact ground state
    # (k = π, odd under spin inversion); the same at k = 0 does not
    import yaml

    from vitqs.build import (
        build_hamiltonian,
        build_network,
        exact_ground_state,
        ground_state_outside,
    )
    from vitqs.config import from_dict

    data = {
        "lattice": {"shape": [6], "pbc": True},
        "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "sign_rule": False},
    }
    code, out, err = run_main(capsys, "ed", write_config(tmp_path / "ring.yaml", data))
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.strip().startswith("model.sector"))
    sector = yaml.safe_load(line.split(None, 1)[1])
    assert sector == {"momentum": [3], "point_characters": [1, 1], "spin_flip": -1}
    for momentum, inside in (([3], True), ([0], False)):
        model = {"patch_size": 1, "translation_invariant": False, "symmetrize": "space_group"}
        config = from_dict({**data, "model": {**model, "sector": {**sector, "momentum": momentum}}})
        hamiltonian = build_hamiltonian(config)
        vector = exact_ground_state(config, hamiltonian, return_vector=True).vector
        outside = ground_state_outside(hamiltonian, build_network(config, hamiltonian), vector)
        assert (outside is None) == inside, outside


def _ring6_run(tmp_path, **model):
    data = tiny_heisenberg(tmp_path / "out", final={"n_samples": 64, "symmetrize": "translations"})
    data["hamiltonian"]["sign_rule"] = False
    data["model"].update(model)
    data["optimizer"]["n_iter"] = 1
    return write_config(tmp_path / "ring6.yaml", data)


def test_a_run_warns_when_its_sector_holds_no_ground_state(tmp_path, capsys):
    # the 6-site ring's ground state is at k = π: a final k = 0 projection cannot reach it
    code, _, err = run_main(capsys, "run", _ring6_run(tmp_path), "--quiet")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1, err
    assert "final.symmetrize" in warnings[0] and "momentum [3]" in warnings[0]
    assert "shift by [1] cells the ground state takes the factor -1, ψ +1" in warnings[0]
    # the same run at k = π (patches of 2: their shifts have phase 1) is not warned about
    code, _, err = run_main(
        capsys, "run", _ring6_run(tmp_path, sector={"momentum": [3]}), "--quiet", "--overwrite"
    )
    assert code == 0, err
    assert "warning" not in err


def _mutated(tmp_path, mutate):
    data = tiny_heisenberg(tmp_path / "out")
    mutate(data)
    return write_config(tmp_path / "bad.yaml", data)


def _bose_hubbard(**values):
    return lambda d: d.update(hamiltonian={"kind": "bose_hubbard", "n_particles": 4, **values})


# name: (mutation of the tiny config, the key the message must name)
BAD_CONFIGS = {
    "unknown_key": (lambda d: d["sampler"].update(n_chain=4), "did you mean 'sampler.n_chains'"),
    "wrong_type": (lambda d: d["optimizer"].update(n_iter="ten"), "optimizer.n_iter"),
    "no_lattice": (lambda d: d.pop("lattice"), "lattice"),
    "no_hamiltonian": (lambda d: d.pop("hamiltonian"), "hamiltonian"),
    "zero_size": (lambda d: d["lattice"].update(shape=[0]), "lattice.shape"),
    "negative_chains": (lambda d: d["sampler"].update(n_chains=-16), "sampler.n_chains"),
    "total_sz": (lambda d: d["hamiltonian"].update(total_sz=0.5), "hamiltonian.total_sz"),
    "n_particles": (_bose_hubbard(n_particles=-1), "hamiltonian.n_particles"),
    "n_max": (_bose_hubbard(n_max=0), "hamiltonian.n_max"),
    "sign_rule": (
        lambda d: d.update(
            lattice={"shape": [3, 3]},
            hamiltonian={"kind": "heisenberg", "sign_rule": True, "total_sz": 0.5},
        ),
        "sign_rule",
    ),
    "schedule": (lambda d: d["optimizer"].update(lr={"schedule": "cosine"}), "optimizer.lr"),
    "retired": (lambda d: d["sampler"].update(rule="hop"), "sampler.rule"),
    # values that once ended in a traceback (torch's C int, timedelta's range, int("²"))
    "threads": (lambda d: d.update(threads=2**53), "threads"),
    "timeout": (lambda d: d.update(distributed={"timeout": 1e300}), "distributed.timeout"),
    "device": (lambda d: d.update(device="cuda:\u00b2"), "device"),
}
# errors found only while building the model or sampler, which `vitqs ed` does not do
BAD_FOR_RUN = {
    "patch": (lambda d: d["model"].update(patch_size=4), "model.patch_size"),
    "patch_axes": (lambda d: d["model"].update(patch_size=[2, 2]), "model.patch_size"),
    "heads": (lambda d: d["model"].update(heads=3), "model.heads"),
    "chains": (lambda d: d["sampler"].update(n_chains=5), "sampler.n_chains"),
    "max_dim": (lambda d: d.update(exact={"enabled": True, "max_dim": 10}), "exact.max_dim"),
    # refused before allocation: it once allocated until the machine ran out of memory
    "layers": (lambda d: d["model"].update(layers=10**9), "model.layers"),
    "d_model": (lambda d: d["model"].update(d_model=10**8, heads=2), "model.d_model"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("command", ["ed", "run"])
def test_bad_config_exits_2_with_one_line(command, case, tmp_path, capsys):
    mutate, key = BAD_CONFIGS[case]
    code, out, err = run_main(capsys, command, _mutated(tmp_path, mutate), "--json")
    assert_one_line_error(code, err, key)
    assert run_files(tmp_path) == []
    # under --json a script reads why there is no result off the last stdout line
    assert last_json(out) == {"error": err.strip().split(": error: ", 1)[1], "exit_code": 2}


@pytest.mark.parametrize("case", sorted(BAD_FOR_RUN))
def test_bad_run_config_leaves_no_results_file(case, tmp_path, capsys):
    mutate, key = BAD_FOR_RUN[case]
    code, _, err = run_main(capsys, "run", _mutated(tmp_path, mutate), "--quiet")
    assert_one_line_error(code, err, key)
    assert run_files(tmp_path) == []


@pytest.mark.parametrize("value", ["[" * 40 + "]" * 40, "{a: " * 5000 + "1" + "}" * 5000])
@pytest.mark.parametrize("command", ["ed", "run"])
def test_a_deeply_nested_value_is_one_line_and_short(command, value, tmp_path, capsys):
    # 5,000 levels overflowed PyYAML's recursive composer: a RecursionError traceback
    config = write_config(tmp_path / "tiny.yaml", tiny_heisenberg(tmp_path / "out"))
    code, _, err = run_main(capsys, command, config, "--set", f"model.d_model={value}")
    assert_one_line_error(code, err, "--set", "nests deeper than 32")
    assert len(err) < 300
    nested = tmp_path / "nested.yaml"
    nested.write_text("".join(f"{'  ' * i}k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n")
    code, _, err = run_main(capsys, command, nested)
    assert_one_line_error(code, err, "nested.yaml", "nests deeper than 32")


def test_ed_refuses_a_sector_over_max_dim(tmp_path, capsys):
    path = write_config(tmp_path / "square.yaml", {**HEISENBERG_4X4, "exact": {"max_dim": 1000}})
    code, _, err = run_main(capsys, "ed", path)
    assert_one_line_error(code, err, "exact.max_dim")


@pytest.mark.parametrize("command", ["ed", "run"])
def test_bad_files_and_arguments_exit_2(command, tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("lattice: {shape: [4]\nhamiltonian: [\n")
    listing = tmp_path / "list.yaml"
    listing.write_text("- lattice: {shape: [4]}\n")
    good = write_config(tmp_path / "good.yaml", tiny_heisenberg(tmp_path / "out"))
    for argv, text in [
        ((broken,), "broken.yaml"),
        ((tmp_path / "missing.yaml",), "missing.yaml"),
        ((listing,), "mapping"),
        ((good, "--set", "hamiltonian.J1"), "hamiltonian.J1"),
        ((good, "--set", "model.d_model=[1"), "model.d_model"),
        ((good, "--set", "hamiltonian.J1=x"), "hamiltonian.J1"),
    ]:
        code, _, err = run_main(capsys, command, *argv)
        assert_one_line_error(code, err, text)
    assert run_files(tmp_path) == []


def test_resume_and_overwrite_exclude_each_other(tmp_path, capsys):
    good = write_config(tmp_path / "good.yaml", tiny_heisenberg(tmp_path / "out"))
    code, _, err = run_main(capsys, "run", good, "--resume", "--overwrite")
    assert_one_line_error(code, err, "--resume")


def test_bad_config_in_a_subprocess_prints_no_traceback(tmp_path):
    path = _mutated(tmp_path, lambda d: d["model"].update(heads=3))
    process = vitqs_process("run", path, "--quiet")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 2
    assert_one_line_error(process.returncode, err, "model.heads")
    assert run_files(tmp_path) == []


def test_report_refuses_a_missing_path_and_a_foreign_file(tmp_path, capsys):
    code, _, err = run_main(capsys, "report", tmp_path / "nothing")
    assert_one_line_error(code, err, "nothing")
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2, 3]
    code, _, err = run_main(capsys, "report", foreign)
    assert_one_line_error(code, err, "not a vitqs results file")


def test_run_text_without_a_relative_error():
    # an exact energy of 0 (no particles) has no relative error: the summary must still print
    from vitqs.cli import _run_text

    summary = {
        "name": "empty",
        "n_iter": 1,
        "n_params": 10,
        "seconds": 1.0,
        "seconds_per_iter": float("nan"),
        "energy": 0.0,
        "energy_error": 0.0,
        "variance": 0.0,
        "v_score": float("nan"),
        "exact_energy": 0.0,
        "relative_error": None,
        "results_file": "empty.h5",
    }
    text = _run_text(summary)
    assert "exact energy" in text and "relative error" not in text
