"""The meta-batch plan: which task runs on which rank, and which sequences share each pass.

This is the contract between the sampler (which builds plans) and the meta-algorithms (which run
them). Under DeepSpeed ZeRO-3 every forward and backward all-gathers each layer's parameters, so
ranks meet at every pass: a meta-step costs about the *sum over passes of the slowest rank's
pass*, and a rank that runs one pass fewer than the others hangs them. A plan therefore fixes the
passes, not only the tasks:

* every rank holds any number of :class:`TaskSlot` (whole tasks: a task's fast weights live on
  one rank), chosen so that ranks carry about the same tokens;
* every rank runs the same number of support passes (repeated once per inner step) and of query
  passes. A :class:`PackedPass` holds sequences of *several* tasks, each row tagged with the
  slot whose fast adapter it runs through, so every pass can be filled to one token budget;
* a pass without rows is a *dummy pass*: one forward and backward on a 2-token sequence with
  zero weight, which keeps the collectives matched without changing any result.

A plan places work one of two ways (:data:`Placement`). ``"tasks"``: each task on one rank, as
above. ``"rows"``: every rank holds *every* task of the meta-batch (the same slots everywhere)
and runs a share of each task's rows; the ranks sum their tasks' inner gradients once per inner
step (:mod:`fmmeta.sampling.rows_plan` explains why and what it costs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Sequence, TypeVar

import numpy as np

from fmmeta.tasks.episode import Episode, Example, padded_length

if TYPE_CHECKING:
    from fmmeta.sampling.cost import CostModel


@dataclass(frozen=True, slots=True)
class TaskSlot:
    """One task's episode on one rank within a meta-step.

    Attributes:
        episode: the episode to adapt on and score.
        task_id: index of the task in the sampler's pool.
        cost: the cost model's estimate of the task's own work (its sequences, unpadded), in the
            cost model's unit; what the assignment balanced.
    """

    episode: Episode
    task_id: int
    cost: float = 0.0


def pass_features(n_rows: int, width: int) -> tuple[float, float, float]:
    """The cost model's regressors of a pass of ``n_rows`` rows ``width`` tokens wide:
    ``(1, n_rows * width, n_rows * width^2)``; a pass of no rows (dummy) counts as one token.

    The one definition for a planned pass (:attr:`PackedPass.features`) and for a collated one
    (its tensors' shape, which padding-free lines and ``pad_to_multiple_of`` change)."""
    if n_rows == 0:
        return (1.0, 1.0, 1.0)
    return (1.0, float(n_rows * width), float(n_rows * width * width))


@dataclass(frozen=True, slots=True)
class PackedPass:
    """The sequences one forward+backward pass runs: rows of several tasks, padded to one width.

    Attributes:
        slots: ``slots[i]`` is the index (into the rank's slots) of row ``i``'s task.
        examples: ``examples[i]`` indexes that task's support set (support passes) or query set
            (query passes).
        width: padded length of the pass (its longest row); 0 for a dummy pass.
        n_tokens: real tokens of the pass (sum of row lengths).
    """

    slots: tuple[int, ...]
    examples: tuple[int, ...]
    width: int
    n_tokens: int

    @property
    def is_dummy(self) -> bool:
        """Whether this pass only keeps the collectives in lockstep."""
        return not self.slots

    @property
    def n_rows(self) -> int:
        """Sequences in the pass."""
        return len(self.slots)

    @property
    def n_padded_tokens(self) -> int:
        """Tokens processed, padding included (a dummy pass counts as 1)."""
        return self.n_rows * self.width if self.slots else 1

    @property
    def features(self) -> tuple[float, float, float]:
        """The cost model's regressors ``(passes, padded tokens, sum of padded length^2)``."""
        return pass_features(self.n_rows, self.width)

    def rows(self, slots: tuple[TaskSlot, ...], *, query: bool) -> list[Example]:
        """The examples of the pass, in row order."""
        if query:
            return [slots[s].episode.query[e] for s, e in zip(self.slots, self.examples)]
        return [slots[s].episode.support[e] for s, e in zip(self.slots, self.examples)]


DUMMY_PASS = PackedPass((), (), 0, 0)

_T = TypeVar("_T", TaskSlot, PackedPass)

Placement = Literal["tasks", "rows"]
"""How a plan places a meta-batch on ranks: whole tasks per rank, or every task's rows dealt
across all ranks."""


def _make_many(cls: type[_T], *columns: Sequence) -> list[_T]:
    """``[cls(*row) for row in zip(*columns)]`` for the planner's hot path, ~2.5x faster.

    :class:`TaskSlot` and :class:`PackedPass` are frozen slotted dataclasses without
    ``__post_init__``, so an instance is fully described by its slots: the objects are made by
    ``object.__new__`` and each slot is filled through its member descriptor, all in C-level
    ``map`` calls (the frozen ``__init__`` costs ~1 us per object, and a 64 x 32 plan makes
    ~3,000). ``columns`` are given in field order, every field included.
    """
    n = len(columns[0])
    made: list[_T] = list(map(object.__new__, itertools.repeat(cls, n)))
    for name, column in zip(cls.__slots__, columns, strict=True):
        any(map(getattr(cls, name).__set__, made, column))  # __set__ returns None: runs them all
    return made


@dataclass(frozen=True)
class RankPlan:
    """One rank's share of a meta-step.

    Attributes:
        slots: the tasks this rank adapts (possibly none); with ``shared`` every task of the
            meta-batch, the same on every rank.
        support: support passes; every inner step runs all of them, in order.
        query: query passes, run once after the inner steps.
        shared: the rows-across-ranks placement: this rank runs only a share of its slots' rows,
            and every inner step sums the tasks' gradients over all ranks.
        length_buckets: ascending widths every pass is padded up to (``sampler.length_buckets``;
            the passes' ``width`` already says the bucket); empty: each pass's own width.
    """

    slots: tuple[TaskSlot, ...]
    support: tuple[PackedPass, ...]
    query: tuple[PackedPass, ...]
    shared: bool = False
    length_buckets: tuple[int, ...] = ()


@dataclass(frozen=True)
class MetaBatchPlan:
    """All ranks' work for one meta-step.

    Attributes:
        step: the meta-step this plan is for.
        ranks: ``ranks[r]`` is rank ``r``'s :class:`RankPlan`; all have the same pass counts.
        n_real_tasks: tasks over all ranks (the meta-gradient's divisor).
        placement: ``"tasks"`` or ``"rows"`` (every rank's :attr:`RankPlan.shared` says the same).
        predicted: the cost model's price of this meta-batch under each placement the planner
            weighed (``{"tasks": ..., "rows": ...}``; empty when it weighed none).

    Raises:
        ValueError: if the ranks' pass counts differ (a plan that would hang ZeRO-3), or their
            placement disagrees with ``placement``.
    """

    step: int
    ranks: tuple[RankPlan, ...]
    n_real_tasks: int
    placement: Placement = "tasks"
    predicted: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if any(r.shared != (self.placement == "rows") for r in self.ranks):
            raise ValueError(
                f"plan for step {self.step} has placement={self.placement!r} but ranks with "
                f"shared={[r.shared for r in self.ranks]}: build rows plans with plan_rows_across_ranks"
            )
        counts = {(len(r.support), len(r.query)) for r in self.ranks}
        if len(counts) > 1:
            raise ValueError(
                f"plan for step {self.step} has unequal (support, query) pass counts across ranks "
                f"{sorted(counts)}: every rank must run the same passes or ZeRO-3 hangs"
            )

    def for_rank(self, rank: int) -> RankPlan:
        """The work ``rank`` runs."""
        return self.ranks[rank]

    @property
    def slots(self) -> tuple[TaskSlot, ...]:
        """Every task of the meta-batch once: every rank's slots, rank by rank (with rows across
        ranks every rank holds them all: rank 0's)."""
        if self.placement == "rows":
            return self.ranks[0].slots
        return tuple(s for r in self.ranks for s in r.slots)

    def compute_cost(self, cost_model: CostModel, *, support_repeats: int, lockstep: bool = True) -> float:
        """The passes' price (``a + b * padded tokens + c * sum len^2`` each; support passes run
        ``support_repeats`` times), collectives aside.

        ``lockstep`` (ZeRO-3, where ranks meet inside every pass): per phase, the sum over pass
        indices of the costliest rank's pass. Otherwise ranks meet only where the placement makes
        them: at the outer step for ``"tasks"`` (the most loaded rank's total), and also after
        every inner step for ``"rows"`` (whose inner steps all-reduce)."""
        cost = []
        a, b, c = cost_model.coefficients
        for phase in ([r.support for r in self.ranks], [r.query for r in self.ranks]):
            # PackedPass.features, for all passes at once (a 64 x 32 plan prices ~5,000 passes)
            width = np.array([[p.width for p in passes] for passes in phase], dtype=np.float64)  # R x P
            rows = np.array([[len(p.slots) for p in passes] for passes in phase], dtype=np.float64)
            padded = np.where(rows > 0, rows * width, 1.0)
            squares = np.where(rows > 0, padded * width, 1.0)
            cost.append(a + b * padded + c * squares if width.size else np.zeros((len(self.ranks), 1)))
        support, query = cost
        if lockstep:
            return support_repeats * float(support.max(axis=0).sum()) + float(query.max(axis=0).sum())
        if self.placement == "rows":
            return support_repeats * float(support.sum(axis=1).max()) + float(query.sum(axis=1).max())
        return float((support_repeats * support.sum(axis=1) + query.sum(axis=1)).max())

    def digest(self) -> str:
        """SHA-256 of the plan's structure; equal on every rank when samplers agree."""
        h = hashlib.sha256(f"step={self.step};n={self.n_real_tasks};{self.placement}".encode())
        for r, rank in enumerate(self.ranks):
            for s in rank.slots:
                ep = s.episode
                h.update(
                    f"r{r}:{s.task_id}:{ep.task}|{[e.prompt_ids + e.answer_ids for e in ep.support]}|"
                    f"{[e.prompt_ids + e.answer_ids for e in ep.query]};".encode()
                )
            for name, passes in (("s", rank.support), ("q", rank.query)):
                for p in passes:
                    h.update(f"{name}:{p.slots}:{p.examples};".encode())
        return h.hexdigest()


@dataclass
class PricedPlan:
    """A plan priced under lockstep before its objects exist: choosing between placements needs
    only the prices, so only the chosen plan is made (:meth:`build`)."""

    support: float
    """The support passes' lockstep price (the sum over pass indices of the costliest rank's pass)."""
    query: float
    """The query passes' lockstep price."""
    build: Callable[[], MetaBatchPlan]

    def price(self, support_repeats: int) -> float:
        """What :meth:`MetaBatchPlan.compute_cost` gives the built plan with ``lockstep=True``."""
        return support_repeats * self.support + self.query


def ascending_widths(buckets: Sequence[object]) -> bool:
    """Whether ``buckets`` are distinct integer widths >= 1 in ascending order (``sampler.length_buckets``)."""
    ints = [b for b in buckets if isinstance(b, int) and not isinstance(b, bool) and b >= 1]
    return len(ints) == len(buckets) and ints == sorted(set(ints))


def bucket_widths(lengths: np.ndarray, buckets: Sequence[int]) -> np.ndarray:
    """Each length raised to the smallest of ``buckets`` (ascending) that holds it; a length past
    the last bucket stays (:func:`~fmmeta.tasks.episode.padded_length`, vectorised). What the
    planners pack and price when ``sampler.length_buckets`` is set: the widths that will run."""
    if not buckets:
        return lengths
    b = np.asarray(buckets, dtype=lengths.dtype)
    at = np.searchsorted(b, lengths, side="left")
    return np.where(at < b.size, b[np.minimum(at, b.size - 1)], lengths)


def bucketed(plan: MetaBatchPlan, buckets: Sequence[int]) -> MetaBatchPlan:
    """``plan``, packed by the planners on bucket widths (:func:`bucket_widths`), with the buckets
    recorded on each rank (collation pads to them), every pass's width a bucket and its
    ``n_tokens`` the real tokens of its rows again (the planners counted the widths). No
    buckets: ``plan`` itself.

    Fixed widths are what a static-shape compiled graph or a CUDA graph reuses; engine.compile's
    layers take dynamic shapes, so on a CPU a new width costs them no graph, and buckets only add
    padded tokens (e.g. [64, 128, 256, 512] pays up to 2x on a short row)."""
    if not buckets:
        return plan
    keep = tuple(buckets)

    def widen(r: RankPlan, query: bool) -> tuple[PackedPass, ...]:
        return tuple(p if p.is_dummy else dataclasses.replace(
            p, width=padded_length(p.width, None, keep),
            n_tokens=sum(ex.n_tokens for ex in p.rows(r.slots, query=query)))
            for p in (r.query if query else r.support))

    ranks = tuple(dataclasses.replace(r, support=widen(r, False), query=widen(r, True), length_buckets=keep)
                  for r in plan.ranks)
    return dataclasses.replace(plan, ranks=ranks, predicted=dict(plan.predicted))
