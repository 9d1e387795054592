"""One meta-step: run this rank's slots one task at a time, then one outer update.

Peak memory is one task's, not ``meta_batch_size`` tasks': each task's meta-gradient is added,
times its weight, into a single buffer and then dropped. The engine is touched exactly once, by
``engine.outer_step(grad_sum, plan.n_real_tasks)``, which averages over every rank's real tasks.
Every rank runs the same number of slots with the same pass counts (the plan guarantees it), so
ZeRO-3's per-pass collectives stay in lockstep.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import torch

from fmmeta.algorithms.protocol import MetaAlgorithm
from fmmeta.engine.protocol import Engine
from fmmeta.sampling.plan import MetaBatchPlan

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskRecord:
    """What one real task did on this rank (the recipe turns these into the sampler's
    ``fmmeta.sampling.TaskObservation`` and gathers them from every rank).

    Attributes:
        task_id: index of the task in the sampler's pool.
        task: the episode's task name.
        query_loss_before: query loss per answer token at theta (``nan`` if not measured).
        query_loss_after: query loss per answer token after adaptation.
        n_tokens: real tokens processed; n_padded_tokens: including padding.
        n_passes: forward passes run.
        cost: the cost model's estimate the plan carried (to calibrate it against ``seconds``).
        seconds: wall time of the task on this rank.
    """

    task_id: int
    task: str
    query_loss_before: float
    query_loss_after: float
    n_tokens: int
    n_padded_tokens: int
    n_passes: int
    cost: float
    seconds: float


@dataclass(frozen=True)
class StepStats:
    """This rank's summary of one meta-step.

    Attributes:
        step: the plan's meta-step.
        outer_loss: mean over this rank's real tasks of the loss the meta-gradient follows
            (the query loss after adaptation; for multi-task, the query loss at theta).
        query_loss_before: mean over this rank's real tasks (``nan`` if not measured or none).
        query_loss_after: mean over this rank's real tasks (``nan`` if none).
        n_real_tasks: real tasks on this rank.
        n_tokens: real tokens processed on this rank (dummies excluded).
        n_padded_tokens: tokens processed including padding and dummy passes.
        n_passes: forward passes on this rank (equal on every rank by construction).
        seconds: wall time of the whole meta-step on this rank, outer step included.
        outer: what ``engine.outer_step`` returned (``grad_norm``, ``lr``, ...).
        tasks: one observation per real task, in slot order.
    """

    step: int
    outer_loss: float
    query_loss_before: float
    query_loss_after: float
    n_real_tasks: int
    n_tokens: int
    n_padded_tokens: int
    n_passes: int
    seconds: float
    outer: dict[str, float] = field(default_factory=dict)
    tasks: tuple[TaskRecord, ...] = ()


def _mean(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return sum(real) / len(real) if real else math.nan


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def meta_step(engine: Engine, algorithm: MetaAlgorithm, plan: MetaBatchPlan) -> StepStats:
    """Runs this rank's share of ``plan`` and applies one outer update.

    Args:
        engine: the backend (adapter parameters, model, outer optimizer).
        algorithm: FOMAML, Reptile or MultiTask (see ``build_algorithm``).
        plan: the meta-batch plan; identical on every rank.

    Returns:
        This rank's :class:`StepStats`.

    Raises:
        ValueError: if the plan has no real task, or does not cover this rank.

    Example:
        >>> stats = meta_step(engine, build_algorithm(AlgorithmConfig(), pad_id=0), sampler.sample(step))
    """
    if plan.n_real_tasks < 1:
        raise ValueError(
            f"plan for step {plan.step} has n_real_tasks={plan.n_real_tasks}: a meta-step needs at "
            "least one real task; check the sampler's meta_batch_size and task pool"
        )
    if len(plan.ranks) != engine.world_size:
        raise ValueError(
            f"plan for step {plan.step} has {len(plan.ranks)} ranks but the engine has "
            f"world_size={engine.world_size}: build the plan with the engine's world size"
        )
    start = time.perf_counter()
    model = engine.model
    params = engine.adapter_parameters()
    device = params[0].device if params else engine.device
    grad_sum = [torch.zeros_like(p) for p in params]
    tasks: list[TaskRecord] = []
    n_tokens = n_padded = n_passes = 0
    for slot in plan.for_rank(engine.rank):
        t0 = time.perf_counter()
        result = algorithm.task_gradient(model, params, slot)
        if slot.weight != 0.0:
            for acc, g in zip(grad_sum, result.grads, strict=True):
                acc.add_(g, alpha=slot.weight)
        result.grads = []  # drop the task's gradient now: peak memory stays one task
        _sync(device)
        seconds = time.perf_counter() - t0
        n_passes += result.n_passes
        n_padded += result.n_padded_tokens
        if slot.is_dummy:
            continue
        n_tokens += result.n_tokens
        tasks.append(
            TaskRecord(
                task_id=slot.task_id,
                task=slot.episode.task if slot.episode is not None else "",
                query_loss_before=result.query_loss_before,
                query_loss_after=result.query_loss_after,
                n_tokens=result.n_tokens,
                n_padded_tokens=result.n_padded_tokens,
                n_passes=result.n_passes,
                cost=slot.cost,
                seconds=seconds,
            )
        )
    outer = engine.outer_step(grad_sum, plan.n_real_tasks)
    _sync(device)
    after = _mean([t.query_loss_after for t in tasks])
    return StepStats(
        step=plan.step,
        outer_loss=after,
        query_loss_before=_mean([t.query_loss_before for t in tasks]),
        query_loss_after=after,
        n_real_tasks=len(tasks),
        n_tokens=n_tokens,
        n_padded_tokens=n_padded,
        n_passes=n_passes,
        seconds=time.perf_counter() - start,
        outer=dict(outer),
        tasks=tuple(tasks),
    )
