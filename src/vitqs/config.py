"""The run configuration: YAML in, validated dataclasses out.

YAML keys map one to one onto dataclass fields; defaults live only here; unknown keys are
errors with a "did you mean". Every check raises ``ConfigError`` with a one-line message that
names the dotted key, the value given and what is allowed; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from vitqs import recipes
from vitqs.errors import ConfigError, describe, shown
from vitqs.recipes import singlet_spin_flip
from vitqs.yamlfile import apply_overrides, read_yaml, yaml_value

# ---- value checkers: each takes (key, value) and returns the value, converted -------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The largest integer a float carries exactly (and JSON readers keep): no count of samples,
# steps or sites comes near it, so a larger value is a typo, not a wish.
MAX_INTEGER = 2**53
# torch takes its thread count as a C int; no machine has more cores than this
MAX_THREADS = 4096
# seconds; datetime.timedelta (the process group's timeout) overflows near 1e14, and a
# collective that waits longer than 100 days waits for nothing
MAX_TIMEOUT = 1e7
# A wall-clock budget beyond 115 days is a typo (as a timeout would be).
MAX_BUDGET = 1e7


def integer(minimum=None, maximum=MAX_INTEGER):
    def check(key, value):
        if not _is_int(value):
            raise ConfigError(f"{key}={describe(value)} must be an integer")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise ConfigError(f"{key}={value} must be {_range_text(minimum, maximum)}")
        return value

    return check


def real(minimum=None, maximum=None, positive=False):
    def check(key, value):
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}={describe(value)} must be a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={describe(value)} must be a number")
        try:
            value = float(value)
        except OverflowError:  # an integer literal beyond the float range
            raise ConfigError(f"{key}: a {len(str(value))}-digit integer is too large") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}={value} must be a finite number")
        if positive and value <= 0:
            raise ConfigError(f"{key}={value} must be > 0")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise ConfigError(f"{key}={value} must be {_range_text(minimum, maximum)}")
        return value

    return check


def schedule(minimum=None, positive=False):
    """A value that a schedule may move: a number (constant), or a mapping ``{schedule:
    exponential | cosine, start: <number>, end: <number>}`` over the run (its steps or its
    budget, whichever ends first). Returns the number, or the mapping with its keys checked."""
    number = real(minimum=minimum, positive=positive)

    def check(key, value):
        if not isinstance(value, dict):
            return number(key, value)
        keys = ("schedule", "start", "end")
        unknown, missing = sorted(set(value) - set(keys)), [k for k in keys if k not in value]
        if unknown or missing:
            raise ConfigError(
                f"{key}={shown(value)} must be a number or a mapping of schedule, start and end, "
                f"e.g. {{schedule: cosine, start: 0.05, end: 0.002}}"
            )
        kind = choice(*SCHEDULES)(f"{key}.schedule", value["schedule"])
        start, end = number(f"{key}.start", value["start"]), number(f"{key}.end", value["end"])
        if kind == "exponential" and not (start > 0 and end > 0):
            raise ConfigError(
                f"{key}: an exponential schedule needs start={start} and end={end} both > 0"
            )
        return {"schedule": kind, "start": start, "end": end}

    return check


def schedule_values(value) -> tuple[float, ...]:
    """Returns the numbers a `schedule` value takes at its ends (one for a constant)."""
    return (value["start"], value["end"]) if isinstance(value, dict) else (value,)


def device_name():
    def check(key, value):
        text()(key, value)
        kind, colon, index = value.partition(":")
        ascii_index = index.isascii() and index.isdigit()
        if value in ("auto", "cpu", "cuda") or (kind == "cuda" and colon and ascii_index):
            return value
        raise ConfigError(
            f"{key}={shown(value)} is not a device; choose one of: auto | cpu | cuda | "
            "cuda:<index>, e.g. cuda:0"
        )

    return check


def boolean():
    def check(key, value):
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={describe(value)} must be true or false")
        return value

    return check


def choice(*options):
    def check(key, value):
        # compare types too: YAML's true must not pass for 1, nor 1 for true
        if not any(value == o and type(value) is type(o) for o in options):
            allowed = " | ".join(str(o).lower() if isinstance(o, bool) else str(o) for o in options)
            raise ConfigError(f"{key}={shown(value)} is not allowed; choose one of: {allowed}")
        return value

    return check


def pbc_per_axis(pbc, ndim: int, kind: str = "square") -> tuple[bool, ...]:
    """Returns ``pbc`` (one bool, or one per axis) as one bool per axis; a ladder's single
    bool is along its legs, across them it is open."""
    if not isinstance(pbc, (list, tuple)):  # one bool (Python's or numpy's) for every axis
        if kind == "ladder":
            return (bool(pbc), False)
        return (bool(pbc),) * ndim
    pbc = tuple(bool(p) for p in pbc)
    if len(pbc) != ndim:
        raise ValueError(f"lattice.pbc={list(pbc)} must be a bool or a list of {ndim} bools")
    return pbc


def default_lattice_kind(shape) -> str:
    """Returns the kind of a lattice without ``kind``: a chain for one extent, else a square."""
    return "chain" if len(shape) == 1 else "square"


def bool_list(length=(1, 2)):
    def check(key, value):
        if not isinstance(value, (list, tuple)) or not (length[0] <= len(value) <= length[1]):
            raise ConfigError(f"{key}={describe(value)} must be a bool or a list of bools")
        for i, item in enumerate(value):
            boolean()(f"{key}[{i}]", item)
        return list(value)

    return check


def text():
    def check(key, value):
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{key}={describe(value)[:80]} must be a non-empty string")
        if any(unicodedata.category(ch) == "Cc" for ch in value):
            raise ConfigError(
                f"{key}={value[:60]!r} must not contain control characters (newlines, NUL, ...)"
            )
        return value

    return check


def int_list(length=(1, 2), minimum=1):
    def check(key, value):
        if _is_int(value):
            value = [value]
        if not isinstance(value, (list, tuple)) or not (length[0] <= len(value) <= length[1]):
            counts = " or ".join(str(n) for n in range(length[0], length[1] + 1))
            raise ConfigError(f"{key}={value!r} must be a list of {counts} integers")
        for i, item in enumerate(value):
            integer(minimum)(f"{key}[{i}]", item)
        return list(value)

    return check


# bytes of a name: <name>.h5 and its companions (.<name>.h5.<random>.tmp, .<name>.h5.lock,
# .<name>.h5.pending) must stay under the 255 bytes most file systems allow
MAX_NAME_BYTES = 200


def plain_file_name_problem(value: str) -> str | None:
    """Returns why ``value`` cannot name a file inside the output folder, or None."""
    if not value.strip():
        return "it is blank"
    if value.startswith(".") or "/" in value or "\\" in value:
        return "it must not contain '/' or '\\' nor start with '.'"
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in value):
        return "it must not contain control characters (newlines, NUL, ...)"
    if len(value.encode("utf-8")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return None


def file_name():
    def check(key, value):
        text()(key, value)
        problem = plain_file_name_problem(value)
        if problem:
            raise ConfigError(
                f"{key}={value[:60]!r} must be a plain file name: {problem} (it names the "
                "results file)"
            )
        return value

    return check


def real_mapping(example: str):
    def check(key, value):
        if not isinstance(value, dict) or not value:
            raise ConfigError(
                f"{key}={describe(value)} must be a mapping of names to numbers, e.g. {example}"
            )
        return {name: real()(f"{key}.{name}", number) for name, number in value.items()}

    return check


# the keys of a sector (`model.sector`), and what each is when left out
SECTOR_KEYS = {"momentum": None, "point_characters": None, "spin_flip": 0}


def sector_value():
    """`model.sector`: ``search``, null, or a mapping of ``momentum``, ``point_characters``
    and ``spin_flip`` (each optional). Returns the mapping with all three keys, or None when
    it gives none of them (k = 0, all characters +1, no spin inversion)."""
    checks = {
        "momentum": optional(int_list((1, 2), minimum=0)),
        "point_characters": optional(int_list((1, 48), minimum=-1)),
        "spin_flip": choice(*SPIN_FLIPS),
    }

    def check(key, value):
        if value is None or value == "search":
            return value
        if not isinstance(value, dict):
            raise ConfigError(
                f"{key}={shown(value)} must be search, null or a mapping of momentum, "
                "point_characters and spin_flip, e.g. {momentum: [1, 0], spin_flip: -1}"
            )
        for name in value:
            if name not in SECTOR_KEYS:
                raise _unknown_key_error(name, list(SECTOR_KEYS), f"{key}.")
        sector = {
            name: checks[name](f"{key}.{name}", value.get(name, default))
            for name, default in SECTOR_KEYS.items()
        }
        return None if sector == SECTOR_KEYS else sector

    return check


def anneal_path():
    """The path of `optimizer.anneal`: ``{from: {coupling: number}, until: fraction}``."""
    couplings, fraction = real_mapping("{U: 2.0}"), real(positive=True, maximum=1.0)

    def check(key, value):
        if not isinstance(value, dict) or set(value) != {"from", "until"}:
            raise ConfigError(
                f"{key}={shown(value)} must be a mapping of from and until, e.g. "
                "{from: {U: 2.0}, until: 0.25}"
            )
        return {
            "from": couplings(f"{key}.from", value["from"]),
            "until": fraction(f"{key}.until", value["until"]),
        }

    return check


def optional(checker):
    def check(key, value):
        return None if value is None else checker(key, value)

    return check


def either(*checkers, expected: str):
    def check(key, value):
        for checker in checkers:
            try:
                return checker(key, value)
            except ConfigError:
                continue
        raise ConfigError(f"{key}={describe(value)} must be {expected}")

    return check


def _range_text(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f"between {minimum} and {maximum}"
    return f">= {minimum}" if minimum is not None else f"<= {maximum}"


_REQUIRED = object()


def option(
    default=_REQUIRED,
    check=None,
    *,
    doc: str = "",
    allowed: str = "",
    resumable=False,
    free_across_init=False,
    runtime=False,
    escape_hatch=False,
    physics=False,
):
    """A config field: its default (or required), its checker, its documentation and the
    rules of the field. docs/config.md is generated from these (`vitqs.config_reference`).

    Args:
        doc: what the option does, in a few sentences (Markdown): its unit where it has one,
            what null means; measurements stay in results/, pointed to.
        allowed: the values it takes, as text (Markdown), e.g. ``"int ≥ 1, or null"``.
        resumable: a resumed run may change the value: it does not alter the trajectory
            already recorded (the steps still to come, where files go, how the final state
            is measured).
        free_across_init: (``model`` keys) a run may start from another run's parameters
            (``model.init_from``) whose value differs: no parameter changes shape or meaning.
        runtime: the value says where and how a run goes, not what it computes: a sweep
            reads a finished point back whatever it is now.
        escape_hatch: a setting a user turns to when the default does not fit the machine
            or the run (device, precision, memory, time, files): it keeps its place without
            a shipped config that sets it (issue 51; tests/test_config_reference.py).
        physics: a parameter of the system studied (boundary conditions, couplings, the
            sector's charge): a physicist sets it for their problem, whether or not a shipped
            config does.
    """
    metadata = {
        "check": check,
        "doc": doc,
        "allowed": allowed,
        "resumable": resumable,
        "free_across_init": free_across_init,
        "runtime": runtime,
        "escape_hatch": escape_hatch,
        "physics": physics,
    }
    if default is _REQUIRED:
        return field(default=None, metadata={**metadata, "required": True})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# ---- vocabularies: the values an option may take, written once --------------------------
# The modules that implement the options read them here (sr its solves, the models their
# embeddings); nothing else spells them out.

SAMPLER_KINDS = ("metropolis", "full_sum")
NATURAL_GRADIENTS = ("auto", "sr", "minsr")  # auto: the smaller of the two solves
SCHEDULES = ("exponential", "cosine")  # besides a constant, which is a plain number
EMBEDDINGS = ("linear", "onehot")
SYMMETRIZE = ("none", "translations", "space_group")
SPIN_FLIPS = (0, 1, -1)  # the eigenvalue of spin inversion projected on (0: none)
# a fixed sign (−1)^(up spins on the cells of odd n_x | odd n_y | odd n_x + n_y) on ψ
FIXED_SIGN_PRIORS = ("none", "stripes_x", "stripes_y", "stripes_xy")
# `search`: the run races the fixed ones first (`sector_search.search_sign_prior`)
SIGN_PRIORS = (*FIXED_SIGN_PRIORS, "search")
DTYPES = ("float64", "float32")
LATTICE_KINDS = ("chain", "square", "triangular", "honeycomb", "kagome", "ladder")
# sites per unit cell of the kinds with a basis (every other kind has one)
SITES_PER_CELL = {"honeycomb": 2, "kagome": 3}


# ---- the sections -------------------------------------------------------------------------


class Section:
    """A config section. Every value is checked (and converted) when the section is made,
    whether it came from YAML (`from_dict`) or from Python (``SamplerConfig(n_chains=64)``):
    one path, so the Python API and the YAML share defaults, allowed values and errors."""

    prefix: ClassVar[str] = ""  # the dotted path of the section, for the error messages

    def __post_init__(self):
        for f in dataclasses.fields(self):
            key, value = f"{self.prefix}{f.name}", getattr(self, f.name)
            if value is None and f.metadata.get("required"):
                raise ConfigError(f"{key} is required")
            check = f.metadata.get("check")
            if check is not None:
                setattr(self, f.name, check(key, value))


@dataclass
class LatticeConfig(Section):
    prefix = "lattice."

    shape: list = option(
        check=int_list((1, 2), minimum=1),
        doc="Unit cells per axis. Site b of cell (x, y) is `n_basis·(x + Lx·y) + b` (a chain "
        "or a square: site `x + Lx·y`); at most 65,536 sites in all.",
        allowed="`[L]` or `[Lx, Ly]` (a ladder: `[L, legs]`), integers ≥ 1",
    )
    pbc: Any = option(
        True,
        either(boolean(), bool_list((1, 2)), expected="true, false or a list of them"),
        physics=True,
        doc="Periodic boundaries: one bool for every axis, or one per axis. A ladder's single "
        "bool is along its legs; across them it stays open unless a list says otherwise.",
        allowed="bool, or a list of one bool per axis",
    )
    kind: str | None = option(
        None,
        optional(choice(*LATTICE_KINDS)),
        physics=True,
        doc="The lattice ([lattices.md](lattices.md)). null: a chain for `[L]`, "
        "a square for `[Lx, Ly]`.",
        allowed="`chain` | `square` | `triangular` | `honeycomb` | `kagome` | `ladder`, or null",
    )

    @property
    def resolved_kind(self) -> str:
        """Returns the kind, a chain or a square by the length of ``shape`` when unset."""
        return default_lattice_kind(self.shape) if self.kind is None else self.kind

    @property
    def n_sites(self) -> int:
        n = SITES_PER_CELL.get(self.resolved_kind, 1)
        for extent in self.shape:
            n *= extent
        return n


@dataclass
class HeisenbergConfig(Section):
    prefix = "hamiltonian."

    kind: str = option(
        "heisenberg",
        choice("heisenberg"),
        doc="Spins 1/2: `H = J1 Σ_⟨ij⟩ S_i·S_j + J2 Σ_⟨⟨ij⟩⟩ S_i·S_j` with S = σ/2 (netket's "
        "`Heisenberg` uses Pauli matrices: its energies are 4× ours).",
        allowed="`heisenberg`",
    )
    J1: float = option(
        1.0,
        real(),
        physics=True,
        doc="Coupling of the order-1 (nearest-neighbour) bonds; > 0 is antiferromagnetic.",
        allowed="float",
    )
    J2: float = option(
        0.0,
        real(),
        physics=True,
        doc="Coupling of the order-2 (next-nearest-neighbour) bonds.",
        allowed="float",
    )
    J_leg: float | None = option(
        None,
        optional(real()),
        physics=True,
        doc="A ladder's order-1 coupling along its legs; other lattices refuse it. null: `J1`.",
        allowed="float, or null",
    )
    J_rung: float | None = option(
        None,
        optional(real()),
        physics=True,
        doc="A ladder's order-1 coupling across its legs (the rungs); other lattices refuse it. "
        "null: `J1`.",
        allowed="float, or null",
    )
    sign_rule: bool = option(
        False,
        boolean(),
        doc="Work in the basis rotated by the Marshall sign on the J1 bonds, where an "
        "unfrustrated ground state is positive; the spectrum is unchanged. Bipartite lattices "
        "only (chain and square of even extents, honeycomb, ladder).",
        allowed="bool",
    )
    total_sz: float = option(
        0.0,
        real(),
        physics=True,
        doc="The S^z sector the run works in.",
        allowed="float: an integer (a half-integer on an odd number of sites) within ±N/2",
    )


@dataclass
class BoseHubbardConfig(Section):
    prefix = "hamiltonian."

    kind: str = option(
        "bose_hubbard",
        choice("bose_hubbard"),
        doc="Bosons at fixed number: `H = −J Σ_⟨ij⟩ (b_i† b_j + h.c.) + U/2 Σ n_i(n_i − 1) "
        "− μ Σ n_i`.",
        allowed="`bose_hubbard`",
    )
    J: float = option(
        1.0,
        real(),
        physics=True,
        doc="Hopping amplitude along the order-1 bonds.",
        allowed="float",
    )
    U: float = option(4.0, real(), physics=True, doc="On-site interaction.", allowed="float")
    n_particles: int = option(
        check=integer(1),
        physics=True,
        doc="The number of bosons on the lattice.",
        allowed="int ≥ 1",
    )
    n_max: int | None = option(
        None,
        optional(integer(1)),
        physics=True,
        doc="Most bosons one site may hold. null: `n_particles` (no cutoff).",
        allowed="int ≥ 1, or null",
    )


@dataclass
class ModelConfig(Section):
    prefix = "model."

    patch_size: Any = option(
        2,
        either(
            integer(1), int_list((1, 2), minimum=1), expected="an integer >= 1 or a list of them"
        ),
        doc="Cells per patch, each with all its basis sites: b on a chain, b×b on a 2-d lattice "
        "(or `[bx, by]`). Must divide the lattice's extents.",
        allowed="int ≥ 1, or a list of one per axis",
    )
    d_model: int = option(
        16,
        integer(1),
        doc="Width of the patch embeddings; `heads` must divide it.",
        allowed="int ≥ 1",
    )
    heads: int = option(4, integer(1), doc="Attention heads.", allowed="int ≥ 1")
    layers: int = option(2, integer(1), doc="Encoder blocks.", allowed="int ≥ 1")
    translation_invariant: bool = option(
        True,
        boolean(),
        doc="Attention depends on the relative positions of patches only, so ψ is invariant "
        "under shifts by whole patches.",
        allowed="bool",
    )
    embedding: str = option(
        "linear",
        choice(*EMBEDDINGS),
        doc="How a patch's occupations enter: a linear map, or one-hot vectors (suit bosons).",
        allowed="`linear` | `onehot`",
    )
    jastrow: bool = option(
        False, boolean(), doc="Multiply ψ by a two-body Jastrow factor.", allowed="bool"
    )
    symmetrize: str = option(
        "none",
        choice(*SYMMETRIZE),
        free_across_init=True,
        doc="Train ψ averaged over the lattice translations (a translation-invariant ViT needs "
        "only the shifts inside a patch: 4 copies on 2×2 patches), or over the space group "
        "(translations after the rotations and reflections found from the geometry), projected "
        "on the momentum and point characters of `model.sector`. A step costs one "
        "forward pass per copy.",
        allowed="`none` | `translations` | `space_group`",
    )
    sector: Any = option(
        None,
        sector_value(),
        free_across_init=True,
        doc="The symmetry sector ψ is trained in, a mapping of (each optional): `momentum`, the "
        "crystal momentum `[n_x, n_y]` that the translations of `symmetrize` (model or final) "
        "project on, ψ(T_a x) = e^{ik·a} ψ(x) with k·a = 2π Σ n_i a_i / L_i (null: k = 0; a "
        "small cluster's ground state need not be at k = 0: the kagome 2×3's is at `[1, 0]`; "
        "needs a complex ψ and a network that shifts of phase ≠ 1 do not leave invariant, "
        "with one-cell patches `translation_invariant: false`); `point_characters`, with "
        "`symmetrize: space_group` (model or final), the characters χ_P under the rotations "
        "and reflections that keep the momentum (its little group, identity first), so that "
        "ψ(P x) = χ_P ψ(x) (null: all +1; refused when they are not a one-dimensional "
        "representation of that group); `spin_flip`, the eigenvalue of global spin inversion "
        "ψ is projected on (spins at S^z = 0 only; 0: none). `vitqs ed` prints the ground "
        "state's sector in these keys. `search`: the run finds the sector itself before its steps,"
        " by short runs of this network projected on every candidate sector (one momentum per "
        "star, each real character of its little group, each spin inversion; successive halving by"
        " energy; `vitqs sectors` runs it alone; a sector of momentum π along some axes, with an "
        "odd number of up spins, is run with the `sign_prior` stripes that give a constant that "
        "momentum, unless `sign_prior` is set), then trains in the winner from the winner's state,"
        " as its trial ran (averaged over the space group, at half the samples a step, with the "
        "trial's prior: the results file's `model` and `sampler` keep them; the final state over "
        "the space group unless `final.symmetrize` says otherwise); the "
        "table, the margin and whether the choice is settled (no candidate dropped while its "
        "energy, over its last quarter of steps, still fell by more than it lay behind the cut) "
        "are kept in the results file, and ED, where it exists, only checks the choice. Under a "
        "`budget` the search takes a tenth of it (100 steps a candidate at least, at half the "
        "samples a step). The recipe of "
        "spins without a sign rule searches on one-cell patches (kagome, honeycomb, an odd "
        "extent), whose network carries every momentum. null: k = 0, all characters +1, no "
        "spin-inversion projection.",
        allowed="`search`, or a mapping of `momentum` (one int per axis, 0 ≤ n_i < L_i; 0 "
        "along an open axis), `point_characters` (list of +1 / -1) and `spin_flip` (0 | 1 | "
        "-1), e.g. `{momentum: [1, 0], point_characters: [1, -1], spin_flip: -1}`, or null",
    )
    positive: bool = option(
        False,
        boolean(),
        doc="A real log ψ, ψ > 0 (`vit` only): right when H has no sign problem (Heisenberg with "
        "`sign_rule: true` and J2 ≤ 0, Bose-Hubbard with J ≥ 0), whose ground state is "
        "positive (Perron-Frobenius); half the log-derivatives, a 4× cheaper minSR solve. "
        "Refused for a Hamiltonian with signs.",
        allowed="bool",
    )
    sign_prior: str = option(
        "none",
        choice(*SIGN_PRIORS),
        doc="Multiply ψ by the fixed sign (−1)^(up spins on the marked cells): cells of odd n_x, "
        "odd n_y or odd n_x + n_y (`stripes_xy` is the Marshall sign on the square lattice); the "
        "network learns the sign structure relative to it. A complex ViT of spins only; needs an "
        "even extent along a periodic marked axis. `search`: the run races short runs of every "
        "prior the lattice takes before its steps (successive halving by energy, as "
        "`model.sector: search`; `vitqs sectors --sign-prior` runs it alone) and trains on with "
        "the winner; kept in the results file. `model.sector: search` sets it to the stripes "
        "that carry the chosen sector's momentum where there are such (`none` written or "
        "left out). The recipe of spins without a sign rule searches "
        "on the triangular lattice, where a wrong prior stalls in an excited singlet "
        "(docs/new_system.md).",
        allowed="`none` | `stripes_x` | `stripes_y` | `stripes_xy` | `search`",
    )
    init_from: str | None = option(
        None,
        optional(text()),
        resumable=True,
        free_across_init=True,
        doc="Start from another run's results file: its checkpoint's parameters (a finished "
        "run's final state) and, when they are states of this sector, its Monte Carlo chains. "
        "The network must have the same shape (the keys marked `init_from` may differ); a "
        "factored, translation-invariant ViT without Jastrow may come from another size of the "
        "same lattice kind (`models/transfer.py`); the run warns when its first step's energy "
        "lies above the infinite-temperature energy (the state carried over kept nothing). "
        "`--resume` ignores it: the checkpoint wins. null: random parameters.",
        allowed="path of a results file (`.h5`), or null",
    )

    @property
    def searches_sector(self) -> bool:
        """The run finds its sector itself (``sector: search``)."""
        return self.sector == "search"

    @property
    def momentum(self) -> list | None:
        """The sector's crystal momentum (None: k = 0)."""
        return self._sector_key("momentum")

    @property
    def point_characters(self) -> list | None:
        """The sector's characters of the momentum's little group (None: all +1)."""
        return self._sector_key("point_characters")

    @property
    def spin_flip(self) -> int:
        """The spin-inversion eigenvalue ψ is projected on (0: none)."""
        return self._sector_key("spin_flip")

    def _sector_key(self, name: str):
        given = isinstance(self.sector, dict)
        return self.sector[name] if given else SECTOR_KEYS[name]


@dataclass
class SamplerConfig(Section):
    prefix = "sampler."

    kind: str = option(
        "metropolis",
        choice(*SAMPLER_KINDS),
        doc="`metropolis`: Markov chains on |ψ|²; `full_sum`: exact sums over the sector (at "
        "most 200,000 states) for the steps and the final measurement, without error bars.",
        allowed="`metropolis` | `full_sum`",
    )
    n_samples: int = option(
        1024,
        integer(1),
        doc="Samples per step over all chains; a multiple of `n_chains`.",
        allowed="int ≥ 1",
    )
    n_chains: int = option(
        256,
        integer(1),
        doc="Metropolis chains run side by side; they persist across steps. As many chains as "
        "samples (one sample each, a small `n_discard`) gives independent samples for a few "
        "sweeps of one large batch.",
        allowed="int ≥ 1",
    )
    n_discard: int = option(
        16,
        integer(0),
        doc="Sweeps each chain makes after each update before it keeps samples.",
        allowed="int ≥ 0",
    )
    chunk_size: int | None = option(
        None,
        optional(integer(1)),
        resumable=True,
        escape_hatch=True,
        doc="Samples per chunk in local energies and log-derivatives: bounds memory and changes "
        "nothing else, so a run killed for memory resumes with a smaller one. null: chunks of at "
        "most 262,144 connected configurations and forward passes of at most 16,384.",
        allowed="int ≥ 1, or null",
    )
    dtype: str | None = option(
        "float32",
        optional(choice(*DTYPES)),
        resumable=True,
        escape_hatch=True,
        doc="Precision of the network copy the Metropolis chains run on; the samples' log ψ, "
        "local energies, gradients and SR keep the model's `dtype`. float32 chains cost about "
        "half a float64 model's and move |ψ|² by ~1e-6 relative, far below any sampling error "
        "(results/history/performance_notes.md). null: the model's `dtype`.",
        allowed="`float32` | `float64`, or null",
    )
    local_energy_dtype: str | None = option(
        None,
        optional(choice(*DTYPES)),
        resumable=True,
        doc="Precision of the network copy that evaluates the connected configurations in the "
        "training steps' local energies; the samples' log ψ, the sums, gradients, SR and the "
        "final energy keep the model's `dtype` (`models/precision.py`). float32 for a float64 "
        "model makes local energies ~2× cheaper and moves a step's energy by ~1e-6 relative: "
        "for goals far above 1e-7 (results/history/accuracy_notes.md). null: the model's "
        "`dtype`. Metropolis only.",
        allowed="`float32` | `float64`, or null",
    )
    machine_pow: float = option(
        2.0,
        real(positive=True),
        doc="The chains sample |ψ|^machine_pow and weight each sample by |ψ|^(2 − machine_pow), "
        "so energies, gradients and S remain those of |ψ|². Below 2 a peaked |ψ|² (a Mott "
        "insulator, a frustrated chain) is sampled more evenly, at more distinct samples per "
        "step (results/history/accuracy_notes.md). The final measurement samples |ψ|². "
        "Metropolis only.",
        allowed="float > 0",
    )
    bare_chains: bool = option(
        False,
        boolean(),
        doc="Run the Metropolis chains on the network φ inside `model.symmetrize` / "
        "`model.sector`'s spin inversion, not on the average ψ_sym: one forward pass per "
        "proposal instead of one per copy; each sample is weighted by |ψ_sym|²/|φ|^machine_pow, "
        "so energies, "
        "gradients and S stay those of |ψ_sym|². Efficient while φ is not far from symmetric "
        "(watch the energy's error bar). The final measurement samples |ψ|². Metropolis only.",
        allowed="bool",
    )
    max_frozen_steps: int | None = option(
        50,
        optional(integer(1)),
        resumable=True,
        runtime=True,
        escape_hatch=True,
        doc="Stop the run (status `failed`, checkpoint kept, exit 2) once the Metropolis "
        "acceptance has been below one accepted move per chain in 100 sweeps (0 included) for "
        "this many steps in a row: every chain is frozen, the state "
        "has collapsed (a sector of one state is exempt). null: never stop for it (the final "
        "measurement still fails a collapsed state).",
        allowed="int ≥ 1, or null",
    )


@dataclass
class OptimizerConfig(Section):
    prefix = "optimizer."

    lr: Any = option(
        0.01,
        schedule(positive=True),
        resumable=True,
        doc="Learning rate η: θ ← θ − η·δθ. A schedule moves it from `start` to `end` over "
        "`n_iter`, or over the optimisation's share of `budget` when that ends first.",
        allowed="float > 0, or `{schedule: exponential | cosine, start, end}`",
    )
    diag_shift: Any = option(
        1.0e-3,
        schedule(minimum=0.0),
        resumable=True,
        doc="λ added to the diagonal of S (or of the minSR kernel); a schedule as for `lr`.",
        allowed="float ≥ 0, or `{schedule: exponential | cosine, start, end}`",
    )
    n_iter: int | None = option(
        None,
        optional(integer(1)),
        resumable=True,
        doc="Optimisation steps. null: 300 without a `budget`; with one, as many as its "
        "optimisation share allows.",
        allowed="int ≥ 1, or null",
    )
    average_from: float | None = option(
        None,
        optional(real(minimum=0.0, maximum=1.0)),
        doc="The final state is the mean of the parameters after this fraction of the run (of "
        "`n_iter` or of the budget's share for the steps): Polyak averaging of the noisy "
        "iterates. null: the last parameters.",
        allowed="float in [0, 1], or null",
    )
    momentum: float | None = option(
        None,
        optional(real(minimum=0.0, maximum=0.999)),
        doc="SPRING (Goldshlager, Abrahamsen & Lin 2024): the natural gradient is regularised "
        "towards this × the last direction instead of towards zero, so what one step's samples "
        "barely resolve is averaged over steps (results/history/accuracy_notes.md). Needs "
        "`diag_shift` > 0. null: plain SR / minSR.",
        allowed="float in [0, 0.999], or null",
    )
    anneal: dict | None = option(
        None,
        optional(anneal_path()),
        doc="Start the Hamiltonian's couplings (Heisenberg `J1`, `J2`; Bose-Hubbard `J`, `U`) "
        "at the values of `from` and move them linearly to the hamiltonian section's over "
        "the first `until` of the run (a fraction of `n_iter` or of the budget's share for the "
        "steps): the ground state is followed from where it is easy to find. `average_from` "
        "must not start before `until`. The final energy is always the config's Hamiltonian's. "
        "null: no annealing.",
        allowed="`{from: {<coupling>: <number>, ...}, until: <fraction in (0, 1]>}`, e.g. "
        "`{from: {U: 2.0}, until: 0.25}`, or null",
    )


@dataclass
class ExactConfig(Section):
    prefix = "exact."

    enabled: Any = option(
        "auto",
        choice("auto", True, False),
        resumable=True,
        escape_hatch=True,
        doc="The exact reference. `auto`: ED when the sector has at most `max_dim` states, else "
        "a reference past ED where one exists (`physics/reference.py`: the Bethe ansatz ring, "
        "published square-lattice energies up to 10×10, some not exact); true: ED, an error "
        "above `max_dim`; false: no reference.",
        allowed="`auto` | true | false",
    )
    max_dim: int = option(
        5_000_000,
        integer(1),
        resumable=True,
        escape_hatch=True,
        doc="Largest sector (in states) to diagonalise.",
        allowed="int ≥ 1",
    )


@dataclass
class FinalConfig(Section):
    prefix = "final."

    n_samples: int | None = option(
        None,
        optional(integer(1)),
        resumable=True,
        doc="Samples of the final energy and observables: with a `budget` or `target_error`, the "
        "most the final measurement takes (it stops earlier when the budget ends or the target "
        "is reached; `final/stopped_by` says which). null: 8192 without either; with one, "
        "1,048,576.",
        allowed="int ≥ 1, or null",
    )
    target_error: float | None = option(
        None,
        optional(real(positive=True)),
        resumable=True,
        doc="Relative error of the final energy (σ/|E|, one standard error) at which the final "
        "measurement stops drawing samples. null: none; the samples or the budget end it.",
        allowed="float > 0, or null",
    )
    symmetrize: str = option(
        "none",
        choice(*SYMMETRIZE),
        resumable=True,
        doc="Measure the final energy of ψ averaged over the lattice translations (projected "
        "on the momentum of `model.sector`) or over the space group, as `model.symmetrize` "
        "does: for a model trained without it. A model trained with the spin inversion of "
        "`model.sector` keeps that projection.",
        allowed="`none` | `translations` | `space_group`",
    )
    spin_flip: int = option(
        0,
        choice(*SPIN_FLIPS),
        resumable=True,
        doc="Also project the final state on this eigenvalue of global spin inversion (spins at "
        "S^z = 0 only), for a model trained without `model.sector.spin_flip`. A singlet of N spins "
        "has (−1)^(N/2), +1 under `hamiltonian.sign_rule`; a value that contradicts this is "
        "refused for J1 > 0. 0: no projection.",
        allowed="0 | 1 | -1",
    )
    n_discard: int | None = option(
        None,
        optional(integer(0)),
        resumable=True,
        doc="Sweeps each chain makes before the final measurement keeps samples: the final ψ is "
        "another distribution than the steps sampled (|ψ|², averaged parameters, a symmetrized "
        "ψ, the last update), and chains that have not forgotten the old one bias the energy "
        "upward. null: as many as each chain then keeps (`final.n_samples / sampler.n_chains`), "
        "at least `sampler.n_discard`. The value used is stored as `final/n_discard`.",
        allowed="int ≥ 0, or null",
    )
    n_samples_observables: int | None = option(
        None,
        optional(integer(1)),
        resumable=True,
        doc="Samples the final observables (spin correlations and S(q); densities and the "
        "one-body density matrix) use: the first of each chain. They cost about as much per "
        "sample as the energy and need far fewer. null: all of `final.n_samples`.",
        allowed="int ≥ 1, or null",
    )


@dataclass
class OutputConfig(Section):
    prefix = "output."

    dir: str = option(
        "results",
        text(),
        resumable=True,
        runtime=True,
        escape_hatch=True,
        doc="Folder of the results files (`<dir>/<name>.h5`).",
        allowed="folder path",
    )
    checkpoint_every: int = option(
        25,
        integer(1),
        resumable=True,
        runtime=True,
        escape_hatch=True,
        doc="Steps between checkpoints (one is also written after the last step and on Ctrl-C "
        "or SIGTERM).",
        allowed="int ≥ 1",
    )


@dataclass
class DistributedConfig(Section):
    prefix = "distributed."

    timeout: float = option(
        600.0,
        real(positive=True, maximum=MAX_TIMEOUT),
        resumable=True,
        runtime=True,
        escape_hatch=True,
        doc="Seconds a rank waits for the others in one collective (a step's sums, rank 0's ED "
        "and file writes) before the run stops: a rank that died or hangs ends the job instead "
        "of torch's 30-minute wait. Raise it where one step or the ED takes longer.",
        allowed="float, 0 < t ≤ 1e7",
    )


_HAMILTONIANS = {"heisenberg": HeisenbergConfig, "bose_hubbard": BoseHubbardConfig}


@dataclass
class Config(Section):
    name: str | None = option(
        None,
        optional(file_name()),
        resumable=True,
        runtime=True,
        doc="The run's name: results go to `<output.dir>/<name>.h5`. null: the config file's "
        "name without `.yaml`.",
        allowed="plain file name (≤ 200 bytes, no `/`, no leading `.`), or null",
    )
    seed: int = option(
        0,
        integer(0, 2**63 - 1),
        doc="Seeds the initial parameters; the sampler seeds its generator with seed + 1.",
        allowed="int, 0 ≤ seed < 2^63",
    )
    device: str = option(
        "auto",
        device_name(),
        resumable=True,
        runtime=True,
        escape_hatch=True,
        doc="Where the run computes. `auto`: CUDA when present, else the CPU.",
        allowed="`auto` | `cpu` | `cuda` | `cuda:<index>`",
    )
    dtype: str = option(
        "float64",
        choice(*DTYPES),
        escape_hatch=True,
        doc="Precision of the network's parameters, and of log ψ, energies and gradients. The "
        "natural-gradient solve is float64-accurate either way (`vmc/sr.py`).",
        allowed="`float64` | `float32`",
    )
    threads: int | None = option(
        None,
        optional(integer(1, MAX_THREADS)),
        resumable=True,
        runtime=True,
        escape_hatch=True,
        doc="torch's CPU threads. null: torch's default.",
        allowed="int 1–4096, or null",
    )
    budget: float | None = option(
        None,
        optional(real(positive=True, maximum=MAX_BUDGET)),
        resumable=True,
        doc="Wall-clock seconds of the whole run, counted across resumes: setting up (ED "
        "included), the optimisation (until 85 % of it is spent) and the final measurement, "
        "which then draws samples until the budget ends (`final.n_samples` at most). The "
        "summary and `final/seconds` give the time taken. null: no budget; the run ends after "
        "`optimizer.n_iter` steps and `final.n_samples` samples.",
        allowed="float, 0 < t ≤ 1e7, or null",
    )
    lattice: LatticeConfig | None = None  # required, as is the hamiltonian
    hamiltonian: HeisenbergConfig | BoseHubbardConfig | None = None
    # left out (None): the recipe of the problem's class (`vitqs.recipes`)
    model: ModelConfig | None = None
    sampler: SamplerConfig | None = None
    optimizer: OptimizerConfig | None = None
    exact: ExactConfig = field(default_factory=ExactConfig)
    final: FinalConfig | None = None
    output: OutputConfig = field(default_factory=OutputConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self):
        for section in ("lattice", "hamiltonian"):
            if getattr(self, section) is None:
                raise ConfigError(f"the '{section}' section is required")
        super().__post_init__()
        _check_lattice(self.lattice, self.hamiltonian)  # before a recipe reads the lattice
        # the sections the config left out, which the recipe fills (not a field: a config
        # rebuilt from its resolved data has left out none)
        self.left_to_recipe = tuple(n for n in recipes.SECTIONS if getattr(self, n) is None)
        recipe = recipe_sections(self.lattice, self.hamiltonian, self.model)
        for name in self.left_to_recipe:
            setattr(self, name, recipe[name])
        _check_consistency(self)

    @property
    def n_sites(self) -> int:
        return self.lattice.n_sites

    def to_dict(self) -> dict:
        """Returns the resolved config as plain data (what the results file embeds)."""
        return dataclasses.asdict(self)


def recipe_sections(lattice, hamiltonian, model: ModelConfig | None = None) -> dict:
    """Returns the recipe of a lattice and Hamiltonian (`recipes.recipe`) as built sections,
    its sampler fitted to ``model`` where the config wrote one."""
    data = recipes.recipe(lattice, hamiltonian, model)
    return {name: _build(_SECTIONS[name], data[name], f"{name}.") for name in recipes.SECTIONS}


def recipe_followed(config: Config) -> dict:
    """Returns the recipe a config follows: ``{class, name, sections, not_taken}``, its
    sections (of `recipes.SECTIONS`) equal to its class's recipe, whether written or left
    out, and, where it left any section out, for each other section the recipe's values
    that it holds at the schema's defaults instead: a written section replaces the recipe's
    whole, so that a config writing ``sampler.n_samples`` alone also leaves the recipe's
    chains and ``machine_pow`` behind. A config that writes every section does not lean on
    the recipe, and is not told what it left."""
    kind = recipes.problem_class(config.hamiltonian)
    taken = recipe_sections(config.lattice, config.hamiltonian, config.model)
    sections = [name for name in recipes.SECTIONS if getattr(config, name) == taken[name]]
    not_taken = {}
    for name in recipes.SECTIONS if config.left_to_recipe else ():
        ours = dataclasses.asdict(getattr(config, name))
        recipes_own = dataclasses.asdict(taken[name])
        default = dataclasses.asdict(_SECTIONS[name]())
        left = {
            key: value
            for key, value in recipes_own.items()
            if ours[key] == default[key] != value  # not written, and the recipe's differs
        }
        if left:  # a section equal to the recipe's leaves nothing
            not_taken[name] = left
    return {
        "class": kind,
        "name": recipes.CLASSES[kind],
        "sections": sections,
        "not_taken": not_taken,
    }


def not_taken_lines(followed: dict) -> list[str]:
    """Returns a line for each section a config wrote that leaves recipe values behind
    (``not_taken`` of `recipe_followed`; absent from files written before it)."""
    return [
        f"{section} as written, without the recipe's "
        + ", ".join(f"{key}: {yaml_value(value)}" for key, value in left.items())
        for section, left in followed.get("not_taken", {}).items()
    ]


_SECTIONS = {
    "lattice": LatticeConfig,
    "model": ModelConfig,
    "sampler": SamplerConfig,
    "optimizer": OptimizerConfig,
    "exact": ExactConfig,
    "final": FinalConfig,
    "output": OutputConfig,
    "distributed": DistributedConfig,
}


def keys_with(rule: str) -> frozenset[str]:
    """Returns the dotted keys whose field carries ``rule`` (``"resumable"``,
    ``"free_across_init"`` or ``"runtime"``; see `option`), over every section and both
    Hamiltonians."""
    sections = [("", Config), *((f"{name}.", cls) for name, cls in _SECTIONS.items())]
    sections += [("hamiltonian.", cls) for cls in _HAMILTONIANS.values()]
    return frozenset(
        f"{prefix}{f.name}"
        for prefix, cls in sections
        for f in dataclasses.fields(cls)
        if f.metadata.get(rule)
    )


def key_defaults() -> dict:
    """Returns the default of every dotted key that has a plain default (not required),
    over every section and both Hamiltonians, and the off value of each retired key."""
    sections = [("", Config), *((f"{name}.", cls) for name, cls in _SECTIONS.items())]
    sections += [("hamiltonian.", cls) for cls in _HAMILTONIANS.values()]
    defaults = {}
    for prefix, cls in sections:
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING and not f.metadata.get("required"):
                defaults[f"{prefix}{f.name}"] = f.default
            elif f.default_factory is not dataclasses.MISSING and prefix:
                defaults[f"{prefix}{f.name}"] = f.default_factory()
    return {**RETIRED_KEYS, **defaults}


# ---- what a budget leaves to each part of the run ----------------------------------------

# The steps' share of a whole-run `budget`; the final measurement has the rest. Why 0.85: a
# 2σ goal of 1e-5 or below takes 10^5–10^6 final samples, which took 8 % of the J1-J2 4×4
# recipe's run (100 s after 1,200 s of steps), and the observables and the file come after.
OPTIMISATION_SHARE = 0.85
DEFAULT_STEPS = 300  # without a budget
DEFAULT_FINAL_SAMPLES = 8192  # without a budget or a target error
MOST_FINAL_SAMPLES = 2**20  # with one: what the final measurement takes at most


def optimisation_seconds(config: Config) -> float | None:
    """Returns the seconds the steps may run (counted from the run's start, across resumes),
    or None without a budget."""
    return None if config.budget is None else config.budget * OPTIMISATION_SHARE


def n_steps(config: Config) -> int | None:
    """Returns the optimisation steps of the config (`steps_of`)."""
    return steps_of(config.optimizer.n_iter, budgeted=config.budget is not None)


def steps_of(n_iter: int | None, budgeted: bool) -> int | None:
    """Returns the optimisation steps: ``n_iter``, else 300 without a budget and None (the
    budget ends them) with one."""
    if n_iter is not None:
        return n_iter
    return None if budgeted else DEFAULT_STEPS


def final_open_ended(config: Config) -> bool:
    """Returns whether the final measurement draws until a budget or a target error ends
    it (else exactly `final_samples`)."""
    return config.budget is not None or config.final.target_error is not None


def final_samples(config: Config) -> int:
    """Returns the final measurement's samples (its most, when `final_open_ended`)."""
    if config.final.n_samples is not None:
        return config.final.n_samples
    return MOST_FINAL_SAMPLES if final_open_ended(config) else DEFAULT_FINAL_SAMPLES


# ---- building and validating --------------------------------------------------------------


def _unknown_key_error(key: str, known: list[str], prefix: str) -> ConfigError:
    full = f"{prefix}{key}"
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; allowed: {', '.join(known)}"
    return ConfigError(f"unknown key '{full}'{hint}")


# Keys that levers measured and not adopted once had (issue 51), and the value that left
# them off: a config or a stored one (an older results file) holding that value means what
# it always meant, and the key is dropped; any other value asks for what vitqs no longer does.
RETIRED_KEYS = {
    "sampler.n_samples_late": None,
    "sampler.late_fraction": 0.75,
    "optimizer.clip_local_energy": None,
    "optimizer.max_update_ratio": None,
    "optimizer.jacobian_dtype": None,
    "sampler.compile": False,
    "sampler.sum_over_orbits": True,
    "model.head_init_std": 0.1,
    "sampler.rule": "auto",
    "sampler.sweep_size": None,
    "optimizer.method": "auto",
    "model.kind": "vit",
    "model.attention": "factored",
    "hamiltonian.mu": 0.0,
    "sampler.sector_table": True,
}
# Retired keys whose lever was adopted, or is chosen for the run: what vitqs does instead
RETIRED_BECAUSE = {
    "sampler.compile": "the chains are compiled where it pays, without a key: in a run of a "
    "budget of 600 s or more (build.compiled_chains), and a bare ViT of complex log ψ's "
    "log-derivatives with them (VMC._compiled_jacobian)",
    "sampler.sum_over_orbits": "a full sum always sums over the orbits of the model's symmetries",
    "model.head_init_std": "the head's output weights always start at std 0.1 (models/vit.py)",
    "sampler.rule": "the move follows the model: a spin exchange along the Hamiltonian's bonds "
    "for spins, a boson hop for bosons (vmc/rules.py)",
    "sampler.sweep_size": "a chain makes one proposal per site between kept samples; set "
    "sampler.n_discard for longer thermalisation",
    "optimizer.method": "the update is SR or its kernel form minSR, whichever matrix is smaller "
    "(the same update); Adam was removed",
    "model.kind": "the wave function is the ViT; the one-layer seed design and a Jastrow alone "
    "were removed (model.jastrow multiplies the ViT by one)",
    "model.attention": "the attention is factored, weights of the patches' positions only "
    "(softmax attention was removed)",
    "sampler.sector_table": "the chains walk a sector by table look-up whenever it holds no "
    "more states than a step's proposals (vmc/sector_walk.py): the same chains from the same "
    "random numbers as a forward pass per proposal, one forward pass over the sector instead",
    "hamiltonian.mu": "at a fixed number of bosons N a chemical potential only shifts every "
    "energy by −μN: subtract μN from the energies instead",
}


# Before issue 51 a schedule was three keys (``lr``, ``lr_final``, ``lr_schedule``, and the
# same for diag_shift); results files written then store them so.
_LEGACY_SCHEDULES = ("lr", "diag_shift")


def upgrade_stored(data):
    """Returns a stored config (the ``config_yaml`` of a results file) in today's keys: its
    sector of four model keys, schedules of three and anneal of two as one value each, its
    optimisation budget ``optimizer.max_seconds`` as the whole run's (its steps keep their
    seconds; the ``final.n_samples`` it stored is then the final measurement's most). Other
    data, and today's configs, unchanged."""
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, dict) and _LEGACY_SECTOR_KEYS & set(model):
        data = {**data, "model": _one_sector(model)}
    optimizer = data.get("optimizer") if isinstance(data, dict) else None
    if not isinstance(optimizer, dict):
        return data
    optimizer = dict(optimizer)
    if "max_seconds" in optimizer:  # before issue 52 the budget counted the steps only
        seconds = optimizer.pop("max_seconds")
        if seconds is not None and data.get("budget") is None:
            data = {**data, "budget": seconds / OPTIMISATION_SHARE}
    for name in _LEGACY_SCHEDULES:
        kind = optimizer.pop(f"{name}_schedule", None)
        final = optimizer.pop(f"{name}_final", None)
        if kind not in (None, "constant") and name in optimizer:
            optimizer[name] = {"schedule": kind, "start": optimizer[name], "end": final}
    if "anneal_from" in optimizer or "anneal_until" in optimizer:  # two keys before issue 51
        start, until = optimizer.pop("anneal_from", None), optimizer.pop("anneal_until", None)
        optimizer["anneal"] = None if start is None else {"from": start, "until": until}
    return {**data, "optimizer": optimizer}


# Before issue 51 a sector was four model keys: momentum, point_characters, spin_flip and
# sector (given | search)
_LEGACY_SECTOR_KEYS = {"momentum", "point_characters", "spin_flip"}


def _one_sector(model: dict) -> dict:
    """Returns a model section whose sector was written as separate keys with the one value
    ``sector`` (``search``, or a mapping of the keys given, null for none)."""
    model = dict(model)
    given = {name: model.pop(name) for name in SECTOR_KEYS if name in model}
    if model.get("sector") != "search":
        given = {k: v for k, v in given.items() if v != SECTOR_KEYS[k]}
        model["sector"] = given or None
    return model


def _without_retired(data: dict, prefix: str) -> dict:
    """Returns ``data`` without the retired keys that hold their off value; ConfigError for
    one that holds another."""
    kept = dict(data)
    for key, value in data.items():
        full = f"{prefix}{key}"
        if full not in RETIRED_KEYS:
            continue
        if value != RETIRED_KEYS[full]:
            why = RETIRED_BECAUSE.get(full, "this lever was measured, not adopted and removed")
            raise ConfigError(
                f"{full}={shown(value)}: {why} (issue 51; results/history/"
                f"performance_notes.md); delete the key"
            )
        del kept[key]
    return kept


def _refuse_legacy_keys(data: dict, prefix: str) -> None:
    """Raises for a value once written as several keys (a sector, a schedule, an anneal),
    naming the one value that says it now, and for the optimisation-only budget, naming the
    whole run's."""
    if prefix == "model." and (_LEGACY_SECTOR_KEYS & set(data) or data.get("sector") == "given"):
        given = _one_sector({**data, "sector": "given"})["sector"]
        today = "search" if data.get("sector") == "search" else yaml_value(given)
        if given is not None and today == "search":  # both: say which they are
            today = f"search (the run finds it) or model.sector: {yaml_value(given)}"
        raise ConfigError(
            "model.momentum / point_characters / spin_flip: the sector is one value now; "
            f"write model.sector: {today}"
        )
    if prefix != "optimizer.":
        return
    if data.get("max_seconds") is not None:
        seconds = data["max_seconds"]
        raise ConfigError(
            f"optimizer.max_seconds={shown(seconds)}: the wall-clock budget covers the whole "
            f"run now (the final measurement too; the steps get {OPTIMISATION_SHARE:.0%} of "
            f"it); write the top-level key budget: <seconds> instead"
        )
    for name in _LEGACY_SCHEDULES:
        if f"{name}_final" in data or f"{name}_schedule" in data:
            today = upgrade_stored({"optimizer": data})["optimizer"].get(name)
            raise ConfigError(
                f"optimizer.{name}_final / {name}_schedule: a schedule is one value now; "
                f"write optimizer.{name}: {yaml_value(today)} (a number for a constant)"
            )
    if "anneal_from" in data or "anneal_until" in data:
        today = upgrade_stored({"optimizer": data})["optimizer"]["anneal"]
        raise ConfigError(
            "optimizer.anneal_from / anneal_until: the anneal is one value now; write "
            f"optimizer.anneal: {yaml_value(today)}"
        )


def _build(cls, data, prefix: str):
    """Returns ``cls(**data)``, its values checked by the section itself; ``prefix`` is the
    dotted path, for unknown keys."""
    section = prefix.rstrip(".") or "config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{section} must be a mapping of keys to values, got {describe(data)}")
    _refuse_legacy_keys(data, prefix)
    if prefix == "optimizer." and "max_seconds" in data:  # null: no budget, as before
        data = {key: value for key, value in data.items() if key != "max_seconds"}
    data = _without_retired(data, prefix)
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in fields:
            raise _unknown_key_error(key, fields, prefix)
    return cls(**data)


def _build_hamiltonian(data):
    if not isinstance(data, dict):
        raise ConfigError(f"hamiltonian must be a mapping of keys to values, got {describe(data)}")
    if "kind" not in data:
        raise ConfigError("hamiltonian.kind is required: heisenberg | bose_hubbard")
    kind = data["kind"]
    if not isinstance(kind, str) or kind not in _HAMILTONIANS:
        close = difflib.get_close_matches(str(kind), list(_HAMILTONIANS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"hamiltonian.kind={kind!r} is not allowed; "
            f"choose one of: heisenberg | bose_hubbard{hint}"
        )
    return _build(_HAMILTONIANS[kind], data, "hamiltonian.")


def from_dict(data, *, default_name: str | None = None) -> Config:
    """Returns a validated ``Config`` from plain data (a parsed YAML document)."""
    if not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping of sections, got {describe(data)}")
    top = {f.name for f in dataclasses.fields(Config)}
    for key in data:
        if key not in top:
            raise _unknown_key_error(key, sorted(top), "")
    for section in ("lattice", "hamiltonian"):
        if section not in data:
            raise ConfigError(f"the '{section}' section is required")
    sections = {
        name: _build(cls, data.get(name), f"{name}.")
        for name, cls in _SECTIONS.items()
        if name not in recipes.SECTIONS or data.get(name) is not None  # else the recipe's
    }
    sections["hamiltonian"] = _build_hamiltonian(data["hamiltonian"])
    scalars = {name: data[name] for name in top if name in data and name not in sections}
    config = Config(**scalars, **sections)  # checks every value, then their consistency
    if config.name is None and default_name:
        config.name = file_name()("name", default_name)
    return config


# Sites a lattice may have: a 256 x 256 square. Far beyond what a ViT's attention or a
# Metropolis chain can hold; a larger lattice.shape is a typo that would exhaust memory.
MAX_SITES = 65_536


def _check_lattice(lattice: LatticeConfig, ham) -> None:
    """Checks that ``shape`` and ``pbc`` fit the kind, and that ladder couplings go on a
    ladder."""
    kind, shape = lattice.resolved_kind, lattice.shape
    dims = 1 if kind == "chain" else 2
    if len(shape) != dims:
        form = {"chain": "[L]", "ladder": "[L, legs]"}.get(kind, "[Lx, Ly]")
        raise ConfigError(f"lattice.shape={shape} must be {form} for lattice.kind={kind}")
    if isinstance(lattice.pbc, list) and len(lattice.pbc) != dims:
        raise ConfigError(
            f"lattice.pbc={lattice.pbc} must be one bool or a list of {dims} (one per axis of "
            f"lattice.shape={shape})"
        )
    for key in ("J_leg", "J_rung"):
        value = getattr(ham, key, None)
        if value is not None and kind != "ladder":
            raise ConfigError(
                f"hamiltonian.{key}={value} couples a ladder; lattice.kind={kind} has J1 and J2 "
                "only (set lattice.kind: ladder, or drop the key)"
            )


def _check_consistency(config: Config) -> None:
    """Checks that need more than one field (the lattice and the Hamiltonian together...)."""
    n_sites, ham = config.n_sites, config.hamiltonian
    _check_lattice(config.lattice, ham)
    if n_sites > MAX_SITES:
        raise ConfigError(
            f"lattice.shape={config.lattice.shape} has {n_sites:,} sites; vitqs handles at most "
            f"{MAX_SITES:,}"
        )
    if isinstance(ham, HeisenbergConfig):
        n_up = n_sites / 2 + ham.total_sz
        if n_up != int(n_up) or not 0 <= n_up <= n_sites:
            allowed = "an integer" if n_sites % 2 == 0 else "a half-integer"
            raise ConfigError(
                f"hamiltonian.total_sz={ham.total_sz} is impossible on {n_sites} sites: "
                f"it must be {allowed} between {-n_sites / 2} and {n_sites / 2}"
            )
    else:
        n_max = ham.n_max if ham.n_max is not None else max(ham.n_particles, 1)
        if ham.n_particles > n_sites * n_max:
            raise ConfigError(
                f"hamiltonian.n_particles={ham.n_particles} does not fit on {n_sites} sites "
                f"with n_max={n_max}: at most {n_sites * n_max}"
            )
    _check_positive(config.model, ham)
    _check_sign_prior(config)
    _check_final_spin_flip(config)
    _check_singlet_flip(config)
    _check_sector_search(config.model)
    _check_momentum_sector(config)
    _check_point_characters(config)
    _check_momentum(config.optimizer)
    _check_anneal(config)
    _check_metropolis_only(config)


def _check_sector_search(model: ModelConfig) -> None:
    if model.searches_sector and model.init_from is not None:
        raise ConfigError(
            f"model.sector=search finds the sector itself, from a random start; "
            f"model.init_from={shown(model.init_from)} gives a start: drop the key, or give "
            "model.sector as a mapping (momentum, point_characters, spin_flip)"
        )


def _check_final_spin_flip(config: Config) -> None:
    flip, trained = config.final.spin_flip, config.model.spin_flip
    if not flip:
        return
    ham = config.hamiltonian
    if not isinstance(ham, HeisenbergConfig) or ham.total_sz != 0:
        raise ConfigError(
            f"final.spin_flip={flip} needs spins at hamiltonian.total_sz=0, the only sector "
            "that spin inversion maps to itself; set final.spin_flip=0"
        )
    if trained and trained != flip:
        raise ConfigError(
            f"final.spin_flip={flip} contradicts model.sector.spin_flip={trained}, which the model "
            "already projects on; set final.spin_flip=0 (or equal to model.sector.spin_flip)"
        )


def _check_momentum_sector(config: Config) -> None:
    """Raises for a ``model.sector.momentum`` that does not fit the lattice or that no projection
    uses."""
    momentum, model = config.model.momentum, config.model
    lattice = config.lattice
    shape = list(lattice.shape)
    if momentum is not None and len(momentum) != len(shape):  # k = 0 written [0, 0] too
        raise ConfigError(
            f"model.sector.momentum={momentum} must hold one integer per axis of "
            f"lattice.shape={shape}"
        )
    if not momentum or not any(momentum):
        return
    pbc = pbc_per_axis(lattice.pbc, len(shape), lattice.resolved_kind)
    for axis, (n, extent, periodic) in enumerate(zip(momentum, shape, pbc, strict=True)):
        if not periodic and n:
            raise ConfigError(
                f"model.sector.momentum={momentum} has a momentum along axis {axis}, which is open "
                "(lattice.pbc): only 0 is allowed there"
            )
        if n >= extent:
            raise ConfigError(
                f"model.sector.momentum={momentum}: n_{axis}={n} must be below the lattice's "
                f"{extent} cells along axis {axis} (k = 2π n / L)"
            )
    projections = {model.symmetrize, config.final.symmetrize}
    if not projections & {"translations", "space_group"}:
        raise ConfigError(
            f"model.sector.momentum={momentum} needs model.symmetrize or final.symmetrize: "
            "translations or space_group, the projections it selects the sector of"
        )
    if model.positive:
        raise ConfigError(
            f"model.sector.momentum={momentum} needs a complex ψ (a state at k ≠ 0 changes sign or "
            "phase under translations); set model.positive: false"
        )


def _check_point_characters(config: Config) -> None:
    """Raises for ``model.sector.point_characters`` that no projection uses or that are not
    ±1 (their number and consistency depend on the lattice: checked where the model is
    built)."""
    chi = config.model.point_characters
    if chi is None:
        return
    if any(c not in (1, -1) for c in chi):
        raise ConfigError(f"model.sector.point_characters={chi} must hold +1 or -1 only")
    if "space_group" not in {config.model.symmetrize, config.final.symmetrize}:
        raise ConfigError(
            f"model.sector.point_characters={chi} select a sector of the space group: set "
            "model.symmetrize or final.symmetrize to space_group (or point_characters: null)"
        )


def _check_sign_prior(config: Config) -> None:
    """Raises for a sign prior on anything but a complex ViT of spins, or along an axis the
    lattice lacks (the geometry itself is checked where the lattice is built)."""
    model, prior = config.model, config.model.sign_prior
    if prior == "none":
        return
    if model.positive or not isinstance(config.hamiltonian, HeisenbergConfig):
        raise ConfigError(
            f"model.sign_prior={prior} multiplies a complex ViT of spins by a sign: it needs "
            f"model.positive=false (got {str(model.positive).lower()}) and "
            f"hamiltonian.kind=heisenberg (got {config.hamiltonian.kind}); or set "
            "model.sign_prior=none"
        )
    if prior == "search" and (model.sector == "search" or model.init_from is not None):
        given = "model.sector=search" if model.sector == "search" else "model.init_from"
        raise ConfigError(
            f"model.sign_prior=search races the priors from random starts, one search a run; "
            f"{given} is another start: set model.sign_prior to one of "
            f"{', '.join(FIXED_SIGN_PRIORS)}"
        )
    if prior not in ("stripes_x", "search") and len(config.lattice.shape) == 1:
        raise ConfigError(
            f"model.sign_prior={prior} needs a 2-d lattice, got lattice.shape="
            f"{config.lattice.shape}; a chain allows none or stripes_x"
        )


def _check_singlet_flip(config: Config) -> None:
    """Raises for a spin-inversion projection that removes the singlet ground state of an
    antiferromagnet (J1 > 0, J2 ≥ 0, S^z = 0): ψ would be trained or measured in a sector
    that holds no ground state, and its energy would stay far above E_exact."""
    ham = config.hamiltonian
    if not isinstance(ham, HeisenbergConfig) or ham.total_sz != 0 or ham.J1 <= 0 or ham.J2 < 0:
        return
    singlet = singlet_spin_flip(config.n_sites, ham.sign_rule)
    for key, value in (
        ("model.sector", config.model.spin_flip),
        ("final", config.final.spin_flip),
    ):
        if value == -singlet:
            rule = "with" if ham.sign_rule else "without"
            raise ConfigError(
                f"{key}.spin_flip={value} projects out the singlet ground state: {rule} "
                f"hamiltonian.sign_rule a singlet of {config.n_sites} spins has spin-inversion "
                f"eigenvalue {singlet:+d}; set {key}.spin_flip={singlet} (or 0)"
            )


def _check_metropolis_only(config: Config) -> None:
    """Raises for a key away from its default that only Monte Carlo sampling uses (null, the
    model's own dtype for the two network copies, is never an error)."""
    sampler = config.sampler
    if sampler.bare_chains and config.model.symmetrize == "none" and not config.model.spin_flip:
        raise ConfigError(
            "sampler.bare_chains=true runs the chains on the network under model.symmetrize or "
            "model.sector's spin_flip; with neither there is no other network (set "
            "sampler.bare_chains: false)"
        )
    if sampler.kind == "metropolis":
        return
    keys = [  # (key, value, default, why a full sum has no use for it)
        ("sampler.dtype", sampler.dtype, SamplerConfig.dtype, "a full sum runs no chains"),
        ("sampler.bare_chains", sampler.bare_chains, False, "a full sum runs no chains"),
        (
            "sampler.machine_pow",
            sampler.machine_pow,
            2.0,
            "a full sum weighs every state by |ψ|² exactly",
        ),
        (
            "sampler.local_energy_dtype",
            sampler.local_energy_dtype,
            None,
            "a full sum's local energies come from one sparse product, not the network",
        ),
    ]
    for key, value, default, why in keys:
        if value not in (default, None):
            raise ConfigError(
                f"{key}={value} needs sampler.kind=metropolis, not {sampler.kind!r}: {why}"
            )


def _check_positive(model: ModelConfig, ham) -> None:
    """A positive ψ can only be right when every off-diagonal element of H is <= 0."""
    if not model.positive:
        return
    if isinstance(ham, HeisenbergConfig):
        # in the sign-rule basis a J1 bond's exchange is -J1/2, a J2 bond's +J2/2
        stoquastic = (ham.J1 >= 0 if ham.sign_rule else ham.J1 <= 0) and ham.J2 <= 0
        found = f"J1={ham.J1}, J2={ham.J2}, sign_rule={str(ham.sign_rule).lower()}"
        allowed = "sign_rule=true with J1 >= 0 and J2 <= 0, or sign_rule=false with J1, J2 <= 0"
    else:
        stoquastic = ham.J >= 0
        found, allowed = f"J={ham.J}", "J >= 0"
    if not stoquastic:
        raise ConfigError(
            f"model.positive=true needs a ground state without signs, but the hamiltonian has "
            f"{found}; allowed: {allowed}, or set model.positive=false"
        )


# the couplings optimizer.anneal may start elsewhere (not the sector: it fixes the space)
_COUPLINGS = {"heisenberg": ("J1", "J2"), "bose_hubbard": ("J", "U")}


def _check_anneal(config: Config) -> None:
    cfg, ham = config.optimizer, config.hamiltonian
    if cfg.anneal is None:
        return
    start, until = cfg.anneal["from"], cfg.anneal["until"]
    allowed = _COUPLINGS[ham.kind]
    for name in start:
        if name not in allowed:
            raise ConfigError(
                f"optimizer.anneal.from.{name} is not a coupling of hamiltonian.kind={ham.kind}; "
                f"allowed: {', '.join(allowed)}"
            )
    if cfg.average_from is not None and cfg.average_from < until:
        raise ConfigError(
            f"optimizer.average_from={cfg.average_from} must be >= optimizer.anneal.until="
            f"{until}: the mean would hold states of another hamiltonian"
        )
    # H is linear in the couplings and the sign conditions are linear inequalities: if
    # both ends of the path allow a positive psi, every point between does
    try:
        _check_positive(config.model, dataclasses.replace(ham, **start))
    except ConfigError as err:
        raise ConfigError(f"optimizer.anneal.from={start}: {err}") from None


def _check_momentum(cfg: OptimizerConfig) -> None:
    """SPRING's memory is the diagonal shift: with λ = 0 the last direction is forgotten."""
    if not cfg.momentum:
        return
    if not all(schedule_values(cfg.diag_shift)):
        raise ConfigError(
            f"optimizer.diag_shift={cfg.diag_shift} must be > 0 with optimizer.momentum="
            f"{cfg.momentum}: the diagonal shift is what pulls a step towards the last one"
        )


def load(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Returns the validated config of a YAML file, with ``--set`` overrides applied."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return from_dict(data, default_name=Path(path).stem)
