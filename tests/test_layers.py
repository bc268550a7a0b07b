"""The package's layers: every import (also those inside functions) goes downward, and nothing forms a cycle.

    cli  ->  pipeline  ->  federated  ->  families, device  ->  core

families and device sit side by side and never import each other: the device knows a model only through
model.json and the generated header. See docs/design.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tinyproto
from helpers import LAYER_RANK

PACKAGE = Path(tinyproto.__file__).resolve().parent
RANK = LAYER_RANK
# Modules at the package root: the entry point, and the package itself (a facade: its version, which every layer
# may read, and the estimators it exports lazily).
ROOT_MODULES = {"tinyproto.__main__": 6, "tinyproto": 6}
# Known back edges being removed (each names its issue); the list only shrinks.
KNOWN: set[str] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every tinyproto module `path` imports, at any depth of its code."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "tinyproto")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            if base.split(".")[0] != "tinyproto":
                continue
            for alias in node.names:  # `from tinyproto.x import y` may import the module tinyproto.x.y
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _layer(module: str) -> tuple[str, int]:
    if module in ROOT_MODULES:
        return module, ROOT_MODULES[module]
    layer = module.split(".")[1]
    assert layer in RANK, f"{module} is in no layer: put it under one of {sorted(RANK)}"
    return layer, RANK[layer]


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py")) if "_data" not in p.parts}


def test_every_import_goes_downward():
    wrong = []
    for module, targets in _graph().items():
        layer, rank = _layer(module)
        for target in targets:
            if target == "tinyproto":
                continue  # `from tinyproto import __version__` / `families` is resolved as a module below
            target_layer, target_rank = _layer(target)
            if target_layer == layer:
                continue
            if f"{module} imports {target}" in KNOWN:
                continue
            if target_rank > rank or (target_rank == rank and target_layer != layer):
                wrong.append(f"{module} ({layer}) imports {target} ({target_layer})")
    assert not wrong, "upward or sideways imports:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle_between_modules():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if target not in graph:
                continue
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]) if target in stack else target)
            elif not state.get(target):
                visit(target, stack + [target])
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_module_says_which_layer_it_belongs_to():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if "_data" in path.parts or module in ROOT_MODULES:
            continue
        layer, _ = _layer(module)
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if f"Layer: {layer}" not in doc:
            wrong.append(f"{module}: its docstring should say 'Layer: {layer}'")
    assert not wrong, "\n".join(wrong)
