"""Rows across ranks: every row of every task on exactly one rank, equal pass counts, every rank
holding every task, budgets kept, the optimal cut, and the placement chosen by predicted cost."""

from __future__ import annotations

import numpy as np
import pytest

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.plan import MetaBatchPlan, RankPlan
from fmmeta.sampling.planner import pass_cost, plan_meta_batch, plan_stats
from fmmeta.sampling.rows_plan import (
    _aligned_cut,
    fast_weight_megabytes,
    plan_cost,
    plan_placed,
    plan_rows_across_ranks,
)
from fmmeta.sampling.synthetic import bimodal_pool
from fmmeta.tasks.episode import Episode

from .conftest import make_example


def _episodes(n: int, seed: int) -> list[Episode]:
    rng = np.random.default_rng(seed)
    return [Episode(f"t{i}", tuple(make_example(int(k)) for k in rng.integers(3, 300, int(rng.integers(1, 14)))),
                    tuple(make_example(int(k)) for k in rng.integers(3, 300, int(rng.integers(1, 7)))), shots=1)
            for i in range(n)]


def _rows(eps: list[Episode], world_size: int, budget: int = 600, seed: int = 0) -> MetaBatchPlan:
    return plan_rows_across_ranks(eps, list(range(len(eps))), step=3, world_size=world_size, budget=budget,
                                  cost_model=CostModel(), rng=np.random.default_rng(seed))


@pytest.mark.parametrize("world_size, n_tasks", [(1, 4), (2, 3), (4, 2), (8, 5), (3, 1)])
def test_every_row_once_on_one_rank_equal_passes_budget_kept(world_size: int, n_tasks: int) -> None:
    eps = _episodes(n_tasks, seed=world_size + 10 * n_tasks)
    plan = _rows(eps, world_size)
    assert plan.placement == "rows" and plan.n_real_tasks == n_tasks
    assert len({(len(r.support), len(r.query)) for r in plan.ranks}) == 1
    assert all(r.shared and r.slots == plan.ranks[0].slots for r in plan.ranks)
    assert [s.task_id for s in plan.slots] == list(range(n_tasks))
    for query in (False, True):
        seen = sorted((t, e) for r in plan.ranks for p in (r.query if query else r.support)
                      for t, e in zip(p.slots, p.examples))
        want = sorted((t, e) for t, ep in enumerate(eps) for e in range(len(ep.query if query else ep.support)))
        assert seen == want  # every row exactly once, over all ranks
    for rank in plan.ranks:
        for p, query in [(p, False) for p in rank.support] + [(p, True) for p in rank.query]:
            if p.is_dummy:
                continue
            lens = [x.n_tokens for x in p.rows(rank.slots, query=query)]
            assert p.width == max(lens) and p.n_tokens == sum(lens)
            assert p.n_rows * p.width <= 600 or p.n_rows == 1


def test_rows_are_dealt_by_tokens_so_every_rank_gets_about_the_same_work() -> None:
    """One long task and many short ones on 4 ranks: whole tasks cannot balance, rows can."""
    eps = [Episode("long", tuple(make_example(250) for _ in range(16)), tuple(make_example(250) for _ in range(8)),
                   shots=16)]
    eps += [Episode(f"s{i}", tuple(make_example(20) for _ in range(4)), (make_example(20),), shots=4)
            for i in range(7)]
    plan = _rows(eps, 4, budget=1000)
    tokens = [sum(p.n_tokens for p in r.support) for r in plan.ranks]
    assert max(tokens) - min(tokens) <= 250  # within one row
    per_rank_long = [sum(1 for p in r.support for t in p.slots if t == 0) for r in plan.ranks]
    assert per_rank_long == [4, 4, 4, 4]  # the long task is split over every rank
    tasks = plan_meta_batch(eps, list(range(8)), step=3, world_size=4, micro_batch_size=4, support_repeats=2,
                            cost_model=CostModel(), rng=np.random.default_rng(0), tokens_per_pass=1000)
    assert plan.compute_cost(CostModel(), support_repeats=2) < 0.5 * tasks.compute_cost(CostModel(), support_repeats=2)


def _lockstep(width: np.ndarray, pass_of: np.ndarray, seat_of: np.ndarray, cost: CostModel) -> float:
    """The lockstep price of a deal, recomputed pass by pass from its rows."""
    a, b, c = cost.coefficients
    total = 0.0
    for g in range(int(pass_of.max()) + 1):
        costliest = cost.dummy_pass_cost
        for seat in np.unique(seat_of[pass_of == g]):
            rows = width[(pass_of == g) & (seat_of == seat)]
            costliest = max(costliest, a + rows.size * (b * rows.max() + c * float(rows.max()) ** 2))
        total += costliest
    return total


def test_one_long_row_runs_beside_many_short_ones_of_the_same_cost() -> None:
    """The case whole tasks (and equal row counts per rank) cannot balance: one 640-token row
    among 36 short ones on 4 ranks. One pass holds it all: the long row alone on one rank, 12 short
    rows on each other rank (their cost just below the long row's), so the step costs the long row."""
    width = np.array([640] + [64] * 36)
    cost = CostModel()
    pass_of, seat_of, price = _aligned_cut(width, 4, budget=4 * 640, cost_model=cost)
    assert (pass_of == 0).all()
    assert seat_of.tolist() == [0] + [1] * 12 + [2] * 12 + [3] * 12
    assert price == pytest.approx(cost.a + 640 * (1 + 640 / 2048))
    assert price == pytest.approx(_lockstep(width, pass_of, seat_of, cost))


@pytest.mark.parametrize("seed", range(6))
def test_the_aligned_cut_keeps_every_row_order_and_budget_and_prices_itself(seed: int) -> None:
    rng = np.random.default_rng(seed)
    width = np.sort(rng.integers(1, 400, int(rng.integers(1, 80))))[::-1]
    cost = CostModel(a=float(rng.uniform(0, 300)), c=float(rng.uniform(0, 0.01)))
    budget, ranks = int(rng.integers(150, 900)), int(rng.integers(1, 6))
    pass_of, seat_of, price = _aligned_cut(width, ranks, budget, cost)
    key = pass_of * ranks + seat_of
    assert (np.diff(key) >= 0).all() and seat_of.max() < ranks  # consecutive runs, in seat order
    for k in np.unique(key):
        rows = width[key == k]
        assert rows.size == 1 or rows.size * rows.max() <= budget
    assert price == pytest.approx(_lockstep(width, pass_of, seat_of, cost), rel=1e-12)


def _placed(eps: list[Episode], world_size: int, **kw) -> MetaBatchPlan:
    args = dict(step=0, world_size=world_size, micro_batch_size=8, support_repeats=3, cost_model=CostModel(),
                rng=np.random.default_rng(1), fast_weight_numel=460_800)
    args.update(kw)
    return plan_placed(eps, list(range(len(eps))), **args)


def test_auto_picks_the_cheaper_placement_and_reports_both_prices() -> None:
    eps = [bimodal_pool(16, seed=5)[i].sample_episode(np.random.default_rng(i)) for i in range(16)]
    plan = _placed(eps, 8)
    assert set(plan.predicted) == {"tasks", "rows"}
    assert plan.placement == min(plan.predicted, key=plan.predicted.__getitem__)
    stats = plan_stats(plan, support_repeats=3, cost_model=CostModel())
    assert stats.placement == plan.placement and dict(stats.predicted) == plan.predicted
    # An all-reduce priced out of reach leaves the tasks placement; a forced one is obeyed.
    assert _placed(eps, 8, cost_model=CostModel(r=1e9)).placement == "tasks"
    assert _placed(eps, 8, placement="rows", cost_model=CostModel(r=1e9)).placement == "rows"
    assert _placed(eps, 8, placement="tasks").predicted == {}


@pytest.mark.parametrize("seed", range(4))
def test_under_lockstep_the_planners_prices_are_the_built_plans_prices(seed: int) -> None:
    """plan_placed weighs the placements by the prices the planners computed while cutting, and
    builds only the plan it keeps: each price must be what that plan, built, costs."""
    eps = [bimodal_pool(32, seed=seed)[i].sample_episode(np.random.default_rng([seed, i])) for i in range(12)]
    cm, ids = CostModel(a=float(40 + 30 * seed)), list(range(12))
    plan = _placed(eps, 4, cost_model=cm)
    rng = np.random.default_rng(1)  # as _placed's: the tasks plan draws first, then the rows plan
    tasks = plan_meta_batch(eps, ids, step=0, world_size=4, micro_batch_size=8, support_repeats=3,
                            cost_model=cm, rng=rng)
    budget = 8 * max(x.n_tokens for e in eps for x in (*e.support, *e.query))
    rows = plan_rows_across_ranks(eps, ids, step=0, world_size=4, budget=budget, cost_model=cm, rng=rng)
    for built in (tasks, rows):
        want = plan_cost(built, support_repeats=3, cost_model=cm, fast_weight_numel=460_800)
        assert plan.predicted[built.placement] == pytest.approx(want, rel=1e-12)
    kept = tasks if plan.placement == "tasks" else rows
    assert plan.digest() == kept.digest() and plan.placement == min(plan.predicted, key=plan.predicted.__getitem__)


def test_one_rank_always_plans_tasks_and_the_prices_follow_the_engine() -> None:
    eps = _episodes(6, seed=2)
    assert _placed(eps, 1, placement="rows").placement == "tasks"
    a = _placed(eps, 4, lockstep=True).predicted
    b = _placed(eps, 4, lockstep=False).predicted
    assert b["tasks"] <= a["tasks"] and b["rows"] <= a["rows"]  # meeting less often never costs more


def test_bimodal_pool_at_two_tasks_per_rank_lockstep_falls_with_rows() -> None:
    pool = bimodal_pool(64, seed=0)
    eps = [pool[i].sample_episode(np.random.default_rng(i)) for i in range(16)]
    tasks = _placed(eps, 8, placement="tasks")
    rows = _placed(eps, 8, placement="rows")
    cm = CostModel()
    s_tasks = plan_stats(tasks, support_repeats=3, cost_model=cm)
    s_rows = plan_stats(rows, support_repeats=3, cost_model=cm)
    assert s_rows.lockstep < 0.85 * s_tasks.lockstep
    assert s_rows.lockstep < s_tasks.largest_task  # what no whole-task plan can reach


def test_a_plan_whose_ranks_disagree_on_placement_is_refused() -> None:
    plan = _rows(_episodes(3, seed=0), 2)
    r0, r1 = plan.ranks
    with pytest.raises(ValueError, match="placement='rows'"):
        MetaBatchPlan(step=0, ranks=(r0, RankPlan(r1.slots, r1.support, r1.query, shared=False)),
                      n_real_tasks=3, placement="rows")
    with pytest.raises(ValueError, match="placement='tasks'"):
        MetaBatchPlan(step=0, ranks=plan.ranks, n_real_tasks=3)
    with pytest.raises(ValueError, match="placement='sideways' is invalid"):
        _placed(_episodes(3, seed=0), 2, placement="sideways")


def test_plans_are_deterministic_and_the_digest_tells_placements_apart() -> None:
    eps = _episodes(5, seed=4)
    assert _rows(eps, 4).digest() == _rows(eps, 4).digest()
    assert _placed(eps, 4, placement="rows").digest() != _placed(eps, 4, placement="tasks").digest()


def test_fast_weight_memory() -> None:
    # The default adapter (460,800 floats) for 16 tasks: weights + grads, and Adam's two moments.
    assert fast_weight_megabytes(16, 460_800) == pytest.approx(16 * 460_800 * 4 * 2 / 2**20)
    assert fast_weight_megabytes(16, 460_800, adam=True) == pytest.approx(2 * fast_weight_megabytes(16, 460_800))


@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_compute_cost_equals_the_passes_priced_one_by_one(world_size: int) -> None:
    """The vectorised price against a plain loop over :func:`pass_cost`, dummy passes included."""
    eps = _episodes(7, seed=world_size)
    cost = CostModel(a=50.0, c=0.002)
    tasks = plan_meta_batch(eps, list(range(7)), step=0, world_size=world_size, micro_batch_size=3,
                            support_repeats=2, cost_model=cost, rng=np.random.default_rng(0))
    for plan in (tasks, _rows(eps, world_size)):
        support = [[pass_cost(p, cost) for p in r.support] for r in plan.ranks]
        query = [[pass_cost(p, cost) for p in r.query] for r in plan.ranks]
        lockstep = 2 * sum(map(max, zip(*support))) + sum(map(max, zip(*query)))
        assert plan.compute_cost(cost, support_repeats=2) == pytest.approx(lockstep, rel=1e-12)
        if plan.placement == "rows":
            apart = 2 * max(map(sum, support)) + max(map(sum, query))
        else:
            apart = max(2 * sum(s) + sum(q) for s, q in zip(support, query))
        assert plan.compute_cost(cost, support_repeats=2, lockstep=False) == pytest.approx(apart, rel=1e-12)
