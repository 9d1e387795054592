"""Padding-free lines: every example placed once, alone in its positions, with fewer padded tokens."""

from __future__ import annotations

import random

import pytest
import torch

from fmmeta.tasks.episode import IGNORE_INDEX, Example, collate
from fmmeta.tasks.lines import MAX_WIDTH_FACTOR, MIN_SAVING, collate_lines, first_fit, line_layout


def _examples(seed: int, n: int) -> list[Example]:
    rng = random.Random(seed)
    return [Example(tuple(rng.randrange(1, 50) for _ in range(rng.randint(1, 12))),
                    tuple(rng.randrange(1, 50) for _ in range(rng.randint(1, 4)))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_layout_places_every_example_once_within_its_width(seed) -> None:
    lengths = [ex.n_tokens for ex in _examples(seed, 3 + 4 * seed)]
    width, lines = line_layout(lengths)
    assert sorted(i for line in lines for i in line) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in line) <= width for line in lines)
    assert max(lengths) <= width <= MAX_WIDTH_FACTOR * max(lengths)
    # never more padded tokens than padding every example to the longest
    assert len(lines) * width <= len(lengths) * max(lengths)


def test_layout_fills_lines_and_rounds_the_width() -> None:
    assert line_layout([4, 4, 4, 4]) == (4, [[0], [1], [2], [3]])  # a tie goes to the narrower
    assert line_layout([4, 2, 2, 1]) == (9, [[0, 1, 2, 3]])
    assert line_layout([4, 3, 2, 1]) == (5, [[0, 3], [1, 2]])
    assert first_fit([5, 3, 2], 5) == [[0], [1, 2]]
    width, _ = line_layout([5, 3, 2], pad_to_multiple_of=8)
    assert width % 8 == 0
    with pytest.raises(ValueError, match="no examples"):
        line_layout([])


@pytest.mark.parametrize("seed", range(3))
def test_lines_hold_the_padded_batch_tokens_example_by_example(seed) -> None:
    examples = _examples(seed, 9)
    padded, lines = collate(examples, pad_id=0), collate_lines(examples, pad_id=0)
    assert lines.lines is not None and lines.n_rows == padded.n_rows == len(examples)
    assert (lines.n_answer_tokens, lines.n_tokens) == (padded.n_answer_tokens, padded.n_tokens)
    assert lines.n_padded_tokens < padded.n_padded_tokens
    assert torch.equal(lines.answers_per_row(), padded.answers_per_row())
    rows, positions = lines.lines.token_rows, lines.lines.position_ids
    for i, ex in enumerate(examples):
        at = rows == i
        assert int(at.sum()) == ex.n_tokens and int(at.any(dim=1).sum()) == 1  # one line, contiguous
        assert positions[at].tolist() == list(range(ex.n_tokens))
        assert lines.input_ids[at].tolist() == list(ex.prompt_ids + ex.answer_ids)
        assert lines.labels[at].tolist() == [IGNORE_INDEX] * len(ex.prompt_ids) + list(ex.answer_ids)
    pad = rows < 0
    assert not bool(lines.attention_mask[pad].any()) and bool((lines.labels[pad] == IGNORE_INDEX).all())


def test_a_pass_that_lines_barely_shorten_stays_padded() -> None:
    same = [Example((1, 2, 3), (4,)) for _ in range(5)]  # equal lengths: lines save nothing
    assert collate_lines(same, pad_id=0).lines is None
    short = [Example((1,) * 9, (2,))] + [Example((1,), (2,)) for _ in range(8)]  # one long, many short
    packed = collate_lines(short, pad_id=0)
    assert packed.lines is not None
    assert packed.n_padded_tokens <= (1 - MIN_SAVING) * collate(short, pad_id=0).n_padded_tokens
