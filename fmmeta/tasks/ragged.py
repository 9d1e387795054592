"""Rows of token ids of different lengths, stored flat: one values array and each row's span.

A collection of a million examples holds hundreds of millions of token ids. As Python lists of
ints they take ~36 bytes an id (5 GB for 150M), and every rank of a node holds its own copy; as
one int32 array they take 4 bytes, and read from a memory-mapped cache file they take nothing
until a row is read (the page cache is shared by every process of the machine). A task keeps its
prompts (and answers) as :class:`RaggedIds`; an episode turns the few rows it draws into tuples.

Fitting a row to a token budget is moving its start (cutting from the left) and dropping a row is
leaving its span out, so neither copies a token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

import numpy as np

from fmmeta.tasks.episode import Example

IDS_DTYPE = np.int32
"""Token ids fit 31 bits for every vocabulary there is; the cache stores them so."""


class RaggedIds:
    """Rows of token ids: row ``i`` is ``values[starts[i]:ends[i]]``.

    Args:
        values: every row's ids, back to back (a memory-mapped array is read in place).
        starts: where each row begins in ``values``.
        ends: where each row ends (exclusive).

    Example:
        >>> rows = RaggedIds.from_lists([[1, 2, 3], [4]])
        >>> rows.row(0), rows.lengths.tolist()
        ((1, 2, 3), [3, 1])
    """

    __slots__ = ("values", "starts", "ends")

    def __init__(self, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        if starts.shape != ends.shape:
            raise ValueError(f"RaggedIds: {starts.shape} starts but {ends.shape} ends")
        self.values = values
        self.starts = np.asarray(starts, dtype=np.int64)
        self.ends = np.asarray(ends, dtype=np.int64)

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]]) -> RaggedIds:
        """Rows given as Python sequences (a builder's freshly tokenized ids), copied flat."""
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        ends = np.cumsum(lengths)
        total = int(ends[-1]) if len(ends) else 0
        values = np.fromiter((t for r in rows for t in r), dtype=IDS_DTYPE, count=total)
        return cls(values, ends - lengths, ends)

    @classmethod
    def of(cls, rows: RaggedIds | Sequence[Sequence[int]]) -> RaggedIds:
        """``rows`` as :class:`RaggedIds` (as they are, or copied flat from Python sequences)."""
        return rows if isinstance(rows, RaggedIds) else cls.from_lists(rows)

    @classmethod
    def from_offsets(cls, values: np.ndarray, offsets: np.ndarray) -> RaggedIds:
        """Rows as Arrow and the cache store them: row ``i`` spans ``offsets[i]:offsets[i + 1]``."""
        return cls(values, offsets[:-1], offsets[1:])

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens in each row."""
        return self.ends - self.starts

    def row(self, i: int) -> tuple[int, ...]:
        """Row ``i`` as a tuple of Python ints (what an :class:`~fmmeta.tasks.episode.Example` holds)."""
        return tuple(self.values[self.starts[i] : self.ends[i]].tolist())

    def take(self, index: np.ndarray) -> RaggedIds:
        """The rows at ``index`` (positions or a boolean mask), sharing ``values``."""
        return RaggedIds(self.values, self.starts[index], self.ends[index])

    def keep_last(self, room: np.ndarray | int) -> RaggedIds:
        """Each row cut from the left to its last ``room`` ids (rows no longer stay as they are)."""
        return RaggedIds(self.values, np.maximum(self.starts, self.ends - room), self.ends)

    def row_bytes(self, i: int) -> bytes:
        """Row ``i`` as int64 bytes, whatever the stored dtype (what fingerprints hash)."""
        return self.values[self.starts[i] : self.ends[i]].astype(np.int64).tobytes()


class LazyExamples(Sequence[Example]):
    """A task's examples, each made when it is read: the task keeps ids, not ``Example`` objects,
    so the list of a million examples costs nothing until someone walks it."""

    __slots__ = ("_n", "_make")

    def __init__(self, n: int, make: Callable[[int], Example]) -> None:
        self._n = n
        self._make = make

    def __len__(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        """Equal to another sequence of the same examples (as the tuple tasks once held was)."""
        if not isinstance(other, (LazyExamples, tuple, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, i: int) -> Example: ...

    @overload
    def __getitem__(self, i: slice) -> list[Example]: ...

    def __getitem__(self, i: int | slice) -> Example | list[Example]:
        if isinstance(i, slice):
            return [self._make(k) for k in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(f"example {i} of {self._n}")
        return self._make(i % self._n)


__all__ = ["IDS_DTYPE", "LazyExamples", "RaggedIds"]
