"""One meta-step: run this rank's packed passes, then one outer update.

The rank's tasks share every pass (each row through its own task's fast weights), so peak memory
follows the pass's token budget and the rank's adapters, not the tasks' activations. The engine
is touched exactly once, by ``engine.outer_step(grad_sum, plan.n_real_tasks)``, which averages
over every rank's tasks; an algorithm with state of its own (:class:`OuterUpdate`, Meta-SGD's step
sizes) updates it right after, the same way on every rank. Every rank runs the same number of
passes (the plan guarantees it), so ZeRO-3's per-pass collectives stay in lockstep.

Each step also measures what it cost this rank (:class:`StepStats`' ``compute_seconds``,
``collective_seconds``, ``peak_memory_mb``), so a rank that makes the others wait can be named:
the first collective after the rank's own work is the outer step's all-reduce, so a fast rank's
wait for a slow one lands there, outside its compute time. Under ZeRO-3 the base weights are
also all-gathered inside every forward: a rank slowed *inside* its passes holds the others up
there, and that wait counts as their compute (it happens inside DeepSpeed's hooks, which the
library does not reach into).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from fmmeta.algorithms.passes import Pass
from fmmeta.algorithms.protocol import MetaAlgorithm, OuterUpdate, RankResult, RankWork, RowShare
from fmmeta.engine.protocol import Engine
from fmmeta.sampling.noise_scale import GradientNoise
from fmmeta.sampling.plan import MetaBatchPlan, RankPlan, pass_features
from fmmeta.sampling.source import PassObservation, TaskObservation

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepStats:
    """This rank's summary of one meta-step.

    Attributes:
        step: the plan's meta-step.
        rank: the rank that ran it.
        outer_loss: mean over this rank's tasks of the loss the meta-gradient follows
            (the query loss after adaptation; for multi-task, the query loss at theta).
        query_loss_before: mean over this rank's tasks (``nan`` if not measured or none).
        query_loss_after: mean over this rank's tasks (``nan`` if none).
        n_real_tasks: tasks on this rank.
        n_tokens: real tokens processed on this rank (dummies excluded).
        n_padded_tokens: tokens processed including padding and dummy passes.
        n_passes: forward passes on this rank (equal on every rank by construction).
        seconds: wall time of the whole meta-step on this rank, outer step included.
        compute_seconds: wall time of this rank's own work: collating its passes (when not
            prefetched), its inner loops and query passes.
        collective_seconds: wall time from the end of that work to the end of the outer update:
            the outer step's all-reduces (non-finite check, meta-gradient, Meta-SGD's step
            sizes), where this rank waits for the slowest one, plus the optimizer's step on the
            adapter (small next to it).
        data_wait_seconds: how long this rank waited for this step's work before ``meta_step``
            (the caller measures it, e.g. ``Prefetcher.get``'s ``wait_seconds``).
        peak_memory_mb: on CUDA the peak of allocated memory during this meta-step
            (``torch.cuda.max_memory_allocated``, reset at its start); on CPU the process's peak
            resident set size so far (``ru_maxrss``, never reset). :func:`peak_memory_kind` names it.
        outer: what ``engine.outer_step`` returned (``grad_norm``, ``lr``, ...), plus the stats
            of the algorithm's own outer update, if it has one (``inner_lr_mean``, ...).
        tasks: one observation per task of this rank, in slot order (for the sampler).
        passes: one observation per forward+backward pass of this rank (for the cost fit).
    """

    step: int
    rank: int
    outer_loss: float
    query_loss_before: float
    query_loss_after: float
    n_real_tasks: int
    n_tokens: int
    n_padded_tokens: int
    n_passes: int
    seconds: float
    compute_seconds: float = math.nan
    collective_seconds: float = math.nan
    data_wait_seconds: float = 0.0
    peak_memory_mb: float = math.nan
    outer: dict[str, float] = field(default_factory=dict)
    tasks: tuple[TaskObservation, ...] = ()
    passes: tuple[PassObservation, ...] = ()

    @property
    def observations(self) -> tuple[TaskObservation | PassObservation, ...]:
        """Everything the sampler learns from this rank's step."""
        return self.tasks + self.passes


def peak_memory_kind(device: torch.device) -> str:
    """What :attr:`StepStats.peak_memory_mb` measures on ``device``: ``"cuda_max_allocated_step"``
    (peak allocated during the step) or ``"max_rss_process"`` (the process's peak RSS so far)."""
    return "cuda_max_allocated_step" if device.type == "cuda" else "max_rss_process"


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory_mb(device: torch.device) -> float:
    """See :attr:`StepStats.peak_memory_mb`; ``nan`` where neither measure exists."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource
    except ImportError:  # not on Windows
        return math.nan
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, else KiB


def _synchronize(device: torch.device) -> None:
    """Waits for queued CUDA work, so host timers measure the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mean(values: torch.Tensor) -> float:
    real = values[~torch.isnan(values)]
    return float(real.mean()) if real.numel() else math.nan


def _tokens(passes: list[Pass], repeats: int) -> tuple[int, int]:
    """Real and padded tokens of the passes as collated (what ran; a dummy pass counts 1)."""
    real = sum(p.batch.n_tokens for p in passes if p is not None)
    padded = sum(1 if p is None else p.batch.n_padded_tokens for p in passes)
    return repeats * real, repeats * padded


def _pass_observations(
    step: int, rank: int, phase: str, passes: Sequence[Pass], seconds: list[float] | None
) -> list[PassObservation]:
    """The passes' times, each with the features of the tensors that ran (padding-free lines,
    ``pad_to_multiple_of`` and MetaICL's demonstrations make them differ from the plan's), so the
    cost model is fitted on the work it timed."""
    if not seconds:
        return []
    return [PassObservation(step=step, rank=rank, phase=phase, index=i, seconds=s,
                            features=pass_features(*p.batch.input_ids.shape) if p is not None else
                            pass_features(0, 0))
            for i, (p, s) in enumerate(zip(passes, seconds, strict=True))]


def _reported(mine: RankPlan, rank: int, world_size: int) -> list[int]:
    """The slots whose observations this rank reports: all of its own, or with rows across ranks
    (where every rank holds every task) those with ``index % world_size == rank``."""
    if not mine.shared:
        return list(range(len(mine.slots)))
    return list(range(rank, len(mine.slots), world_size))


def _all_reduce_in_place(engine: Engine) -> Callable[[Sequence[torch.Tensor]], None]:
    """An in-place sum over ranks of a list of tensors: one ``all_reduce_sum`` per dtype, of the
    tensors flattened into one buffer on the engine's device (NCCL reduces no CPU tensor)."""

    def reduce(tensors: Sequence[torch.Tensor]) -> None:
        if engine.world_size == 1:
            return
        groups: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:  # the same order on every rank, so the same collectives
            groups.setdefault(t.dtype, []).append(t)
        for group in groups.values():
            flat = torch.cat([t.detach().reshape(-1).to(engine.device) for t in group])
            total = engine.all_reduce_sum(flat)
            offset = 0
            with torch.no_grad():
                for t in group:
                    t.copy_(total[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    return reduce


def _gradient_noise(engine: Engine, result: RankResult, n_tasks: int, grad_norm: float) -> GradientNoise | None:
    """The step's meta-gradient statistics: every task's squared outer-gradient norm summed over
    ranks (one all-reduce of one number) beside the norm of their mean the outer step measured;
    ``None`` where the algorithm has no per-task gradient (the same on every rank)."""
    if result.task_grad_sq is None:
        return None
    total = result.task_grad_sq.double().sum().reshape(1)
    if engine.world_size > 1:
        total = engine.all_reduce_sum(total.to(engine.device))
    return GradientNoise(tasks=n_tasks, task_sq_mean=float(total.item()) / n_tasks, mean_sq=float(grad_norm) ** 2)


def _check_plan(plan: MetaBatchPlan, world_size: int) -> None:
    """Refuses a plan a meta-step cannot run: no real task, or built for another world size."""
    if plan.n_real_tasks < 1:
        raise ValueError(
            f"plan for step {plan.step} has n_real_tasks={plan.n_real_tasks}: a meta-step needs at "
            "least one real task; check the sampler's meta_batch_size and task pool"
        )
    if len(plan.ranks) != world_size:
        raise ValueError(
            f"plan for step {plan.step} has {len(plan.ranks)} ranks but the engine has "
            f"world_size={world_size}: build the plan with the engine's world size"
        )


def meta_step(
    engine: Engine, algorithm: MetaAlgorithm, plan: MetaBatchPlan, work: RankWork | None = None,
    *, data_wait_s: float = 0.0,
) -> StepStats:
    """Runs this rank's share of ``plan`` and applies one outer update.

    Args:
        engine: the backend (adapter parameters, model, outer optimizer).
        algorithm: FOMAML, Meta-SGD, Reptile or MultiTask (see ``build_algorithm``).
        plan: the meta-batch plan; identical on every rank.
        work: this rank's passes already collated (``algorithm.prepare(plan.for_rank(rank))``,
            e.g. by the prefetcher's thread); collated here when ``None``.
        data_wait_s: how long the caller waited for ``work`` (recorded, not measured here).

    Returns:
        This rank's :class:`StepStats`.

    Raises:
        ValueError: if the plan has no real task, or does not cover this rank.

    Example:
        >>> stats = meta_step(engine, build_algorithm("fomaml", AlgorithmConfig(), pad_id=0), sampler.sample(step))
    """
    _check_plan(plan, engine.world_size)
    _reset_peak_memory(engine.device)
    start = time.perf_counter()
    mine = plan.for_rank(engine.rank)
    if work is None:
        work = algorithm.prepare(mine)
    if mine.shared:
        work = dataclasses.replace(work, share=RowShare(_all_reduce_in_place(engine), lead=engine.rank == 0))
    result: RankResult = algorithm.rank_gradient(engine.model, engine.adapter_parameters(), work)
    _synchronize(engine.device)
    computed = time.perf_counter()
    outer = dict(engine.outer_step(result.grads, plan.n_real_tasks))
    if isinstance(algorithm, OuterUpdate):  # e.g. Meta-SGD's step sizes, on every rank alike
        outer.update(algorithm.outer_update(engine, result, plan.n_real_tasks,
                                            skipped=bool(outer.get("skipped", 0.0))))
    noise = _gradient_noise(engine, result, plan.n_real_tasks, outer.get("grad_norm", math.nan))
    if noise is not None:
        outer.update(noise.as_record())
    _synchronize(engine.device)
    updated = time.perf_counter()
    s_real, s_pad = _tokens(work.support, result.support_repeats)
    q_real, q_pad = _tokens(work.query, result.query_repeats)
    after = result.query_loss_after
    # With rows across ranks every rank holds every task's (whole) loss: each task is reported by
    # one rank only (task i by rank i mod world size), so gathered counts and means stay right.
    reported = _reported(mine, engine.rank, engine.world_size)
    tasks = tuple(
        TaskObservation(task_id=mine.slots[i].task_id, query_loss=float(after[i]), step=plan.step)
        for i in reported
    )
    passes = tuple(
        _pass_observations(plan.step, engine.rank, "support", work.support, result.support_seconds)
        + _pass_observations(plan.step, engine.rank, "query", work.query, result.query_seconds)
    )
    return StepStats(
        step=plan.step,
        rank=engine.rank,
        outer_loss=_mean(after[reported]),
        query_loss_before=_mean(result.query_loss_before[reported]),
        query_loss_after=_mean(after[reported]),
        n_real_tasks=len(reported),
        n_tokens=s_real + q_real,
        n_padded_tokens=s_pad + q_pad,
        n_passes=result.support_repeats * len(work.support) + result.query_repeats * len(work.query),
        seconds=time.perf_counter() - start,
        compute_seconds=computed - start,
        collective_seconds=updated - computed,
        data_wait_seconds=data_wait_s,
        peak_memory_mb=_peak_memory_mb(engine.device),
        outer=dict(outer),
        tasks=tasks,
        passes=passes,
    )
