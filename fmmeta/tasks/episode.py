"""Episodes: the unit of work every other layer consumes.

An :class:`Example` is one tokenized (prompt, answer) pair, tokenized once and cached by the task
layer. An :class:`Episode` is a support set and a query set drawn from one task. Assembling an
episode only gathers cached token ids; :func:`collate` turns a list of examples into padded
tensors whose labels cover the answer tokens only, so no prompt or padding token is ever trained on.

The two uses of an episode share this module:

* support as inner-loop training data: each support example is its own sequence
  (``collate(episode.support, ...)``);
* support as in-context demonstrations (MetaICL style): :meth:`Episode.in_context_query`
  prepends the support examples to each query, and the loss still covers only the query's answer;
  :meth:`Episode.in_context` formats support and query alike, for an inner loop that adapts on
  in-context rows (each support example with the others as demonstrations).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

IGNORE_INDEX = -100
"""Label value that the causal-LM loss skips (transformers' convention)."""


@dataclass(frozen=True, slots=True)
class Example:
    """One tokenized example.

    Attributes:
        prompt_ids: token ids of the prompt (no loss on these).
        answer_ids: token ids of the answer, ending with EOS where the tokenizer has one (loss on these).
        label: index of the answer among ``Episode.choices`` for classification tasks, or among
            ``options`` for multiple-choice questions, else ``None``.
        options: a multiple-choice question's own answer candidates (token ids, EOS included),
            which change from question to question; ``answer_ids`` is ``options[label]``, so
            training on an example is training on its gold option. ``None`` for other tasks.
    """

    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]
    label: int | None = None
    options: tuple[tuple[int, ...], ...] | None = None

    @property
    def n_tokens(self) -> int:
        """Sequence length in tokens (prompt + answer)."""
        return len(self.prompt_ids) + len(self.answer_ids)


@dataclass(frozen=True)
class Episode:
    """A support set and a query set drawn from one task, without overlap.

    Attributes:
        task: name of the task the episode was drawn from.
        support: examples the model adapts on.
        query: examples the adapted model is scored on.
        shots: support examples per class (classification) or support size (other tasks).
        ways: number of classes for classification episodes, ``None`` otherwise.
        choices: tokenized answer candidates (label words) for verbalizer ranking in classification
            episodes; ``Example.label`` indexes into it. ``None`` for generation and
            multiple-choice tasks (a question carries its own ``Example.options``).
        separator_ids: tokens placed between in-context demonstrations and the query.
    """

    task: str
    support: tuple[Example, ...]
    query: tuple[Example, ...]
    shots: int
    ways: int | None = None
    choices: tuple[tuple[int, ...], ...] | None = None
    separator_ids: tuple[int, ...] = field(default=())

    @property
    def support_lengths(self) -> list[int]:
        """Token count of each support sequence (what a cost model needs)."""
        return [ex.n_tokens for ex in self.support]

    @property
    def query_lengths(self) -> list[int]:
        """Token count of each query sequence."""
        return [ex.n_tokens for ex in self.query]

    def _demonstrations(self, skip: int | None = None) -> tuple[int, ...]:
        """The support examples (all, or all but ``skip``) as one run of demonstration tokens."""
        demos: list[int] = []
        for i, ex in enumerate(self.support):
            if i != skip:
                demos.extend(ex.prompt_ids)
                demos.extend(ex.answer_ids)
                demos.extend(self.separator_ids)
        return tuple(demos)

    def in_context_query(self, max_length: int | None = None) -> tuple[Example, ...]:
        """Queries with every support example prepended as a demonstration (MetaICL style).

        The demonstrations (prompt and answer) become part of the prompt, so the loss still covers
        only the query's own answer tokens.

        Args:
            max_length: longest sequence (prompt + answer) to return; a longer one loses tokens from
                the left of its prompt (the oldest demonstrations first, as tasks truncate long
                prompts), so the query and its answer always survive. ``None`` keeps everything.
        """
        prefix = self._demonstrations()
        return tuple(_with_prefix(prefix, ex, max_length) for ex in self.query)

    def in_context_support(self, max_length: int | None = None) -> tuple[Example, ...]:
        """Support examples, each with the *other* support examples prepended as demonstrations
        (leave one out): the rows an in-context inner loop adapts on, so adaptation sees the
        format the query is scored in. Truncated as :meth:`in_context_query`."""
        return tuple(_with_prefix(self._demonstrations(skip=i), ex, max_length)
                     for i, ex in enumerate(self.support))

    def in_context(self, max_length: int | None = None) -> Episode:
        """This episode in the in-context format: :meth:`in_context_support` as its support and
        :meth:`in_context_query` as its query (``algorithm.inner_format=in_context``)."""
        return dataclasses.replace(self, support=self.in_context_support(max_length),
                                   query=self.in_context_query(max_length))


def _with_prefix(prefix: tuple[int, ...], ex: Example, max_length: int | None) -> Example:
    """``ex`` with ``prefix`` before its prompt, the prompt cut from the left to fit ``max_length``."""
    prompt = prefix + ex.prompt_ids
    if max_length is not None and len(prompt) + len(ex.answer_ids) > max_length:
        prompt = prompt[-max(max_length - len(ex.answer_ids), 1) :]
    return Example(prompt, ex.answer_ids, ex.label, ex.options)


@dataclass(frozen=True)
class Batch:
    """Padded tensors for one micro-batch of a causal LM.

    Attributes:
        input_ids: ``[B, T]`` token ids, right-padded.
        attention_mask: ``[B, T]``, 1 on real tokens.
        labels: ``[B, T]``, the token id on answer tokens and ``IGNORE_INDEX`` elsewhere.
        n_answer_tokens: number of labelled tokens (the loss normaliser).
        n_tokens: number of real (non-pad) tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    n_answer_tokens: int
    n_tokens: int
    lines: Lines | None = None
    """Set when several examples share a row (padding-free lines, :mod:`fmmeta.tasks.lines`)."""

    @property
    def n_padded_tokens(self) -> int:
        """Tokens processed including padding (``B * T``)."""
        return int(self.input_ids.numel())

    @property
    def n_rows(self) -> int:
        """Examples in the batch (rows of its tensors, unless they are padding-free lines)."""
        return int(self.input_ids.shape[0]) if self.lines is None else self.lines.n_rows

    def answers_per_row(self) -> torch.Tensor:
        """``[n_rows]`` int64 answer tokens of each example."""
        labelled = self.labels != IGNORE_INDEX
        if self.lines is None:
            return labelled.sum(dim=1)
        rows = self.lines.token_rows[labelled]
        return torch.zeros(self.n_rows, dtype=torch.long, device=rows.device).index_add_(
            0, rows, torch.ones_like(rows))

    def to(self, device: torch.device | str) -> "Batch":
        """Returns the batch on ``device``."""
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.labels.to(device),
            self.n_answer_tokens,
            self.n_tokens,
            None if self.lines is None else self.lines.to(device),
        )


@dataclass(frozen=True)
class Lines:
    """How examples sit in the rows of a padding-free :class:`Batch`: several per row, each
    restarting its positions at 0, so the model sees each one alone (transformers splits a row
    into sequences where ``position_ids`` restart, given no attention mask and no cache).

    Attributes:
        position_ids: ``[L, W]`` each token's position within its own example (padding at a row's
            end restarts too, a sequence of its own that nothing attends to).
        token_rows: ``[L, W]`` int64 the example each token belongs to (``-1`` on padding).
        n_rows: examples in the batch.
    """

    position_ids: torch.Tensor
    token_rows: torch.Tensor
    n_rows: int

    def to(self, device: torch.device | str) -> "Lines":
        """Returns the layout on ``device``."""
        return Lines(self.position_ids.to(device), self.token_rows.to(device), self.n_rows)


def padded_length(n: int, pad_to_multiple_of: int | None, buckets: Sequence[int] = ()) -> int:
    """``n`` raised to the smallest of ``buckets`` (ascending widths) that holds it, if one does,
    then rounded up to a multiple of ``pad_to_multiple_of`` (``None``: no rounding).

    Buckets give a run's passes a few fixed widths (``sampler.length_buckets``): a compiled graph
    or a CUDA graph of a fixed shape is then reused instead of being made for every width."""
    for b in buckets:
        if b >= n:
            n = b
            break
    step = pad_to_multiple_of or 1
    return -(-n // step) * step


def collate(
    examples: Sequence[Example], pad_id: int, pad_to_multiple_of: int | None = None,
    buckets: Sequence[int] = (),
) -> Batch:
    """Pads ``examples`` into one :class:`Batch` with labels on answer tokens only.

    Args:
        examples: at least one example.
        pad_id: token id used for padding (never labelled).
        pad_to_multiple_of: round the padded length up to this multiple (tensor-core friendly).
        buckets: ascending widths; the padded length is the smallest that holds the longest
            example (:func:`padded_length`).

    Raises:
        ValueError: if ``examples`` is empty.
    """
    if not examples:
        raise ValueError("collate() got no examples: a micro-batch needs at least one sequence")
    width = padded_length(max(ex.n_tokens for ex in examples), pad_to_multiple_of, buckets)
    # Fill numpy buffers row by row and convert once: one tensor per batch, not per row.
    n = len(examples)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    labels = np.full((n, width), IGNORE_INDEX, dtype=np.int64)
    lengths = np.empty(n, dtype=np.int64)
    n_answer = 0
    for i, ex in enumerate(examples):
        p, a = len(ex.prompt_ids), len(ex.answer_ids)
        ids[i, :p] = ex.prompt_ids
        ids[i, p : p + a] = ex.answer_ids
        labels[i, p : p + a] = ex.answer_ids
        lengths[i] = p + a
        n_answer += a
    attention_mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    input_ids = torch.from_numpy(ids)
    n_real = int(lengths.sum())
    return Batch(
        input_ids, torch.from_numpy(attention_mask), torch.from_numpy(labels), n_answer, n_real
    )
