"""Held-out evaluation, honest by construction: :func:`evaluate_held_out`.

Every method is an adapter state (the tensors of the LoRA parameters): the base model (zero LoRA B,
i.e. the initial adapter), the FOMAML- and Reptile-trained adapters, the multi-task baseline, ...
Each is adapted on every held-out episode's support set with the project's one inner loop
(:func:`fmmeta.algorithms.inner_loop.adapt_tasks`, on fp32 fast weights as in training) for 0..k
steps and scored on the query set after each step, so "0 steps" is the zero-shot score and the
curve shows what adaptation buys. Several episodes are adapted and scored together
(``episodes_per_pass``), each through its own fast weights: a few-shot pass is small, and on a
CPU its cost is mostly per-operation overhead, so one pass for 8 episodes costs far less than 8. The special
method ``"in_context"`` scores its adapter state (normally the base) with the support set as
in-context demonstrations (:meth:`Episode.in_context_query`) and no adaptation; it has a step-0 score
only.

What keeps it honest:

* the same inner loop, support set and step budget for every method; the adapter parameters are
  never written while adapting, and are restored bit-exactly after the whole evaluation;
* the adaptation learning rate is chosen per method on meta-*validation* tasks from a small grid
  (:func:`select_inner_lr`; inner-loop SGD on LoRA is fragile, docs/design.md, so one shared lr
  would favour whichever method it happens to suit), never on the held-out tasks;
  :func:`evaluate_held_out` refuses validation and held-out sets that share a task name;
* at least 3 seeds of episode draws, summarised as the mean over seeds and the worst seed
  (:mod:`fmmeta.evaluation.result`).

Evaluation runs with the model in eval mode (no dropout, so no random draws) and restores the mode
afterwards. Several ranks (``ranks=`` an engine) split the episodes in lockstep and get the result
one process computes (:mod:`fmmeta.evaluation.lockstep`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.inner_loop import restore, snapshot
from fmmeta.algorithms.task_lora import TaskLoRA
from fmmeta.evaluation.adaptation import AdaptPlan, Scored, adapt_and_score, by_length, groups_of
from fmmeta.evaluation.lockstep import Lockstep, OneRank, Ranks, per_method
from fmmeta.evaluation.methods import EvalMethod, MethodSpec, needs_lr, prepare_methods
from fmmeta.evaluation.metrics import metrics_of
from fmmeta.evaluation.result import EpisodeRecord, EvalResult, LrSelection, chance_of, kind_of
from fmmeta.evaluation.settings import EvalSettings
from fmmeta.progress import Progress
from fmmeta.tasks.episode import Episode
from fmmeta.workers import Workers

logger = logging.getLogger(__name__)


def _check_draws(episodes_per_seed: Sequence[Sequence[Episode]], min_seeds: int) -> None:
    """Refuses episode draws that give no mean and worst case to report."""
    if len(episodes_per_seed) < min_seeds:
        raise ValueError(
            f"episodes_per_seed has {len(episodes_per_seed)} seed(s): at least min_seeds={min_seeds} "
            "episode draws are needed for a mean and a worst case; draw more seeds or lower min_seeds"
        )
    for s, eps in enumerate(episodes_per_seed):
        if len(eps) == 0:
            raise ValueError(f"episodes_per_seed[{s}] is empty: every seed needs >= 1 episode")


@contextlib.contextmanager
def _eval_mode(model: nn.Module, params: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """The model in eval mode (no dropout, so no random draws) inside the block; afterwards the
    adapter is restored bit-exactly and the mode put back. Yields the adapter as it was."""
    theta = snapshot(params)
    was_training = model.training
    model.eval()
    try:
        yield theta
    finally:
        restore(params, theta)
        model.train(was_training)


@contextlib.contextmanager
def _progress(show: bool, total: int, what: str, rank: int) -> Iterator[Callable[[Sequence[Any]], None]]:
    """Counts (method, episode) pairs as groups finish: a tqdm bar when ``show``, else log lines
    (:class:`~fmmeta.progress.Progress`, rank 0), which also reach a log file and report the
    groups that worker processes finish."""
    if not show:
        log = Progress(what, total if rank == 0 else 0, "episodes")
        yield lambda group: log.advance(len(group))
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="eval", unit="ep")
    try:
        yield lambda group: bar.update(len(group))
    finally:
        bar.close()


def _groups(episodes_per_seed: Sequence[Sequence[Episode]], episodes_per_pass: int
            ) -> tuple[list[tuple[int, int, Episode]], list[int], list[list[Episode]]]:
    """Every (seed, index, episode); the order that puts episodes of similar lengths together
    (across seeds); and that order cut into groups of ``episodes_per_pass``."""
    flat = [(seed, i, ep) for seed, episodes in enumerate(episodes_per_seed) for i, ep in enumerate(episodes)]
    order = by_length([ep for _, _, ep in flat])
    return flat, order, groups_of([flat[j][2] for j in order], episodes_per_pass)


def _records(method: str, flat: list[tuple[int, int, Episode]], order: list[int],
             done: list[list[Scored]], families: Mapping[str, str]) -> list[EpisodeRecord]:
    """The groups' scores (``done``, in ``order``) as records in seed, then episode order."""
    scored: list[Scored] = [[] for _ in flat]
    for j, sc in zip(order, (sc for group in done for sc in group)):
        scored[j] = sc
    return [
        EpisodeRecord(
            method=method, seed=seed, episode=i, task=ep.task, kind=kind_of(ep),
            family=families.get(ep.task, ""), step=step, metrics=metrics_of(score, kind_of(ep)), n=score.n,
            chance=chance_of(ep),
        )
        for (seed, i, ep), sc in zip(flat, scored)
        for step, score in sc
    ]


def _plan(settings: EvalSettings, spec: EvalMethod, inner: InnerLoopConfig) -> AdaptPlan:
    """How ``spec``'s method adapts and is scored, with ``inner`` (its chosen lr)."""
    icl, support_icl = (settings.icl_max_length if f else None for f in (spec.demonstrations, spec.in_context_support))
    return AdaptPlan(inner=inner, pad_id=settings.pad_id, micro_batch_size=settings.micro_batch_size,
                     step_sizes=spec.step_sizes, adapted=spec.adapted, icl_max_length=icl,
                     support_icl_max_length=support_icl)


def _adapt_group(model: nn.Module, lora: TaskLoRA, params: Sequence[torch.Tensor],
                 start: Sequence[torch.Tensor], group: list[Episode] | None, **kwargs: Any) -> list[Scored]:
    """One group of episodes adapted and scored together (``None``: a rank's empty turn)."""
    return adapt_and_score(model, lora, params, start, group or [], **kwargs)


def _final_losses(model: nn.Module, lora: TaskLoRA, params: Sequence[torch.Tensor],
                  start: Sequence[torch.Tensor], group: list[tuple[float, Episode]] | None,
                  steps: int, **kwargs: Any) -> list[float]:
    """The query loss after ``steps`` steps of each (lr, episode) pair of a group, adapted
    together, each at its own lr (``None``: a rank's empty turn)."""
    scored = adapt_and_score(model, lora, params, start, [ep for _, ep in group or []], steps=steps,
                             score_steps=(), task_lrs=[lr for lr, _ in group or []] if steps else None,
                             **kwargs)
    return [sc[0][1].loss for sc in scored]


def evaluate_methods(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    methods: Mapping[str, MethodSpec],
    episodes_per_seed: Sequence[Sequence[Episode]],
    settings: EvalSettings,
    *,
    inner_lrs: Mapping[str, float] | None = None,
    lr_selection: LrSelection | None = None,
    families: Mapping[str, str] | None = None,
    progress: bool = False,
    ranks: Ranks | None = None,
    workers: Workers | None = None,
) -> EvalResult:
    """Adapts each method on each held-out episode for 0..``settings.max_steps`` steps and scores
    the query.

    Every method sees the very same episodes (so differences between methods are paired).

    Args:
        model: the causal LM whose adapter tensors are ``params``.
        params: the adapter tensors (resident, in the engine's order); restored exactly on return.
        methods: method name -> :class:`EvalMethod`, or just the adapter state to load into
            ``params`` (``None`` = ``params`` as they are now, e.g. the base model's zero-B LoRA;
            see :func:`as_eval_method`: the name ``"in_context"`` scores with demonstrations).
        episodes_per_seed: ``episodes_per_seed[s]`` are the held-out episodes of seed ``s``.
        settings: how every method is adapted and scored (:class:`EvalSettings`).
        inner_lrs: adaptation lr per method (from :func:`select_inner_lr`); missing = the inner
            loop's ``inner_lr``.
        lr_selection: recorded in the result so the report can show how lrs were chosen.
        families: task name -> its family in the suite; the report then also has a table per family.
        progress: show a tqdm bar over (method, episode) pairs (turn on for rank 0 only).
        ranks: split the episodes over the ranks of this engine (every rank must call, with the
            same arguments); the result is the same on every rank and equals one process's.
        workers: in a one-process run, forked processes that share the groups of episodes of
            every method (:class:`~fmmeta.workers.Workers`); the result equals one process's.

    Returns:
        All records and their summary.

    Raises:
        ValueError: on too few seeds, an empty seed, invalid settings or a state that does not
            fit ``params``.

    Example:
        >>> sel = select_inner_lr(model, params, methods, validation_episodes, settings)
        >>> res = evaluate_methods(model, params, methods, held_out_episodes_per_seed, settings,
        ...                        inner_lrs=sel.chosen, lr_selection=sel)      # doctest: +SKIP
    """
    settings.check()
    _check_draws(episodes_per_seed, settings.min_seeds)
    specs = prepare_methods(params, methods)
    inner = settings.inner
    lrs = {m: (inner_lrs or {}).get(m, inner.inner_lr) for m in needs_lr(specs)}
    ranks = ranks or OneRank()
    lockstep = Lockstep(model, params, ranks)
    lora = TaskLoRA(model, params)
    flat, order, groups = _groups(episodes_per_seed, settings.episodes_per_pass)
    total = len(specs) * len(flat)
    with _eval_mode(model, params) as theta, _progress(progress, total, "evaluating", ranks.rank) as advance:
        scorers: dict[str, Callable[[list[Episode] | None], list[Scored]]] = {}
        for method, spec in specs.items():
            start = theta if spec.state is None else [t.detach() for t in spec.state]
            logger.info("evaluating %s (lr %s) on %d seeds", method,
                        "learned" if spec.step_sizes is not None else lrs.get(method), len(episodes_per_seed))
            plan = _plan(settings, spec, dataclasses.replace(inner, inner_lr=lrs.get(method, inner.inner_lr)))
            scorers[method] = functools.partial(
                _adapt_group, model, lora, params, start, plan=plan,
                steps=settings.max_steps if spec.adapt else 0, lockstep=lockstep, score_steps=settings.score_steps,
            )
        done = per_method(ranks, workers, groups, scorers, on_result=advance)
    records = [r for method in specs for r in _records(method, flat, order, done[method], families or {})]
    return EvalResult(
        records=records,
        methods=list(specs),
        max_steps=settings.max_steps,
        n_seeds=len(episodes_per_seed),
        inner_lrs=lrs,
        inner=inner,
        lr_selection=lr_selection,
        step_sizes={m: [float(x) for x in spec.step_sizes] for m, spec in specs.items()
                    if spec.step_sizes is not None},
    )


def select_inner_lr(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    methods: Mapping[str, MethodSpec],
    validation_episodes: Sequence[Episode],
    settings: EvalSettings,
    *,
    ranks: Ranks | None = None,
    workers: Workers | None = None,
) -> LrSelection:
    """Chooses each method's adaptation lr on validation episodes (never held-out ones).

    For every method that adapts and every lr of ``settings.lr_grid``, adapts ``max_steps`` steps
    on each validation episode's support and measures the mean query loss, scored as the method is
    scored (with demonstrations where it uses them); the lr with the lowest loss wins (loss, not
    accuracy: it is smooth on small query sets; ties go to the smaller lr; a diverged, non-finite
    loss counts as ``inf``). Methods that do not adapt (in-context demonstrations) and methods
    with learned per-tensor step sizes get no lr.

    Args:
        model: the causal LM; params: its adapter tensors, restored exactly on return.
        methods: as for :func:`evaluate_methods`.
        validation_episodes: episodes of validation tasks (disjoint from the held-out tasks).
        settings: as for :func:`evaluate_methods`; only the inner loop's lr is varied.
        ranks, workers: split the episodes (as for :func:`evaluate_methods`).

    Raises:
        ValueError: on no validation episodes or invalid settings (an empty grid, a non-positive lr).
    """
    if len(validation_episodes) == 0:
        raise ValueError(
            "validation_episodes is empty: lr selection needs validation episodes "
            "(tasks kept out of both meta-training and the held-out set)"
        )
    settings.check()
    steps, lr_grid = settings.max_steps, settings.lr_grid
    specs = prepare_methods(params, methods)
    ranks = ranks or OneRank()
    lockstep = Lockstep(model, params, ranks)
    lora = TaskLoRA(model, params)
    val_loss: dict[str, dict[float, float]] = {}
    chosen: dict[str, float] = {}
    # Every (lr, episode) pair of the grid is one task: the lrs are tried side by side.
    pairs = [(lr, validation_episodes[j]) for j in by_length(validation_episodes) for lr in sorted(lr_grid)]
    with _eval_mode(model, params) as theta, \
            _progress(False, len(pairs) * len(needs_lr(specs)), "choosing lrs", ranks.rank) as advance:
        scorers: dict[str, Callable[[list[tuple[float, Episode]] | None], list[float]]] = {}
        for method in needs_lr(specs):
            spec = specs[method]
            start = theta if spec.state is None else [t.detach() for t in spec.state]
            scorers[method] = functools.partial(
                _final_losses, model, lora, params, start, plan=_plan(settings, spec, settings.inner),
                steps=steps, lockstep=lockstep,
            )
        done = per_method(ranks, workers, groups_of(pairs, settings.episodes_per_pass), scorers, on_result=advance)
    for method in scorers:
        losses = [x for g in done[method] for x in g]
        table: dict[float, float] = {}
        for lr in sorted(lr_grid):
            mine = [x for (p_lr, _), x in zip(pairs, losses) if p_lr == lr]
            mean = sum(mine) / len(mine)
            table[lr] = mean if math.isfinite(mean) else math.inf
        val_loss[method] = table
        chosen[method] = min(table, key=lambda lr: (table[lr], lr))
        logger.info("lr for %s: %s (validation query loss %s)", method, chosen[method], table)
    return LrSelection(chosen=chosen, val_loss=val_loss, steps=steps,
                       tasks=tuple(sorted({ep.task for ep in validation_episodes})))


def evaluate_held_out(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    methods: Mapping[str, MethodSpec],
    validation_episodes: Sequence[Episode],
    held_out_episodes_per_seed: Sequence[Sequence[Episode]],
    settings: EvalSettings,
    *,
    families: Mapping[str, str] | None = None,
    progress: bool = False,
    ranks: Ranks | None = None,
    workers: Workers | None = None,
) -> EvalResult:
    """Chooses lrs on validation tasks, then evaluates on held-out tasks: the whole honest protocol.

    The lrs are fixed before any held-out episode is seen, and a task that appears in both sets is
    refused (the held-out numbers would no longer be held out).

    Args:
        model, params, methods, settings, families, progress, ranks, workers: as for
            :func:`evaluate_methods`.
        validation_episodes: episodes of validation tasks, for :func:`select_inner_lr` (each
            method's lr is chosen at ``settings.max_steps`` steps).
        held_out_episodes_per_seed: held-out episodes, one list per seed of episode draws.

    Raises:
        ValueError: if a task name appears in both ``validation_episodes`` and the test episodes,
            and on the errors of :func:`select_inner_lr` and :func:`evaluate_methods`.

    Example:
        >>> settings = EvalSettings(inner=InnerLoopConfig(), max_steps=3, pad_id=0)
        >>> res = evaluate_held_out(model, params, {"base": None, "fomaml": phi},
        ...                         validation_episodes, held_out_episodes_per_seed, settings)
        >>> write_report(res, "out/eval")                                      # doctest: +SKIP
    """
    validation_tasks = {ep.task for ep in validation_episodes}
    held_out_tasks = {ep.task for eps in held_out_episodes_per_seed for ep in eps}
    shared = sorted(validation_tasks & held_out_tasks)
    if shared:
        raise ValueError(
            f"tasks {shared} are both validation and held-out tasks: the lr would be tuned on the "
            "held-out set; split the task suite so validation and held-out tasks are disjoint"
        )
    sel = select_inner_lr(model, params, methods, validation_episodes, settings, ranks=ranks, workers=workers)
    return evaluate_methods(model, params, methods, held_out_episodes_per_seed, settings, inner_lrs=sel.chosen,
                            lr_selection=sel, families=families, progress=progress, ranks=ranks, workers=workers)
