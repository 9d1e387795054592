"""The one-task-per-pass baseline plan: its chunking, its equal-count balance, its pass structure."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.one_task import assign_balanced, chunk_sets, plan_one_task_per_pass
from fmmeta.sampling.cost import CostModel
from fmmeta.tasks.episode import Episode

from .conftest import make_example


def _episode(name: str, support: list[int], query: list[int]) -> Episode:
    return Episode(name, tuple(make_example(n) for n in support), tuple(make_example(n) for n in query), shots=len(support))


def _uneven_episodes(n: int, seed: int) -> list[Episode]:
    rng = np.random.default_rng(seed)
    eps = []
    for i in range(n):
        n_s = int(rng.integers(1, 14))
        n_q = int(rng.integers(1, 7))
        eps.append(_episode(f"t{i}", rng.integers(3, 300, n_s).tolist(), rng.integers(3, 300, n_q).tolist()))
    return eps


def _plan(eps: list[Episode], world_size: int, **kw):
    args = dict(step=0, world_size=world_size, micro_batch_size=4, support_repeats=2, cost_model=CostModel(), rng=np.random.default_rng(0))
    args.update(kw)
    return plan_one_task_per_pass(eps, list(range(len(eps))), **args)


def test_every_pass_holds_one_task_and_ranks_run_equal_passes() -> None:
    eps = _uneven_episodes(10, seed=0)  # 10 tasks over 4 ranks: two ranks run a task short
    plan = _plan(eps, 4)
    k_s = max(-(-len(e.support) // 4) for e in eps)
    k_q = max(-(-len(e.query) // 4) for e in eps)
    assert {len(r.slots) for r in plan.ranks} == {2, 3}
    assert {(len(r.support), len(r.query)) for r in plan.ranks} == {(3 * k_s, 3 * k_q)}
    for r in plan.ranks:
        for passes in (r.support, r.query):
            assert all(len(set(p.slots)) == 1 for p in passes if not p.is_dummy)
            assert all(p.n_rows <= 4 for p in passes)
        for i, slot in enumerate(r.slots):
            assert sorted(e for p in r.support for t, e in zip(p.slots, p.examples) if t == i) == \
                list(range(len(slot.episode.support)))
    assert plan.n_real_tasks == 10


def _brute_force_makespan(costs: np.ndarray, world_size: int) -> float:
    t = len(costs) // world_size
    best = np.inf
    idx = list(range(len(costs)))

    def rec(left: list[int], loads: list[float]) -> None:
        nonlocal best
        if not left:
            best = min(best, max(loads))
            return
        first, rest = left[0], left[1:]
        for combo in itertools.combinations(rest, t - 1):
            group = (first, *combo)
            remaining = [i for i in rest if i not in combo]
            rec(remaining, loads + [float(costs[list(group)].sum())])

    rec(idx, [])
    return best


@pytest.mark.parametrize("seed", range(5))
def test_assignment_matches_brute_force_on_small_instances(seed: int) -> None:
    costs = np.random.default_rng(seed).lognormal(0.0, 1.0, 9)
    assign = assign_balanced(costs, 3, tol=0.0)
    assert sorted(assign.ravel().tolist()) == list(range(9))
    makespan = costs[assign].sum(axis=1).max()
    assert makespan <= _brute_force_makespan(costs, 3) * 1.05


def test_balance_is_near_the_lower_bound_with_many_tasks_per_rank() -> None:
    costs = np.random.default_rng(7).lognormal(0.0, 0.8, 8 * 8)
    assign = assign_balanced(costs, 8)
    loads = costs[assign].sum(axis=1)
    lb = max(costs.sum() / 8, costs.max())
    assert loads.max() / lb <= 1.01
    # LPT alone (no swaps) is measurably worse: the improvement step does work
    no_swaps = costs[assign_balanced(costs, 8, max_swaps=0)].sum(axis=1).max()
    assert loads.max() <= no_swaps


def test_two_tasks_per_rank_pairs_largest_with_smallest() -> None:
    costs = np.array([10.0, 9.0, 1.0, 2.0, 5.0, 6.0])
    assign = assign_balanced(costs, 3)
    pairs = sorted(tuple(sorted(costs[row].tolist())) for row in assign)
    assert pairs == [(1.0, 10.0), (2.0, 9.0), (5.0, 6.0)]


def _reference_chunks(
    lengths: list[int], k_all: int, mb: int, cm: CostModel
) -> tuple[tuple[tuple[int, ...], ...], float]:
    """The chunking rule of the module docstring, one set at a time in plain python."""
    n = len(lengths)
    if n == 0:
        return ((),) * k_all, 0.0
    order = sorted(range(n), key=lambda i: -lengths[i])  # stable: ties keep episode order
    k = min(k_all, n)
    q, rem = divmod(n, k)
    sizes_a = [q] * (k - rem) + [q + 1] * rem
    spare = max(mb - 1, 1)
    full = (n - k) // spare
    short, left = [], n
    for size in [mb] * full + [1 + (n - k) - full * spare]:
        take = min(size, left)
        if take:
            short.append(take)
            left -= take
    sizes_b = (short + [1] * left)[::-1]

    def cut(sizes: list[int]) -> tuple[tuple[tuple[int, ...], ...], float]:
        chunks, cost, pos = [], 0.0, 0
        for s in sizes:
            chunk = tuple(order[pos : pos + s])
            chunks.append(chunk)
            cost += cm.chunk_cost([lengths[i] for i in chunk])
            pos += s
        return tuple(chunks), cost

    (ch_a, cost_a), (ch_b, cost_b) = cut(sizes_a), cut(sizes_b)
    chunks, cost = (ch_b, cost_b) if cost_b < cost_a else (ch_a, cost_a)
    return chunks + ((),) * (k_all - k), cost


@pytest.mark.parametrize("micro_batch_size", [1, 3, 4, 32])
def test_vectorised_chunking_matches_the_per_set_reference(micro_batch_size: int) -> None:
    # Ties, outliers, empty sets, sets shorter than K; 32 per chunk exceeds the packed chunk code
    # (63 bits), so that size exercises the direct tuple path.
    rng = np.random.default_rng(micro_batch_size)
    cm = CostModel()
    sets_len = [rng.integers(2, 60, int(rng.integers(0, 70))).tolist() for _ in range(40)]
    sets_len += [[7] * 9, [400, 5, 5, 5, 5], []]
    sets = [tuple(make_example(n) for n in lens) for lens in sets_len]
    need = max(-(-len(s) // micro_batch_size) for s in sets_len)
    k_all = [need + int(rng.integers(0, 3)) for _ in sets]
    got = chunk_sets(sets, micro_batch_size=micro_batch_size, cost_model=cm, n_chunks=k_all)
    for i, lens in enumerate(sets_len):
        chunks, cost = _reference_chunks(lens, k_all[i], micro_batch_size, cm)
        assert got.chunks[i] == chunks, f"set {i}"
        assert got.real_cost[i] == pytest.approx(cost)
        assert got.n_dummy[i] == k_all[i] - min(k_all[i], len(lens))


@pytest.mark.parametrize("seed", range(4))
def test_two_tasks_per_rank_is_optimal(seed: int) -> None:
    # LPT in rounds pairs the i-th largest with the i-th smallest of the rest, which is the
    # optimal pairing, so at 2 tasks per rank nothing (Karmarkar-Karp, swaps) can do better.
    costs = np.random.default_rng(seed).lognormal(0.0, 1.2, 10)
    makespan = costs[assign_balanced(costs, 5, tol=0.0)].sum(axis=1).max()
    assert makespan == pytest.approx(_brute_force_makespan(costs, 5))


def test_equal_count_bound_holds_and_balance_reaches_it_on_a_heavy_tail() -> None:
    # With equal task counts the rank holding the largest task also runs t - 1 others, so no
    # assignment beats largest + (t - 1) cheapest; on a heavy tail that bound is above LB.
    rng = np.random.default_rng(11)
    for _ in range(20):
        costs = rng.lognormal(0.0, 1.5, 8 * 8)
        loads = costs[assign_balanced(costs, 8)].sum(axis=1)
        srt = np.sort(costs)
        tight = max(costs.sum() / 8, srt[-1] + srt[:7].sum())
        assert tight - 1e-9 <= loads.max() <= tight * 1.02
