"""The sampler: determinism, exact resume, equal passes, randomness kept, config errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig, critical_passes
from fmmeta.sampling.source import PassObservation
from fmmeta.sampling.synthetic import lognormal_pool

from .conftest import FixedSource
from .helpers import fake_observations


def _pool(n: int = 30):
    return lognormal_pool(n, seed=5)


def _sampler(seed: int = 0, world_size: int = 2, **kw) -> CostAwareSampler:
    cfg = SamplerConfig(**{"meta_batch_size": 6, "micro_batch_size": 4, **kw})
    return CostAwareSampler(_pool(), cfg, world_size=world_size, seed=seed, support_repeats=2)


def test_same_seed_same_plans_other_seed_other_plans() -> None:
    a, b, c = _sampler(seed=3), _sampler(seed=3), _sampler(seed=4)
    da = [a.sample(s).digest() for s in range(5)]
    assert da == [b.sample(s).digest() for s in range(5)]
    assert da != [c.sample(s).digest() for s in range(5)]
    assert len(set(da)) == 5
    assert a.sample(2).digest() == da[2]  # a step's plan does not depend on what was sampled before


@pytest.mark.parametrize("strategy", ["hard", "curriculum", "uniform"])
def test_resume_reproduces_the_uninterrupted_run(strategy: str) -> None:
    kw = {"strategy": strategy, "difficulty": "loss", "pacing_steps": 8, "cost_damping": 0.3, "fit_cost": True}
    ref = _sampler(seed=9, **kw)
    digests, saved, costs_at_save = [], None, None
    for step in range(10):
        plan = ref.sample(step)
        digests.append(plan.digest())
        ref.observe(fake_observations(plan, support_repeats=2))
        if step == 4:
            saved = json.dumps(ref.state_dict())  # plain JSON, no pickle
            costs_at_save = ref.cost_model.coefficients
    assert costs_at_save != (64.0, 1.0, 1.0 / 2048.0)  # the fit did move the coefficients
    resumed = _sampler(seed=9, **kw)
    resumed.load_state_dict(json.loads(saved))
    assert resumed.cost_model.coefficients == costs_at_save
    for step in range(5, 10):
        plan = resumed.sample(step)
        assert plan.digest() == digests[step], step
        resumed.observe(fake_observations(plan, support_repeats=2))
    assert resumed.state_dict() == ref.state_dict()
    # control: a sampler that did not restore the state diverges (the state matters)
    if strategy == "hard":
        fresh = _sampler(seed=9, **kw)
        assert [fresh.sample(s).digest() for s in range(5, 10)] != digests[5:]


def test_observation_order_does_not_matter() -> None:
    a, b = _sampler(strategy="hard"), _sampler(strategy="hard")
    obs = fake_observations(a.sample(0), support_repeats=2)
    b.sample(0)
    a.observe(obs)
    b.observe(list(reversed(obs)))
    assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize("placement", ["tasks", "rows"])
def test_equal_pass_counts_with_uneven_task_lengths(placement: str) -> None:
    pool = [FixedSource(f"t{i}", tuple(range(5, 5 + 3 * (i + 1), 3)), (7,) * (1 + i % 5)) for i in range(9)]
    cfg = SamplerConfig(meta_batch_size=7, micro_batch_size=2, placement=placement)
    sampler = CostAwareSampler(pool, cfg, world_size=3, seed=1, support_repeats=3)
    for step in range(6):
        plan = sampler.sample(step)
        assert plan.placement == placement
        assert len({(len(r.support), len(r.query)) for r in plan.ranks}) == 1
        assert len(plan.slots) == 7 == plan.n_real_tasks
        # every sequence of every task runs exactly once per phase (with rows across ranks, on
        # exactly one of the ranks that all hold the task)
        groups = [plan.ranks] if plan.placement == "rows" else [(r,) for r in plan.ranks]
        for ranks in groups:
            for i, slot in enumerate(ranks[0].slots):
                sup = sorted(e for r in ranks for p in r.support for t, e in zip(p.slots, p.examples) if t == i)
                qry = sorted(e for r in ranks for p in r.query for t, e in zip(p.slots, p.examples) if t == i)
                assert sup == list(range(len(slot.episode.support)))
                assert qry == list(range(len(slot.episode.query)))


def test_consecutive_meta_batches_mean_lengths_are_uncorrelated() -> None:
    sampler = _sampler(meta_batch_size=8, world_size=4)
    means = []
    for step in range(200):
        ids = sampler.select(step)
        means.append(float(np.mean([np.mean(sampler.sources[i].lengths) for i in ids])))
    m = np.array(means)
    corr = float(np.corrcoef(m[:-1], m[1:])[0, 1])
    assert abs(corr) < 0.2, corr
    assert m.std() > 0  # the pool does vary in length, so the check is meaningful


def test_state_dict_is_plain_json() -> None:
    s = _sampler(strategy="hard")
    s.observe(fake_observations(s.sample(0), support_repeats=2))
    state = s.state_dict()
    assert json.loads(json.dumps(state, allow_nan=False)) == state
    assert sum(v is not None for v in state["loss"]) == 6


def test_state_from_another_pool_or_seed_is_rejected() -> None:
    state = _sampler(seed=1).state_dict()
    with pytest.raises(ValueError, match="seed=1"):
        _sampler(seed=2).load_state_dict(state)
    other = CostAwareSampler(_pool(10), SamplerConfig(), world_size=2, seed=1)
    with pytest.raises(ValueError, match="another task pool"):
        other.load_state_dict(state)


def test_config_errors_name_key_value_and_fix() -> None:
    from fmmeta.config import ConfigError

    bad = SamplerConfig(meta_batch_size=0, strategy="greedy", hard_floor=0.0)
    with pytest.raises(ConfigError) as err:
        CostAwareSampler(_pool(), bad, world_size=2, seed=0)  # a sampler refuses an invalid config
    problems = err.value.problems  # one line each; the config loader prefixes "sampler."
    assert problems == bad.validate()
    assert len(problems) == 3
    assert any(p.startswith("meta_batch_size=0") and ">= 1" in p for p in problems)
    assert any(p.startswith("strategy='greedy'") and "uniform_difficulty" in p for p in problems)
    assert any(p.startswith("hard_floor=0.0") and "starve" in p for p in problems)
    with pytest.raises(ValueError, match="on_uneven='pad'"):
        CostAwareSampler(_pool(), SamplerConfig(meta_batch_size=5, on_uneven="error"), world_size=2, seed=0)
    with pytest.raises(TypeError):
        SamplerConfig(8)  # keyword-only


def test_meta_batch_larger_than_the_pool_is_refused() -> None:
    """Drawing with replacement would silently weight a task twice in one meta-batch."""
    with pytest.raises(ValueError, match=r"sampler.meta_batch_size=9 is larger than the meta-training pool \(8 tasks\)"):
        CostAwareSampler(_pool(8), SamplerConfig(meta_batch_size=9), world_size=1, seed=0)
    assert CostAwareSampler(_pool(8), SamplerConfig(meta_batch_size=8), world_size=1, seed=0).sample(0).n_real_tasks == 8


def test_cost_fit_learns_from_the_critical_pass_of_each_index() -> None:
    """Under lockstep only the slowest rank's pass measures work; a fit on every rank's time would
    learn the waiting. Times below are inflated on non-critical ranks: the fit must not see them."""
    from .helpers import TRUE_COST

    s = _sampler(meta_batch_size=6, world_size=3, fit_cost=True, cost_damping=0.0)
    naive = CostModel(damping=0.0)  # control: fitted on every rank's times
    for step in range(40):
        plan = s.sample(step)
        obs = fake_observations(plan, support_repeats=2)
        crit = {o.sort_key() for o in critical_passes([o for o in obs if isinstance(o, PassObservation)],
                                                       s.cost_model)}
        waited = [dataclasses.replace(o, seconds=o.seconds * 3.0)
                  if isinstance(o, PassObservation) and o.sort_key() not in crit else o for o in obs]
        s.observe(waited)
        naive.fit([o for o in waited if isinstance(o, PassObservation)])
    np.testing.assert_allclose(s.cost_model.coefficients, TRUE_COST, rtol=0.05)
    # the control learnt the waiting: some coefficient is far off
    assert np.abs(np.array(naive.coefficients) / np.array(TRUE_COST) - 1).max() > 0.3


def test_support_draws_add_fresh_support_sets_and_keep_the_first_draw() -> None:
    cfg = SamplerConfig(meta_batch_size=6, micro_batch_size=4)
    plain = CostAwareSampler(_pool(), cfg, world_size=2, seed=1, support_repeats=3)
    drawn = CostAwareSampler(_pool(), cfg, world_size=2, seed=1, support_draws=3, support_repeats=1)
    for step in range(3):
        a = {s.task_id: s.episode for r in plain.sample(step).ranks for s in r.slots}
        b = {s.task_id: s.episode for r in drawn.sample(step).ranks for s in r.slots}
        assert a.keys() == b.keys()
        for t, ep in a.items():
            more = b[t]
            n = len(ep.support)
            assert more.support[:n] == ep.support and more.query == ep.query
            assert len(more.support) == 3 * n
            assert more.support[n:2 * n] != more.support[2 * n:]  # fresh draws, not copies
    with pytest.raises(ValueError, match="support_draws=0"):
        CostAwareSampler(_pool(), cfg, world_size=2, seed=1, support_draws=0)
