"""Claiming a run's output folder: lock it, check the resume, and write into it only once the
run is accepted.

Why in this order: a run refused for any reason (another run holds the folder, the resume does
not match, and the refusals found only once the model and tasks are built: LoRA targets, data
too long for ``tasks.max_length``, ``eval.query``) must leave the folder exactly as it found it,
so the resolved ``config.yaml`` of a refused run never replaces the one that belongs to the
checkpoints next to it, and a new folder is not left behind holding a config of a run that never
ran. The claim holds the lock; :meth:`RunClaim.accept` writes ``config.yaml`` when the recipe has
accepted everything; :meth:`RunClaim.release` removes a folder the claim created and nothing
filled.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from fmmeta.checkpoint.lock import LOCK_NAME, RunLock
from fmmeta.checkpoint.resume import resume_problems
from fmmeta.config import save_resolved
from fmmeta.errors import UserInputError

__all__ = ["RunClaim", "claim_output_dir", "claimed_output_dir", "is_run_folder"]

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


class RunClaim:
    """A locked output folder: :meth:`accept` writes the run's ``config.yaml``, :meth:`release`
    gives the lock back (and removes the folders this claim created if nothing was written).

    ``created`` is the topmost folder the claim created (``output_dir`` or a parent of it), or
    None when ``output_dir`` existed.
    """

    def __init__(self, folder: Path, lock: RunLock, *, created: Path | None) -> None:
        self.folder = folder
        self.lock = lock
        self.created = created

    def accept(self, cfg: Any) -> None:
        """Writes the resolved ``config.yaml``: the run is accepted and starts writing."""
        save_resolved(cfg, self.folder / "config.yaml")
        logger.info("resolved config written to %s", self.folder / "config.yaml")

    def release(self) -> None:
        """Unlocks; a folder this claim created that is still empty is removed (idempotent)."""
        self.lock.release()
        if self.created is None:
            return
        for folder in (self.folder, *self.folder.parents):
            if not folder.is_dir() or any(folder.iterdir()):
                return
            folder.rmdir()
            if folder == self.created:
                return


def claim_output_dir(cfg: Any) -> RunClaim:
    """Creates and locks ``cfg.output_dir`` and refuses a mismatched resume; writes nothing else.

    Call it on rank 0 only, before anything else writes into the folder; call
    :meth:`RunClaim.accept` once the run is accepted, and release the claim when the run ends (the
    kernel releases the lock if the process dies).

    Raises:
        UserInputError: the folder cannot be created, holds files no run wrote, another live
            run holds it, or the resume does not match (every difference listed). The folder
            is then left as it was.
    """
    out = Path(cfg.output_dir).expanduser()
    _refuse_foreign(out, cfg.output_dir)
    created = None
    for folder in (out, *out.parents):
        if folder.exists():
            break
        created = folder
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
    try:
        lock = RunLock.acquire(out)
    except OSError as err:  # a read-only (finished, archived) run folder, a file system gone read-only
        raise UserInputError(
            f"output_dir={cfg.output_dir!r} cannot be locked for this run ({err.strerror}: {err.filename!r}): "
            "a run writes into its folder; make it writable, or give this run another output_dir"
        ) from None
    claim = RunClaim(out, lock, created=created)
    try:
        problems = resume_problems(cfg, out)
        if problems:
            raise UserInputError(
                f"train.resume={cfg.train.resume!r} refused; nothing in {str(out)!r} was changed:\n"
                + "\n".join(f"  - {p}" for p in problems)
            )
    except BaseException:
        claim.release()
        raise
    return claim


@contextlib.contextmanager
def claimed_output_dir(cfg: Any, rank: int,
                       broadcast: Callable[[str | None], str | None]) -> Iterator[RunClaim | None]:
    """Rank 0's claim on ``cfg.output_dir`` (``None`` on other ranks), released at the end.

    Nothing is written into output_dir before rank 0 holds its lock and has checked the resume;
    every rank learns the outcome through ``broadcast`` (rank 0's value on every rank; the
    engine's ``broadcast_from_rank0``, passed in so this layer knows no collective), so all stop
    together or go on together.

    Raises:
        UserInputError: on every rank, with rank 0's refusal (see :func:`claim_output_dir`).
    """
    claim, refused = None, None
    if rank == 0:
        try:
            claim = claim_output_dir(cfg)
        except UserInputError as err:
            refused = str(err)
    refused = broadcast(refused)
    if refused is not None:
        raise UserInputError(refused)
    try:
        yield claim
    finally:
        if claim is not None:
            claim.release()
