"""Every file path and module the documentation and the docstrings name exists.

Modules move (``fmmeta/sampling/one_task.py`` became ``benchmarks/one_task.py``) and functions are
renamed (``load_inner_lrs`` became ``load_step_sizes``); a reference left behind sends a reader to
nothing. Checked: repository paths (``fmmeta/...py``, ``recipes/...``, ``docs/...``) anywhere in the
README, docs and sources, and ``fmmeta.x.y`` names written as code (after a backquote or ``~``),
which must import, down to the attribute.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TEXTS = [REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("fmmeta/**/*.py"),
         *REPO.glob("recipes/**/*.py"), *REPO.glob("benchmarks/*.py"), *REPO.glob("scripts/*")]
PATH = re.compile(r"(?<![\w/.-])(?:fmmeta|recipes|benchmarks|scripts|docs|tests)/[\w/.-]*\w\.(?:py|yaml|sh|md|json)\b")
NAME = re.compile(r"(?<=[`~])fmmeta(?:\.\w+)+")


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute chain under the longest module it starts with."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.util.find_spec(".".join(parts[:i])) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            obj: Any = importlib.import_module(".".join(parts[:i]))
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def test_every_named_path_and_module_exists() -> None:
    missing: list[str] = []
    for file in (f for f in TEXTS if f.is_file()):
        text = file.read_text(encoding="utf-8")
        where = file.relative_to(REPO)
        missing += [f"{where}: {p}" for p in sorted(set(PATH.findall(text))) if not (REPO / p).exists()]
        missing += [f"{where}: {n}" for n in sorted(set(NAME.findall(text))) if not _resolves(n)]
    assert not missing, "references to nothing:\n" + "\n".join(missing)


def test_the_docs_index_lists_every_page() -> None:
    """A page nobody links to is a page nobody finds: docs/index.md names every page of docs/ and
    every notebook of docs/research/ (the reports in their folders are linked from the notebooks)."""
    index = (REPO / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w/.-]+\.md)\)", index))
    pages = {p.relative_to(REPO / "docs").as_posix() for p in [*REPO.glob("docs/*.md"), *REPO.glob("docs/research/*.md")]}
    pages -= {"index.md"}
    assert not pages - linked, f"docs/index.md does not list {sorted(pages - linked)}"
    assert not linked - pages, f"docs/index.md links to missing pages {sorted(linked - pages)}"
