"""Replacing a small text file so that a crash leaves the old file or the new one, never half of one.

Run folders hold files a later step reads back or rewrites (``config.yaml``, ``metrics.jsonl`` cut
back on resume, ``telemetry.json`` with one entry per method, a report, a learned-lr file); a
process killed mid-write must not destroy what was there. The text goes to a temporary name in
the same folder and is renamed over the target, which POSIX makes atomic.

Methods that train side by side (``engine.workers``) append to one ``metrics.jsonl`` and add
their entries to one ``telemetry.json``; :func:`locked` makes each read-modify-write (and each
append) whole with respect to the others.

A rerun that changes nothing rewrites nothing: a file whose bytes would stay the same keeps its
modification time, which later commands compare (``fmmeta adapt`` refuses an evaluation older
than the adapter it chose an lr for; a finished run rerun once more is not "newer").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from typing import Iterator

__all__ = ["locked", "replace_bytes", "replace_changed", "replace_text"]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``.<name>.lock`` beside ``path`` (released by the kernel if
    the holder dies) while the block reads or writes ``path``."""
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def replace_text(path: Path, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` through ``.<name>.tmp`` and an atomic rename, unless
    ``path`` already holds exactly that; returns ``path``."""
    return replace_bytes(path, text.encode("utf-8"))


def replace_bytes(path: Path, data: bytes) -> Path:
    """:func:`replace_text` for bytes (a plot's PNG)."""
    if _same_bytes(path, data):
        return path
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def replace_changed(fresh: Path, folder: Path) -> list[str]:
    """Moves every file of the folder ``fresh`` into ``folder`` (made if missing) whose bytes
    differ from the file of that name there, each by an atomic rename, then removes ``fresh``.

    Returns:
        The names of the files replaced or added (empty when ``folder`` already held them all).
    """
    folder.mkdir(parents=True, exist_ok=True)
    changed = []
    for file in sorted(fresh.iterdir()):
        if file.is_file() and not _same_bytes(folder / file.name, file.read_bytes()):
            os.replace(file, folder / file.name)
            changed.append(file.name)
    shutil.rmtree(fresh)
    return changed
