"""docs/config.md is the schema's own account of itself (issue 51): every option documents
itself in `config.py`, the file equals what the generator writes from it, and every key is
either set by a shipped config or named an escape hatch."""

import dataclasses
import re
from pathlib import Path

import pytest

from vitqs import config
from vitqs.config_reference import (
    DOC_PATH,
    REGENERATE,
    default_of,
    is_required,
    option_fields,
    reference_markdown,
    rows,
    sections,
    yaml_value,
)

README = Path(__file__).resolve().parents[1] / "README.md"

# Keys that no shipped config sets away from its default and that are neither escape hatches
# nor parameters of the system studied (physics). Issue 51 removed or adopted each; a new key
# of that kind fails the test below unless it is listed here with the reason it waits.
NEITHER_SET_NOR_ESCAPE_HATCH: set[str] = set()


def test_every_option_of_every_section_documents_itself():
    undocumented = [
        f"{section.prefix}{f.name} ({part})"
        for section in sections()
        for f in option_fields(section.cls)
        for part in ("doc", "allowed")
        if not f.metadata.get(part, "").strip()
    ]
    assert not undocumented, f"options without doc or allowed in config.py: {undocumented}"


def test_the_sections_cover_every_field_of_the_schema():
    covered = {(s.cls, f.name) for s in sections() for f in option_fields(s.cls)}
    schema = [config.Config, *config._SECTIONS.values(), *config._HAMILTONIANS.values()]
    nested = {"lattice", "hamiltonian", *config._SECTIONS}
    every = {
        (cls, f.name)
        for cls in schema
        for f in dataclasses.fields(cls)
        if not (cls is config.Config and f.name in nested)
    }
    assert covered == every


def test_docs_config_md_is_what_the_schema_generates():
    expected = reference_markdown()
    found = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else None
    assert found == expected, f"docs/config.md is stale: regenerate it with `{REGENERATE}`"


def test_every_key_is_set_by_a_shipped_config_or_is_an_escape_hatch():
    neither = {row.key for row in rows() if not (row.set_by or row.escape_hatch or row.physics)}
    new, settled = neither - NEITHER_SET_NOR_ESCAPE_HATCH, NEITHER_SET_NOR_ESCAPE_HATCH - neither
    assert not new, (
        f"{sorted(new)}: no shipped config sets these away from their default and they are not "
        "escape hatches: set one in a config under configs/, mark it escape_hatch=True in "
        "config.py with its reason, or remove the key"
    )
    assert not settled, (
        f"{sorted(settled)} are now set by a shipped config or escape hatches: remove them from "
        "NEITHER_SET_NOR_ESCAPE_HATCH"
    )


def test_a_required_key_and_a_hamiltonian_kind_show_as_required():
    text = reference_markdown()
    assert "| `lattice.shape` |" in text
    for line in text.splitlines():
        if line.startswith(("| `lattice.shape` |", "| `hamiltonian.kind` |")):
            assert line.split(" | ")[2] == "required"


@pytest.mark.parametrize(
    "value, written", [(None, "null"), (True, "true"), (1.0e-3, "0.001"), ([2, 2], "[2, 2]")]
)
def test_defaults_are_written_as_yaml_writes_them(value, written):
    assert yaml_value(value) == written


def _readme_configuration_rows() -> list[tuple[str, str]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Configuration\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            found.append((cells[0], cells[1]))
    return found


def test_the_readme_table_names_real_keys_with_their_defaults():
    """The README's short table (`a.b`, `c` means a.b and a.c) agrees with the schema."""
    schema = {}
    for section in sections():
        for f in option_fields(section.cls):
            default = "required" if is_required(section, f) else yaml_value(default_of(f))
            schema[f"{section.prefix}{f.name}"] = default
    readme_rows = _readme_configuration_rows()
    assert len(readme_rows) >= 10
    for keys_cell, defaults_cell in readme_rows:
        names = [k.strip(" `") for k in keys_cell.split(",")]
        prefix = names[0].rpartition(".")[0]
        keys = [names[0], *(f"{prefix}.{name}" for name in names[1:])]
        defaults = [d.strip(" `") for d in defaults_cell.split(",")]
        assert len(defaults) == len(keys), keys_cell
        for key, default in zip(keys, defaults, strict=True):
            assert key in schema, f"README names {key}, which is not a config key"
            assert default == schema[key], f"README gives {key} the default {default}"
