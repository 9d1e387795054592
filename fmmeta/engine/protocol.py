"""The engine interface: the only layer that knows the distributed framework.

Meta-algorithms talk to an :class:`Engine`; they never import DeepSpeed or accelerate. The local
engine (plain torch, one process) is the reference every distributed engine is compared against.

The contract, shaped by DeepSpeed's behaviour (docs/design.md):

* Inner loops are rank-local and never call the framework's ``backward``: they use
  ``torch.autograd.grad`` over :meth:`Engine.adapter_parameters`, which are full, resident
  tensors on every rank (under ZeRO-3 the engine keeps them persistent), so in-place inner-loop
  updates, snapshots and restores are plain tensor ops.
* The framework is touched once per meta-step, by :meth:`Engine.outer_step`, with this rank's
  weighted sum of task meta-gradients; the engine averages over all ranks' real tasks, clips and
  applies the outer optimizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Engine(Protocol):
    """What a meta-algorithm and a recipe need from a training backend."""

    rank: int
    """This process's data-parallel rank."""
    world_size: int
    """Number of data-parallel ranks."""
    device: torch.device
    """Where batches go."""

    @property
    def model(self) -> nn.Module:
        """The peft-wrapped causal LM to call forward on (the framework's wrapper where it needs one)."""
        ...

    @property
    def lockstep(self) -> bool:
        """Whether the ranks meet at every forward and backward pass (ZeRO-3 gathers each layer's
        parameters from every rank), so a meta-step costs the slowest rank's pass, pass by pass:
        what the sampler prices placements by."""
        ...

    @property
    def sharding(self) -> str:
        """How the engine splits the model over ranks, for the run's banner (``"ZeRO stage 3"``,
        ``"no ZeRO (one process)"``)."""
        ...

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The trainable LoRA tensors, in a fixed order, fully materialised on this rank."""
        ...

    def outer_step(self, grad_sum: Sequence[torch.Tensor], n_real_tasks: int) -> dict[str, float]:
        """Applies one outer update.

        Args:
            grad_sum: this rank's sum of weighted task meta-gradients, one tensor per adapter
                parameter (same order and shapes as :meth:`adapter_parameters`).
            n_real_tasks: real tasks over all ranks; the update uses
                ``sum over ranks of grad_sum / n_real_tasks``.

        Returns:
            Stats such as ``grad_norm`` (before clipping) and ``lr``.
        """
        ...

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (used to keep sampler state identical)."""
        ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of ``tensor`` over ranks (returns a new tensor, on every rank)."""
        ...

    def barrier(self) -> None:
        """Blocks until every rank arrives."""
        ...

    def save_adapter(self, path: str | Path) -> None:
        """Writes the adapter in peft's format (rank 0 writes; every rank must call)."""
        ...

    def save_optimizer(self, directory: str | Path) -> list[Path]:
        """Writes this rank's share of the outer optimizer and LR-scheduler state into ``directory``.

        Every rank must call it (under ZeRO the state is partitioned). Returns the files written,
        so the checkpoint layer can list them in its manifest. Uses safetensors or tensors loadable
        with ``torch.load(weights_only=True)``.
        """
        ...

    def load_optimizer(self, directory: str | Path) -> None:
        """Restores what :meth:`save_optimizer` wrote (same world size and adapter shapes)."""
        ...

    def load_adapter(self, path: str | Path) -> None:
        """Loads adapter weights saved by :meth:`save_adapter` into :meth:`adapter_parameters`."""
        ...

    def close(self) -> None:
        """Releases the model (every rank must call it): under ZeRO-3 removes the framework's hooks,
        so that the next engine can wrap the same model (the recipe trains one method after another
        on one base, then evaluates on it). The adapter keeps its values."""
        ...
