"""Planner: equal pass counts on every rank, low padding, near-optimal balance."""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pytest

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.planner import _LengthCache, assign_balanced, chunk_sets, plan_meta_batch, plan_stats
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
    args = dict(step=0, world_size=world_size, micro_batch_size=4, inner_steps=2, cost_model=CostModel(), rng=np.random.default_rng(0))
    args.update(kw)
    return plan_meta_batch(eps, list(range(len(eps))), **args)


def test_every_rank_and_slot_runs_the_same_number_of_passes() -> None:
    eps = _uneven_episodes(12, seed=0)
    plan = _plan(eps, 4)
    n_support = {len(s.support_chunks) for r in plan.ranks for s in r}
    n_query = {len(s.query_chunks) for r in plan.ranks for s in r}
    assert {len(r) for r in plan.ranks} == {3}
    # the largest support set has 13 sequences -> ceil(13/4) = 4 chunks, query 6 -> 2
    assert n_support == {max(-(-len(e.support) // 4) for e in eps)}
    assert n_query == {max(-(-len(e.query) // 4) for e in eps)}
    assert plan.n_real_tasks == 12


def test_chunks_cover_each_set_once_within_the_micro_batch_size() -> None:
    eps = _uneven_episodes(16, seed=1)
    plan = _plan(eps, 4)
    seen = set()
    for slot in (s for r in plan.ranks for s in r):
        ep = slot.episode
        seen.add(slot.task_id)
        for chunks, items in ((slot.support_chunks, ep.support), (slot.query_chunks, ep.query)):
            flat = [i for c in chunks for i in c]
            assert sorted(flat) == list(range(len(items)))
            assert all(len(c) <= 4 for c in chunks)
            # fewer sequences than chunks: one per chunk, the rest dummies
            if len(items) <= len(chunks):
                assert sum(1 for c in chunks if not c) == len(chunks) - len(items)
            # similar lengths share a chunk: chunks are contiguous runs of the sorted lengths
            lens = [[items[i].n_tokens for i in c] for c in chunks if c]
            for a, b in zip(lens, lens[1:]):
                assert min(a) >= max(b)
    assert seen == set(range(16))


def test_grouping_by_length_cuts_padding() -> None:
    # Long and short sequences interleaved; 2 chunks of 4 -> the long ones share a chunk.
    lengths = [200, 10, 210, 12, 205, 11, 9, 198]
    ep = _episode("t", lengths, [5])
    plan = _plan([ep], 1, inner_steps=1)
    slot = plan.ranks[0][0]
    groups = [sorted(ep.support[i].n_tokens for i in c) for c in slot.support_chunks]
    assert groups == [[198, 200, 205, 210], [9, 10, 11, 12]]
    stats = plan_stats(plan, inner_steps=1, cost_model=CostModel())
    assert stats.padding_efficiency == pytest.approx((sum(lengths) + 5) / (4 * 210 + 4 * 12 + 5))
    assert stats.padding_efficiency > 0.95  # the given order would pad both chunks to ~205: 0.52


def test_spare_chunks_are_filled_before_dummies() -> None:
    # The big task needs 3 chunks; the small one spreads its 5 sequences over all 3 (the longest
    # alone) instead of packing them into 2 chunks plus a dummy pass.
    big = _episode("big", [50] * 12, [5])
    small = _episode("small", [100, 20, 21, 22, 19], [5])
    plan = _plan([big, small], 1, inner_steps=1)
    slot = next(s for s in plan.ranks[0] if s.task_id == 1)
    groups = [[small.support[i].n_tokens for i in c] for c in slot.support_chunks]
    assert groups == [[100], [22, 21], [20, 19]]
    tiny = _episode("tiny", [7], [5])
    plan = _plan([big, tiny], 1, inner_steps=1)
    slot = next(s for s in plan.ranks[0] if s.task_id == 1)
    assert slot.support_chunks == ((0,), (), ())


def test_uneven_meta_batch_gets_zero_weight_dummies_or_an_error() -> None:
    eps = _uneven_episodes(5, seed=2)
    plan = _plan(eps, 4)
    slots = [s for r in plan.ranks for s in r]
    assert {len(r) for r in plan.ranks} == {2}
    dummies = [s for s in slots if s.is_dummy]
    assert len(dummies) == 3 and all(s.weight == 0.0 and s.episode is None and s.task_id == -1 for s in dummies)
    assert all(all(c == () for c in s.support_chunks + s.query_chunks) for s in dummies)
    assert {len(s.support_chunks) for s in slots} == {len(slots[0].support_chunks)}
    assert plan.n_real_tasks == 5
    with pytest.raises(ValueError, match=r"meta_batch_size=5 does not divide by world_size=4"):
        _plan(eps, 4, on_uneven="error")


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


def test_rank_order_is_shuffled_by_the_generator() -> None:
    eps = _uneven_episodes(16, seed=3)
    heavy = set()
    for s in range(8):
        plan = _plan(eps, 4, rng=np.random.default_rng(s))
        loads = [sum(x.cost for x in r) for r in plan.ranks]
        heavy.add(int(np.argmax(loads)))
    assert len(heavy) > 1


def test_a_long_outlier_gets_a_chunk_of_its_own() -> None:
    big = _episode("big", [50] * 12, [5])  # needs 3 support chunks
    outlier = _episode("outlier", [45, 400, 47, 50, 46, 49, 48], [5])
    plan = _plan([big, outlier], 1, inner_steps=1)
    slot = next(s for s in plan.ranks[0] if s.task_id == 1)
    groups = [[outlier.support[i].n_tokens for i in c] for c in slot.support_chunks]
    # equal sizes would give [400, 50], [49, 48], [47, 46, 45]: 1039 padded tokens instead of 692
    assert groups == [[400], [50, 49], [48, 47, 46, 45]]


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


@pytest.mark.parametrize("collide", [False, True])
def test_length_cache_returns_true_lengths_for_hits_misses_and_after_eviction(collide: bool) -> None:
    cache = _LengthCache(max_entries=50)
    if collide:  # every id hashes to one table slot: all but one are found by searchsorted
        cache._MULT = np.uint64(0)
    pool = [make_example(n) for n in range(2, 42)]  # 40 distinct examples
    first = [pool[i] for i in (3, 3, 0, 39)]
    assert cache.lengths(first).tolist() == [5, 5, 2, 41]
    assert cache.lengths(first[::-1]).tolist() == [41, 2, 5, 5]  # every one a hit
    mixed = pool[:20] + [make_example(100)]  # hits and misses in one call
    assert cache.lengths(mixed).tolist() == list(range(2, 22)) + [100]
    assert cache.lengths(pool).tolist() == list(range(2, 42))  # overflows 50: cleared, refilled
    # stored examples stay alive, so a new object can never take a stored id
    kept = {id(ex) for batch in cache._keep for ex in batch}
    assert all(id(ex) in kept for ex in pool)
    fresh = [make_example(n) for n in (9, 3)]
    assert cache.lengths(fresh).tolist() == [9, 3]
    cache.clear()
    assert cache.lengths(pool[:2]).tolist() == [2, 3]
    too_many = [make_example(2) for _ in range(60)]  # more than it holds: answered, not stored
    assert cache.lengths(too_many).tolist() == [2] * 60
    assert cache._keys.size <= 50
    assert sum(map(len, cache._keep)) == cache._keys.size


def test_planning_leaves_the_garbage_collector_as_it_found_it() -> None:
    eps = _uneven_episodes(8, seed=4)
    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            _plan(eps, 2)
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()


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
