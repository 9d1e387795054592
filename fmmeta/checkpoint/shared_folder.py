"""Refuses a run folder that the ranks do not all see: checkpoints need one shared folder.

Every rank writes its share of a checkpoint (its optimizer partition, its RNG state, a report of
its files) into one temporary folder, and rank 0 then lists them all in the manifest
(:mod:`fmmeta.checkpoint.manager`). On several nodes that only works when ``output_dir`` is one
folder on a filesystem every node mounts at the same path (NFS, Lustre, a cloud file share). On
node-local disks each node would get its own, partial folder, and the first checkpoint would fail
after a whole interval of training with "rank 2 did not report its files"; a relative
``output_dir`` under launchers that start each node in a different working directory has the same
effect. :func:`check_shared_folder` finds this at start-up, before any model is built.

Example:
    >>> check_shared_folder(Path("runs/x"), rank=0, all_gather=lambda obj: [obj])
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Callable

MARKER = ".fmmeta_shared_check"
"""Written by rank 0 into the run folder for the duration of the check, then removed."""


class SharedFolderError(RuntimeError):
    """The run folder is not the same folder on every rank."""


def check_shared_folder(
    folder: Path,
    *,
    rank: int,
    all_gather: Callable[[Any], list[Any]],
    wait_s: float = 10.0,
) -> None:
    """Checks that every rank sees the marker rank 0 writes into ``folder``; every rank calls it.

    Rank 0 creates ``folder`` and writes a random token into :data:`MARKER`; every rank then looks
    for that token (polling for up to ``wait_s``, because a network filesystem may show another
    client's new file only after its attribute cache expires). The verdicts are gathered, so every
    rank raises the same error together instead of one rank leaving the others waiting in a
    collective.

    Args:
        folder: the run folder (``output_dir``); relative paths resolve per process.
        rank: this process's global rank.
        all_gather: every rank's object in rank order (``torch.distributed.all_gather_object``).
        wait_s: seconds a rank keeps looking before it reports the marker missing.

    Raises:
        SharedFolderError: on every rank, naming the ranks and hosts that do not see rank 0's
            folder and how to fix it.
    """
    host = socket.gethostname()
    token, error = "", ""
    if rank == 0:
        token = secrets.token_hex(16)  # not a training draw: no generator state is involved
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _write_durably(folder / MARKER, token)
        except OSError as err:
            error = f"rank 0 could not write {folder / MARKER}: {err}"
    token, error = all_gather((token, error))[0]
    if error:
        raise SharedFolderError(f"output_dir={str(folder)!r} is not usable: {error}")
    seen = _wait_for(folder / MARKER, token, wait_s)
    verdicts = all_gather((rank, host, str(folder.resolve()), seen))
    if rank == 0:
        (folder / MARKER).unlink(missing_ok=True)
    blind = [v for v in verdicts if v[3] != "ok"]
    if blind:
        raise SharedFolderError(_message(verdicts[0], blind))


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _wait_for(marker: Path, token: str, wait_s: float) -> str:
    """``"ok"`` once ``marker`` holds ``token``; otherwise what was found when time ran out."""
    deadline = time.monotonic() + wait_s
    pause = 0.05
    while True:
        try:
            found = "ok" if marker.read_text(encoding="utf-8") == token else "a marker of another run"
        except FileNotFoundError:
            found = "no marker" if marker.parent.is_dir() else "no such folder"
        except OSError as err:
            found = f"unreadable ({err.strerror})"
        if found == "ok" or time.monotonic() >= deadline:
            return found
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def _message(writer: tuple, blind: list[tuple]) -> str:
    """The same text on every rank: built only from what was gathered."""
    _, host0, path0, _ = writer
    who = "; ".join(f"rank {r} on {h} looked in {p}: {found}" for r, h, p, found in blind)
    return (
        f"output_dir is not one folder shared by every rank: rank 0 on {host0} "
        f"wrote a marker into {path0}, but {who}. Every rank writes its share of each checkpoint "
        "into that one folder, so it must be on a filesystem all nodes mount at the same path "
        "(NFS, Lustre, a cloud file share). Fix: set output_dir to an absolute path on such a "
        "filesystem (a relative output_dir resolves against each node's working directory)."
    )
