"""Claiming a run's output folder: lock it, check the resume, and only then write into it.

Why in this order: a run refused for any reason (another run holds the folder, the resume does
not match) must leave the folder exactly as it found it, so the resolved ``config.yaml`` of the
refused run never replaces the one that belongs to the checkpoints next to it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from fmmeta.checkpoint.lock import LOCK_NAME, RunLock
from fmmeta.checkpoint.resume import resume_problems
from fmmeta.config import save_resolved
from fmmeta.errors import UserInputError

__all__ = ["claim_output_dir", "is_run_folder"]

logger = logging.getLogger(__name__)


_RUN_KEYS = frozenset({"output_dir", "methods", "model", "train"})
"""Top-level keys every resolved ``config.yaml`` of a run has (``save_resolved`` writes them all)."""


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is empty (a lock left by a killed run aside) or holds the resolved
    ``config.yaml`` a run writes first: the folders a run may write into."""
    entries = [p for p in folder.iterdir() if p.name != LOCK_NAME]
    if not entries:
        return True
    try:
        config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(config, dict) and _RUN_KEYS <= set(config)


def _refuse_foreign(out: Path, name: str) -> None:
    """Refuses a folder that holds files no run wrote, before anything is written into it."""
    if not out.is_dir() or is_run_folder(out):
        return
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
    shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    raise UserInputError(
        f"output_dir={name!r} holds files no fmmeta run wrote ({shown}) and no run's "
        "config.yaml: nothing was written into it. Give output_dir an empty or new folder, or "
        "the folder of an earlier run to resume it"
    )


def claim_output_dir(cfg: Any) -> RunLock:
    """Creates and locks ``cfg.output_dir``, refuses a mismatched resume, writes ``config.yaml``.

    Call it on rank 0 only, before anything else writes into the folder; release the returned
    lock when the run ends (the kernel releases it if the process dies).

    Raises:
        UserInputError: the folder cannot be created, holds files no run wrote, another live
            run holds it, or the resume does not match (every difference listed). The folder
            is then left as it was.
    """
    out = Path(cfg.output_dir).expanduser()
    _refuse_foreign(out, cfg.output_dir)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        raise UserInputError(
            f"output_dir={cfg.output_dir!r} cannot be a folder: {err.filename!r} is a file. "
            "Give output_dir a path that is a folder or does not exist yet"
        ) from None
    except OSError as err:  # no permission, a read-only file system, a name too long, ...
        raise UserInputError(
            f"output_dir={cfg.output_dir!r} cannot be created ({err.strerror}: {err.filename!r}): "
            "choose a folder you can write to"
        ) from None
    lock = RunLock.acquire(out)
    try:
        problems = resume_problems(cfg, out)
        if problems:
            raise UserInputError(
                f"train.resume={cfg.train.resume!r} refused; nothing in {str(out)!r} was changed:\n"
                + "\n".join(f"  - {p}" for p in problems)
            )
        save_resolved(cfg, out / "config.yaml")
    except BaseException:
        lock.release()
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    logger.info("resolved config written to %s", out / "config.yaml")
    return lock
