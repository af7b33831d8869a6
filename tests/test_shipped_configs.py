"""Every config under ``configs/`` loads and builds, and those small enough to diagonalize
train and measure ψ in the symmetry sector of their exact ground state (the kagome 2×3's
config once projected on k = 0 while its ground state is at k = (π, 0)), or, searching for
it, try that sector among their candidates."""

from pathlib import Path

import pytest
import yaml

from vitqs.build import (
    build_hamiltonian,
    build_network,
    exact_ground_state,
    final_network,
    ground_state_outside,
)
from vitqs.config import FIXED_SIGN_PRIORS, ConfigError, load
from vitqs.models.sectors import same_sector
from vitqs.physics.symmetry import ground_state_sector
from vitqs.sector_search import SignPrior, candidates_of, prior_config, trial_config
from vitqs.sweep import load_sweep, point_configs

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))
# sectors up to this size are diagonalized here (a few seconds each)
_MAX_DIM = 60_000


def _is_sweep(path: Path) -> bool:
    return "sweep" in yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_a_shipped_config_loads_and_builds(path):
    configs = [c for _, c in point_configs(load_sweep(path))] if _is_sweep(path) else [load(path)]
    assert configs
    for config in configs[:2]:
        hamiltonian = build_hamiltonian(config)
        if config.model.sign_prior == "search":  # the run races the priors: each one builds
            # or is refused by the lattice, and at least one builds
            built = []
            for name in FIXED_SIGN_PRIORS:
                try:
                    built.append(build_network(prior_config(config, SignPrior(name)), hamiltonian))
                except ConfigError as err:
                    assert "periodic extent" in str(err), err
            assert built
            continue
        model = build_network(config, hamiltonian)
        assert sum(p.numel() for p in model.parameters()) > 0


SMALL = [
    p
    for p in CONFIGS
    if not _is_sweep(p) and build_hamiltonian(load(p)).hilbert.dimension <= _MAX_DIM
]


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_a_shipped_config_can_reach_its_exact_ground_state(path, tmp_path):
    config = load(path)
    hamiltonian = build_hamiltonian(config)
    solved = exact_ground_state(config, hamiltonian, return_vector=True, use_cache=False)
    if solved is None:
        pytest.skip("exact.enabled: false")
    if config.model.sector == "search":  # the sector is found as the run starts: one of
        # the candidates it tries is the ground state's, and the network can carry it
        # (whether the search picks it: tests/test_sector_search.py, tests/test_recipes.py)
        exact = ground_state_sector(hamiltonian, solved.vector)
        (sector,) = [s for s in candidates_of(config) if same_sector(hamiltonian.lattice, s, exact)]
        config = trial_config(config, sector)
    model = build_network(config, hamiltonian)
    assert ground_state_outside(hamiltonian, model, solved.vector) is None
    measured = final_network(config, model, hamiltonian.lattice)
    assert ground_state_outside(hamiltonian, measured, solved.vector) is None
