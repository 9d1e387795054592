"""Atomic, verified, multi-rank checkpoints.

A checkpoint is a folder ``step_00000012/`` under the run's checkpoint root. It is complete only
when it holds a ``manifest.json`` listing the SHA-256 and size of every file; the manifest is
written last, by rank 0, after every rank has written and reported its files, and the folder is
then renamed into place with ``os.replace``. So a crash at any point of a write leaves either the
previous checkpoints untouched plus a ``.tmp_step_*`` folder (ignored and cleaned later), or a
complete new checkpoint; never a folder that looks complete but is not.

Loading verifies every file against the manifest (safetensors itself does not notice a flipped
byte), names the first bad file, and falls back to the previous good checkpoint.

The format (:mod:`~fmmeta.checkpoint.format`), one rank's writer (:mod:`~fmmeta.checkpoint.writer`)
and a complete folder (:mod:`~fmmeta.checkpoint.folder`) live in their own modules; their names are
re-exported here.

Example:
    >>> mgr = CheckpointManager("runs/x/checkpoints", keep_last=2)
    >>> ckpt = mgr.save(12, lambda w: w.save_json("state.json", {"step": 12}))
    >>> mgr.latest().load_json("state.json")
    {'step': 12}
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from fmmeta.checkpoint.folder import Checkpoint, check_compatible
from fmmeta.checkpoint.format import (
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    CheckpointMismatchError,
    FaultHook,
    fsync_dir,
    no_fault,
    safe_torch_load,
    sha256_file,
    step_dirname,
    write_durably,
)
from fmmeta.checkpoint.writer import CheckpointWriter
from fmmeta.errors import UserInputError

__all__ = [
    "MANIFEST",
    "Checkpoint",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointWriter",
    "FaultHook",
    "check_compatible",
    "safe_torch_load",
    "step_dirname",
]

logger = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step_(\d{8,})$")


class CheckpointWriteError(UserInputError):
    """A checkpoint could not be written (no space, no permission): the user's machine to fix,
    and the complete checkpoints before it stay; the recipes exit with code 2 and this message."""


class CheckpointManager:
    """Writes, verifies, finds and prunes checkpoints under one root folder.

    Every rank constructs one with the same ``root`` (a filesystem all ranks share) and calls
    :meth:`save` together; only rank 0 writes the manifest, renames and prunes.

    Args:
        root: the folder holding ``step_*`` checkpoints.
        keep_last: complete checkpoints to keep (>= 2); older ones are deleted only after a newer
            one is complete.
        rank: this process's rank.
        world_size: number of ranks writing each checkpoint.
        barrier: blocks until every rank arrives; required when ``world_size > 1``.
        fault_hook: test hook called at every file boundary (see :data:`FaultHook`).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        keep_last: int = 2,
        rank: int = 0,
        world_size: int = 1,
        barrier: Callable[[], None] | None = None,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if keep_last < 2:
            raise ValueError(
                f"keep_last={keep_last} is invalid: must be >= 2 so a corrupt newest checkpoint "
                "has a fallback"
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank}, world_size={world_size} is invalid")
        if world_size > 1 and barrier is None:
            raise ValueError(
                f"world_size={world_size} needs a barrier (e.g. engine.barrier) so rank 0 writes "
                "the manifest only after every rank finished writing"
            )
        # Absolute, so files reported relative to the working directory resolve the same way.
        self.root = Path(root).resolve()
        self.keep_last = keep_last
        self.rank = rank
        self.world_size = world_size
        self._barrier = barrier or (lambda: None)
        self._fault: FaultHook = fault_hook or no_fault

    # ------------------------------------------------------------------ writing

    def save(
        self,
        step: int,
        write: Callable[[CheckpointWriter], None],
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """Writes checkpoint ``step`` atomically; every rank must call it.

        Raises:
            CheckpointWriteError: the file system refused a write (a full disk, a quota, a folder
                made read-only); the message names the last complete checkpoint, which stays.
        """
        try:
            return self._save(step, write, meta=meta)
        except OSError as err:
            last = self.latest(verify=False)
            fix = ("Move the run to a shorter path (its whole folder) and rerun with that output_dir" if
                   err.errno == errno.ENAMETOOLONG else "Free space (or make the folder writable) and rerun the same command")
            raise CheckpointWriteError(
                f"writing checkpoint {step_dirname(step)} into {str(self.root)!r} failed ({err.strerror}: "
                f"{err.filename!r}). {fix}: it resumes from the last complete checkpoint, "
                + (f"{str(last.path)!r} (after meta-step {last.step})" if last else "none yet (from step 0)")
            ) from None

    def _save(
        self,
        step: int,
        write: Callable[[CheckpointWriter], None],
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """:meth:`save`, its errors as they come.

        Args:
            step: the meta-step just completed (names the folder).
            write: called on every rank with a :class:`CheckpointWriter` for the temp folder.
            meta: JSON-able facts recorded in the manifest; ``model_id`` and ``lora_shapes``
                are checked by :func:`check_compatible` on load.

        Returns:
            The complete checkpoint (on every rank, after the final barrier).
        """
        final = self.root / step_dirname(step)
        tmp = self.root / f".tmp_{step_dirname(step)}"
        self._fault(f"rank{self.rank}:begin")
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # left by a crashed write of the same step
                shutil.rmtree(tmp)
            tmp.mkdir()
        self._barrier()
        writer = CheckpointWriter(directory=tmp, rank=self.rank, _fault=self._fault)
        write(writer)
        # Each rank reports its files in its own small file: rank 0 needs every rank's list and
        # the filesystem is the one channel all ranks share here.
        report = {"rank": self.rank, "files": list(writer.files)}
        writer.save_bytes(_report_name(self.rank), json.dumps(report).encode("utf-8"))
        self._barrier()
        if self.rank == 0:
            self._finalize(step, tmp, final, meta or {})
        self._barrier()
        if self.rank == 0:
            self._prune()
        manifest = json.loads((final / MANIFEST).read_text(encoding="utf-8"))
        return Checkpoint(path=final, step=step, manifest=manifest)

    def _finalize(self, step: int, tmp: Path, final: Path, meta: Mapping[str, Any]) -> None:
        ranks: dict[str, list[str]] = {}
        for r in range(self.world_size):
            report_path = tmp / _report_name(r)
            if not report_path.is_file():
                raise CheckpointError(
                    f"rank {r} did not report its files for step {step} ({report_path.name} is "
                    "missing): it did not finish writing; the checkpoint is not complete"
                )
            listed = json.loads(report_path.read_text(encoding="utf-8"))["files"]
            for name in listed:
                if not (tmp / name).is_file():
                    raise CheckpointError(f"rank {r} reported {name!r} but it is not in {tmp}")
            ranks[str(r)] = listed
        files: dict[str, dict[str, Any]] = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = path.relative_to(tmp).as_posix()
            if rel == MANIFEST:
                continue
            files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "world_size": self.world_size,
            "created_unix": time.time(),
            "meta": dict(meta),
            "ranks": ranks,
            "files": files,
        }
        data = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
        self._write_manifest(tmp, data)
        fsync_dir(tmp)
        self._fault("rank0:before:rename")
        aside = self.root / f".old_{step_dirname(step)}"
        if final.exists():  # re-saving a step (e.g. after resume): keep the old one until replaced
            if aside.exists():
                shutil.rmtree(aside)
            os.replace(final, aside)
        os.replace(tmp, final)
        fsync_dir(self.root)
        self._fault("rank0:after:rename")
        if aside.exists():
            shutil.rmtree(aside)
        logger.info("checkpoint %s complete (%d files)", final, len(files))

    def _write_manifest(self, tmp: Path, data: bytes) -> None:
        write_durably(tmp / MANIFEST, data, lambda label: self._fault(f"rank0:{label}"), MANIFEST)

    def _prune(self) -> None:
        """Deletes checkpoints beyond the newest ``keep_last`` complete ones, and stale temp dirs."""
        complete = [(s, p) for s, p in self._step_dirs() if (p / MANIFEST).is_file()]
        for step, path in complete[self.keep_last :]:
            self._fault(f"rank0:before:prune:{path.name}")
            trash = self.root / f".trash_{path.name}"
            if trash.exists():
                shutil.rmtree(trash)
            # Rename first so a crash mid-delete never leaves a half-deleted folder with a manifest.
            os.replace(path, trash)
            shutil.rmtree(trash)
            logger.info("deleted old checkpoint %s (keep_last=%d)", path, self.keep_last)
        for stale in self.root.glob(".tmp_step_*"):
            shutil.rmtree(stale, ignore_errors=True)
        for stale in self.root.glob(".trash_step_*"):
            shutil.rmtree(stale, ignore_errors=True)

    # ------------------------------------------------------------------ reading

    def _step_dirs(self) -> list[tuple[int, Path]]:
        """``(step, folder)`` for every ``step_*`` folder, newest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = _STEP_RE.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return sorted(found, reverse=True)

    def verify(self, path: str | Path) -> list[str]:
        """Every problem with a checkpoint folder; empty if it is complete and intact."""
        path = Path(path)
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            return [f"{path.name} is incomplete: no {MANIFEST} (its write did not finish)"]
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            files = manifest["files"]
            if not isinstance(files, dict) or manifest.get("format") != FORMAT_VERSION:
                raise ValueError("unexpected layout")
        except (ValueError, KeyError, UnicodeDecodeError) as err:
            return [f"{path.name}/{MANIFEST} is unreadable ({err})"]
        problems = []
        for name, entry in sorted(files.items()):
            fp = path / name
            if not fp.is_file():
                problems.append(f"{path.name}/{name} is missing")
                continue
            size = fp.stat().st_size
            if size != entry["size"]:
                problems.append(
                    f"{path.name}/{name} has {size} bytes, the manifest says {entry['size']} "
                    "(truncated or overwritten)"
                )
                continue
            if sha256_file(fp) != entry["sha256"]:
                problems.append(
                    f"{path.name}/{name} is corrupt: its SHA-256 does not match the manifest"
                )
        return problems

    def open(self, path: str | Path, *, verify: bool = True) -> Checkpoint:
        """Opens one checkpoint folder; raises :class:`CheckpointError` naming every bad file."""
        path = Path(path)
        problems = self.verify(path) if verify else []
        if not verify and not (path / MANIFEST).is_file():
            problems = [f"{path.name} is incomplete: no {MANIFEST}"]
        if problems:
            raise CheckpointError(
                f"checkpoint {str(path)!r} cannot be used: " + "; ".join(problems)
            )
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        return Checkpoint(path=path, step=int(manifest["step"]), manifest=manifest)

    def latest(self, *, verify: bool = True) -> Checkpoint | None:
        """The newest complete checkpoint whose files all match its manifest, or None.

        A newer folder that is incomplete or corrupt is skipped with a warning naming the file,
        and the previous good checkpoint is used (and the log says so).
        """
        skipped: list[str] = []
        for step, path in self._step_dirs():
            try:
                ckpt = self.open(path, verify=verify)
            except (CheckpointError, ValueError, KeyError) as err:
                logger.warning("%s", err)
                skipped.append(path.name)
                continue
            if skipped:
                logger.warning(
                    "falling back to checkpoint %s (skipped unusable newer: %s)",
                    path.name,
                    ", ".join(skipped),
                )
            return ckpt
        if skipped:
            logger.warning("no usable checkpoint in %s (unusable: %s)", self.root, ", ".join(skipped))
        return None

    def step_folders(self) -> list[Path]:
        """Every ``step_*`` folder, complete or not, newest first."""
        return [p for _, p in self._step_dirs()]

    def complete_steps(self) -> list[int]:
        """Steps of the folders that have a manifest (not verified), newest first."""
        return [s for s, p in self._step_dirs() if (p / MANIFEST).is_file()]


def _report_name(rank: int) -> str:
    return f"rank_{rank:05d}.files.json"
