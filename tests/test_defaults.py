"""The Python API and the YAML give the same defaults for every option (issue 28).

A config read from YAML that names only what is required, the sections made in Python with
nothing given, and the constructors of the objects those options reach, called without the
option, must agree field by field. A default written in two places that drifts apart (the
optimizer's lr was 0.01 in YAML and 0.02 in Python) fails here. A section left out is its
problem's recipe (`vitqs.recipes`), in YAML and in Python alike; a section written empty is
the schema's defaults.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from vitqs import config as cfg
from vitqs.models.symmetrize import final_symmetrized
from vitqs.models.vit import ViT
from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc.driver import VMC
from vitqs.vmc.exact_sampler import ExactSampler
from vitqs.vmc.sampler import MetropolisSampler
from vitqs.yamlfile import parse_yaml

MINIMAL_YAML = """
lattice: {shape: [4]}
hamiltonian: {kind: heisenberg}
"""
# every section written, and empty: the schema's defaults
EMPTY_SECTIONS = MINIMAL_YAML + "model: {}\nsampler: {}\noptimizer: {}\nfinal: {}\n"
MINIMAL_BOSONS = {
    "lattice": {"shape": [4]},
    "hamiltonian": {"kind": "bose_hubbard", "n_particles": 4},
}


def _defaults(section) -> dict:
    """Returns the default of every field of a section class that has one."""
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(section)
        if not f.metadata.get("required")
    }


def test_sections_made_in_python_equal_the_sections_read_from_yaml():
    system = {"lattice": cfg.LatticeConfig(shape=[4]), "hamiltonian": cfg.HeisenbergConfig()}
    from_yaml = cfg.from_dict(parse_yaml(MINIMAL_YAML))
    assert from_yaml == cfg.Config(**system)  # both the recipe
    written = cfg.from_dict(parse_yaml(EMPTY_SECTIONS))
    sections = {name: cls() for name, cls in cfg._SECTIONS.items() if name != "lattice"}
    assert written == cfg.Config(**system, **sections)
    for name in ("model", "sampler", "optimizer", "exact", "final", "output", "distributed"):
        section = getattr(written, name)
        assert dataclasses.asdict(section) == _defaults(type(section)), name
    recipe = cfg.recipe_sections(from_yaml.lattice, from_yaml.hamiltonian)
    assert {name: getattr(from_yaml, name) for name in recipe} == recipe
    bosons = cfg.from_dict(MINIMAL_BOSONS).hamiltonian
    assert dataclasses.asdict(bosons) == {**_defaults(cfg.BoseHubbardConfig), "n_particles": 4}


# (callable, section, {parameter: field}): every parameter the callable has a default for
# whose option is in the section
CONSTRUCTORS = [
    (
        MetropolisSampler,
        cfg.SamplerConfig,
        {k: k for k in ("n_samples", "n_chains", "n_discard", "machine_pow")},
    ),
    (ExactSampler, cfg.SamplerConfig, {"chunk_size": "chunk_size"}),
    (VMC, cfg.SamplerConfig, {"chunk_size": "chunk_size"}),
    (
        ViT,
        cfg.ModelConfig,
        {
            k: k
            for k in (
                "patch_size",
                "d_model",
                "heads",
                "layers",
                "translation_invariant",
                "embedding",
                "jastrow",
                "positive",
            )
        },
    ),
    (Heisenberg, cfg.HeisenbergConfig, {k: k for k in ("J1", "J2", "sign_rule", "total_sz")}),
    (BoseHubbard, cfg.BoseHubbardConfig, {k: k for k in ("J", "U", "n_max")}),
    (Lattice, cfg.LatticeConfig, {"pbc": "pbc"}),
    (exact.ground_state, cfg.ExactConfig, {"max_dim": "max_dim"}),
    (final_symmetrized, cfg.FinalConfig, {"spin_flip": "spin_flip"}),
]


@pytest.mark.parametrize(
    "function, section, names", CONSTRUCTORS, ids=[c[0].__name__ for c in CONSTRUCTORS]
)
def test_constructors_default_to_the_schema(function, section, names):
    parameters = inspect.signature(function).parameters
    schema = _defaults(section)
    for parameter, name in names.items():
        default = parameters[parameter].default
        assert default is not inspect.Parameter.empty, f"{function.__name__}({parameter}=?)"
        assert default == schema[name], f"{function.__name__}({parameter}={default!r})"


def test_a_loop_made_in_python_optimizes_with_the_yaml_s_optimizer():
    hamiltonian = Heisenberg(Lattice((4,)))
    model = ViT((4,), layers=1)
    vmc = VMC(hamiltonian, model, MetropolisSampler(hamiltonian))
    assert vmc.optimizer == cfg.from_dict(parse_yaml(EMPTY_SECTIONS)).optimizer
    assert vmc.lr(0) == cfg.OptimizerConfig.lr
    assert vmc.diag_shift(0) == cfg.OptimizerConfig.diag_shift
