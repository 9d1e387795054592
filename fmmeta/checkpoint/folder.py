"""A complete checkpoint folder: reading its files, and whether it fits the run that opens it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from fmmeta.checkpoint.format import CheckpointError, CheckpointMismatchError


@dataclass(frozen=True)
class Checkpoint:
    """A complete (manifest-verified) checkpoint folder."""

    path: Path
    """The ``step_XXXXXXXX`` folder."""
    step: int
    """The meta-step it was taken after."""
    manifest: Mapping[str, Any]
    """The parsed ``manifest.json``."""

    @property
    def meta(self) -> Mapping[str, Any]:
        """What the writer recorded about the run (model id, LoRA shapes, ...)."""
        return self.manifest.get("meta", {})

    def file(self, name: str) -> Path:
        """The path of a file listed in the manifest."""
        if name not in self.manifest["files"]:
            raise CheckpointError(
                f"checkpoint {str(self.path)!r} has no file {name!r}; it holds: "
                + ", ".join(sorted(self.manifest["files"]))
            )
        return self.path / name

    def load_json(self, name: str) -> Any:
        """Reads a JSON file written with :meth:`CheckpointWriter.save_json`."""
        return json.loads(self.file(name).read_text(encoding="utf-8"))

    def load_tensors(self, name: str, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Reads a safetensors file written with :meth:`CheckpointWriter.save_tensors`."""
        from safetensors.torch import load_file

        return load_file(self.file(name), device=str(device))

    def check_compatible(self, *, model_id: str, lora_shapes: Mapping[str, Sequence[int]]) -> None:
        """Raises :class:`CheckpointMismatchError` unless written for this model and LoRA shape."""
        check_compatible(self, model_id=model_id, lora_shapes=lora_shapes)


def check_compatible(
    ckpt: Checkpoint, *, model_id: str, lora_shapes: Mapping[str, Sequence[int]]
) -> None:
    """Refuses a checkpoint from a different model or LoRA shape, listing every difference.

    Why: loading LoRA tensors of another rank or model fails deep inside a ``copy_`` with a bare
    size mismatch, or worse, succeeds for a same-shaped but different model.
    """
    meta = ckpt.meta
    problems: list[str] = []
    saved_id = meta.get("model_id")
    if saved_id is not None and saved_id != model_id:
        problems.append(f"it was written for model {saved_id!r}, this run uses {model_id!r}")
    saved_shapes = meta.get("lora_shapes")
    if saved_shapes is not None:
        want = {k: list(v) for k, v in lora_shapes.items()}
        have = {k: list(v) for k, v in saved_shapes.items()}
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        if missing:
            problems.append(
                f"{len(missing)} adapter tensors of this run are not in it (first: {missing[0]!r})"
            )
        if extra:
            problems.append(
                f"it holds {len(extra)} adapter tensors this run lacks (first: {extra[0]!r})"
            )
        for k in sorted(set(want) & set(have)):
            if want[k] != have[k]:
                problems.append(
                    f"adapter tensor {k!r} has shape {have[k]} there, {want[k]} here "
                    "(different lora.r or model size?)"
                )
                break
    if problems:
        raise CheckpointMismatchError(
            f"checkpoint {str(ckpt.path)!r} does not match this run: "
            + "; ".join(problems)
            + ". Resume with the same model and lora settings, or start fresh with "
            "train.resume=never (or another output_dir)."
        )
