"""No orphan docstrings: a string statement that documents nothing.

A string literal is a docstring at the top of a module, class or function, or an attribute
docstring right under the assignment it documents. Anywhere else it is left over from code that
moved (a refactor took the constant and left its doc behind) and tells a reader about something
that is not there.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def orphan_docstrings(source: str) -> list[int]:
    """Line numbers of string statements that are neither a docstring nor an attribute docstring."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                        and isinstance(stmt.value.value, str)):
                    continue
                documents_owner = i == 0 and name == "body" and isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                prev = body[i - 1] if i else None
                documents_assignment = isinstance(prev, ast.Assign | ast.AnnAssign) \
                    and prev.end_lineno == stmt.lineno - 1
                if not (documents_owner or documents_assignment):
                    found.append(stmt.lineno)
    return found


def test_library_and_recipes_have_no_orphan_docstrings() -> None:
    found = [
        f"{path.relative_to(ROOT).as_posix()}:{line}"
        for top in ("fmmeta", "recipes")
        for path in sorted((ROOT / top).rglob("*.py"))
        for line in orphan_docstrings(path.read_text(encoding="utf-8"))
    ]
    assert not found, "string statements that document nothing (delete or move them):\n" + "\n".join(found)


def test_an_orphan_is_found_and_real_docstrings_are_not() -> None:
    source = (
        '"""Module."""\n'
        "X = 1\n"
        '"""Doc of X."""\n'
        "Y = 2\n"
        "\n"
        '"""Orphan: a blank line away from Y."""\n'
        "def f():\n"
        '    """Doc of f."""\n'
        "    return 1\n"
        '"""Orphan after a function."""\n'
    )
    assert orphan_docstrings(source) == [6, 10]
