"""The front door holds: README reads in ten minutes, every command and config in README and
docs/ is one vitqs accepts, every link lands, and the headline table is the stored rows'."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from vitqs.config import from_dict, load
from vitqs.sweep import load_sweep, point_configs

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_WORDS = 1500


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)


def _commands(page: Path) -> list[list[str]]:
    """Returns the ``vitqs ...`` commands of a page's bash blocks, split like a shell does."""
    commands = []
    for block in _blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            for part in re.split(r"&&|;", line):
                words = shlex.split(part)
                if words[:1] == ["vitqs"]:
                    commands.append(words[1:])
    return commands


def test_the_readme_reads_in_ten_minutes():
    assert len((ROOT / "README.md").read_text().split()) <= README_WORDS


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_of_a_page_names_a_config_vitqs_accepts(page):
    for command in _commands(page):
        name, rest = command[0], command[1:]
        if name in ("report", "bench") or not rest or "CONFIG" in rest[0]:
            continue  # a results path, or a placeholder
        overrides = [rest[i + 1] for i, word in enumerate(rest) if word == "--set"]
        target = ROOT / rest[0]
        assert target.is_file(), f"{page.name}: {' '.join(command)}"
        if name == "sweep":
            assert point_configs(load_sweep(target))
        else:
            load(target, overrides)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_and_yaml_block_parses(page):
    for block in _blocks(page, "python"):
        compile(block, str(page), "exec")
    for block in _blocks(page, "yaml"):
        from_dict(yaml.safe_load(block), default_name="doc")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_lands(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_the_headline_table_is_the_stored_rows():
    from vitqs.accuracy import load_rows, render_headline

    rows = load_rows(ROOT / "results" / "benchmarks", "accuracy")
    expected = render_headline(rows)
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- begin headline -->\n(.*?)\n<!-- end headline -->", readme, re.S)
    assert block and block.group(1) == expected, (
        "README's headline is stale: vitqs bench accuracy --report-only rewrites it"
    )
    assert expected.count("\n") >= 4  # rows, not an empty table


def test_the_readme_summary_of_the_defaults_is_the_stored_rows():
    from vitqs.accuracy import load_rows, render_defaults_summary

    rows = load_rows(ROOT / "results" / "benchmarks", "defaults")
    expected = render_defaults_summary(rows)
    readme = (ROOT / "README.md").read_text()
    block = re.search(
        r"<!-- begin defaults-summary -->\n(.*?)\n<!-- end defaults-summary -->", readme, re.S
    )
    assert block and block.group(1) == expected, (
        "README's defaults summary is stale: vitqs bench accuracy --report-only rewrites it"
    )
    assert expected.count("\n") >= 4  # rows, not an empty table
