"""Splitting an evaluation over ranks, in lockstep.

Several ranks (``ranks=`` an engine) split the episodes: in round ``k`` rank ``r`` takes episode
``k * world_size + r`` (or none), and the scores are gathered and put back in episode order, so the
result is the one a single process computes (:func:`sharded`). Under ZeRO-3 every forward and
backward pass all-gathers parameters, so every rank must run the same sequence of passes or the run
hangs: each phase of an episode (a support step, a query scoring) is padded with zero-weight dummy
passes up to the largest pass count of any rank in that round (:class:`Lockstep`). The adapter
tensors must be resident (the engine layer keeps them so).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

import torch
from torch import nn

from fmmeta.algorithms.inner_loop import evaluate_loss
from fmmeta.workers import Workers


class Ranks(Protocol):
    """The part of an engine that splitting evaluation over ranks needs."""

    rank: int
    world_size: int

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        ...


class OneRank:
    """A single process: the ranks of an evaluation without an engine."""

    rank = 0
    world_size = 1

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]


_T = TypeVar("_T")
_P = TypeVar("_P")  # a support pass: a Batch, or a PackedBatch of several episodes' rows


class Lockstep:
    """Pads each phase of an episode to the same number of passes on every rank."""

    def __init__(self, model: nn.Module, params: Sequence[torch.Tensor], ranks: Ranks) -> None:
        self.model, self.params, self.ranks = model, params, ranks

    def most(self, n: int) -> int:
        """The largest ``n`` over ranks (a collective when there are several)."""
        return n if self.ranks.world_size == 1 else max(self.ranks.all_gather_object(n))

    def support(self, batches: list[_P | None]) -> list[_P | None]:
        """``batches`` padded with dummy passes (``None``) to the longest support of the round."""
        return batches + [None] * (self.most(len(batches)) - len(batches))

    def score(self, passes: int, fn: Callable[[], _T] | None) -> _T | None:
        """Runs ``fn`` (forward-only scoring of ``passes`` passes; ``None`` for a rank without an
        episode), then dummy forward passes up to the busiest rank's count.

        The counts are exchanged before any pass runs: a rank still in its forward passes while
        another waits in the exchange would mismatch the collectives.

        Raises:
            RuntimeError: if ``fn`` ran another number of passes than announced.
        """
        target = self.most(passes)
        ran = 0

        def count(*_: Any) -> None:
            nonlocal ran
            ran += 1

        handle = self.model.register_forward_pre_hook(count)
        try:
            result = fn() if fn is not None else None
        finally:
            handle.remove()
        if ran != passes:
            raise RuntimeError(
                f"scoring ran {ran} forward passes but score_passes() announced {passes}: "
                "fmmeta.evaluation.scoring.score_passes must follow score_query"
            )
        if target > ran:
            evaluate_loss(self.model, self.params, [None] * (target - ran))
        return result


def sharded(ranks: Ranks, items: Sequence[Any], fn: Callable[[Any | None], _T],
            on_result: Callable[[Any], None] | None = None) -> list[_T]:
    """``[fn(item) for item in items]`` with the items split over ranks, in the original order.

    Every rank calls ``fn`` once per round, with ``None`` when it has no item left, so ranks run the
    same number of rounds. ``on_result(item)`` is called for every item of a round (all ranks')
    once this rank has run its own.
    """
    world, rank = ranks.world_size, ranks.rank
    mine: dict[int, _T] = {}
    for start in range(0, len(items), world):
        i = start + rank
        result = fn(items[i] if i < len(items) else None)
        if i < len(items):
            mine[i] = result
        if on_result is not None:
            for item in items[start:start + world]:
                on_result(item)
    if world == 1:
        return [mine[i] for i in range(len(items))]
    merged: dict[int, _T] = {}
    for part in ranks.all_gather_object(mine):
        merged.update(part)
    return [merged[i] for i in range(len(items))]


def per_method(ranks: Ranks, workers: Workers | None, items: Sequence[Any],
               fns: Mapping[str, Callable[[Any | None], _T]],
               on_result: Callable[[Any], None] | None = None) -> dict[str, list[_T]]:
    """``{m: [fn(item) for item in items] for m, fn in fns.items()}``, the work split up.

    Over several ranks each method's items are :func:`sharded` (a round holds one method's items
    only, so every rank runs the same phases in lockstep). In a one-process run the items of all
    methods go to ``workers`` at once (:class:`fmmeta.workers.Workers`), so no worker waits for the
    last group of a method while there is another method's work. ``on_result(item)`` reports
    progress as items finish.
    """
    if ranks.world_size > 1:
        return {m: sharded(ranks, items, fn, on_result) for m, fn in fns.items()}
    pairs = [(m, item) for m in fns for item in items]
    results = (workers or Workers(1, 1)).map(
        lambda pair: fns[pair[0]](pair[1]), pairs,
        on_result=None if on_result is None else lambda i: on_result(pairs[i][1]),
    )
    done: dict[str, list[_T]] = {m: [] for m in fns}
    for (m, _), result in zip(pairs, results):
        done[m].append(result)
    return done
