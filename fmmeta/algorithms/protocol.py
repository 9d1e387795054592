"""The meta-algorithm interface: a rank's packed work in, the sum of its tasks' meta-gradients out.

FOMAML, Reptile and the baselines differ only in :meth:`MetaAlgorithm.rank_gradient`; the plan,
the collation of passes (:func:`prepare_rank`), the outer step and the observations live in
``fmmeta.algorithms.meta_step``. An algorithm owns whatever it learns besides the adapter
(``state_dict``/``load_state_dict``, ``save_with_adapter``), so a recipe checkpoints and saves
every method alike and never asks which one it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import torch
from torch import nn

from fmmeta.algorithms.passes import Pass, answer_tokens_per_task, pack_pass
from fmmeta.engine.protocol import Engine
from fmmeta.sampling.plan import PackedPass, RankPlan
from fmmeta.tasks.episode import Example


@dataclass(frozen=True)
class RowShare:
    """This rank's part in a meta-step whose rows are dealt across ranks (placement ``"rows"``).

    Every rank holds every task and runs a share of each task's rows, so a per-task sum a rank
    computes (an inner gradient, a loss sum) is partial until the ranks add theirs: ``reduce``
    does that, in place, and every rank must call it at the same points. Gradients the outer
    step adds anyway (the query phase's) stay partial; sums every rank then holds whole (Reptile's
    ``theta - phi``) are returned by the ``lead`` rank only, so the outer step counts them once.
    """

    reduce: Callable[[Sequence[torch.Tensor]], None]
    lead: bool


def make_whole(share: RowShare | None, tensors: Sequence[torch.Tensor]) -> None:
    """Makes per-task sums whole when rows are dealt across ranks; nothing otherwise."""
    if share is not None:
        share.reduce(tensors)


@dataclass
class RankWork:
    """One rank's packed work for a meta-step, collated (see :func:`prepare_rank`).

    Attributes:
        n_tasks: tasks on this rank (may be 0: then every pass is a dummy).
        support: support passes (``None`` = dummy), run once per inner step.
        query: query passes.
        support_answers: support answer tokens per task, ``[max(n_tasks, 1)]`` (a rank without
            tasks gets one all-zero entry, which its dummy passes route to).
        query_answers: query answer tokens per task, same shape.
        share: with rows across ranks (``RankPlan.shared``), how this rank's partial sums are made
            whole; ``meta_step`` sets it (``None`` until then, and for the tasks placement). The
            answer counts above are then the whole tasks', over every rank's rows.
    """

    n_tasks: int
    support: list[Pass]
    query: list[Pass]
    support_answers: torch.Tensor
    query_answers: torch.Tensor
    share: RowShare | None = None

    @property
    def reduce(self) -> Callable[[Sequence[torch.Tensor]], None] | None:
        """The inner loop's in-place sum over ranks with rows across ranks; ``None`` otherwise."""
        return None if self.share is None else self.share.reduce


def answer_tokens_of_sets(sets: Sequence[Sequence[Example]]) -> torch.Tensor:
    """``[max(len(sets), 1)]`` answer tokens of each task's whole set: the normaliser of a task
    whose rows are dealt across ranks (every rank knows every row, so no collective is needed)."""
    counts = [float(sum(len(e.answer_ids) for e in examples)) for examples in sets]
    return torch.tensor(counts or [0.0], dtype=torch.float64)


def prepare_rank(plan: RankPlan, pad_id: int, *, pad_to_multiple_of: int | None = None,
                 padding_free: bool = False) -> RankWork:
    """Collates a rank's plan into tensors (cheap enough to run in the prefetcher's thread):
    each pass padded to its longest row, or packed into padding-free lines, widths raised to the
    plan's :attr:`~fmmeta.sampling.plan.RankPlan.length_buckets`."""
    n = len(plan.slots)

    def collated(passes: Sequence[PackedPass], query: bool) -> list[Pass]:
        return [pack_pass(p, plan.slots, pad_id, query=query, pad_to_multiple_of=pad_to_multiple_of,
                          padding_free=padding_free, buckets=plan.length_buckets) for p in passes]

    support, query = collated(plan.support, False), collated(plan.query, True)
    if plan.shared:
        return RankWork(n, support, query, answer_tokens_of_sets([s.episode.support for s in plan.slots]),
                        answer_tokens_of_sets([s.episode.query for s in plan.slots]))
    return RankWork(n, support, query, answer_tokens_per_task(support, max(n, 1)),
                    answer_tokens_per_task(query, max(n, 1)))


@dataclass(kw_only=True)
class RankResult:
    """What one rank's tasks contribute to a meta-step.

    Attributes:
        grads: the sum of the rank's task meta-gradients, one tensor per adapter parameter.
        query_loss_before: ``[n_tasks]`` query loss per answer token at theta (``nan`` if not
            measured).
        query_loss_after: ``[n_tasks]`` query loss per answer token at phi.
        support_seconds: per support pass, wall seconds (mean over its inner-step repeats;
            empty when no support pass ran).
        query_seconds: per query pass, wall seconds of its forward+backward; ``None`` when the
            query passes ran forward only (their times would mislead the cost fit).
        support_repeats: how many times each support pass ran.
        query_repeats: how many times each query pass ran (forward-only runs included).
        step_size_grad: Meta-SGD only: ``[n adapter tensors]`` fp32, the sum over the rank's tasks
            of each task's query-loss gradient with respect to the log inner step sizes
            (``None`` for the other algorithms).
        task_grad_sq: ``[n_tasks]`` fp32, each task's outer gradient's squared L2 norm over every
            adapter tensor (:mod:`fmmeta.sampling.noise_scale`); ``None`` where the tasks share
            one gradient (multi-task, MetaICL: no fast weights) or a task's gradient is split
            over ranks (rows across ranks).
    """

    grads: list[torch.Tensor]
    query_loss_before: torch.Tensor
    query_loss_after: torch.Tensor
    support_seconds: list[float]
    query_seconds: list[float] | None
    support_repeats: int
    query_repeats: int
    step_size_grad: torch.Tensor | None = None
    task_grad_sq: torch.Tensor | None = None


def task_sq_norms(per_task: Sequence[torch.Tensor], n_tasks: int) -> torch.Tensor:
    """``[n_tasks]`` fp32: each task's squared L2 norm over tensors stacked ``[T, *shape]``."""
    with torch.no_grad():
        return torch.stack([g[:n_tasks].float().flatten(1).square().sum(dim=1) for g in per_task]).sum(dim=0)


class MetaAlgorithm(Protocol):
    """Computes one rank's summed meta-gradient; leaves the adapter parameters as it found them.

    What is fixed about a method (its name, whether it has fast weights, how it is scored) is on
    its record, :class:`fmmeta.algorithms.build.Method`, not here: the algorithm holds only what
    its settings decide for a run.
    """

    support_draws: int
    """Support sets per episode the sampler should draw (the multi-task baseline spends its
    matched compute on ``inner_steps`` distinct ones; everything else takes 1)."""
    support_repeats: int
    """How many times each support pass runs per meta-step (the plan's cost model needs it)."""

    def prepare(self, plan: RankPlan) -> RankWork:
        """Collates a rank's plan into the passes :meth:`rank_gradient` runs."""
        ...

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """Runs the rank's inner loops and query passes and returns the summed meta-gradient."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What the algorithm learned besides the adapter, JSON-able, for a checkpoint's
        ``state.json`` (each key a top-level key there); ``{}`` for the stateless ones."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict` from a checkpoint's ``state.json`` (which holds other keys
        too); refuses, with the fix, a state that lacks what this algorithm needs."""
        ...

    def save_with_adapter(self, folder: Path, names: Sequence[str]) -> None:
        """Writes what evaluation needs next to a saved adapter in ``folder`` (Meta-SGD: its step
        sizes, one per adapter tensor of ``names``); nothing for the others. Rank 0 calls it."""
        ...


class Stateless:
    """The checkpoint hooks of a method that learns nothing besides the adapter (all but
    Meta-SGD): nothing to checkpoint, restore or save next to the adapter."""

    def state_dict(self) -> dict[str, Any]:
        """Nothing learned besides the adapter."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""

    def save_with_adapter(self, folder: Path, names: Sequence[str]) -> None:
        """Nothing to save next to the adapter."""


@runtime_checkable
class OuterUpdate(Protocol):
    """A meta-algorithm that learns something besides the adapter (Meta-SGD: its inner step sizes).

    ``meta_step`` calls :meth:`outer_update` on every rank right after the engine's outer step.
    The state it updates is not a model parameter, so no engine knows it: the algorithm keeps a
    copy on every rank and must apply the same update everywhere (an all-reduce, then identical
    arithmetic), which makes every engine agree by construction.
    """

    def outer_update(self, engine: Engine, result: RankResult, n_real_tasks: int, *,
                     skipped: bool) -> dict[str, float]:
        """Updates the extra state from this rank's ``result``; ``skipped``: the engine skipped
        this meta-step (non-finite meta-gradient), so the extra state must not move either.
        Every rank must call it (it runs collectives). Returns stats for the step record."""
        ...
