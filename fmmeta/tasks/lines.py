"""Padding-free lines: a pass's examples packed several to a row, so it carries little padding.

:func:`~fmmeta.tasks.episode.collate` pads every example to the pass's longest; few-shot rows
differ in length (a pass of the default suite is about a quarter padding), and a CPU pays for
every padded token as for a real one. :func:`collate_lines` instead lays the examples end to end
in rows ("lines") of one width, first-fit by decreasing length, each example's ``position_ids``
restarting at 0. Given those positions, no attention mask and no KV cache, transformers builds a
mask in which each example attends only to itself (``find_packed_sequence_indices``), so every
loss equals the padded pass's to float rounding; the row an answer token belongs to travels
with the batch (:class:`~fmmeta.tasks.episode.Lines`).

The width is chosen per pass to minimise lines x width, from the longest example up to
:data:`MAX_WIDTH_FACTOR` times it (longer lines would trade padding for attention over more
keys). Whether a model honours the layout is checked, not assumed
(:func:`fmmeta.algorithms.answer_loss.check_lines`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fmmeta.tasks.episode import IGNORE_INDEX, Batch, Example, Lines, collate, padded_length

MAX_WIDTH_FACTOR = 4
"""The widest line a pass may take, in multiples of its longest example."""

MIN_SAVING = 0.05
"""Lines are used only where they process at least this fraction fewer tokens than padding:
a line costs a little more per token (a mask per line, LoRA routed per token; SmolLM2 on CPU,
MetaICL passes whose lines held one example each: 2-6% slower than padded), so a pass they
barely shorten stays padded."""


def first_fit(lengths: Sequence[int], width: int) -> list[list[int]]:
    """Example indices of each line: first fit, longest first, into lines of ``width`` tokens."""
    free: list[int] = []
    lines: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        for li, room in enumerate(free):
            if lengths[i] <= room:
                free[li] -= lengths[i]
                lines[li].append(i)
                break
        else:
            free.append(width - lengths[i])
            lines.append([i])
    return lines


def line_layout(lengths: Sequence[int], pad_to_multiple_of: int | None = None,
                buckets: Sequence[int] = ()) -> tuple[int, list[list[int]]]:
    """``(width, lines)`` with the fewest padded tokens (lines x width) over the widths tried:
    for every line count ``L``, the narrowest width that could hold the tokens in ``L`` lines."""
    if not lengths:
        raise ValueError("line_layout() got no examples: a pass needs at least one sequence")
    longest, total = max(lengths), sum(lengths)
    widths = sorted({padded_length(max(longest, -(-total // n)), pad_to_multiple_of, buckets)
                     for n in range(1, len(lengths) + 1)})
    widest = max(widths[0], MAX_WIDTH_FACTOR * longest)
    best: tuple[int, int, list[list[int]]] | None = None
    for width in (w for w in widths if w <= widest):
        lines = first_fit(lengths, width)
        if best is None or len(lines) * width < best[0]:
            best = (len(lines) * width, width, lines)
    assert best is not None  # widths[0] <= widest
    return best[1], best[2]


def collate_lines(examples: Sequence[Example], pad_id: int, pad_to_multiple_of: int | None = None,
                  buckets: Sequence[int] = ()) -> Batch:
    """Packs ``examples`` into padding-free lines (see the module docstring), or pads them
    (:func:`~fmmeta.tasks.episode.collate`) where lines save under :data:`MIN_SAVING`.

    Raises:
        ValueError: if ``examples`` is empty.
    """
    lengths = [ex.n_tokens for ex in examples]
    width, layout = line_layout(lengths, pad_to_multiple_of, buckets)
    padded = padded_length(max(lengths), pad_to_multiple_of, buckets)
    if len(layout) * width > (1 - MIN_SAVING) * len(lengths) * padded:
        return collate(examples, pad_id, pad_to_multiple_of, buckets)
    shape = (len(layout), width)
    ids = np.full(shape, pad_id, dtype=np.int64)
    labels = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros(shape, dtype=np.int64)
    rows = np.full(shape, -1, dtype=np.int64)
    for li, members in enumerate(layout):
        start = 0
        for i in members:
            ex = examples[i]
            p, end = start + len(ex.prompt_ids), start + ex.n_tokens
            ids[li, start:p], ids[li, p:end], labels[li, p:end] = ex.prompt_ids, ex.answer_ids, ex.answer_ids
            positions[li, start:end] = np.arange(ex.n_tokens)
            rows[li, start:end] = i
            start = end
        positions[li, start:] = np.arange(width - start)  # the padding: a sequence of its own
    token_rows = torch.from_numpy(rows)
    return Batch(torch.from_numpy(ids), (token_rows >= 0).long(), torch.from_numpy(labels),
                 sum(len(ex.answer_ids) for ex in examples), sum(ex.n_tokens for ex in examples),
                 Lines(torch.from_numpy(positions), token_rows, len(examples)))


__all__ = ["MAX_WIDTH_FACTOR", "MIN_SAVING", "collate_lines", "first_fit", "line_layout"]
