"""One run per output folder: an exclusive lock on ``output_dir/.fmmeta.lock``.

Why: two runs writing into one folder interleave ``metrics.jsonl`` and leave a ``config.yaml`` of
one run next to the adapter and checkpoints of the other, and both exit 0. The lock is taken
before anything else is written into the folder and refused at once, naming the holder.

The lock is an ``fcntl.flock`` on the file, so the kernel releases it when the holder dies, even
by SIGKILL; the file itself (pid, host, start time) is only there to say who holds it. A file left
behind by a dead process is therefore simply taken over, with a warning naming the dead holder.

Example:
    >>> with RunLock.acquire("runs/x"):
    ...     pass  # write the run
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from fmmeta.errors import UserInputError

__all__ = ["LOCK_NAME", "RunLock", "RunLockError"]

logger = logging.getLogger(__name__)

LOCK_NAME = ".fmmeta.lock"
"""The lock file inside the output folder (hidden: it is not part of the run's results)."""


class RunLockError(UserInputError):
    """Another live process holds the output folder."""


def _describe(holder: dict[str, Any]) -> str:
    started = holder.get("started_unix")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "unknown"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (started {when})"


def _read_holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        holder = {}
    return holder if isinstance(holder, dict) else {}


class RunLock:
    """An acquired lock; :meth:`release` (or leaving the ``with`` block) gives it back."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, folder: str | Path) -> RunLock:
        """Locks ``folder`` (which must exist) for this process.

        Raises:
            RunLockError: another live process holds it; the message names its pid and host.
        """
        path = Path(folder) / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunLockError(
                    f"output_dir={str(folder)!r} is in use by another run: {_describe(holder)} "
                    f"holds {str(path)!r}. Wait for it to finish, stop it, or give this run "
                    "another output_dir"
                ) from None
            # The previous holder may have unlinked the file between our open and our flock:
            # then we hold a lock on a file nobody else will ever open, so start again.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read_holder(fd)
        if previous:
            logger.warning(
                "took over the lock %s left by %s: that process is no longer running (it was "
                "killed or crashed)", path, _describe(previous),
            )
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started_unix": time.time()}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode("utf-8"))
        os.fsync(fd)
        return cls(path, fd)

    def release(self) -> None:
        """Removes the lock file, then unlocks (idempotent)."""
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
