"""fmmeta.atomic.replace_text: the new text replaces the file; a write that dies before the rename
leaves the old file whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fmmeta.atomic import replace_text


def test_replace_text_replaces_and_a_failed_rename_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metrics.jsonl"
    assert replace_text(path, "old\n") == path and path.read_text() == "old\n"

    def killed(src: object, dst: object) -> None:
        raise KeyboardInterrupt  # the process dies between writing and renaming

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        replace_text(path, "new, longer text\n")
    assert path.read_text() == "old\n"
    monkeypatch.undo()
    replace_text(path, "new\n")
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
