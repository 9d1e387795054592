"""Adapting and scoring a group of episodes together, each through its own fp32 fast weights.

Held-out evaluation adapts every method on every episode's support set and scores its query.
A few-shot pass is small, and on a CPU its cost is mostly per-operation overhead, so episodes
are adapted in groups: the group's support rows share passes, each row routed to its episode's
slice of stacked fast weights by :class:`~fmmeta.algorithms.task_lora.TaskLoRA`, with
per-episode loss normalisation and clipping as in training (this is training's inner loop,
:func:`~fmmeta.algorithms.inner_loop.adapt_tasks`), and the group's query sets share scoring
passes (:func:`~fmmeta.evaluation.scoring.score_query_sets`). Every score equals the one the
episode gets alone, up to float rounding. Under several ranks, every phase is padded to the
busiest rank's pass count (:class:`~fmmeta.evaluation.lockstep.Lockstep`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Collection, Iterator, Sequence, TypeVar

import torch
from torch import nn

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.inner_loop import InnerOptimizer, adapt_tasks, only_adapting
from fmmeta.algorithms.passes import PackedBatch, Pass, answer_tokens_per_task, collate_pass
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters
from fmmeta.evaluation.lockstep import Lockstep
from fmmeta.evaluation.scoring import QueryScore, QuerySet, score_passes, score_query_sets
from fmmeta.tasks.episode import Episode

_T = TypeVar("_T")

Scored = list[tuple[int, QueryScore]]
"""``(step, score)`` per scored adaptation step of one episode: the query set's
:class:`~fmmeta.evaluation.scoring.QueryScore`, every metric's input
(:mod:`fmmeta.evaluation.metrics`)."""


SUPPORT_PASS_TOKENS = 2048
"""Padded tokens per support pass of a group of episodes (or one row, if longer). Rows are
sorted by length before they are cut into passes, so a pass pads its rows to a similar length;
a few thousand tokens keep a CPU pass compute-bound (below that, per-operation overhead
dominates) while bounding activation memory."""


def support_passes(episodes: Sequence[Episode], pad_id: int, micro_batch_size: int,
                   icl_max_length: int | None = None, *, padding_free: bool = False) -> list[Pass]:
    """The support sets of episodes adapted together, every row routed to its episode (task
    ``g``): all rows sorted by length and cut into passes of at most ``micro_batch_size`` rows
    per episode and :data:`SUPPORT_PASS_TOKENS` padded tokens (a pass mixes episodes; each
    episode's gradient sums over the passes its rows are in). With ``icl_max_length`` the rows are
    in the in-context format (:meth:`~fmmeta.tasks.episode.Episode.in_context_support`); with
    ``padding_free`` each pass is laid out in padding-free lines (:mod:`fmmeta.tasks.lines`)."""
    sets = [ep.support if icl_max_length is None else ep.in_context_support(icl_max_length) for ep in episodes]
    rows = sorted(((ex.n_tokens, g, i) for g, support in enumerate(sets) for i, ex in enumerate(support)))
    max_rows = micro_batch_size * max(1, len(episodes))
    cuts: list[list[tuple[int, int, int]]] = []
    for row in rows:  # ascending length: the row joining a pass is its longest
        if cuts and len(cuts[-1]) < max_rows and (len(cuts[-1]) + 1) * row[0] <= SUPPORT_PASS_TOKENS:
            cuts[-1].append(row)
        else:
            cuts.append([row])
    return [PackedBatch(collate_pass([sets[g][i] for _, g, i in cut], pad_id, padding_free=padding_free),
                        torch.tensor([g for _, g, _ in cut], dtype=torch.long)) for cut in cuts]


@dataclass(frozen=True)
class AdaptSteps:
    """What :func:`adapting` yields: call it to take one adaptation step of every episode; ``fast``
    holds the stacked fp32 fast weights (``[T, *shape]`` per adapter tensor) as they are now, so a
    caller that keeps the adapted weights (``fmmeta adapt`` writes them out) reads them here
    instead of running an inner loop of its own."""

    take_step: Callable[[], None]
    fast: list[torch.Tensor]

    def __call__(self) -> None:
        self.take_step()


@contextlib.contextmanager
def adapting(
    model: nn.Module,
    lora: TaskLoRA,
    params: Sequence[torch.Tensor],
    start: Sequence[torch.Tensor],
    support: Sequence[Pass],
    n_answer: torch.Tensor,
    cfg: InnerLoopConfig,
    step_sizes: Sequence[float] | None = None,
    task_lrs: Sequence[float] | None = None,
    first: tuple[Sequence[Pass], torch.Tensor] | None = None,
    adapted: Sequence[int] | None = None,
) -> Iterator[AdaptSteps]:
    """The model with ``T = len(n_answer)`` copies of the adapter at ``start`` as fp32 fast
    weights inside the block (one per episode adapted together); yields the function that takes
    one adaptation step of all of them on ``support`` (passes whose rows name their episode;
    ``None`` entries are dummy passes; ``n_answer[g]`` is episode ``g``'s support answer tokens).
    ``step_sizes`` gives every adapter tensor its own step size, ``task_lrs`` every episode its own.
    ``first``: the first step's passes and, per copy, the copy whose gradient it takes
    (:func:`_first_step`). ``adapted``: the adapter tensors the steps update (indices; ``None``:
    every one), as the method's inner loop adapts them in training.

    This is training's inner loop (:func:`~fmmeta.algorithms.inner_loop.adapt_tasks` over
    stacked weights routed by ``lora``), so each episode's trajectory is the one it has alone.
    The adapter parameters are never written: with a bf16 model an in-place step of
    ``lr * grad`` is often below half a unit in the last place of a bf16 weight and would be
    lost, while the fast weights, the inner optimizer's moments and the loss sums stay fp32 and
    only the forward casts.
    """
    if not n_answer.numel():  # no episodes on this rank: one idle task for the dummy passes
        n_answer, task_lrs = torch.zeros(1, dtype=torch.float64), None
    fast = stack_adapters([t.detach().to(p.device) for p, t in zip(params, start)], n_answer.numel())
    with only_adapting(fast, adapted) as weights, lora.active(fast):
        lora.rows = None
        yield AdaptSteps(_stepper(model, lora, weights, support, n_answer, cfg, step_sizes, task_lrs, first), fast)


def _stepper(model: nn.Module, lora: TaskLoRA, weights: list[torch.Tensor], support: Sequence[Pass],
             n_answer: torch.Tensor, cfg: InnerLoopConfig, step_sizes: Sequence[float] | None,
             task_lrs: Sequence[float] | None, first: tuple[Sequence[Pass], torch.Tensor] | None,
             ) -> Callable[[], None]:
    """The function that takes one adaptation step of ``weights`` (see :func:`adapting`), with
    one inner optimizer that carries the trajectories from step to step."""
    opt = InnerOptimizer(cfg, weights, step_sizes, task_lrs=task_lrs)
    pending = first

    def step() -> None:
        nonlocal pending
        if pending is None:
            adapt_tasks(model, weights, support, n_answer, cfg, lora=lora, steps=1, optimizer=opt)
            return
        passes, source = pending
        pending = None
        copies = source.numel() == n_answer.numel()  # else a rank without episodes: one idle task
        adapt_tasks(model, weights, passes, n_answer, cfg, lora=lora, steps=1, optimizer=opt,
                    reduce=_copied_from(source) if copies else None)

    return step


def _first_step(episodes: Sequence[Episode], lockstep: Lockstep, pad_id: int, micro_batch_size: int,
                icl_max_length: int | None, padding_free: bool) -> tuple[list[Pass], torch.Tensor]:
    """The first adaptation step of episodes that repeat (one episode at several lrs, as the lr
    choice adapts them): its gradient is taken at ``start`` for every copy, whatever the copy's
    lr, so the passes hold each distinct episode once, routed to its first copy, and the other
    copies take that copy's gradient (``source[t]``: the copy whose gradient copy ``t`` takes)
    before the clipping and the update. Each copy then steps with its own lr."""
    first_copy: dict[int, int] = {}
    source = torch.tensor([first_copy.setdefault(id(ep), t) for t, ep in enumerate(episodes)], dtype=torch.long)
    distinct = [episodes[t] for t in first_copy.values()]
    copy_of = torch.tensor(list(first_copy.values()), dtype=torch.long)  # distinct episode -> its first copy
    passes = support_passes(distinct, pad_id, micro_batch_size, icl_max_length, padding_free=padding_free)
    return lockstep.support([p and PackedBatch(p.batch, copy_of[p.rows]) for p in passes]), source


def _copied_from(source: torch.Tensor) -> Callable[[Sequence[torch.Tensor]], None]:
    """Gives every copy the gradient and loss sum of its ``source`` copy, in place."""
    def copy(tensors: Sequence[torch.Tensor]) -> None:
        for t in tensors:
            t.copy_(t.index_select(0, source.to(t.device)))
    return copy


def _route(lora: TaskLoRA) -> Callable[[torch.Tensor], None]:
    def route(rows: torch.Tensor) -> None:
        lora.rows = rows
    return route


def _score(
    model: nn.Module, lora: TaskLoRA, episodes: Sequence[Episode], micro_batch_size: int,
    lockstep: Lockstep, icl_max_length: int | None,
) -> list[QueryScore]:
    """Scores the episodes' queries as they are now, episode ``g`` through fast weights ``g``:
    plain, or with the support in context when ``icl_max_length`` is given (no episodes: a rank
    with nothing left runs dummy passes)."""
    sets = [QuerySet(ep.query if icl_max_length is None else ep.in_context_query(icl_max_length),
                     ep.choices) for ep in episodes]

    def score() -> list[QueryScore]:
        try:
            return score_query_sets(model, sets, micro_batch_size=micro_batch_size, route=_route(lora))
        finally:
            lora.rows = None  # the lockstep's dummy passes that may follow are one row of task 0

    s = lockstep.score(score_passes(sets, micro_batch_size=micro_batch_size), score if sets else None)
    return list(s or [])


@dataclass(frozen=True, kw_only=True)
class AdaptPlan:
    """How one method's episodes are adapted and scored (what :func:`adapt_and_score` needs
    besides the episodes, the model and the steps).

    Attributes:
        inner: the inner loop (its ``inner_lr`` is the method's lr unless ``step_sizes`` is given).
        pad_id: the tokenizer's padding id.
        micro_batch_size: rows of one episode per support pass, and queries per scoring pass.
        step_sizes: one step size per adapter tensor (Meta-SGD's learned ones); ``None``: the lr.
        adapted: the adapter tensors the steps update (indices; ``None``: every one).
        icl_max_length: score every query with the support prepended as demonstrations, cut to
            this many tokens; ``None``: plain queries.
        support_icl_max_length: adapt on support rows in the in-context format, cut to this many
            tokens; ``None``: plain support rows.
    """

    inner: InnerLoopConfig
    pad_id: int
    micro_batch_size: int
    step_sizes: Sequence[float] | None = None
    adapted: Sequence[int] | None = None
    icl_max_length: int | None = None
    support_icl_max_length: int | None = None


def adapt_and_score(
    model: nn.Module,
    lora: TaskLoRA,
    params: Sequence[torch.Tensor],
    start: Sequence[torch.Tensor],
    episodes: Sequence[Episode],
    plan: AdaptPlan,
    steps: int,
    lockstep: Lockstep,
    *,
    score_steps: Collection[int] | None = None,
    task_lrs: Sequence[float] | None = None,
) -> list[Scored]:
    """Adapts the episodes together, step by step from ``start``, as ``plan`` says; returns per
    episode ``(step, score)`` per scored step (:data:`Scored`).

    One inner optimizer carries the trajectories across the steps (:func:`adapting`), so stepping
    and scoring in between gives exactly the weights of ``steps`` steps in a row. No episodes
    runs only the dummy passes that keep this rank in step with the others. ``score_steps`` limits
    scoring to those steps (``None``: every step; the last one always); ``task_lrs`` gives every
    episode its own lr, and then an episode may be given once per lr: the first step's gradient,
    the same for every lr, is computed once per distinct episode (:func:`_first_step`).
    """
    out: list[Scored] = [[] for _ in episodes]
    cfg, support_icl = plan.inner, plan.support_icl_max_length
    support = (lockstep.support(support_passes(episodes, plan.pad_id, plan.micro_batch_size, support_icl,
                                               padding_free=cfg.padding_free)) if steps else [])
    n_answer = answer_tokens_per_task(support, len(episodes))
    # Every rank decides alike (on task_lrs, not on what its group holds): the first step's
    # passes are padded in lockstep like the others.
    first = (_first_step(episodes, lockstep, plan.pad_id, plan.micro_batch_size, support_icl, cfg.padding_free)
             if task_lrs is not None and steps else None)
    with adapting(model, lora, params, start, support, n_answer, cfg, plan.step_sizes, task_lrs, first,
                  plan.adapted) as adapt_step:
        for step in range(steps + 1):
            if step > 0:
                adapt_step()
            if score_steps is None or step in score_steps or step == steps:
                scored = _score(model, lora, episodes, plan.micro_batch_size, lockstep, plan.icl_max_length)
                for o, sc in zip(out, scored):
                    o.append((step, sc))
    return out


def groups_of(items: Sequence[_T], size: int) -> list[list[_T]]:
    """``items`` in consecutive groups of ``size`` (the last may be smaller)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def by_length(episodes: Sequence[Episode]) -> list[int]:
    """Episode indices ordered by their longest support and query rows, so the episodes of a
    group (and the rows of its passes) have similar lengths and little padding; the order is
    a pure function of the episodes, the same on every rank."""
    def key(i: int) -> tuple[int, int, int]:
        ep = episodes[i]
        return (max((ex.n_tokens for ex in ep.support), default=0),
                max((ex.n_tokens for ex in ep.query), default=0), i)
    return sorted(range(len(episodes)), key=key)


__all__ = ["SUPPORT_PASS_TOKENS", "AdaptPlan", "AdaptSteps", "Scored", "adapt_and_score", "adapting", "by_length", "groups_of",
           "support_passes"]
