"""No import circle inside fmmeta/: every module's top-level imports form a graph without cycles.

A circle works only by the order modules happen to be imported in, or hides behind an
``if TYPE_CHECKING:`` block (as first_order.py and meta_sgd.py once did), and either way a reader
cannot tell which module depends on which: imports under ``TYPE_CHECKING`` count. Imports inside
functions are left out: they are the deliberate lazy ones (DeepSpeed, optional trackers), run
after both modules exist.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fmmeta"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """The fmmeta modules ``module`` imports in its body (try/if blocks, TYPE_CHECKING included)."""
    found: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If):
            todo.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            todo.extend(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return {m for m in found if m == "fmmeta" or m.startswith("fmmeta.")}


def _graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imports = _top_level_imports(tree, name, path.name == "__init__.py")
        # importing a.b.c runs a and a.b first: edges to every existing parent package too
        edges: set[str] = set()
        for m in imports:
            parts = m.split(".")
            edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[name] = {m for m in edges if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it, or ``None``."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    """The check below can fail: a two-module circle is found, also one behind TYPE_CHECKING."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    hidden = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fmmeta.x import y\n")
    assert _top_level_imports(hidden, "fmmeta.z", False) == {"fmmeta.x", "fmmeta.x.y"}


def test_fmmeta_has_no_import_circle() -> None:
    graph = _graph()
    assert len(graph) > 50 and graph["fmmeta.algorithms.meta_sgd"] >= {"fmmeta.algorithms.first_order"}
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])
