"""Passes and the sweep over them: one forward (and one ``torch.autograd.grad``) per pass.

A pass is a :class:`PackedBatch`: a collated micro-batch whose examples may belong to several tasks
(``rows`` names each example's task; an example is a row of the batch, or a stretch of one in
padding-free lines, :mod:`fmmeta.tasks.lines`), or ``None`` for a dummy pass, one forward+backward on a 2-token
sequence with weight 0 that keeps ZeRO-3's per-pass collectives in lockstep across ranks without
changing any result. :func:`run_passes` is the sweep the inner loop, the outer (query) gradient
and evaluation's forward-only losses all run.

Gradients come from ``torch.autograd.grad`` over the given weights only, never from
``.backward()``: under DeepSpeed ZeRO-2/3 every ``engine.backward()`` reduce-scatters across ranks,
and inner loops must choose their own collectives: none when each task is on one rank, one sum
of the inner gradients per step when rows are dealt across ranks (docs/design.md, "No `no_sync`
under ZeRO-2/3").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fmmeta.algorithms.answer_loss import answer_loss_rows, dummy_batch
from fmmeta.algorithms.task_lora import TaskLoRA
from fmmeta.sampling.plan import PackedPass, TaskSlot
from fmmeta.tasks.episode import Batch, Example, collate
from fmmeta.tasks.lines import collate_lines


@dataclass(frozen=True)
class PackedBatch:
    """One pass: a collated micro-batch and the task (index into the rank's tasks) of each example."""

    batch: Batch
    rows: torch.Tensor

    @classmethod
    def one_task(cls, batch: Batch) -> PackedBatch:
        """Every row belongs to task 0."""
        return cls(batch, torch.zeros(batch.n_rows, dtype=torch.long))

    def routes(self) -> torch.Tensor:
        """What :attr:`TaskLoRA.rows` takes: the task of each row, or of each token when the
        batch is padding-free lines (padding goes to task 0; nothing reads its output)."""
        lines = self.batch.lines
        if lines is None:
            return self.rows
        return self.rows.index_select(0, lines.token_rows.clamp(min=0).flatten()).view_as(lines.token_rows)

    def to(self, device: torch.device | str) -> PackedBatch:
        """The pass on ``device``."""
        return PackedBatch(self.batch.to(device), self.rows.to(device))


Pass = PackedBatch | None
"""A pass of a loop; ``None`` is a dummy pass."""


def collate_pass(examples: Sequence[Example], pad_id: int, pad_to_multiple_of: int | None = None,
                 *, padding_free: bool = False, buckets: Sequence[int] = ()) -> Batch:
    """The examples padded to one length, or packed into padding-free lines (widths raised to
    ``buckets``, :func:`~fmmeta.tasks.episode.padded_length`)."""
    return (collate_lines if padding_free else collate)(examples, pad_id, pad_to_multiple_of, buckets)


def pack_pass(p: PackedPass, slots: Sequence[TaskSlot], pad_id: int, *, query: bool,
              pad_to_multiple_of: int | None = None, padding_free: bool = False,
              buckets: Sequence[int] = ()) -> Pass:
    """Collates a plan's :class:`~fmmeta.sampling.plan.PackedPass` (``None`` for a dummy pass)."""
    if p.is_dummy:
        return None
    examples = p.rows(tuple(slots), query=query)
    return PackedBatch(collate_pass(examples, pad_id, pad_to_multiple_of, padding_free=padding_free,
                                    buckets=buckets),
                       torch.tensor(p.slots, dtype=torch.long))


def answer_tokens_per_task(passes: Sequence[Pass], n_tasks: int) -> torch.Tensor:
    """``[n_tasks]`` answer tokens of each task over ``passes`` (a task's loss normaliser)."""
    out = torch.zeros(n_tasks, dtype=torch.float64)
    for p in passes:
        if p is not None:
            out.index_add_(0, p.rows, p.batch.answers_per_row().to(torch.float64))
    return out


def per_token(sums: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Each task's loss sum over its answer-token count ``n``; ``nan`` where it has none."""
    return torch.where(n > 0, sums / n.clamp(min=1.0), torch.full_like(sums, torch.nan))


def inverse_tokens(n: torch.Tensor) -> torch.Tensor:
    """``1 / n`` per task, ``0`` where it has no answer tokens: the weight that makes a task's
    gradient its own mean loss's, whatever passes or neighbours it shares."""
    return torch.where(n > 0, 1.0 / n.clamp(min=1.0), torch.zeros_like(n))


def answer_tokens(batches: Sequence[Batch | None]) -> int:
    """Total answer tokens of the real micro-batches (a set's loss normaliser)."""
    return sum(b.n_answer_tokens for b in batches if b is not None)



def _device_of(weights: Sequence[torch.Tensor]) -> torch.device:
    if not weights:
        raise ValueError(
            "got no adapter parameters: pass engine.adapter_parameters() (the trainable LoRA tensors)"
        )
    return weights[0].device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class PassResult:
    """What a sweep over passes produced.

    Attributes:
        grads: one gradient per weight (``None`` for a forward-only sweep).
        task_sums: ``[T]`` unscaled answer-loss sum of each task's rows.
        seconds: wall seconds of every pass, in order.
    """

    grads: list[torch.Tensor] | None
    task_sums: torch.Tensor
    seconds: list[float]


def run_passes(
    model: nn.Module,
    weights: Sequence[torch.Tensor],
    passes: Sequence[Pass],
    task_scale: torch.Tensor,
    *,
    lora: TaskLoRA | None = None,
    pass_scales: Sequence[float] | None = None,
    grad: bool = True,
) -> PassResult:
    """One sweep: ``grad of sum_p pass_scales[p] * sum_rows task_scale[row task] * row loss``.

    One forward (and one ``torch.autograd.grad``) per pass, so the graph of only one pass is alive
    at a time.

    Args:
        model: the causal LM.
        weights: tensors to differentiate: stacked fast weights (with ``lora``) or the adapter
            parameters (one task).
        passes: the passes; ``None`` runs a zero-weight dummy pass.
        task_scale: ``[T]`` weight of a row's loss by its task (e.g. ``1 / answer tokens``).
        lora: routes rows to their task's slice of ``weights`` (already :meth:`TaskLoRA.active`).
        pass_scales: per-pass weight (default 1.0 each).
        grad: ``False`` runs forward only (no gradient, ``grads`` is ``None``).
    """
    device = _device_of(weights)
    scale = task_scale.to(device=device, dtype=torch.float32)
    sums = torch.zeros(task_scale.shape[0], dtype=torch.float64)
    grads: list[torch.Tensor] | None = None
    seconds: list[float] = []
    for i, p in enumerate(passes):
        t0 = time.perf_counter()
        if p is None:
            batch, rows, weight = dummy_batch(device), torch.zeros(1, dtype=torch.long, device=device), 0.0
            routes = rows
        else:
            p = p.to(device)
            batch, rows, weight = p.batch, p.rows, 1.0 if pass_scales is None else pass_scales[i]
            routes = p.routes()
        if lora is not None:
            lora.rows = routes
        with torch.set_grad_enabled(grad):
            per_row = answer_loss_rows(model, batch)
            if grad:
                loss = (per_row * scale.index_select(0, rows)).sum() * weight
                g = torch.autograd.grad(loss, list(weights), allow_unused=True)
        if p is not None:
            sums.index_add_(0, rows.cpu(), per_row.detach().to("cpu", torch.float64))
        if grad:
            if grads is None:
                grads = [torch.zeros_like(w) if gi is None else gi.detach() for w, gi in zip(weights, g)]
            elif p is not None:
                for acc, gi in zip(grads, g):
                    if gi is not None:
                        acc.add_(gi)
        _sync(device)
        seconds.append(time.perf_counter() - t0)
    if lora is not None:
        # A route belongs to its pass: a forward after the sweep (e.g. scoring the adapted task
        # with rows of another shape) runs as task 0, as it did when a one-task route was a
        # Python int that fit any shape.
        lora.rows = None
    if grad and grads is None:  # no passes at all
        grads = [torch.zeros_like(w) for w in weights]
    return PassResult(grads, sums, seconds)
