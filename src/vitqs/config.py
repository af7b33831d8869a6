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

from vitqs.errors import ConfigError, describe, shown
from vitqs.yamlfile import apply_overrides, read_yaml

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
    default=_REQUIRED, check=None, *, resumable=False, free_across_init=False, runtime=False
):
    """A config field: its default (or required), its checker, and the rules of the field.

    Args:
        resumable: a resumed run may change the value: it does not alter the trajectory
            already recorded (the steps still to come, where files go, how the final state
            is measured).
        free_across_init: (``model`` keys) a run may start from another run's parameters
            (``model.init_from``) whose value differs: no parameter changes shape or meaning.
        runtime: the value says where and how a run goes, not what it computes: a sweep
            reads a finished point back whatever it is now.
    """
    metadata = {
        "check": check,
        "resumable": resumable,
        "free_across_init": free_across_init,
        "runtime": runtime,
    }
    if default is _REQUIRED:
        return field(default=None, metadata={**metadata, "required": True})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# ---- vocabularies: the values an option may take, written once --------------------------
# The modules that implement the options read them here (the sampler its rules, sr its
# solves, the models their kinds); nothing else spells them out.

SAMPLER_KINDS = ("metropolis", "full_sum")
SPIN_RULES = ("exchange", "exchange_global")  # the first is what auto picks
BOSON_RULES = ("hop",)
RULES = ("auto", *SPIN_RULES, *BOSON_RULES)
NATURAL_GRADIENTS = ("auto", "sr", "minsr")  # auto: the smaller of the two solves
METHODS = (*NATURAL_GRADIENTS, "adam")
SCHEDULES = ("exponential", "cosine")  # besides a constant, which is a plain number
MODEL_KINDS = ("vit", "simple_vit", "jastrow")
ATTENTIONS = ("factored", "full")
EMBEDDINGS = ("linear", "onehot")
SYMMETRIZE = ("none", "translations", "space_group")
SPIN_FLIPS = (0, 1, -1)  # the eigenvalue of spin inversion projected on (0: none)
# a fixed sign (−1)^(up spins on the cells of odd n_x | odd n_y | odd n_x + n_y) on ψ
SIGN_PRIORS = ("none", "stripes_x", "stripes_y", "stripes_xy")
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

    shape: list = option(check=int_list((1, 2), minimum=1))
    # one bool for every axis, or one per axis; a ladder's single bool is along its legs
    # (across them it stays open unless a list says otherwise)
    pbc: Any = option(
        True, either(boolean(), bool_list((1, 2)), expected="true, false or a list of them")
    )
    kind: str | None = option(None, optional(choice(*LATTICE_KINDS)))

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

    kind: str = option("heisenberg", choice("heisenberg"))
    J1: float = option(1.0, real())
    J2: float = option(0.0, real())
    # a ladder's order-1 bonds: along the legs and across them (rungs); None: J1
    J_leg: float | None = option(None, optional(real()))
    J_rung: float | None = option(None, optional(real()))
    sign_rule: bool = option(False, boolean())
    total_sz: float = option(0.0, real())


@dataclass
class BoseHubbardConfig(Section):
    prefix = "hamiltonian."

    kind: str = option("bose_hubbard", choice("bose_hubbard"))
    J: float = option(1.0, real())
    U: float = option(4.0, real())
    mu: float = option(0.0, real())
    n_particles: int = option(check=integer(1))
    n_max: int | None = option(None, optional(integer(1)))


@dataclass
class ModelConfig(Section):
    prefix = "model."

    kind: str = option("vit", choice(*MODEL_KINDS))
    patch_size: Any = option(
        2,
        either(
            integer(1), int_list((1, 2), minimum=1), expected="an integer >= 1 or a list of them"
        ),
    )
    d_model: int = option(16, integer(1))
    heads: int = option(4, integer(1))
    layers: int = option(2, integer(1))
    attention: str = option("factored", choice(*ATTENTIONS))
    translation_invariant: bool = option(True, boolean())
    embedding: str = option("linear", choice(*EMBEDDINGS))
    jastrow: bool = option(False, boolean())
    symmetrize: str = option("none", choice(*SYMMETRIZE), free_across_init=True)
    spin_flip: int = option(0, choice(*SPIN_FLIPS), free_across_init=True)
    # the crystal momentum of the sector that model.symmetrize and final.symmetrize:
    # translations project on, as integers [n_x, n_y] (one per axis, 0 <= n_i < L_i):
    # ψ(T_a x) = exp(i k·a) ψ(x) for a shift by a cells, k·a = 2π Σ n_i a_i / L_i. A small
    # cluster's ground state need not be at k = 0 (the kagome 2x3's is at [1, 0]). null: k = 0
    momentum: list | None = option(
        None, optional(int_list((1, 2), minimum=0)), free_across_init=True
    )
    # with symmetrize: space_group (model or final), the characters (+1 or -1) of the sector
    # under the rotations and reflections that keep model.momentum (the little group, identity
    # first, in the order `vitqs ed` reports the ground state's as point_characters): ψ(P x) =
    # χ_P ψ(x). A ground state odd under a reflection (the kagome 2x3's) needs it; null: all +1
    point_characters: list | None = option(
        None, optional(int_list((1, 48), minimum=-1)), free_across_init=True
    )
    # std of the head's complex output weights: small, so that log ψ starts near a constant
    # (ψ nearly uniform) and the first steps are not dominated by a random, peaked state; but
    # not too small: at S^z = 0 the uniform state is the fully polarised multiplet's member,
    # an exact eigenstate of any SU(2)-symmetric H, where the energy gradient vanishes. At
    # 1e-2 the log-derivatives (~std², ~1e-4) sink below SR's diagonal shift and a J1-J2 run
    # without sign rule sat at E/N = +0.75 for ~16 steps; 1e-1 leaves at once (0.3 and 1.0
    # start too rough)
    head_init_std: float = option(0.1, real(positive=True), free_across_init=True)
    # a real log ψ (ψ > 0): right for a Hamiltonian without a sign problem, whose ground
    # state is positive (Perron-Frobenius); half the log-derivatives, a 4x cheaper minSR solve
    positive: bool = option(False, boolean())
    # ψ(x) = s(x) ψ_ViT(x) with the fixed sign s(x) = (−1)^(up spins on the marked cells):
    # cells of odd n_x (stripes_x), odd n_y (stripes_y) or odd n_x + n_y (stripes_xy; the
    # Marshall sign on the square lattice). The network then learns the sign structure
    # relative to s; on the frustrated triangular 6x4 without it the ViT settled in the first
    # excited singlet (95% overlap), with stripes_x it did not (results/accuracy.md)
    sign_prior: str = option("none", choice(*SIGN_PRIORS))
    # a results file (.h5) of an earlier run to start from: its checkpoint's parameters (a
    # finished run's final state) and, when they are states of this sector, its Monte Carlo
    # chains. The network's shape must match; symmetrize and spin_flip may differ, so a
    # cheap bare run can be finished averaged. null: random parameters
    init_from: str | None = option(None, optional(text()), resumable=True, free_across_init=True)


@dataclass
class SamplerConfig(Section):
    prefix = "sampler."

    kind: str = option("metropolis", choice(*SAMPLER_KINDS))
    n_samples: int = option(1024, integer(1))
    n_chains: int = option(256, integer(1))
    sweep_size: int | None = option(None, optional(integer(1)))
    n_discard: int = option(16, integer(0))
    rule: str = option("auto", choice(*RULES))
    # memory only: a run killed for memory resumes with a smaller chunk
    chunk_size: int | None = option(None, optional(integer(1)), resumable=True)
    # precision of the network copy the Metropolis chains run on (null: the model's dtype);
    # the samples' log ψ, local energies, gradients and SR keep the model's dtype
    # (sampler.py). float32 by default: a float64 ViT's forward passes cost twice as much,
    # and the chains' |ψ|² moves by ~1e-6 relative, far below any sampling error
    dtype: str | None = option("float32", optional(choice(*DTYPES)), resumable=True)
    # precision of the network copy that evaluates the connected configurations in the
    # training steps' local energies (null: the model's dtype). The samples' log ψ, the sums,
    # gradients, SR and the final energy keep the model's dtype (models/precision.py)
    local_energy_dtype: str | None = option(None, optional(choice(*DTYPES)), resumable=True)
    # the chains sample |ψ|^machine_pow; each sample is weighted by |ψ|^(2 − machine_pow), so
    # energies, gradients and S remain those of |ψ|²: below 2, a peaked |ψ|² (a Mott
    # insulator) is sampled more evenly. The final energy samples |ψ|² itself (Metropolis only)
    machine_pow: float = option(2.0, real(positive=True))
    # Metropolis chains on the network under model.symmetrize / model.spin_flip, not on the
    # average itself: each proposal costs one forward pass instead of one per symmetry copy,
    # and every kept sample x is weighted by |ψ_sym(x)|²/|φ(x)|^machine_pow, so energies,
    # gradients and S stay those of |ψ_sym|². The final measurement samples |ψ|² itself
    bare_chains: bool = option(False, boolean())
    # on a sector with no more states than a step's sampling makes proposals, the chains walk
    # it by table look-up: one forward pass over the sector instead of one per proposal step,
    # the same chains from the same random numbers (vmc/sector_walk.py). false: never
    sector_table: bool = option(True, boolean(), resumable=True)
    # the chains' forward passes through torch.compile (vit models; models/compiled.py):
    # sampling 1.2-1.7x faster on the per-proposal path (float32, one core, 12 to 64 sites);
    # the first pass compiles (11-22 s, 3-5 s from torch's on-disk cache), so off by default
    compile: bool = option(False, boolean(), resumable=True)
    # stop a run whose Metropolis acceptance has been 0 for this many steps in a row: every
    # chain is frozen on its configuration (a collapsed state); null: never stop
    max_frozen_steps: int | None = option(50, optional(integer(1)), resumable=True, runtime=True)
    # full_sum only: sum over one state per orbit of the model's symmetries (translations,
    # rotations and reflections, spin inversion), weighted by the orbit's size: the same
    # sums at a fraction of the cost
    sum_over_orbits: bool = option(True, boolean())


@dataclass
class OptimizerConfig(Section):
    prefix = "optimizer."

    method: str = option("auto", choice(*METHODS))
    # learning rate and diagonal shift: a number, or {schedule: exponential | cosine, start,
    # end} over n_iter or max_seconds, whichever ends first
    lr: Any = option(0.01, schedule(positive=True), resumable=True)
    diag_shift: Any = option(1.0e-3, schedule(minimum=0.0), resumable=True)
    n_iter: int = option(300, integer(1), resumable=True)
    # wall-clock budget of the optimisation loop in seconds (null: none); schedules run over
    # n_iter or over this budget, whichever ends first, so a budgeted run ends its schedule
    max_seconds: float | None = option(None, optional(real(positive=True)), resumable=True)
    # the final state is the mean of the parameters measured after this fraction of the run
    # (of n_iter or of max_seconds): Polyak averaging of SR's noisy iterates (null: off)
    average_from: float | None = option(None, optional(real(minimum=0.0, maximum=1.0)))
    # SPRING (Goldshlager et al. 2024): the natural gradient regularised towards momentum ×
    # the last direction instead of towards zero, so what the samples of one step cannot
    # resolve is carried over from the steps before (null: plain SR / minSR)
    momentum: float | None = option(None, optional(real(minimum=0.0, maximum=0.999)))
    # start the hamiltonian's couplings at these values, e.g. {U: 3.3}, and move them linearly
    # to the hamiltonian section's over the first anneal_until of the run (of n_iter or of
    # max_seconds): the ground state is followed from where it is easy to find (null: off)
    anneal_from: dict | None = option(None, optional(real_mapping("{U: 3.3}")))
    anneal_until: float | None = option(None, optional(real(positive=True, maximum=1.0)))


@dataclass
class ExactConfig(Section):
    prefix = "exact."

    enabled: Any = option("auto", choice("auto", True, False), resumable=True)
    max_dim: int = option(5_000_000, integer(1), resumable=True)


@dataclass
class FinalConfig(Section):
    prefix = "final."

    n_samples: int = option(8192, integer(1), resumable=True)
    # measure the final energy of ψ averaged over the lattice translations (a k = 0 projection),
    # or over the space group (translations after rotations and reflections)
    symmetrize: str = option("none", choice(*SYMMETRIZE), resumable=True)
    # and over spin inversion, projecting on this eigenvalue (S^z = 0 spins only; 0: off):
    # for a model trained without model.spin_flip, whose sector is known
    spin_flip: int = option(0, choice(*SPIN_FLIPS), resumable=True)
    # sweeps each chain makes before the final measurement keeps a sample. The final state is
    # another distribution than the steps sampled (|ψ|² instead of |ψ|^machine_pow, averaged
    # parameters, a symmetrized ψ, the last update): chains started in the old one bias the
    # energy upward until they forget it. null: as many sweeps as each chain then keeps
    # (final.n_samples / sampler.n_chains), at least sampler.n_discard
    n_discard: int | None = option(None, optional(integer(0)), resumable=True)
    # samples the final observables (spin correlations and S(q), densities, the one-body
    # density matrix) use: the first of each chain. They cost about as much per sample as the
    # energy and need far fewer. null: all of final.n_samples
    n_samples_observables: int | None = option(None, optional(integer(1)), resumable=True)


@dataclass
class OutputConfig(Section):
    prefix = "output."

    dir: str = option("results", text(), resumable=True, runtime=True)
    checkpoint_every: int = option(25, integer(1), resumable=True, runtime=True)


@dataclass
class DistributedConfig(Section):
    prefix = "distributed."

    # seconds a rank waits for the others in one collective (a step's sums, rank 0's ED and
    # file writes) before the run stops: a rank that died or hangs ends the job, instead of
    # the others waiting torch's default 30 minutes. Raise it for steps or EDs that take longer
    timeout: float = option(
        600.0, real(positive=True, maximum=MAX_TIMEOUT), resumable=True, runtime=True
    )


_HAMILTONIANS = {"heisenberg": HeisenbergConfig, "bose_hubbard": BoseHubbardConfig}


@dataclass
class Config(Section):
    name: str | None = option(None, optional(file_name()), resumable=True, runtime=True)
    seed: int = option(0, integer(0, 2**63 - 1))  # the sampler seeds a generator with seed + 1
    device: str = option("auto", device_name(), resumable=True, runtime=True)
    dtype: str = option("float64", choice(*DTYPES))
    threads: int | None = option(
        None, optional(integer(1, MAX_THREADS)), resumable=True, runtime=True
    )
    lattice: LatticeConfig | None = None  # required, as is the hamiltonian
    hamiltonian: HeisenbergConfig | BoseHubbardConfig | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    exact: ExactConfig = field(default_factory=ExactConfig)
    final: FinalConfig = field(default_factory=FinalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self):
        for section in ("lattice", "hamiltonian"):
            if getattr(self, section) is None:
                raise ConfigError(f"the '{section}' section is required")
        super().__post_init__()
        _check_consistency(self)

    @property
    def n_sites(self) -> int:
        return self.lattice.n_sites

    def to_dict(self) -> dict:
        """Returns the resolved config as plain data (what the results file embeds)."""
        return dataclasses.asdict(self)


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
}


# Before issue 51 a schedule was three keys (``lr``, ``lr_final``, ``lr_schedule``, and the
# same for diag_shift); results files written then store them so.
_LEGACY_SCHEDULES = ("lr", "diag_shift")


def upgrade_stored(data):
    """Returns a stored config (the ``config_yaml`` of a results file) in today's keys: its
    schedules of three keys as one value. Other data, and today's configs, unchanged."""
    optimizer = data.get("optimizer") if isinstance(data, dict) else None
    if not isinstance(optimizer, dict):
        return data
    optimizer = dict(optimizer)
    for name in _LEGACY_SCHEDULES:
        kind = optimizer.pop(f"{name}_schedule", None)
        final = optimizer.pop(f"{name}_final", None)
        if kind not in (None, "constant") and name in optimizer:
            optimizer[name] = {"schedule": kind, "start": optimizer[name], "end": final}
    return {**data, "optimizer": optimizer}


def _without_retired(data: dict, prefix: str) -> dict:
    """Returns ``data`` without the retired keys that hold their off value; ConfigError for
    one that holds another."""
    kept = dict(data)
    for key, value in data.items():
        full = f"{prefix}{key}"
        if full not in RETIRED_KEYS:
            continue
        if value != RETIRED_KEYS[full]:
            raise ConfigError(
                f"{full}={shown(value)}: this lever was measured, not adopted and removed "
                f"(issue 51; results/performance.md); delete the key"
            )
        del kept[key]
    return kept


def _refuse_legacy_schedules(data: dict, prefix: str) -> None:
    """Raises for a schedule written as three keys, naming the one value that says it now."""
    if prefix != "optimizer.":
        return
    for name in _LEGACY_SCHEDULES:
        if f"{name}_final" in data or f"{name}_schedule" in data:
            today = upgrade_stored({"optimizer": data})["optimizer"].get(name)
            if isinstance(today, dict):  # as YAML writes it
                today = "{" + ", ".join(f"{k}: {v}" for k, v in today.items()) + "}"
            raise ConfigError(
                f"optimizer.{name}_final / {name}_schedule: a schedule is one value now; "
                f"write optimizer.{name}: {today} (a number for a constant)"
            )


def _build(cls, data, prefix: str):
    """Returns ``cls(**data)``, its values checked by the section itself; ``prefix`` is the
    dotted path, for unknown keys."""
    section = prefix.rstrip(".") or "config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{section} must be a mapping of keys to values, got {describe(data)}")
    _refuse_legacy_schedules(data, prefix)
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
    sections = {name: _build(cls, data.get(name), f"{name}.") for name, cls in _SECTIONS.items()}
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
    _check_momentum_sector(config)
    _check_point_characters(config)
    _check_momentum(config.optimizer)
    _check_anneal(config)
    _check_metropolis_only(config)


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
            f"final.spin_flip={flip} contradicts model.spin_flip={trained}, which the model "
            "already projects on; set final.spin_flip=0 (or equal to model.spin_flip)"
        )


def _check_momentum_sector(config: Config) -> None:
    """Raises for a ``model.momentum`` that does not fit the lattice or that no projection
    uses."""
    momentum, model = config.model.momentum, config.model
    if not momentum or not any(momentum):
        return
    from vitqs.physics.lattice import pbc_per_axis  # physics imports this module

    lattice = config.lattice
    shape = list(lattice.shape)
    if len(momentum) != len(shape):
        raise ConfigError(
            f"model.momentum={momentum} must hold one integer per axis of lattice.shape={shape}"
        )
    pbc = pbc_per_axis(lattice.pbc, len(shape), lattice.resolved_kind)
    for axis, (n, extent, periodic) in enumerate(zip(momentum, shape, pbc, strict=True)):
        if not periodic and n:
            raise ConfigError(
                f"model.momentum={momentum} has a momentum along axis {axis}, which is open "
                "(lattice.pbc): only 0 is allowed there"
            )
        if n >= extent:
            raise ConfigError(
                f"model.momentum={momentum}: n_{axis}={n} must be below the lattice's "
                f"{extent} cells along axis {axis} (k = 2π n / L)"
            )
    projections = {model.symmetrize, config.final.symmetrize}
    if not projections & {"translations", "space_group"}:
        raise ConfigError(
            f"model.momentum={momentum} needs model.symmetrize or final.symmetrize: "
            "translations or space_group, the projections it selects the sector of"
        )
    if model.positive:
        raise ConfigError(
            f"model.momentum={momentum} needs a complex ψ (a state at k ≠ 0 changes sign or "
            "phase under translations); set model.positive: false"
        )


def _check_point_characters(config: Config) -> None:
    """Raises for ``model.point_characters`` that no projection uses or that are not ±1 (their
    number and consistency depend on the lattice: checked where the model is built)."""
    chi = config.model.point_characters
    if chi is None:
        return
    if any(c not in (1, -1) for c in chi):
        raise ConfigError(f"model.point_characters={chi} must hold +1 or -1 only")
    if "space_group" not in {config.model.symmetrize, config.final.symmetrize}:
        raise ConfigError(
            f"model.point_characters={chi} select a sector of the space group: set "
            "model.symmetrize or final.symmetrize to space_group (or point_characters: null)"
        )


def _check_sign_prior(config: Config) -> None:
    """Raises for a sign prior on anything but a complex ViT of spins, or along an axis the
    lattice lacks (the geometry itself is checked where the lattice is built)."""
    model, prior = config.model, config.model.sign_prior
    if prior == "none":
        return
    if (
        model.kind != "vit"
        or model.positive
        or not isinstance(config.hamiltonian, HeisenbergConfig)
    ):
        raise ConfigError(
            f"model.sign_prior={prior} multiplies a complex ViT of spins by a sign: it needs "
            f"model.kind=vit (got {model.kind}), model.positive=false (got "
            f"{str(model.positive).lower()}) and hamiltonian.kind=heisenberg "
            f"(got {config.hamiltonian.kind}); or set model.sign_prior=none"
        )
    if prior != "stripes_x" and len(config.lattice.shape) == 1:
        raise ConfigError(
            f"model.sign_prior={prior} needs a 2-d lattice, got lattice.shape="
            f"{config.lattice.shape}; a chain allows none or stripes_x"
        )


def singlet_spin_flip(n_sites: int, sign_rule: bool) -> int:
    """Returns the eigenvalue of global spin inversion on a singlet of ``n_sites`` spins at
    S^z = 0: ``(−1)^(N/2)``, and +1 in the basis of the Marshall sign rule, whose rotation of
    the N/2 spins of one sublattice multiplies it by ``(−1)^(N/2)``."""
    return 1 if sign_rule else (-1) ** (n_sites // 2)


def _check_singlet_flip(config: Config) -> None:
    """Raises for a spin-inversion projection that removes the singlet ground state of an
    antiferromagnet (J1 > 0, J2 ≥ 0, S^z = 0): ψ would be trained or measured in a sector
    that holds no ground state, and its energy would stay far above E_exact."""
    ham = config.hamiltonian
    if not isinstance(ham, HeisenbergConfig) or ham.total_sz != 0 or ham.J1 <= 0 or ham.J2 < 0:
        return
    singlet = singlet_spin_flip(config.n_sites, ham.sign_rule)
    for key, value in (("model", config.model.spin_flip), ("final", config.final.spin_flip)):
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
            "model.spin_flip; with neither there is no other network (set sampler.bare_chains: "
            "false)"
        )
    if sampler.compile and config.model.kind != "vit":
        raise ConfigError(
            f"sampler.compile=true compiles the vit model's forward pass; model.kind="
            f"{config.model.kind} has none (set sampler.compile: false)"
        )
    if sampler.kind == "metropolis":
        return
    keys = [  # (key, value, default, why a full sum has no use for it)
        ("sampler.dtype", sampler.dtype, SamplerConfig.dtype, "a full sum runs no chains"),
        ("sampler.bare_chains", sampler.bare_chains, False, "a full sum runs no chains"),
        ("sampler.compile", sampler.compile, False, "a full sum runs no chains"),
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
    if model.kind != "vit":
        raise ConfigError(
            f"model.positive=true applies to model.kind='vit' (a jastrow is positive already), "
            f"got model.kind={model.kind!r}"
        )
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


# the couplings optimizer.anneal_from may start elsewhere (not the sector: it fixes the space)
_COUPLINGS = {"heisenberg": ("J1", "J2"), "bose_hubbard": ("J", "U", "mu")}


def _check_anneal(config: Config) -> None:
    cfg, ham = config.optimizer, config.hamiltonian
    if cfg.anneal_from is None:
        if cfg.anneal_until is not None:
            raise ConfigError(
                f"optimizer.anneal_until={cfg.anneal_until} needs optimizer.anneal_from "
                "(the couplings to start from, e.g. {U: 3.3})"
            )
        return
    allowed = _COUPLINGS[ham.kind]
    for name in cfg.anneal_from:
        if name not in allowed:
            raise ConfigError(
                f"optimizer.anneal_from.{name} is not a coupling of hamiltonian.kind={ham.kind}; "
                f"allowed: {', '.join(allowed)}"
            )
    if cfg.anneal_until is None:
        raise ConfigError("optimizer.anneal_until is required with optimizer.anneal_from")
    if cfg.average_from is not None and cfg.average_from < cfg.anneal_until:
        raise ConfigError(
            f"optimizer.average_from={cfg.average_from} must be >= optimizer.anneal_until="
            f"{cfg.anneal_until}: the mean would hold states of another hamiltonian"
        )
    # H is linear in the couplings and the sign conditions are linear inequalities: if
    # both ends of the path allow a positive psi, every point between does
    try:
        _check_positive(config.model, dataclasses.replace(ham, **cfg.anneal_from))
    except ConfigError as err:
        raise ConfigError(f"optimizer.anneal_from={cfg.anneal_from}: {err}") from None


def _check_momentum(cfg: OptimizerConfig) -> None:
    """SPRING's memory is the diagonal shift: with λ = 0 the last direction is forgotten."""
    if not cfg.momentum:
        return
    if cfg.method == "adam":
        raise ConfigError(
            f"optimizer.momentum={cfg.momentum} is SPRING's, for the natural gradient; "
            "optimizer.method=adam has its own moments (set optimizer.momentum: null)"
        )
    if not all(schedule_values(cfg.diag_shift)):
        raise ConfigError(
            f"optimizer.diag_shift={cfg.diag_shift} must be > 0 with optimizer.momentum="
            f"{cfg.momentum}: the diagonal shift is what pulls a step towards the last one"
        )


def load(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Returns the validated config of a YAML file, with ``--set`` overrides applied."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return from_dict(data, default_name=Path(path).stem)
