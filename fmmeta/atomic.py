"""Replacing a small text file so that a crash leaves the old file or the new one, never half of one.

Run folders hold files a later step reads back or rewrites (``config.yaml``, ``metrics.jsonl`` cut
back on resume, ``telemetry.json`` with one entry per method, a report, a learned-lr file); a
process killed mid-write must not destroy what was there. The text goes to a temporary name in
the same folder and is renamed over the target, which POSIX makes atomic.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["replace_text"]


def replace_text(path: Path, text: str) -> Path:
    """Writes ``text`` (UTF-8) to ``path`` through ``.<name>.tmp`` and an atomic rename; returns ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
