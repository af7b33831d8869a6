"""The layout ARCHITECTURE.md draws, read off the imports: each module imports only from its
own layer and the layers above it, and no two modules import each other in a circle (an
import inside a function counts: it is an import all the same)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vitqs"

# ARCHITECTURE.md's table, top to bottom
LAYERS = {
    "base": ["config", "recipes", "yamlfile", "errors", "distributed", "h5tree", "files"],
    "physics": ["physics"],
    "models": ["models"],
    "vmc": ["vmc"],
}
SHELL = "shell"  # every other module of the package


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    first = module.split(".")[1] if module.count(".") else ""
    for layer, names in LAYERS.items():
        if first in names:
            return layer
    return SHELL


def _imports() -> dict[str, set[str]]:
    """Returns each module's vitqs imports (to the module, not the names in it)."""
    modules = {_module(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                found = [name for name in names if name in modules]
                targets.update(found or ([node.module] if node.module in modules else []))
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in modules)
        graph[module] = {t for t in targets if t.startswith("vitqs") and t != module}
    return graph


def test_no_module_imports_from_a_layer_below_its_own():
    order = [*LAYERS, SHELL]
    wrong = [
        f"{module} ({_layer(module)}) imports {target} ({_layer(target)})"
        for module, targets in _imports().items()
        for target in targets
        if target != "vitqs" and order.index(_layer(target)) > order.index(_layer(module))
    ]
    assert wrong == []


def test_no_import_circles():
    graph = _imports()
    circles, state = [], {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                circles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # a package's __init__ re-exporting its own submodules is no circle of the layout
    circles = [c for c in circles if not all(m.startswith(c[0] + ".") for m in c[1:-1])]
    assert circles == []


def test_the_metropolis_sampler_imports_nothing_of_the_models():
    # the network the chains run on comes built (models/chains.py via build.py): the sampler
    # asks it, never which model it has
    imports = _imports()["vitqs.vmc.sampler"]
    assert not [target for target in imports if target.startswith("vitqs.models")]
