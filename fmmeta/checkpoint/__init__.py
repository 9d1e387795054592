"""Atomic, verified checkpoints and pickle-free run state (RNG, small JSON, tensors)."""

from fmmeta.checkpoint.manager import (
    MANIFEST,
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    CheckpointMismatchError,
    CheckpointWriter,
    FaultHook,
    check_compatible,
    safe_torch_load,
    step_dirname,
)
from fmmeta.checkpoint.state import (
    capture_rng_state,
    load_rng_state,
    restore_rng_state,
    save_rng_state,
)

__all__ = [
    "MANIFEST",
    "Checkpoint",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointWriter",
    "FaultHook",
    "capture_rng_state",
    "check_compatible",
    "load_rng_state",
    "restore_rng_state",
    "safe_torch_load",
    "save_rng_state",
    "step_dirname",
]
