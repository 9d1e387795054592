"""The checkpoint format: folder names, the manifest, durable writes and the errors.

Shared by the writer (:mod:`fmmeta.checkpoint.writer`), the reader
(:mod:`fmmeta.checkpoint.folder`) and the manager that ties them together
(:mod:`fmmeta.checkpoint.manager`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

import torch

MANIFEST = "manifest.json"
"""Written last; its presence (and validity) is what makes a checkpoint complete."""
FORMAT_VERSION = 1
_CHUNK = 1 << 20

FaultHook = Callable[[str], None]
"""Called with a label at every file boundary (``"rank0:before:state.json"``); tests raise in it
to simulate a crash exactly there."""


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, corrupt, or cannot be written."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint was written for a different model or LoRA shape than the one loading it."""


def no_fault(label: str) -> None:
    """The :data:`FaultHook` of a real run: does nothing."""
    return None


def fsync_dir(path: Path) -> None:
    """Makes a rename or file creation in ``path`` durable (a no-op where dirs cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes, fault: FaultHook, label: str) -> None:
    """Writes ``data`` to ``path`` and fsyncs it, calling ``fault`` before, half-way and after.

    The half-way call lets tests crash a write with half a file on disk, which is what a killed
    process leaves; the labels are ``{before,partial,after}:{label}``.
    """
    fault(f"before:{label}")
    half = len(data) // 2
    with open(path, "wb") as fh:
        fh.write(data[:half])
        fh.flush()
        fault(f"partial:{label}")
        fh.write(data[half:])
        fh.flush()
        os.fsync(fh.fileno())
    fault(f"after:{label}")


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def step_dirname(step: int) -> str:
    """``12 -> "step_00000012"`` (zero-padded so names sort like steps)."""
    return f"step_{step:08d}"


def safe_torch_load(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load`` restricted to tensors and plain containers (never arbitrary pickles)."""
    return torch.load(path, map_location=map_location, weights_only=True)
