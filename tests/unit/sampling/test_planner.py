"""Packed planner: equal pass counts on every rank, every sequence once, budgets kept, balance
under ZeRO-3's lockstep far better than one task per pass."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.one_task import plan_one_task_per_pass
from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.plan import DUMMY_PASS, MetaBatchPlan, PackedPass, RankPlan, TaskSlot
from fmmeta.sampling.planner import assign_tasks, plan_meta_batch, plan_stats
from fmmeta.sampling.synthetic import lognormal_pool
from fmmeta.tasks.episode import Episode

from .conftest import make_example


def _episode(name: str, support: list[int], query: list[int]) -> Episode:
    return Episode(name, tuple(make_example(n) for n in support), tuple(make_example(n) for n in query),
                   shots=len(support))


def _uneven_episodes(n: int, seed: int) -> list[Episode]:
    rng = np.random.default_rng(seed)
    return [_episode(f"t{i}", rng.integers(3, 300, int(rng.integers(1, 14))).tolist(),
                     rng.integers(3, 300, int(rng.integers(1, 7))).tolist()) for i in range(n)]


def _plan(eps: list[Episode], world_size: int, **kw) -> MetaBatchPlan:
    args = dict(step=0, world_size=world_size, micro_batch_size=4, support_repeats=2, cost_model=CostModel(),
                rng=np.random.default_rng(0))
    args.update(kw)
    return plan_meta_batch(eps, list(range(len(eps))), **args)


def _covered(rank: RankPlan, i: int, query: bool) -> list[int]:
    passes = rank.query if query else rank.support
    return sorted(e for p in passes for t, e in zip(p.slots, p.examples) if t == i)


@pytest.mark.parametrize("world_size, n_tasks", [(1, 5), (3, 7), (4, 12), (4, 3)])
def test_equal_passes_every_sequence_once_budget_kept(world_size: int, n_tasks: int) -> None:
    eps = _uneven_episodes(n_tasks, seed=world_size * 10 + n_tasks)
    plan = _plan(eps, world_size, tokens_per_pass=600)
    assert len({(len(r.support), len(r.query)) for r in plan.ranks}) == 1
    assert sorted(s.task_id for s in plan.slots) == list(range(n_tasks)) == sorted(
        range(plan.n_real_tasks))
    for rank in plan.ranks:
        for i, slot in enumerate(rank.slots):
            assert _covered(rank, i, False) == list(range(len(slot.episode.support)))
            assert _covered(rank, i, True) == list(range(len(slot.episode.query)))
        for p, query in [(p, False) for p in rank.support] + [(p, True) for p in rank.query]:
            if p.is_dummy:
                continue
            lens = [x.n_tokens for x in p.rows(rank.slots, query=query)]
            assert p.width == max(lens) and p.n_tokens == sum(lens)
            assert p.n_rows * p.width <= 600 or p.n_rows == 1  # a lone long row may exceed it
    if n_tasks < world_size:  # a rank without tasks runs dummy passes only
        empty = [r for r in plan.ranks if not r.slots]
        assert empty and all(p.is_dummy for r in empty for p in r.support + r.query)


def test_passes_mix_tasks_and_ranks_may_hold_different_task_counts() -> None:
    eps = _uneven_episodes(10, seed=3)
    plan = _plan(eps, 4)
    assert any(len(set(p.slots)) > 1 for r in plan.ranks for p in r.support)
    assert len({len(r.slots) for r in plan.ranks}) > 1  # balanced by work, not by count
    with pytest.raises(ValueError, match=r"meta_batch_size=10 does not divide by world_size=4"):
        _plan(eps, 4, on_uneven="error")


def test_similar_lengths_share_a_pass() -> None:
    lengths = [200, 10, 210, 12, 205, 11, 9, 198]
    plan = _plan([_episode("t", lengths, [5])], 1, support_repeats=1, tokens_per_pass=840)
    rank = plan.ranks[0]
    groups = sorted(sorted(x.n_tokens for x in p.rows(rank.slots, query=False)) for p in rank.support)
    assert [198, 200, 205, 210] in groups and [9, 10, 11, 12] in groups
    assert plan_stats(plan, support_repeats=1, cost_model=CostModel()).padding_efficiency > 0.95


def test_a_sequence_longer_than_the_budget_gets_a_pass_of_its_own() -> None:
    plan = _plan([_episode("t", [500, 20, 20], [5])], 1, tokens_per_pass=100)
    rank = plan.ranks[0]
    assert any(p.n_rows == 1 and p.width == 500 for p in rank.support)


def _brute_force_free_counts(costs: np.ndarray, world_size: int) -> float:
    best = np.inf
    for assign in itertools.product(range(world_size), repeat=len(costs)):
        loads = np.bincount(assign, weights=costs, minlength=world_size)
        best = min(best, loads.max())
    return best


@pytest.mark.parametrize("seed", range(5))
def test_assignment_is_near_optimal_on_small_instances(seed: int) -> None:
    costs = np.random.default_rng(seed).lognormal(0.0, 1.0, 8)
    ranks = assign_tasks(costs, 3, tol=0.0)
    assert sorted(i for r in ranks for i in r) == list(range(8))
    makespan = max(costs[r].sum() for r in ranks)
    assert makespan <= _brute_force_free_counts(costs, 3) * 1.1


def test_rank_order_is_shuffled_by_the_generator() -> None:
    eps = _uneven_episodes(16, seed=3)
    heavy = {int(np.argmax([sum(x.cost for x in r.slots) for r in _plan(eps, 4, rng=np.random.default_rng(s)).ranks]))
             for s in range(8)}
    assert len(heavy) > 1


def test_plan_stats_lockstep_is_the_sum_over_passes_of_the_slowest_rank() -> None:
    ep = _episode("t", [4, 4, 8], [6])
    slots = (TaskSlot(ep, 0),)
    a = RankPlan(slots, (PackedPass((0, 0), (0, 1), 4, 8), PackedPass((0,), (2,), 8, 8)),
                 (PackedPass((0,), (0,), 6, 6),))
    b = RankPlan((TaskSlot(ep, 1),), (PackedPass((0,), (2,), 8, 8), PackedPass((0, 0), (0, 1), 4, 8)),
                 (DUMMY_PASS,))
    cm = CostModel(a=1.0, b=1.0, c=0.0)
    stats = plan_stats(MetaBatchPlan(0, (a, b), 2), support_repeats=2, cost_model=cm)
    # support passes cost 9 and 9 on both ranks in either order; query 7 vs a dummy's 2
    assert stats.rank_costs == (2 * 18 + 7, 2 * 18 + 2)
    assert stats.lockstep == pytest.approx(2 * (9 + 9) + 7)
    assert stats.lower_bound == pytest.approx(2 * (2 * 16 + 6) / 2)  # unpadded work, no overhead


def test_packing_beats_one_task_per_pass_under_lockstep() -> None:
    pool = lognormal_pool(200, seed=1)
    rng = np.random.default_rng(0)
    cm = CostModel()
    packed, one = [], []
    for step in range(6):
        ids = rng.choice(len(pool), 32, replace=False).tolist()
        eps = [pool[i].sample_episode(np.random.default_rng([step, i])) for i in ids]
        kw = dict(step=step, world_size=4, micro_batch_size=4, support_repeats=3, cost_model=cm,
                  rng=np.random.default_rng(step))
        packed.append(plan_stats(plan_meta_batch(eps, ids, **kw), support_repeats=3, cost_model=cm))
        one.append(plan_stats(plan_one_task_per_pass(eps, ids, **kw), support_repeats=3, cost_model=cm))
    p = np.mean([s.lockstep for s in packed])
    o = np.mean([s.lockstep for s in one])
    assert p < 0.6 * o, (p, o)
    # and the packed plan's lockstep cost is close to its own busiest rank's total
    assert np.mean([s.lockstep / s.makespan for s in packed]) < 1.2


def test_bad_arguments_are_refused() -> None:
    eps = _uneven_episodes(2, seed=0)
    with pytest.raises(ValueError, match="tokens_per_pass=0"):
        _plan(eps, 1, tokens_per_pass=0)
    with pytest.raises(ValueError, match="no episodes"):
        _plan([], 1)


def test_fast_constructor_makes_the_same_objects_as_init() -> None:
    from fmmeta.sampling.plan import _make_many

    ep = _episode("t", [4, 5], [6])
    made = _make_many(PackedPass, [(0, 1), ()], [(1, 0), ()], [5, 0], [9, 0])
    assert made == [PackedPass((0, 1), (1, 0), 5, 9), DUMMY_PASS]
    assert hash(made[0]) == hash(PackedPass((0, 1), (1, 0), 5, 9)) and made[1].is_dummy
    assert _make_many(TaskSlot, [ep], [7], [1.5]) == [TaskSlot(ep, 7, 1.5)]
    with pytest.raises(AttributeError):
        made[0].width = 3  # still frozen


def test_plans_are_deterministic_and_survive_a_cost_model_without_per_token_work() -> None:
    eps = _uneven_episodes(12, seed=5)
    for cm in (CostModel(), CostModel(a=1.0, b=0.0, c=0.0)):  # caps are NaN in the second
        one, two = _plan(eps, 3, cost_model=cm), _plan(eps, 3, cost_model=cm)
        assert one == two and one.digest() == two.digest()
        assert len({(len(r.support), len(r.query)) for r in one.ranks}) == 1
        for rank in one.ranks:
            for i, slot in enumerate(rank.slots):
                assert _covered(rank, i, False) == list(range(len(slot.episode.support)))
