"""lex_order is np.lexsort, through radix sorts where the keys fit 16 bits and without them where not."""

from __future__ import annotations

import numpy as np
import pytest

from fmmeta.sampling.sorting import lex_order


@pytest.mark.parametrize("high", [5, 30_000, 1 << 40])
@pytest.mark.parametrize("n_keys", [1, 3])
def test_lex_order_equals_lexsort(high: int, n_keys: int) -> None:
    rng = np.random.default_rng(high + n_keys)
    keys = tuple(rng.integers(-high, high, 5_000) for _ in range(n_keys))
    assert np.array_equal(lex_order(*keys), np.lexsort(keys))  # ties (many at high=5) in index order


def test_lex_order_of_nothing() -> None:
    assert lex_order(np.array([], dtype=np.int64)).size == 0
