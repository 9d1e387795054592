"""The meta-algorithm interface.

A meta-algorithm turns one :class:`~fmmeta.sampling.plan.TaskSlot` into that task's meta-gradient
for the adapter parameters. FOMAML, Reptile and the multi-task baseline differ only here; the loop
over a rank's slots, the accumulation and the outer step live in ``fmmeta.algorithms.meta_step``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
from torch import nn

from fmmeta.sampling.plan import TaskSlot


@dataclass
class TaskResult:
    """What one task contributes to a meta-step.

    Attributes:
        grads: the task's meta-gradient, one tensor per adapter parameter (unweighted).
        query_loss_before: mean query loss per answer token at theta (``nan`` if not measured).
        query_loss_after: mean query loss per answer token at the adapted weights phi.
        n_passes: forward+backward passes run (equal for every slot of a plan).
        n_tokens: real tokens processed; n_padded_tokens: tokens including padding.
    """

    grads: list[torch.Tensor]
    query_loss_before: float
    query_loss_after: float
    n_passes: int
    n_tokens: int
    n_padded_tokens: int


class MetaAlgorithm(Protocol):
    """Computes one task's meta-gradient; leaves the adapter parameters exactly as it found them."""

    name: str

    def task_gradient(
        self, model: nn.Module, params: Sequence[nn.Parameter], slot: TaskSlot
    ) -> TaskResult:
        """Runs the slot's inner loop and query passes and returns its meta-gradient."""
        ...
