"""docs/config.md: the reference of every config key, written from the schema in `config.py`.

Each field's ``doc``, ``allowed``, default and rules come from its `option` metadata; beside
them, the shipped configs (``configs/``, read from the checkout this module sits in) that set
the key away from its default, or the mark of an escape hatch. The text depends on nothing
else (no date, no machine), so the file is reproducible byte for byte and a test compares it.

Regenerate with ``python -m vitqs.config_reference --write``; without ``--write`` the text goes
to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from vitqs import config
from vitqs.yamlfile import MAX_YAML_NODES, read_yaml, yaml_value

CHECKOUT = Path(__file__).resolve().parents[2]
CONFIGS = CHECKOUT / "configs"
DOC_PATH = CHECKOUT / "docs" / "config.md"
REGENERATE = "python -m vitqs.config_reference --write"

# a key set by more shipped configs than this is shown as a count, not a list
_MAX_LISTED = 3


@dataclass(frozen=True)
class SchemaSection:
    title: str
    prefix: str  # the dotted path of its keys: "" at the top level, "sampler." ...
    cls: type
    kind: str | None = None  # the hamiltonian.kind that selects the section, for the two


def sections() -> list[SchemaSection]:
    """Returns every section of the schema in the order of a config file, both Hamiltonians."""
    found = [SchemaSection("Top level", "", config.Config)]
    for name, cls in config._SECTIONS.items():
        found.append(SchemaSection(f"`{name}`", f"{name}.", cls))
        if name == "lattice":
            found += [
                SchemaSection(f"`hamiltonian` with `kind: {kind}`", "hamiltonian.", cls, kind)
                for kind, cls in config._HAMILTONIANS.items()
            ]
    return found


def option_fields(cls) -> list[dataclasses.Field]:
    """Returns the fields of a section made by `config.option` (not the nested sections)."""
    return [f for f in dataclasses.fields(cls) if "check" in f.metadata]


def is_required(section: SchemaSection, f: dataclasses.Field) -> bool:
    # a Hamiltonian's kind has a default in Python, but a config must name it (it picks the
    # section: config._build_hamiltonian)
    return bool(f.metadata.get("required")) or (section.kind is not None and f.name == "kind")


def default_of(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


@dataclass(frozen=True)
class Row:
    section: SchemaSection
    field: dataclasses.Field
    set_by: tuple[str, ...]  # shipped configs (relative to configs/) that set it off default

    @property
    def key(self) -> str:
        return f"{self.section.prefix}{self.field.name}"

    @property
    def escape_hatch(self) -> bool:
        return bool(self.field.metadata.get("escape_hatch"))

    @property
    def physics(self) -> bool:
        return bool(self.field.metadata.get("physics"))


def rows(configs: Path = CONFIGS) -> list[Row]:
    """Returns one row per key of every section, with the shipped configs under ``configs``
    that set it away from its default."""
    settings = shipped_settings(configs)
    return [
        Row(section, f, tuple(settings.get((section.kind, f"{section.prefix}{f.name}"), ())))
        for section in sections()
        for f in option_fields(section.cls)
    ]


# ---- which shipped configs set which key ------------------------------------------------


def _written_values(path: Path) -> tuple[str | None, dict[str, list]]:
    """Returns the hamiltonian kind of a config or sweep file and, for each dotted key the
    file itself writes, the values it gives it (a sweep writes its ``set`` and its grid; what
    its base sets is the base's)."""
    data = read_yaml(path)
    if "sweep" in data:
        base = read_yaml(path.parent / str(data["base"]))
        written = {key: [value] for key, value in (data.get("set") or {}).items()}
        for key, values in data["sweep"].items():
            written.setdefault(key, []).extend(values)
        kind = written.get("hamiltonian.kind", [base["hamiltonian"]["kind"]])[0]
        return kind, written
    written = {}
    for name, value in data.items():
        if isinstance(value, dict) and name in ("hamiltonian", *config._SECTIONS):
            written.update({f"{name}.{key}": [item] for key, item in value.items()})
        else:
            written[name] = [value]
    return data["hamiltonian"]["kind"], written


def _sets_away_from_default(section: SchemaSection, f: dataclasses.Field, values: list) -> bool:
    if is_required(section, f):
        return True
    key, check = f"{section.prefix}{f.name}", f.metadata["check"]
    return any(check(key, value) != default_of(f) for value in values)


def shipped_settings(configs: Path = CONFIGS) -> dict[tuple[str | None, str], list[str]]:
    """Returns, for each (hamiltonian kind or None, dotted key), the configs under ``configs``
    (paths relative to it, sorted) that set the key to something other than its default."""
    if not configs.is_dir():
        raise FileNotFoundError(
            f"{configs} is not a folder: the reference counts the shipped configs of a checkout "
            "(run from the repository, installed with pip install -e .)"
        )
    fields = {}
    for section in sections():
        for f in option_fields(section.cls):
            fields[(section.kind, f"{section.prefix}{f.name}")] = (section, f)
    found: dict[tuple[str | None, str], list[str]] = {}
    for path in sorted(configs.rglob("*.yaml")):
        kind, written = _written_values(path)
        for key, values in written.items():
            where = (kind if key.startswith("hamiltonian.") else None, key)
            if where not in fields:
                raise ValueError(f"{path}: '{key}' is not a config key")
            if _sets_away_from_default(*fields[where], values):
                found.setdefault(where, []).append(path.relative_to(configs).as_posix())
    return found


# ---- the text ------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Returns ``text`` as one Markdown table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _may_change(f: dataclasses.Field) -> str:
    rules = [("resumable", "`--resume`"), ("free_across_init", "`init_from`")]
    return ", ".join(name for rule, name in rules if f.metadata.get(rule))


def _set_by(row: Row) -> str:
    if len(row.set_by) > _MAX_LISTED:
        shipped = f"{len(row.set_by)} configs"
    else:
        shipped = ", ".join(f"`{path}`" for path in row.set_by)
    for mark, name in ((row.escape_hatch, "escape hatch"), (row.physics, "physics")):
        if mark:
            return f"{name}; {shipped}" if shipped else name
    return shipped or "—"


def _table(section_rows: list[Row]) -> list[str]:
    lines = [
        "| key | allowed | default | meaning | may change on | set by |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in section_rows:
        f = row.field
        required = is_required(row.section, f)
        default = "required" if required else f"`{yaml_value(default_of(f))}`"
        cells = [
            f"`{row.key}`",
            f.metadata["allowed"],
            default,
            f.metadata["doc"],
            _may_change(f),
            _set_by(row),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _introduction() -> list[str]:
    return [
        "# Configuration reference",
        "",
        f"Generated from the schema in `src/vitqs/config.py` by `{REGENERATE}`: edit the "
        "fields' `doc` and `allowed` there, not this file (`tests/test_config_reference.py` "
        "fails when it is stale).",
        "",
        "One YAML file per run. Keys map one to one onto the dataclass fields of `config.py`, "
        "where the defaults live; an unknown key is an error that names the closest known one. "
        "`--set section.key=value` overrides one key by its dotted path (the value is read as "
        "YAML). **may change on** names what a `--resume` may change (the rest must match the "
        "checkpoint) and, for `model` keys, what may differ from the run `model.init_from` "
        "starts from. **set by** names the shipped configs (`configs/`) that set the key to "
        "something other than its default, or counts them; an **escape hatch** is a setting "
        "kept for when the default does not fit the machine or the run (device, precision, "
        "memory, time, files), whether or not a shipped config sets it; **physics** marks a "
        "parameter of the system studied (boundary conditions, couplings, the sector), which "
        "a physicist sets for their problem.",
        "",
        "**A section left out is a recipe.** The `model`, `sampler`, `optimizer` and `final` "
        "sections a config does not write are the measured recipe of its problem's class "
        "(spins with a sign rule, spins without one, bosons: `src/vitqs/recipes.py`, "
        "[new_system.md](new_system.md)); the run prints the class and the sections its "
        "recipe gave. A section the config writes is its own: the keys it leaves out take the "
        "defaults of the tables below, never the recipe's.",
        "",
        f"Integers are at most {config.MAX_INTEGER:,} (2^53), lattices at most "
        f"{config.MAX_SITES:,} sites, names (`name`, a sweep's `name` and its points' "
        f"`key=value`) plain file names of at most {config.MAX_NAME_BYTES} bytes without `/`, a "
        "leading `.` or control characters, and text values without control characters. A YAML "
        "key given twice in one mapping is an error, and so are aliases that expand to more "
        f"than {MAX_YAML_NODES:,} values.",
    ]


def _retired() -> list[str]:
    lines = [
        "## Retired keys",
        "",
        "Levers that were measured and not adopted, and choices vitqs now makes itself "
        "(issue 51; results/history/ keeps the measurements). A config, or an older results "
        "file, that holds the value which left one off still reads, the key dropped; any other "
        "value is refused with one line that says why.",
        "",
        "| key | the value that left it off | what vitqs does instead |",
        "| --- | --- | --- |",
    ]
    for key, off in config.RETIRED_KEYS.items():
        instead = config.RETIRED_BECAUSE.get(key, "nothing: the lever was removed")
        lines.append(f"| `{key}` | `{yaml_value(off)}` | {instead} |")
    legacy = "; ".join(
        f"`optimizer.{name}` with `{name}_final` and `{name}_schedule`"
        for name in config._LEGACY_SCHEDULES
    )
    lines += [
        "",
        f"A schedule was once three keys ({legacy}). Results files written then read as the one "
        "value, `{schedule, start, end}`; a config that holds them is refused with the value to "
        "write.",
    ]
    return lines


def reference_markdown(configs: Path = CONFIGS) -> str:
    """Returns the text of docs/config.md: the introduction, one table per section, then the
    retired keys."""
    all_rows = rows(configs)
    lines = _introduction()
    for section in sections():
        lines += ["", f"## {section.title}", ""]
        lines += _table([row for row in all_rows if row.section == section])
    lines += ["", *_retired()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vitqs.config_reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--write", action="store_true", help=f"write {DOC_PATH}")
    args = parser.parse_args(argv)
    text = reference_markdown()
    if args.write:
        DOC_PATH.parent.mkdir(exist_ok=True)
        DOC_PATH.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
