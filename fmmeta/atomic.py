"""Replacing a small text file so that a crash leaves the old file or the new one, never half of one.

Run folders hold files a later step reads back or rewrites (``config.yaml``, ``metrics.jsonl`` cut
back on resume, ``telemetry.json`` with one entry per method, a report, a learned-lr file); a
process killed mid-write must not destroy what was there. The text goes to a temporary name in
the same folder and is renamed over the target, which POSIX makes atomic.

Methods that train side by side (``engine.workers``) append to one ``metrics.jsonl`` and add
their entries to one ``telemetry.json``; :func:`locked` makes each read-modify-write (and each
append) whole with respect to the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

__all__ = ["locked", "replace_text"]


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


def replace_text(path: Path, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` through ``.<name>.tmp`` and an atomic rename; returns ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
