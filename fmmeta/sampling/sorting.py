"""Stable orders of a plan's rows, fast: the planners sort ~20,000 rows per meta-batch at 64 ranks.

numpy sorts keys of 16 bits or less with a radix sort when asked for a stable sort: ~12x faster
than its comparison sorts on 20,000 rows (0.09 ms against 1.1 ms). Rows' lengths, pass indices,
slots and example indices all fit 16 bits in any real meta-batch, so :func:`lex_order` sorts by
one key at a time, least significant first, each through the radix sort.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lex_order"]

_INT16 = np.iinfo(np.int16)


def lex_order(*keys: np.ndarray) -> np.ndarray:
    """``np.lexsort(keys)``: the indices that sort by the last key, then the one before it, and
    so on, ties in index order; through 16-bit radix sorts where every key fits 16 bits."""
    if not all(k.size == 0 or (_INT16.min <= int(k.min()) and int(k.max()) <= _INT16.max) for k in keys):
        return np.lexsort(keys)
    order = np.arange(keys[0].size)
    for key in keys:  # least significant first: each stable pass keeps the earlier keys' order in ties
        order = order[np.argsort(key[order].astype(np.int16), kind="stable")]
    return order
