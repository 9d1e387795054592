"""The planner's length cache and its pause of the garbage collector."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from fmmeta.sampling.lengths import LengthCache, gc_paused

from .conftest import make_example


@pytest.mark.parametrize("collide", [False, True])
def test_length_cache_returns_true_lengths_for_hits_misses_and_after_eviction(collide: bool) -> None:
    cache = LengthCache(max_entries=50)
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


def test_gc_pause_leaves_the_garbage_collector_as_it_found_it() -> None:
    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            with gc_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()


