"""``scripts/gpu_check.py --smoke``: the GPU check's own code on the CPU at toy sizes writes every
row and field the GPU run fills (issue 55), and netket's parameter count of the tutorial ViT."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import gpu_check  # scripts/ is on the tests' path (pyproject's pythonpath)
import pytest

SCRIPT = Path(gpu_check.__file__)
PHASES = ("sampling", "local_energy", "jacobian", "solve", "total")
CHECKS = {
    "cuda_tests",
    "compiled_equals_eager",
    "j1j2_6x6_step",
    "j1j2_6x6_vs_netket",
    "tutorial_10x10_step",
    "tutorial_10x10_vs_netket",
    "tutorial_10x10_vs_published",
}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Returns ``(process, record, out folder)`` of one real ``--smoke`` run (~50 s here)."""
    out = tmp_path_factory.mktemp("gpu_check")
    process = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    return process, json.loads((out / "gpu_check.json").read_text()), out


@pytest.mark.slow
def test_smoke_times_every_phase_of_both_problems_eager_and_compiled(smoke):
    _, record, _ = smoke
    assert record["smoke"] is True and record["n_iter"] >= 1
    for problem in gpu_check.PROBLEMS:
        for mode in ("eager", "compiled", "float32"):
            row = record["parts"][f"{problem}/{mode}"]
            assert row["status"] == "ok", row
            assert row["n_params"] > 0 and row["n_params_netket_shape"] > 0
            assert all(row["seconds"][phase] > 0 for phase in PHASES), row["seconds"]
            assert row["seconds"]["total"] == row["seconds_per_iter"]
            assert row["peak_memory_mib"] > 0 and row["peak_memory_of"]
            assert row["device"] == "cpu"
        compiled = record["parts"][f"{problem}/compiled"]
        assert compiled["compile_seconds"] > 0 and compiled["compile_error"] is None
        counts = record["models"][problem]
        assert counts["n_params_ours"] == row["n_params"] and counts["n_params_netket"] > 0
    # netket's like: the same network, unsymmetrized
    bare, eager = (record["parts"][f"j1j2_6x6/{mode}"] for mode in ("bare", "eager"))
    assert bare["status"] == "ok" and bare["n_params"] == eager["n_params"]
    assert bare["timing"]["seconds"]["local_energy"] > 0


@pytest.mark.slow
def test_smoke_runs_netket_on_the_10x10_toy_or_says_why_not(smoke):
    _, record, _ = smoke
    netket = record["parts"]["tutorial_10x10/netket"]
    if importlib.util.find_spec("netket") is None:
        assert netket["status"] == "skipped" and "netket is not available" in netket["error"]
        return
    assert netket["status"] == "ok", netket
    assert netket["seconds_per_iter"] > 0 and netket["peak_memory_mib"] > 0
    # netket's own count of its model equals the formula the report uses where netket is absent
    assert netket["n_params"] == netket["n_params_netket_shape"]
    skipped = record["parts"]["j1j2_6x6/netket"]
    assert skipped["status"] == "skipped" and "--smoke" in skipped["error"]


@pytest.mark.slow
def test_smoke_checks_compiled_equals_eager_and_reports_the_cuda_tests(smoke):
    _, record, _ = smoke
    equality = record["parts"]["compiled_equals_eager"]
    assert equality["pass"] is True and equality["atol"] == 1e-12
    assert set(equality["models"]) == set(gpu_check.PROBLEMS)
    assert all(model["compiled_ran"] for model in equality["models"].values())
    tests = record["parts"]["tests.cuda"]
    assert tests["tests"] > 0  # the suite has CUDA tests, and the check found them
    if tests["passed"] == 0:
        assert tests["status"] == "skipped" and tests["skipped"] == tests["tests"]
    assert record["parts"]["tests.compiled_vs_eager"]["status"] == "skipped"


@pytest.mark.slow
def test_smoke_states_every_check_and_prints_the_table(smoke):
    process, record, out = smoke
    assert set(record["criteria"]) == CHECKS
    for name, check in record["criteria"].items():
        assert {"value", "limit", "pass"} <= set(check), name
    assert record["criteria"]["tutorial_10x10_step"]["limit"] == 2.0
    assert record["criteria"]["j1j2_6x6_step"]["limit"] == 1.0
    assert record["verdict"] in ("pass", "fail", "incomplete")
    assert {"device", "torch", "cuda", "machine"} <= set(record["environment"])
    table = (out / "gpu_check.md").read_text()
    assert "tutorial_10x10/compiled" in table and "| check |" in table
    assert table.strip() in process.stdout
    assert (out / "gpu_check.log").stat().st_size > 0


def test_netket_count_of_the_tutorial_shape_is_the_published_one():
    # netket's ViT tutorial: 155,620 parameters at 10x10, 4 layers, d_model 60, 10 heads, 2x2
    config = gpu_check.problem_config("tutorial_10x10", smoke=False)
    assert gpu_check.netket_n_params(config) == 155_620


@pytest.mark.slow
@pytest.mark.netket
def test_netket_builds_the_tutorial_vit_with_155620_parameters():
    jax = pytest.importorskip("jax")
    pytest.importorskip("netket")
    import netket_peer

    system = {"lattice": {"shape": [10, 10], "pbc": True}}
    model = netket_peer.make_vit(system, d_model=60, heads=10, layers=4, patch_size=2)
    params = model.init(jax.random.PRNGKey(0), jax.numpy.ones((1, 100)))
    assert sum(leaf.size for leaf in jax.tree_util.tree_leaves(params)) == 155_620


def test_the_compiled_vs_eager_selection_names_tests_that_exist():
    # the GPU run selects them with -k: a renamed test would leave the part with no test
    source = (SCRIPT.parents[1] / gpu_check.COMPILED_TESTS[0]).read_text()
    names = re.findall(r"^def (test_\w+)", source, flags=re.MULTILINE)
    words = gpu_check.COMPILED_TESTS[2].split(" or ")
    assert all(any(word in name for name in names) for word in words), (words, names)
