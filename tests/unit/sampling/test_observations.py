"""The sampler does not trust what it is told: bad observations, empty tasks, repeats, old states."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig
from fmmeta.sampling.source import PassObservation, TaskObservation
from fmmeta.sampling.strategies import STRATEGIES

from .conftest import FixedSource


def _pool(n: int = 10) -> list[FixedSource]:
    return [FixedSource(f"t{i}", (10,), (10,), family=f"d{i % 3}", shots=8 >> (i % 4)) for i in range(n)]


def _sampler(pool=None, **kw) -> CostAwareSampler:
    return CostAwareSampler(pool or _pool(), SamplerConfig(**{"meta_batch_size": 4, **kw}),
                            world_size=1, seed=3)


def test_non_finite_observations_are_ignored_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    sampler = _sampler(strategy="hard", fit_cost=True)
    plan = sampler.sample(0)
    before = sampler.cost_model.coefficients
    with caplog.at_level(logging.WARNING):
        sampler.observe([
            TaskObservation(task_id=2, query_loss=math.inf, step=0),
            TaskObservation(task_id=3, query_loss=1.5, step=0),
            PassObservation(step=0, rank=0, phase="support", index=0,
                            features=(1.0, 10.0, 100.0), seconds=math.inf),
        ])
    assert sampler.ignored_observations == 2
    assert "ignored 1 non-finite task loss(es) and 1 non-finite pass time(s)" in caplog.text
    assert "first task: t2" in caplog.text
    loss = sampler.loss_estimates
    assert math.isnan(loss[2]) and loss[3] == 1.5
    assert np.array_equal(sampler.cost_model.coefficients, before)
    # Hard mining keeps working (an inf loss used to make every later probability NaN).
    assert np.isfinite(sampler.strategy.probabilities(sampler.pool_view())).all()
    for step in range(1, 5):
        assert plan.step == 0 and sampler.sample(step).step == step


class _Empty(FixedSource):
    def __len__(self) -> int:
        return 0


def test_a_task_with_no_examples_is_refused() -> None:
    with pytest.raises(ValueError, match=r"task\(s\) \['t0'\] have no examples"):
        _sampler([_Empty("t0", (10,), (10,)), *_pool()[1:]])
    no_query = [FixedSource("q0", (10,), ()), *_pool()[1:]]
    sampler = _sampler(no_query, meta_batch_size=len(no_query))
    with pytest.raises(ValueError, match="task 'q0' gave an episode with no query examples"):
        sampler.sample(0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_draws_without_replacement_when_the_pool_allows(strategy: str) -> None:
    # uniform_difficulty with one task alone in its bin used to repeat it up to n times.
    pool = [FixedSource(f"e{i}", (10,), (10,), family=f"d{i % 2}", shots=8) for i in range(9)]
    pool.append(FixedSource("lone", (10,), (10,), family="d0", shots=1))
    sampler = _sampler(pool, strategy=strategy, meta_batch_size=10, pacing_start=1.0,
                       difficulty_bins=4)
    for step in range(50):
        ids = sampler.select(step).tolist()
        assert sorted(ids) == list(range(10)), (strategy, step, ids)


def test_state_from_another_configuration_warns(caplog: pytest.LogCaptureFixture) -> None:
    saved = _sampler(strategy="hard").state_dict()
    with caplog.at_level(logging.WARNING):
        _sampler(strategy="uniform", meta_batch_size=4).load_state_dict(saved)
    assert "saved with another configuration (strategy='hard' -> 'uniform')" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _sampler(strategy="hard").load_state_dict(saved)
    assert "another configuration" not in caplog.text
