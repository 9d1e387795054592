"""Prefetcher: real overlap, same plans as serial, exact checkpoints mid-prefetch."""

from __future__ import annotations

import json
import time

import pytest

from fmmeta.sampling.prefetch import Prefetcher
from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig
from fmmeta.sampling.synthetic import lognormal_pool

from .helpers import fake_observations


def _sampler(strategy: str = "hard") -> CostAwareSampler:
    cfg = SamplerConfig(meta_batch_size=4, micro_batch_size=4, strategy=strategy)
    return CostAwareSampler(lognormal_pool(20, seed=2), cfg, world_size=2, seed=4, support_repeats=2)


def _run(pf: Prefetcher, steps: int, work_s: float = 0.0) -> list[str]:
    out = []
    for _ in range(steps):
        item = pf.get()
        out.append(item.plan.digest())
        time.sleep(work_s)
        pf.observe(fake_observations(item.plan, support_repeats=2))
    return out


def _timed(background: bool) -> tuple[float, float]:
    def prepare(plan):
        time.sleep(0.2)  # e.g. collation / host-to-device copies
        return plan.step

    with Prefetcher(_sampler(), prepare=prepare, background=background) as pf:
        t0 = time.perf_counter()
        for step in range(5):
            item = pf.get()
            assert item.prepared == step
            time.sleep(0.2)  # the "training step"
        return time.perf_counter() - t0, pf.wait_fraction


@pytest.mark.timeout(30)
def test_preparation_overlaps_training() -> None:
    elapsed, wait_fraction = _timed(background=True)
    # serial: 5 x (0.2 prepare + 0.2 train) = 2.0 s; overlapped: 0.2 + 5 x 0.2 = 1.2 s
    assert elapsed < 1.6, elapsed
    assert wait_fraction < 0.35, wait_fraction
    serial, serial_wait = _timed(background=False)  # control: the same test catches no overlap
    assert serial >= 1.9 and serial_wait > 0.4


def test_background_and_serial_give_the_same_plans() -> None:
    with Prefetcher(_sampler(), background=True) as pf:
        threaded = _run(pf, 8)
    with Prefetcher(_sampler(), background=False) as pf:
        serial = _run(pf, 8)
    # reference without the prefetcher: plan t+1 is sampled before observe(t)
    s = _sampler()
    ref, plan = [], s.sample(0)
    for step in range(8):
        ref.append(plan.digest())
        nxt = s.sample(step + 1)
        s.observe(fake_observations(plan, support_repeats=2))
        plan = nxt
    assert threaded == serial == ref


@pytest.mark.timeout(30)
def test_checkpoint_taken_while_prefetching_resumes_exactly() -> None:
    with Prefetcher(_sampler(), background=True) as pf:
        first = _run(pf, 5, work_s=0.01)
        state = json.loads(json.dumps(pf.state_dict()))  # next plan is already being prepared
        live = pf._sampler.state_dict()
        rest = _run(pf, 5)
    assert state["next_step"] == 5  # step 4's observations (4 tasks, both ranks, and passes) are pending
    assert sum(o["kind"] == "task" for o in state["pending"]) == 4
    with Prefetcher(_sampler(), background=True) as resumed:
        resumed.load_state_dict(state)
        assert _run(resumed, 5) == rest
    # control: restoring the sampler's live state (which already holds step 4's losses) is not exact
    naive = _sampler()
    naive.load_state_dict(live)
    with Prefetcher(naive, start_step=5, background=True) as pf:
        assert _run(pf, 5) != rest
    assert len(first) == 5


def test_errors_in_prepare_reach_the_trainer_and_stop_step_ends() -> None:
    def boom(plan):
        raise RuntimeError(f"collate failed at step {plan.step}")

    with Prefetcher(_sampler(), prepare=boom) as pf:
        with pytest.raises(RuntimeError, match="step 0"):
            pf.get()
    with Prefetcher(_sampler(), stop_step=2) as pf:
        assert [pf.get().step for _ in range(2)] == [0, 1]
        with pytest.raises(StopIteration):
            pf.get()
        assert set(pf.metrics()) == {"data_wait_s", "data_wait_fraction"}


def test_observations_round_trip_and_old_checkpoints_are_refused_clearly() -> None:
    from fmmeta.sampling.source import (
        PassObservation,
        TaskObservation,
        observation_from_dict,
    )

    task = TaskObservation(task_id=3, query_loss=float("nan"), step=2)
    pas = PassObservation(step=2, rank=1, phase="query", index=0, features=(1.0, 8.0, 32.0), seconds=0.5)
    back = observation_from_dict(json.loads(json.dumps(task.to_dict())))
    assert back.task_id == 3 and back.query_loss != back.query_loss  # nan survives as null
    assert observation_from_dict(json.loads(json.dumps(pas.to_dict()))) == pas
    old = {"task_id": 3, "query_loss": 1.0, "seconds": 0.2, "n_passes": 4, "n_padded_tokens": 9,
           "attention_tokens": 1.0, "n_tokens": 8, "step": 2}  # what round 1 wrote
    with pytest.raises(ValueError, match="older version"):
        observation_from_dict(old)
