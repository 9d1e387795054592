"""RaggedIds: rows of ids kept flat, cut and dropped without copying a token."""

from __future__ import annotations

import numpy as np
import pytest

from fmmeta.tasks.episode import Example
from fmmeta.tasks.ragged import LazyExamples, RaggedIds


def test_rows_lengths_and_views() -> None:
    rows = RaggedIds.from_lists([[1, 2, 3], [], [4, 5]])
    assert [rows.row(i) for i in range(3)] == [(1, 2, 3), (), (4, 5)]
    assert rows.lengths.tolist() == [3, 0, 2]
    kept = rows.take(np.array([True, False, True]))
    assert kept.values is rows.values and [kept.row(i) for i in range(2)] == [(1, 2, 3), (4, 5)]
    cut = rows.keep_last(np.array([2, 5, 1]))
    assert [cut.row(i) for i in range(3)] == [(2, 3), (), (5,)]
    assert rows.row_bytes(2) == np.array([4, 5], dtype=np.int64).tobytes()


def test_offsets_read_as_arrow_and_the_cache_store_them() -> None:
    rows = RaggedIds.from_offsets(np.arange(6, dtype=np.int32), np.array([0, 2, 2, 6]))
    assert [rows.row(i) for i in range(3)] == [(0, 1), (), (2, 3, 4, 5)]
    assert all(type(t) is int for t in rows.row(2))  # plain ints, as tokenizers give


def test_lazy_examples_index_slice_and_compare() -> None:
    made: list[int] = []

    def make(i: int) -> Example:
        made.append(i)
        return Example((i,), (i + 1,))

    lazy = LazyExamples(3, make)
    assert made == []  # nothing is made until read
    assert lazy[-1] == Example((2,), (3,)) and lazy[1:] == [Example((1,), (2,)), Example((2,), (3,))]
    assert lazy == tuple(make(i) for i in range(3)) and lazy != tuple(make(i) for i in range(2))
    with pytest.raises(IndexError):
        lazy[3]
