"""What one rank writes into a checkpoint while it is being written.

Every file goes through :meth:`CheckpointWriter.save_bytes` (durable, with fault points) or is
reported with :meth:`CheckpointWriter.add_files`, so the manager can list every rank's files in the
manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from fmmeta.checkpoint.format import MANIFEST, CheckpointError, FaultHook, no_fault, write_durably


@dataclass
class CheckpointWriter:
    """What one rank gets while a checkpoint is written: the temp folder and a way to report files.

    Files written through :meth:`save_bytes`, :meth:`save_json` and :meth:`save_tensors` are
    recorded automatically; files another component wrote into :attr:`directory` (for example
    ``engine.save_optimizer``) must be reported with :meth:`add_files`.
    """

    directory: Path
    """The temporary checkpoint folder, shared by all ranks."""
    rank: int
    """This process's rank."""
    _fault: FaultHook = no_fault
    files: list[str] = field(default_factory=list)
    """Files this rank wrote, relative to :attr:`directory`."""

    def path(self, name: str) -> Path:
        """Where ``name`` (a relative path, no ``..``) goes inside the checkpoint."""
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or name in ("", MANIFEST):
            raise CheckpointError(
                f"checkpoint file name {name!r} is invalid: use a relative path inside the "
                f"checkpoint, without '..', other than {MANIFEST!r}"
            )
        return self.directory / rel

    def save_bytes(self, name: str, data: bytes) -> Path:
        """Writes ``data`` durably (flush + fsync) and records the file."""
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(path, data, lambda label: self._fault(f"rank{self.rank}:{label}"), name)
        self._record(name)
        return path

    def save_json(self, name: str, obj: Any) -> Path:
        """Writes small JSON state (step, sampler state); no pickle."""
        text = json.dumps(obj, indent=1, sort_keys=True)
        return self.save_bytes(name, text.encode("utf-8"))

    def save_tensors(
        self, name: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
    ) -> Path:
        """Writes tensors as safetensors (CPU, contiguous copies)."""
        from safetensors.torch import save

        plain = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        return self.save_bytes(name, save(plain, metadata=dict(metadata) if metadata else None))

    def add_files(self, paths: Iterable[str | Path]) -> None:
        """Reports files written into :attr:`directory` by someone else (e.g. the engine)."""
        for p in paths:
            p = Path(p)
            full = p if p.is_absolute() else self.directory / p
            try:
                rel = full.resolve().relative_to(self.directory.resolve())
            except ValueError as err:
                raise CheckpointError(
                    f"file {str(p)!r} is outside the checkpoint folder {str(self.directory)!r}: "
                    "write it inside writer.directory"
                ) from err
            if not full.is_file():
                raise CheckpointError(f"reported checkpoint file {str(full)!r} does not exist")
            self._record(rel.as_posix())
        self._fault(f"rank{self.rank}:after:add_files")

    def _record(self, name: str) -> None:
        if name not in self.files:
            self.files.append(name)
