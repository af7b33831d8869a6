"""The config schema: good configs load, every bad one is a one-line ConfigError naming its key."""

import copy
import dataclasses
import re

import pytest
import yaml
from helpers import (
    run_main,
    tiny_bose_hubbard,
    tiny_heisenberg,
    write_config,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitqs import config as cfg
from vitqs.build import build_hamiltonian, build_network, build_sampler
from vitqs.config import RETIRED_BECAUSE, ConfigError, from_dict, load
from vitqs.yamlfile import apply_overrides


def _dotted_keys() -> set[str]:
    keys = {f.name for f in dataclasses.fields(cfg.Config)}
    sections = dict(cfg._SECTIONS, hamiltonian=cfg.HeisenbergConfig)
    for section, cls in [*sections.items(), ("hamiltonian", cfg.BoseHubbardConfig)]:
        keys |= {f"{section}.{f.name}" for f in dataclasses.fields(cls)}
    return keys


KEYS = _dotted_keys()


def test_good_config_loads_with_defaults_and_name(tmp_path):
    path = write_config(tmp_path / "chain.yaml", tiny_heisenberg(tmp_path))
    path.write_text(path.read_text().replace("name: tiny\n", ""))
    config = load(path)
    assert config.name == "chain"  # the file's stem
    assert config.n_sites == 6
    assert config.model.embedding == "linear"  # a default from the dataclass
    assert isinstance(config.hamiltonian, cfg.HeisenbergConfig)
    assert from_dict(config.to_dict()) == config  # the embedded config reloads to itself


def test_overrides_set_nested_keys_and_parse_yaml(tmp_path):
    data = tiny_heisenberg(tmp_path, model=None)
    data = apply_overrides(data, ["hamiltonian.J1=2", "model.d_model=4", "lattice.shape=[2, 3]"])
    assert data["hamiltonian"]["J1"] == 2
    assert data["model"] == {"d_model": 4}  # an empty section in YAML is None
    assert data["lattice"]["shape"] == [2, 3]


def test_real_accepts_yaml_exponent_strings(tmp_path):
    config = from_dict(tiny_heisenberg(tmp_path, optimizer={"lr": "1e-3"}))
    assert config.optimizer.lr == 1e-3


BAD = {
    # name: (mutation of the tiny config data, text the one-line message must hold)
    "unknown_top": (lambda d: d.update(sampeler={}), "did you mean 'sampler'"),
    "unknown_nested": (lambda d: d["model"].update(d_modle=8), "did you mean 'model.d_model'"),
    "unknown_far": (lambda d: d["model"].update(zzz=1), "model.zzz"),
    "type_int": (lambda d: d["model"].update(d_model="big"), "model.d_model"),
    "type_float_for_int": (lambda d: d["sampler"].update(n_samples=64.5), "sampler.n_samples"),
    "type_bool": (lambda d: d["lattice"].update(pbc="yes"), "lattice.pbc"),
    "pbc_per_axis_count": (lambda d: d["lattice"].update(pbc=[True, False]), "lattice.pbc"),
    "lattice_kind": (lambda d: d["lattice"].update(kind="hexagonal"), "lattice.kind"),
    "shape_of_kind": (lambda d: d["lattice"].update(kind="kagome"), "lattice.shape"),
    "ladder_coupling_off_a_ladder": (
        lambda d: d["hamiltonian"].update(J_rung=0.5),
        "hamiltonian.J_rung",
    ),
    "type_bool_for_int": (lambda d: d["model"].update(layers=True), "model.layers"),
    "type_real": (lambda d: d["hamiltonian"].update(J1=[1]), "hamiltonian.J1"),
    "real_nan": (lambda d: d["hamiltonian"].update(J1=".nan"), "hamiltonian.J1"),
    "real_huge_int": (lambda d: d["hamiltonian"].update(J2=10**400), "hamiltonian.J2"),
    "choice": (lambda d: d["model"].update(embedding="sparse"), "model.embedding"),
    "section_not_mapping": (lambda d: d.update(model=[1, 2]), "model"),
    "no_lattice": (lambda d: d.pop("lattice"), "lattice"),
    "no_hamiltonian": (lambda d: d.pop("hamiltonian"), "hamiltonian"),
    "no_shape": (lambda d: d["lattice"].pop("shape"), "lattice.shape"),
    "no_kind": (lambda d: d["hamiltonian"].pop("kind"), "hamiltonian.kind"),
    "kind_typo": (lambda d: d["hamiltonian"].update(kind="heisenburg"), "did you mean"),
    "kind_unhashable": (lambda d: d["hamiltonian"].update(kind=["heisenberg"]), "hamiltonian.kind"),
    "shape_zero": (lambda d: d["lattice"].update(shape=[0]), "lattice.shape"),
    "shape_negative": (lambda d: d["lattice"].update(shape=[4, -2]), "lattice.shape"),
    "shape_3d": (lambda d: d["lattice"].update(shape=[2, 2, 2]), "lattice.shape"),
    "n_samples_zero": (lambda d: d["sampler"].update(n_samples=0), "sampler.n_samples"),
    "lr_zero": (lambda d: d["optimizer"].update(lr=0), "optimizer.lr"),
    "total_sz_odd": (lambda d: d["hamiltonian"].update(total_sz=0.5), "hamiltonian.total_sz"),
    "total_sz_big": (lambda d: d["hamiltonian"].update(total_sz=4), "hamiltonian.total_sz"),
    "bh_n_negative": (
        lambda d: d.update(hamiltonian={"kind": "bose_hubbard", "n_particles": -1}),
        "hamiltonian.n_particles",
    ),
    "bh_n_max_zero": (
        lambda d: d.update(hamiltonian={"kind": "bose_hubbard", "n_particles": 2, "n_max": 0}),
        "hamiltonian.n_max",
    ),
    "bh_too_many": (
        lambda d: d.update(hamiltonian={"kind": "bose_hubbard", "n_particles": 13, "n_max": 2}),
        "hamiltonian.n_particles",
    ),
    "bh_spin_key": (
        lambda d: d.update(hamiltonian={"kind": "bose_hubbard", "n_particles": 2, "J1": 1}),
        "hamiltonian.J1",
    ),
    "device": (lambda d: d.update(device="gpu"), "device"),
    "seed_negative": (lambda d: d.update(seed=-1), "seed"),
    "seed_huge": (lambda d: d.update(seed=2**70), "seed"),
    "name_path": (lambda d: d.update(name="a/b"), "name"),
    "name_hidden": (lambda d: d.update(name=".x"), "name"),
    "schedule_no_end": (
        lambda d: d["optimizer"].update(lr={"schedule": "exponential", "start": 0.1}),
        "optimizer.lr=",
    ),
    "schedule_kind": (
        lambda d: d["optimizer"].update(lr={"schedule": "linear", "start": 0.1, "end": 0.01}),
        "optimizer.lr.schedule",
    ),
    "schedule_exp_zero": (
        lambda d: d["optimizer"].update(
            diag_shift={"schedule": "exponential", "start": 0, "end": 1e-4}
        ),
        "optimizer.diag_shift",
    ),
    "schedule_old_keys": (
        lambda d: d["optimizer"].update(lr_final=0.01, lr_schedule="cosine"),
        "optimizer.lr_final",
    ),
    "exact_enabled": (lambda d: d.update(exact={"enabled": 1}), "exact.enabled"),
    "final_symmetrize": (lambda d: d.update(final={"symmetrize": "all"}), "final.symmetrize"),
    "sampler_dtype": (lambda d: d["sampler"].update(dtype="float16"), "sampler.dtype"),
    "sampler_dtype_full_sum": (
        lambda d: d["sampler"].update(dtype="float64", kind="full_sum"),
        "sampler.dtype=float64 needs sampler.kind=metropolis",
    ),
    "local_energy_dtype": (
        lambda d: d["sampler"].update(local_energy_dtype="bfloat16"),
        "sampler.local_energy_dtype",
    ),
    "local_energy_dtype_full_sum": (
        lambda d: d["sampler"].update(local_energy_dtype="float32", kind="full_sum"),
        "sampler.local_energy_dtype=float32 needs sampler.kind=metropolis",
    ),
    "machine_pow_zero": (lambda d: d["sampler"].update(machine_pow=0), "sampler.machine_pow"),
    "machine_pow_full_sum": (
        lambda d: d["sampler"].update(machine_pow=1.5, kind="full_sum"),
        "sampler.machine_pow=1.5 needs sampler.kind=metropolis",
    ),
    "anneal_not_mapping": (
        lambda d: d["optimizer"].update(anneal=0.5),
        "optimizer.anneal=0.5 must be a mapping of from and until",
    ),
    "anneal_no_until": (
        lambda d: d["optimizer"].update(anneal={"from": {"J2": 0.0}}),
        "optimizer.anneal={'from': {'J2': 0.0}} must be a mapping of from and until",
    ),
    # a number key beside the two names (sorting the keys raised TypeError, a traceback)
    "anneal_number_key": (
        lambda d: d["optimizer"].update(anneal={"from": {"J2": 0.0}, "until": 0.5, 3: 1}),
        "optimizer.anneal=",
    ),
    "anneal_from_not_mapping": (
        lambda d: d["optimizer"].update(anneal={"from": 0.5, "until": 0.3}),
        "optimizer.anneal.from=0.5 (float) must be a mapping",
    ),
    "anneal_not_a_number": (
        lambda d: d["optimizer"].update(anneal={"from": {"J2": "big"}, "until": 0.3}),
        "optimizer.anneal.from.J2",
    ),
    "anneal_not_a_coupling": (
        lambda d: d["optimizer"].update(anneal={"from": {"U": 2.0}, "until": 0.3}),
        "optimizer.anneal.from.U is not a coupling of hamiltonian.kind=heisenberg; allowed: J1, J2",
    ),
    "anneal_the_sector": (
        lambda d: d["optimizer"].update(anneal={"from": {"total_sz": 1.0}, "until": 0.3}),
        "optimizer.anneal.from.total_sz",
    ),
    "anneal_until_zero": (
        lambda d: d["optimizer"].update(anneal={"from": {"J2": 0.0}, "until": 0}),
        "optimizer.anneal.until=0.0 must be > 0",
    ),
    "anneal_past_averaging": (
        lambda d: d["optimizer"].update(
            anneal={"from": {"J1": 2.0}, "until": 0.6}, average_from=0.5
        ),
        "optimizer.average_from=0.5 must be >= optimizer.anneal.until=0.6",
    ),
    # the two keys it was before issue 51: the error writes the one value
    "anneal_two_keys": (
        lambda d: d["optimizer"].update(anneal_from={"U": 2.0}, anneal_until=0.25),
        "optimizer.anneal_from / anneal_until: the anneal is one value now; write "
        "optimizer.anneal: {from: {U: 2.0}, until: 0.25}",
    ),
    # the target allows a positive ψ, the start of the path does not
    "anneal_from_signs": (
        lambda d: (
            d["model"].update(positive=True),
            d["optimizer"].update(anneal={"from": {"J2": 0.5}, "until": 0.3}),
        ),
        "optimizer.anneal.from={'J2': 0.5}: model.positive=true needs",
    ),
    # a positive ψ for a Hamiltonian with a sign structure: J2 > 0 frustrates the sign rule
    "positive_frustrated": (
        lambda d: (d["model"].update(positive=True), d["hamiltonian"].update(J2=0.5)),
        "model.positive=true needs a ground state without signs",
    ),
    "positive_no_sign_rule": (
        lambda d: (d["model"].update(positive=True), d["hamiltonian"].update(sign_rule=False)),
        "sign_rule=false",
    ),
    "retired_kind": (
        lambda d: d["model"].update(kind="jastrow"),
        "model.kind='jastrow': the wave function is the ViT",
    ),
    "positive_bosons_negative_J": (
        lambda d: (
            d["model"].update(positive=True),
            d.update(hamiltonian={"kind": "bose_hubbard", "n_particles": 4, "J": -1.0}),
        ),
        "J=-1.0",
    ),
    # spin inversion maps only the S^z = 0 sector of spins to itself
    "final_spin_flip_bosons": (
        lambda d: (
            d["final"].update(spin_flip=1),
            d.update(hamiltonian={"kind": "bose_hubbard", "n_particles": 4}),
        ),
        "final.spin_flip=1 needs spins at hamiltonian.total_sz=0",
    ),
    "final_spin_flip_magnetised": (
        lambda d: (d["final"].update(spin_flip=-1), d["hamiltonian"].update(total_sz=1)),
        "final.spin_flip=-1 needs spins",
    ),
    "final_spin_flip_against_the_model": (
        lambda d: (d["final"].update(spin_flip=-1), d["model"].update(sector={"spin_flip": 1})),
        "final.spin_flip=-1 contradicts model.sector.spin_flip=1",
    ),
    "final_spin_flip_choice": (lambda d: d["final"].update(spin_flip=2), "final.spin_flip"),
    # the four keys it was before issue 51: the error writes the one value
    "sector_separate_keys": (
        lambda d: d["model"].update(symmetrize="translations", momentum=[3], spin_flip=-1),
        "model.momentum / point_characters / spin_flip: the sector is one value now; write "
        "model.sector: {momentum: [3], spin_flip: -1}",
    ),
    "sector_given": (
        lambda d: d["model"].update(sector="given"),
        "the sector is one value now; write model.sector: null",
    ),
    "sector_not_a_mapping": (
        lambda d: d["model"].update(sector=3),
        "model.sector=3 must be search, null or a mapping of momentum, point_characters and "
        "spin_flip",
    ),
    "sector_unknown_key": (
        lambda d: d["model"].update(sector={"momenta": [3]}),
        "unknown key 'model.sector.momenta'; did you mean 'model.sector.momentum'?",
    ),
    "sector_search_from_a_state": (
        lambda d: d["model"].update(sector="search", init_from="x.h5"),
        "model.sector=search finds the sector itself, from a random start; "
        "model.init_from='x.h5' gives a start",
    ),
    "momentum_per_axis": (
        lambda d: d["model"].update(symmetrize="translations", sector={"momentum": [1, 0]}),
        "model.sector.momentum=[1, 0] must hold one integer per axis of lattice.shape=[6]",
    ),
    # k = 0 written with an axis too many was taken as k = 0 (found by test_config_fuzz)
    "momentum_zero_per_axis": (
        lambda d: d["model"].update(sector={"momentum": [0, 0]}),
        "model.sector.momentum=[0, 0] must hold one integer per axis of lattice.shape=[6]",
    ),
    "momentum_beyond_the_zone": (
        lambda d: d["model"].update(symmetrize="translations", sector={"momentum": 6}),
        "model.sector.momentum=[6]: n_0=6 must be below the lattice's 6 cells",
    ),
    "momentum_negative": (
        lambda d: d["model"].update(symmetrize="translations", sector={"momentum": [-1]}),
        "model.sector.momentum[0]",
    ),
    "momentum_open_axis": (
        lambda d: (
            d["model"].update(symmetrize="translations", sector={"momentum": [1]}),
            d["lattice"].update(pbc=False),
        ),
        "model.sector.momentum=[1] has a momentum along axis 0, which is open",
    ),
    "point_characters_without_the_space_group": (
        lambda d: d["model"].update(
            symmetrize="translations", sector={"point_characters": [1, -1]}
        ),
        "model.sector.point_characters=[1, -1] select a sector of the space group",
    ),
    "point_characters_not_a_sign": (
        lambda d: d["model"].update(symmetrize="space_group", sector={"point_characters": [1, 2]}),
        "model.sector.point_characters=[1, 2] must hold +1 or -1 only",
    ),
    "momentum_without_a_projection": (
        lambda d: d["model"].update(sector={"momentum": [3]}),
        "model.sector.momentum=[3] needs model.symmetrize or final.symmetrize: translations",
    ),
    "momentum_positive": (
        lambda d: d["model"].update(
            symmetrize="translations", sector={"momentum": [3]}, positive=True
        ),
        "model.sector.momentum=[3] needs a complex ψ",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_line_error_naming_the_key(case, tmp_path):
    mutate, expected = BAD[case]
    data = tiny_heisenberg(tmp_path)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    message = str(info.value)
    assert "\n" not in message
    assert expected in message


def test_unreadable_files_are_config_errors(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("lattice:\n  shape: [4\nhamiltonian: {kind: heisenberg}\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "missing.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- lattice\n- hamiltonian\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load(listing)
    with pytest.raises(ConfigError, match="key.path=value"):
        load(write_config(tmp_path / "good.yaml", tiny_heisenberg(tmp_path)), ["J1"])


# ---- hypothesis: mutations of a good config ------------------------------------------------

WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 0),  # out of range for every size, count and rate
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e3, max_value=1e3),
    st.text(max_size=5),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "kind", "shape"]), st.integers(0, 3), max_size=2),
)


def _leaves(data, prefix=()):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        yield (*prefix, key)


@st.composite
def mutations(draw):
    data = tiny_heisenberg("unused")  # vitqs ed writes nothing there
    paths = list(_leaves(data))
    kind = draw(st.sampled_from(["replace", "delete", "add"]))
    path = draw(st.sampled_from(paths))
    node = data
    for part in path[:-1]:
        node = node[part]
    if kind == "replace":
        node[path[-1]] = draw(WRONG_VALUES)
    elif kind == "delete":
        del node[path[-1]]
    else:
        path = (*path[:-1], draw(st.sampled_from(["colour", "d_mdoel", "patchsize", "spin"])))
        node[path[-1]] = 1
    return kind, ".".join(path), data


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutation=mutations())
def test_mutated_config_is_valid_or_a_one_line_error_naming_a_key(mutation, tmp_path, capsys):
    kind, dotted, data = mutation
    path = write_config(tmp_path / "mutant.yaml", data)
    code, _, err = run_main(capsys, "ed", path)
    if code == 0:
        # valid: the building blocks of a run must accept it too, or refuse it as bad config
        config = load(path)
        try:
            hamiltonian = build_hamiltonian(config)
            build_network(config, hamiltonian)
            build_sampler(config, hamiltonian)
        except ConfigError as error:
            assert "\n" not in str(error)
        return
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    if kind in ("add", "delete") and dotted not in ("lattice", "hamiltonian"):
        # a deleted key with a default is valid; a failing one is the deleted or added key
        assert dotted in err or dotted.split(".")[0] in err, err
    else:
        assert any(key in err for key in KEYS), err


def test_overrides_do_not_touch_the_input():
    data = {"lattice": {"shape": [4]}}
    copied = copy.deepcopy(data)
    apply_overrides(data, ["lattice.shape=[6]"])
    assert data == copied


def test_override_into_a_list_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="lattice.shape"):
        apply_overrides(tiny_heisenberg(tmp_path), ["lattice.shape.x=1"])


def test_to_dict_round_trips_through_yaml(tmp_path):
    config = from_dict(tiny_heisenberg(tmp_path))
    assert from_dict(yaml.safe_load(yaml.safe_dump(config.to_dict()))) == config


@pytest.mark.parametrize(
    "key, off, on",
    [
        ("sampler.n_samples_late", None, 128),
        ("sampler.late_fraction", 0.75, 0.5),
        ("optimizer.clip_local_energy", None, 5.0),
        ("optimizer.max_update_ratio", None, 3.0),
        ("optimizer.jacobian_dtype", None, "float32"),
        # adopted, or chosen for the run: the key is gone, its other value is refused
        ("sampler.compile", False, True),
        ("sampler.sum_over_orbits", True, False),
        ("model.head_init_std", 0.1, 0.5),
        ("sampler.sector_table", True, False),
    ],
)
def test_a_retired_key_means_what_it_meant_off_and_is_refused_on(key, off, on, tmp_path):
    # levers measured and removed (issue 51): a stored config of an older results file
    # holds them at the value vitqs still runs, which reads; asking for another is an error
    from vitqs.config import from_dict

    section, name = key.split(".")
    data = tiny_heisenberg(tmp_path)
    data[section][name] = off
    config = from_dict(data)
    assert not hasattr(getattr(config, section), name)
    data[section][name] = on
    why = RETIRED_BECAUSE.get(key, "this lever was measured, not adopted and removed")
    with pytest.raises(ConfigError, match=rf"{key}=.*: {re.escape(why)} \(issue 51"):
        from_dict(data)


def test_a_chemical_potential_is_no_key_at_fixed_n(tmp_path):
    # at a fixed number of bosons μ only shifts every energy by −μN: older files store
    # mu: 0.0, which reads; any other value is refused with what to do instead
    data = tiny_bose_hubbard(tmp_path)
    data["hamiltonian"]["mu"] = 0.0
    assert not hasattr(from_dict(data).hamiltonian, "mu")
    data["hamiltonian"]["mu"] = 0.5
    with pytest.raises(ConfigError, match=r"hamiltonian.mu=0.5: .*shifts every energy by −μN"):
        from_dict(data)
