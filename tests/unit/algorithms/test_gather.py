"""gather_step and the per-rank telemetry of meta_step: one gather, typed observations, totals that
are sums of what each rank counted, and times attributed to compute or to the outer step."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch

from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.gather import GatheredStep, gather_step
from fmmeta.algorithms.meta_step import StepStats, meta_step
from fmmeta.engine.local import LocalEngine
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.sampling.source import PassObservation, TaskObservation

from ._tiny import PAD_ID, make_mixed_rank, make_plan
from .test_meta_step import SGDEngine


def stats(rank: int, *, step: int = 3, tasks: int = 2, loss: float = 1.0, tokens: int = 100,
          compute: float = 1.0, **kw: Any) -> StepStats:
    """A hand-made rank result: ``tasks`` task observations and one pass observation."""
    return StepStats(
        step=step, rank=rank, outer_loss=loss, query_loss_before=math.nan, query_loss_after=loss,
        n_real_tasks=tasks, n_tokens=tokens, n_padded_tokens=2 * tokens, n_passes=1,
        seconds=compute + 0.5, compute_seconds=compute, collective_seconds=0.5,
        data_wait_seconds=0.1 * rank, peak_memory_mb=10.0 + rank,
        outer={"grad_norm": 2.0, "lr": 0.01, "skipped": 0.0},
        tasks=tuple(TaskObservation(task_id=10 * rank + i, query_loss=loss, step=step) for i in range(tasks)),
        passes=(PassObservation(step=step, rank=rank, phase="support", index=0, features=(1.0, 2.0, 3.0),
                                seconds=0.2),),
        **kw,
    )


class TwoRanks:
    """Rank 0 of a 2-rank group whose other rank sent ``other``; counts the gathers."""

    world_size = 2
    rank = 0
    device = torch.device("cpu")

    def __init__(self, other: Any) -> None:
        self.other, self.calls = other, 0

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.calls += 1
        return [obj, self.other]


def test_gather_is_one_all_gather_of_typed_results_with_summed_totals() -> None:
    a, b = stats(0, tasks=2, loss=1.0, tokens=100), stats(1, tasks=1, loss=4.0, tokens=30, compute=3.0)
    engine = TwoRanks(b)
    g = gather_step(engine, a)  # type: ignore[arg-type]
    assert engine.calls == 1
    assert g.ranks == (a, b) and g.step == 3
    assert g.observations == a.tasks + a.passes + b.tasks + b.passes
    assert all(isinstance(o, (TaskObservation, PassObservation)) for o in g.observations)
    assert (g.n_real_tasks, g.n_tokens, g.n_padded_tokens) == (3, 130, 260)
    rec = g.record()
    assert rec["outer_loss"] == pytest.approx((2 * 1.0 + 1 * 4.0) / 3)  # weighted by tasks
    assert math.isnan(rec["query_loss_before"])  # nan on every rank stays nan
    assert rec["tokens"] == sum(rec["rank_tokens"]) == 130
    assert rec["step_s"] == 3.5 and rec["tokens_per_s"] == pytest.approx(130 / 3.5)
    assert rec["rank_compute_s"] == [1.0, 3.0] and rec["rank_collective_s"] == [0.5, 0.5]
    assert rec["rank_data_wait_s"] == [0.0, 0.1] and rec["rank_peak_memory_mb"] == [10.0, 11.0]
    assert rec["peak_memory"] == "max_rss_process" and rec["grad_norm"] == 2.0 and rec["lr"] == 0.01


def test_gathered_mean_skips_ranks_where_it_is_nan() -> None:
    g = GatheredStep((stats(0, loss=math.nan), stats(1, loss=2.0)), "max_rss_process")
    assert g.mean("outer_loss") == 2.0


@pytest.mark.parametrize("other", [stats(1, step=4), stats(0)])
def test_gather_refuses_ranks_out_of_step(other: StepStats) -> None:
    with pytest.raises(RuntimeError, match="every rank must call gather_step once per meta-step"):
        gather_step(TwoRanks(other), stats(0))  # type: ignore[arg-type]


def test_local_gather_hands_meta_steps_own_objects_to_the_sampler(peft_factory, episodes) -> None:
    engine = LocalEngine(peft_factory(0), OuterOptimConfig(outer_lr=1e-2))
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=1, inner_lr=0.1), PAD_ID)
    s = meta_step(engine, algo, make_plan([make_mixed_rank(episodes, 3)]), data_wait_s=0.25)
    g = gather_step(engine, s)
    assert g.observations == s.observations and g.n_tokens == s.n_tokens
    assert s.rank == 0 and s.data_wait_seconds == 0.25 and g.record()["rank_data_wait_s"] == [0.25]
    assert s.peak_memory_mb > 1  # this process's peak RSS, in MB
    assert 0 < s.compute_seconds and 0 <= s.collective_seconds
    assert s.compute_seconds + s.collective_seconds <= s.seconds


class SlowOuterStep(SGDEngine):
    """An outer step that takes ``delay`` seconds, as one waiting for a slower rank would."""

    delay = 0.3

    def outer_step(self, grad_sum, n_real_tasks):  # type: ignore[no-untyped-def]
        time.sleep(self.delay)
        return super().outer_step(grad_sum, n_real_tasks)


class SlowAlgorithm:
    """Wraps an algorithm; its rank_gradient takes ``delay`` seconds longer."""

    delay = 0.3

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def rank_gradient(self, *args: Any) -> Any:
        time.sleep(self.delay)
        return self.inner.rank_gradient(*args)


def test_meta_step_puts_the_wait_in_the_outer_step_and_the_work_in_compute(peft_factory, episodes) -> None:
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=1, inner_lr=0.1), PAD_ID)
    plan = make_plan([make_mixed_rank(episodes, 3)])
    waited = meta_step(SlowOuterStep(peft_factory(0), 0.0), algo, plan)
    assert waited.collective_seconds >= 0.3 and waited.compute_seconds <= waited.seconds - 0.3
    slow = meta_step(SGDEngine(peft_factory(0), 0.0), SlowAlgorithm(algo), plan)  # type: ignore[arg-type]
    assert slow.compute_seconds >= 0.3 > slow.collective_seconds
    assert slow.compute_seconds - waited.compute_seconds > 0.2
