"""Built once per test session, whichever pytest-xdist worker asks first.

A session fixture runs once per *worker* under ``pytest -n``, so a run every recipe file reads
would be trained once per worker. Here the first worker to ask builds it, under a file lock, in
the session's shared temporary folder; the others wait and read it. Without xdist this is a plain
``mktemp``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``build(folder)`` filled, built by one worker of this session.

    The build writes into its final folder (a run records where it was written), and a marker
    beside it says it finished, so what a worker that died mid-build left is built again.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = factory.mktemp("once") / name
        build(out)
        return out
    root = factory.getbasetemp().parent  # the session's folder, shared by its workers
    out = root / "once" / name
    out.parent.mkdir(exist_ok=True)
    done = out.parent / f"{name}.done"
    with FileLock(str(out) + ".lock"):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            build(out)
            done.touch()
    return out
