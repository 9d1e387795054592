"""Sequence lengths for planning: a cache keyed by example identity, and a pause of the collector.

Planning a 64 ranks x 32 tasks meta-batch reads ~32k sequence lengths and builds thousands of
small tuples; both helpers here keep that under a few milliseconds.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import threading
from typing import Iterator, Sequence

import numpy as np

_PROMPT = operator.attrgetter("prompt_ids")
_ANSWER = operator.attrgetter("answer_ids")


class LengthCache:
    """Token counts of examples seen before, keyed by object identity.

    Reading ``len(prompt_ids) + len(answer_ids)`` touches three scattered objects per example;
    over the ~32k examples of a 64 x 32 meta-batch that memory latency was the largest single
    cost of planning. The task layer caches its tokenized examples, so the same
    :class:`~fmmeta.tasks.episode.Example` objects come back step after step: the cache finds a
    whole meta-batch's ids with numpy alone, in a direct-mapped table (multiplicative hash of the
    id) and, for the few ids that lost a table slot to a collision, a ``searchsorted`` over all
    stored ids. (A python dict keyed by ``id`` is no faster: addresses share their low bits.)

    Safety: the cache holds a reference to every example it stores, so a stored id can never be
    reused by another object, and examples are frozen, so a stored length stays right. It is
    bounded (cleared when full) and locked (the prefetcher plans in a background thread).
    """

    _MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the high bits mix every id bit

    def __init__(self, max_entries: int = 1 << 16) -> None:
        self.max_entries = max_entries
        self._keys = np.empty(0, dtype=np.int64)  # sorted ids
        self._values = np.empty(0, dtype=np.int64)  # token counts, aligned with _keys
        self._keep: list[list] = []  # the stored examples, so no stored id can be reused
        self._lock = threading.Lock()
        self._index(self._keys, self._values)

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        return ((ids.view(np.uint64) * self._MULT) >> self._shift).astype(np.intp)

    def _index(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Stores sorted ``keys``/``values`` and rebuilds the table (about 4 slots per key)."""
        self._keys, self._values = keys, values
        bits = max(4, (4 * keys.size).bit_length())
        self._shift = np.uint64(64 - bits)
        self._table_keys = np.full(1 << bits, -1, dtype=np.int64)  # -1 is no object's id
        self._table_values = np.zeros(1 << bits, dtype=np.int64)
        slot = self._slots(keys)
        self._table_keys[slot] = keys  # on a collision the last key wins the slot
        self._table_values[slot] = values

    def _lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stored lengths of ``ids`` (0 where absent) and whether each was found."""
        slot = self._slots(ids)
        hit = self._table_keys[slot] == ids
        out = self._table_values[slot]
        rest = np.flatnonzero(~hit)
        if rest.size and self._keys.size:
            pos = np.searchsorted(self._keys, ids[rest])
            np.minimum(pos, self._keys.size - 1, out=pos)
            found = self._keys[pos] == ids[rest]
            out[rest[found]] = self._values[pos[found]]
            hit[rest[found]] = True
        return out, hit

    def lengths(self, flat: list) -> np.ndarray:
        """Token count of every example in ``flat`` (a list of ``Example``)."""
        n = len(flat)
        ids = np.fromiter(map(id, flat), dtype=np.int64, count=n)
        with self._lock:
            out, hit = self._lookup(ids)
            if hit.all():
                return out
            miss = np.flatnonzero(~hit)
            new_ex = list(flat) if miss.size == n else list(map(flat.__getitem__, miss.tolist()))
            # One pass that reads both tuples of an example while it is in cache.
            new_len = np.fromiter(
                map(operator.add, map(len, map(_PROMPT, new_ex)), map(len, map(_ANSWER, new_ex))),
                dtype=np.int64,
                count=len(new_ex),
            )
            out[miss] = new_len
            # Repeated ids are stored twice (searchsorted finds either): cheaper than deduping.
            if miss.size <= self.max_entries:
                keys, values = self._keys, self._values
                if keys.size + miss.size > self.max_entries:
                    keys, values = keys[:0], values[:0]
                    self._keep.clear()
                self._keep.append(new_ex)
                keys = np.concatenate([keys, ids[miss]])
                values = np.concatenate([values, new_len])
                order = np.argsort(keys, kind="stable")
                self._index(keys[order], values[order])
            return out

    def clear(self) -> None:
        """Drops every entry (and the references it held)."""
        with self._lock:
            self._keep.clear()
            self._index(self._keys[:0], self._values[:0])


LENGTHS = LengthCache()


def set_lengths(sets: Sequence[Sequence]) -> tuple[np.ndarray, np.ndarray]:
    """Flat sequence lengths of every set and the per-set counts (C-level loops: this is hot)."""
    counts = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
    flat = list(itertools.chain.from_iterable(sets))
    return LENGTHS.lengths(flat), counts




@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Holds off the cyclic garbage collector while a plan's ~25k small tuples are built.

    Every 700 new container objects trigger a young-generation collection; a 64 x 32 plan made
    dozens of them (about 10% of planning time) although index tuples of ints can never form a
    cycle. The collector is re-enabled afterwards (only if it was on), so the deferred objects are
    scanned once. Another thread toggling the collector meanwhile only shifts when it runs.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


