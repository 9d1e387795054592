"""Size rules of the code base: no module over 500 lines, no function over 60 lines of code,
unless the module's or the function's docstring states why it is long.

A long module or function is where a newcomer loses the thread; the rule is not that nothing may
be long, but that length is a decision someone wrote down. The reason is recognised by a line of
the docstring that starts with ``Why this module is long:`` or ``Why this function is long:``.

Lines of code of a function: its source lines that are neither blank, nor only a comment, nor part
of its docstring (a nested function counts towards its parent as well as on its own).
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("fmmeta", "recipes")
MAX_MODULE_LINES = 500
MAX_FUNCTION_CODE_LINES = 60
MODULE_REASON = "Why this module is long:"
FUNCTION_REASON = "Why this function is long:"



def _python_files() -> list[Path]:
    files: list[Path] = []
    for top in CHECKED:
        files.extend(sorted((ROOT / top).rglob("*.py")))
    return files


def _states_reason(docstring: str | None, marker: str) -> bool:
    return any(line.strip().startswith(marker) for line in (docstring or "").splitlines())


def _non_code_lines(source: str) -> set[int]:
    """Line numbers that hold only a comment (blank lines are found by the caller)."""
    code: set[int] = set()
    comments: set[int] = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments.add(tok.start[0])
        elif tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return comments - code


def _docstring_lines(node: ast.AST) -> set[int]:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        first = body[0]
        return set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return set()


def function_code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str],
                        comment_only: set[int]) -> int:
    """Lines of code of ``node``: its span (decorators included) less blank, comment-only and
    docstring lines."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    end = node.end_lineno or node.lineno
    skip = comment_only | _docstring_lines(node)
    return sum(1 for n in range(start, end + 1) if lines[n - 1].strip() and n not in skip)


def offenders() -> list[str]:
    """Every module and function over its limit without a stated reason, with its length."""
    found: list[str] = []
    for path in _python_files():
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source, filename=rel)
        if len(lines) > MAX_MODULE_LINES and not _states_reason(ast.get_docstring(tree), MODULE_REASON):
            found.append(f"{rel}: module of {len(lines)} lines (> {MAX_MODULE_LINES})")
        comment_only = _non_code_lines(source)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            n = function_code_lines(node, lines, comment_only)
            if n > MAX_FUNCTION_CODE_LINES and not _states_reason(ast.get_docstring(node), FUNCTION_REASON):
                found.append(f"{rel}:{node.lineno} {node.name}(): {n} lines of code (> {MAX_FUNCTION_CODE_LINES})")
    return found


def test_no_module_or_function_over_its_size_without_a_stated_reason() -> None:
    found = offenders()
    for line in found:
        print(line)
    assert not found, (
        f"{len(found)} over the size rules (split by job, or state why in the docstring with a line "
        f"starting {MODULE_REASON!r} / {FUNCTION_REASON!r}):\n" + "\n".join(found)
    )


def _measure(source: str) -> tuple[int, bool]:
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    n = function_code_lines(node, source.splitlines(), _non_code_lines(source))
    return n, _states_reason(ast.get_docstring(node), FUNCTION_REASON)


def test_counting_skips_docstring_comments_and_blank_lines() -> None:
    source = (
        "@decorator\n"
        "def f(x):\n"
        '    """Doc.\n'
        "\n"
        "    Why this function is long: a table.\n"
        '    """\n'
        "    # a comment\n"
        "\n"
        "    y = x  # trailing comment counts as code\n"
        "    s = '''a string\n"
        "    # not a comment'''\n"
        "    return y\n"
    )
    # decorator, def, y = x, the two lines of s, return
    assert _measure(source) == (6, True)


def test_a_long_function_without_a_reason_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_CODE_LINES))
    pkg = tmp_path / "fmmeta"
    pkg.mkdir()
    (pkg / "long.py").write_text('"""Short."""\n\ndef f():\n    """No reason."""\n' + body)
    (pkg / "ok.py").write_text(
        '"""Short."""\n\ndef g():\n    """Why this function is long: a test."""\n' + body
    )
    (pkg / "big.py").write_text('"""No reason."""\n' + "x = 1\n" * MAX_MODULE_LINES)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = offenders()
    assert found == [
        f"fmmeta/big.py: module of {MAX_MODULE_LINES + 1} lines (> {MAX_MODULE_LINES})",
        f"fmmeta/long.py:3 f(): {MAX_FUNCTION_CODE_LINES + 1} lines of code (> {MAX_FUNCTION_CODE_LINES})",
    ]
