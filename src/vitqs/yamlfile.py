"""YAML text in, plain data out: safely, strictly, and with ``--set`` overrides applied.

Safe tags only (nothing read is executed), no key twice in one mapping (a second
``optimizer:`` section would silently replace the first), and a bound on the values aliases
may expand to. Malformed text is a `ConfigError` naming the file, the line and the column.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

from vitqs.errors import ConfigError, describe

# A config is a few dozen values; aliases that expand past this many are a mistake or an
# attack ("billion laughs": nine aliases of nine make 10^9 values out of a 1 kB file).
MAX_YAML_NODES = 100_000
# A config nests three levels (section, key, a list of lists); deeper text is a mistake or an
# attack, refused before PyYAML's recursive composer would overflow Python's stack.
MAX_YAML_DEPTH = 32


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only) that also refuses a key given twice in one
    mapping: a second ``optimizer:`` section would silently replace the first."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' merges, then overrides
            continue
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
        try:
            if key in seen:
                raise ConfigError(
                    f"key '{key}' appears twice in one mapping (lines {seen[key]} and {line}); "
                    "keep one"
                )
            seen[key] = line
        except TypeError:  # an unhashable key: the constructor below says so
            continue
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _expanded_size(node, sizes: dict, open_nodes: set) -> int:
    """Returns the number of values ``node`` stands for once its aliases are expanded (an
    alias is the anchored node itself in PyYAML's graph: memoized, this is linear)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise ConfigError("a YAML alias refers to a node that contains it; configs are trees")
    open_nodes.add(key)
    children = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    total = 1
    for child in children:
        total += _expanded_size(child, sizes, open_nodes)
        if total > MAX_YAML_NODES:
            break
    open_nodes.discard(key)
    sizes[key] = total
    return total


_BRACKETS = re.compile(r"[\[\]{}]")


def _nests_deeper(source: str, limit: int) -> bool:
    """Returns whether the collections of ``source`` nest deeper than ``limit``: first its
    brackets and braces counted as characters (quoted ones too: no config quotes 33 of
    them), which costs nothing, where PyYAML's scanner reads 1,024 characters of tokens
    ahead of each bracket (5,000 of them: 0.8 MB); then its tokens, for block sequences and
    mappings. No recursion, and it stops at the first level past ``limit``."""
    depth = 0
    for bracket in _BRACKETS.finditer(source):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > limit:
            return True
    depth = 0
    opening = (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken)
    opening += (yaml.BlockSequenceStartToken, yaml.BlockMappingStartToken)
    closing = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken, yaml.BlockEndToken)
    for token in yaml.scan(source, Loader=yaml.SafeLoader):
        if isinstance(token, opening):
            depth += 1
            if depth > limit:
                return True
        elif isinstance(token, closing):
            depth -= 1
    return False


def parse_yaml(source: str):
    """Returns the plain data of one YAML document: safe tags only, no key twice in a mapping,
    at most ``MAX_YAML_NODES`` values once aliases are expanded, nested at most
    ``MAX_YAML_DEPTH`` deep. Raises ConfigError for the last three and yaml.YAMLError for
    malformed text."""
    if _nests_deeper(source, MAX_YAML_DEPTH):
        raise ConfigError(f"the YAML nests deeper than {MAX_YAML_DEPTH} levels; a config nests 3")
    loader = _StrictLoader(source)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, set()) > MAX_YAML_NODES:
            raise ConfigError(
                f"the YAML expands to more than {MAX_YAML_NODES:,} values through its aliases"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path):
    """Returns the parsed YAML document at ``path``; ConfigError when missing or malformed."""
    path = Path(path)
    try:
        source = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file '{path}' cannot be read: {err}") from None
    try:
        return parse_yaml(source)
    except ConfigError as err:
        raise ConfigError(f"config file '{path}': {err}") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file '{path}' is not valid YAML{at}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"config file '{path}' nests deeper than a config can") from None


def set_dotted(data: dict, key: str, value) -> None:
    """Sets ``data[a][b][c] = value`` for ``key = "a.b.c"``, creating empty sections."""
    if not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping of sections, got {describe(data)}")
    node, parts = data, key.strip().split(".")
    for depth, part in enumerate(parts[:-1]):
        if node.get(part) is None:  # an empty section in YAML reads as None
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            path = ".".join(parts[: depth + 1])
            raise ConfigError(f"--set {key}: '{path}' is not a section")
    node[parts[-1]] = value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Returns a copy of ``data`` with ``key.path=value`` overrides set (values parsed as YAML)."""
    data = copy.deepcopy(data) if isinstance(data, dict) else data
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        shown = repr(item) if len(item) <= 80 else f"{item[:60]!r}..."
        if not sep or not key.strip():
            raise ConfigError(f"--set {shown} must look like key.path=value")
        try:
            value = parse_yaml(raw)
        except ConfigError as err:
            raise ConfigError(f"--set {shown}: {err}") from None
        except yaml.YAMLError:
            raise ConfigError(f"--set {shown}: the value is not valid YAML") from None
        set_dotted(data, key, value)
    return data


def yaml_value(value) -> str:
    """Returns ``value`` as YAML writes it in flow style, on one line, mappings in their own
    order (null, true, 0.001, [1, 2], {from: {U: 2.0}, until: 0.25})."""
    text = yaml.safe_dump(
        value, default_flow_style=True, width=10**9, allow_unicode=True, sort_keys=False
    )
    return text.removesuffix("...\n").strip()
