"""Scoring a query set: mean loss per answer token and accuracy.

Accuracy depends on the task family:

* **classification** (the episode has ``choices``): verbalizer ranking. Every candidate answer is
  scored by the sum of its tokens' log-probabilities given the prompt; a query is correct when the
  gold candidate's score is strictly the highest (a tie counts as wrong, so a model that cannot tell
  the candidates apart never scores above zero by luck of the tie-break). All candidates of all
  queries are batched together.
* **generation** (no ``choices``): exact match under teacher forcing. A query is correct when every
  answer token is the argmax of the model's next-token distribution given the prompt and the gold
  answer tokens before it. By induction this is the same event as greedy decoding producing exactly
  the answer: the first answer token is the greedy choice after the prompt; if the first ``i`` greedy
  tokens equal the gold ones, the greedy model sees the same prefix as teacher forcing, so token
  ``i + 1`` agrees too. Because the task layer ends every answer with EOS, greedy decoding also stops
  right after the answer, so no trailing text can hide behind a matching prefix. One forward pass per
  micro-batch replaces a token-by-token decode.

The loss is the mean negative log-likelihood per answer token over the whole query set (gold answers),
in fp32: the same quantity the meta-algorithms report as the query loss.

Scoring runs under ``torch.no_grad()`` with the model in eval mode (dropout off), and puts the
model's train/eval flag back afterwards. Its number of forward passes depends only on the examples
and ``micro_batch_size``, so ranks of a ZeRO-3 run that score the same episodes stay in lockstep.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# One unwrapping rule (engine/peft wrappers) for both loss paths.
from fmmeta.algorithms.inner_loop import answer_logits
from fmmeta.tasks.episode import Batch, Episode, Example, collate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueryScore:
    """How well a model answers a query set.

    Attributes:
        loss: mean negative log-likelihood per gold answer token (nats), fp32.
        accuracy: fraction of queries answered correctly, in [0, 1] (verbalizer ranking for
            classification, exact match for generation).
        n: number of queries scored.
        n_answer_tokens: number of gold answer tokens the loss is averaged over.
    """

    loss: float
    accuracy: float
    n: int
    n_answer_tokens: int = 0


@dataclass(frozen=True)
class _SequenceScores:
    """Per-sequence results of teacher-forced forward passes."""

    logprob: torch.Tensor  # [N] sum of answer-token log-probabilities
    n_tokens: torch.Tensor  # [N] answer tokens per sequence
    all_argmax: torch.Tensor  # [N] bool: every answer token is the argmax


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _score_batch(model: nn.Module, batch: Batch) -> _SequenceScores:
    """Teacher-forced per-sequence log-probability and argmax agreement on answer tokens."""
    logits, tgt, rows = answer_logits(model, batch, use_cache=False)
    # Only the answer positions go through the (vocabulary-wide) softmax, in fp32.
    picked = logits.float()  # [M, V]
    token_logprob = F.log_softmax(picked, dim=-1).gather(1, tgt[:, None]).squeeze(1)
    token_ok = picked.argmax(dim=-1) == tgt
    n_seq = batch.input_ids.shape[0]
    seq_logprob = torch.zeros(n_seq, dtype=torch.float32, device=picked.device)
    seq_logprob.index_add_(0, rows, token_logprob)
    n_wrong = torch.zeros(n_seq, dtype=torch.float32, device=picked.device)
    n_wrong.index_add_(0, rows, (~token_ok).float())
    n_tok = torch.bincount(rows, minlength=n_seq)
    return _SequenceScores(seq_logprob.cpu(), n_tok.cpu(), (n_wrong == 0).cpu())


def _score_sequences(
    model: nn.Module, examples: Sequence[Example], pad_id: int, micro_batch_size: int
) -> _SequenceScores:
    """Scores ``examples`` in micro-batches and concatenates the per-sequence results."""
    device = _model_device(model)
    parts: list[_SequenceScores] = []
    for start in range(0, len(examples), micro_batch_size):
        batch = collate(examples[start : start + micro_batch_size], pad_id).to(device)
        parts.append(_score_batch(model, batch))
    return _SequenceScores(
        torch.cat([p.logprob for p in parts]),
        torch.cat([p.n_tokens for p in parts]),
        torch.cat([p.all_argmax for p in parts]),
    )


def _check_classification(
    examples: Sequence[Example], choices: Sequence[Sequence[int]]
) -> None:
    if len(choices) < 2:
        raise ValueError(
            f"choices has {len(choices)} candidate(s): verbalizer ranking needs at least 2; "
            "pass choices=None to score a generation task by exact match"
        )
    for i, c in enumerate(choices):
        if len(c) == 0:
            raise ValueError(f"choices[{i}] is empty: every candidate answer needs >= 1 token")
    for i, ex in enumerate(examples):
        if ex.label is None or not 0 <= ex.label < len(choices):
            raise ValueError(
                f"query[{i}].label={ex.label!r} is invalid for {len(choices)} choices: "
                f"classification queries need a label in [0, {len(choices) - 1}]"
            )


def score_query(
    model: nn.Module,
    episode_or_examples: Episode | Sequence[Example],
    pad_id: int,
    *,
    choices: Sequence[Sequence[int]] | None = None,
    micro_batch_size: int = 8,
) -> QueryScore:
    """Scores a query set: mean loss per answer token and accuracy.

    Args:
        model: a causal LM (plain, peft-wrapped or engine-wrapped module) whose forward takes
            ``input_ids`` and ``attention_mask`` and returns ``logits``.
        episode_or_examples: an episode (its ``query`` is scored and its ``choices`` used unless
            ``choices`` is given) or the query examples themselves, e.g.
            ``episode.in_context_query()`` for in-context scoring.
        pad_id: padding token id.
        choices: candidate answers for verbalizer ranking; ``None`` scores by exact match.
        micro_batch_size: sequences per forward pass (candidates count one sequence each).

    Returns:
        The query score. An empty query set raises rather than returning a meaningless 0.

    Raises:
        ValueError: on an empty query set, a bad ``micro_batch_size`` or labels that do not index
            ``choices``.

    Example:
        >>> s = score_query(model, episode, tokenizer.pad_token_id)        # doctest: +SKIP
        >>> s_icl = score_query(model, episode.in_context_query(), pad_id,
        ...                     choices=episode.choices)                     # doctest: +SKIP
    """
    if isinstance(episode_or_examples, Episode):
        examples: Sequence[Example] = episode_or_examples.query
        if choices is None:
            choices = episode_or_examples.choices
    else:
        examples = episode_or_examples
    if len(examples) == 0:
        raise ValueError("score_query() got no query examples: an episode needs >= 1 query")
    if micro_batch_size < 1:
        raise ValueError(
            f"micro_batch_size={micro_batch_size} is invalid: it must be >= 1 (sequences per pass)"
        )
    for i, ex in enumerate(examples):
        if len(ex.answer_ids) == 0 or len(ex.prompt_ids) == 0:
            raise ValueError(
                f"query[{i}] has {len(ex.prompt_ids)} prompt and {len(ex.answer_ids)} answer tokens: "
                "scoring needs >= 1 of each (the first answer token is predicted from the prompt)"
            )
    if choices is not None:
        _check_classification(examples, choices)

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if choices is None:
                return _score_generation(model, examples, pad_id, micro_batch_size)
            return _score_classification(model, examples, choices, pad_id, micro_batch_size)
    finally:
        model.train(was_training)


def score_passes(
    episode_or_examples: Episode | Sequence[Example],
    *,
    choices: Sequence[Sequence[int]] | None = None,
    micro_batch_size: int = 8,
) -> int:
    """The number of forward passes :func:`score_query` runs with the same arguments.

    Known before scoring, so ranks of a ZeRO-3 run can agree on how many passes to run (the one
    with fewer pads with dummy passes) before any of them starts.
    """
    if isinstance(episode_or_examples, Episode):
        examples: Sequence[Example] = episode_or_examples.query
        if choices is None:
            choices = episode_or_examples.choices
    else:
        examples = episode_or_examples

    def passes(n: int) -> int:
        return -(-n // micro_batch_size)

    if choices is None:
        return passes(len(examples))
    n = passes(len(examples) * len(choices))
    gold_is_choice = all(
        ex.label is not None and 0 <= ex.label < len(choices)
        and tuple(ex.answer_ids) == tuple(choices[ex.label])
        for ex in examples
    )
    return n if gold_is_choice else n + passes(len(examples))


def _score_generation(
    model: nn.Module, examples: Sequence[Example], pad_id: int, micro_batch_size: int
) -> QueryScore:
    s = _score_sequences(model, examples, pad_id, micro_batch_size)
    n_tok = int(s.n_tokens.sum())
    return QueryScore(
        loss=float(-s.logprob.sum() / n_tok),
        accuracy=float(s.all_argmax.float().mean()),
        n=len(examples),
        n_answer_tokens=n_tok,
    )


def _score_classification(
    model: nn.Module,
    examples: Sequence[Example],
    choices: Sequence[Sequence[int]],
    pad_id: int,
    micro_batch_size: int,
) -> QueryScore:
    n_c = len(choices)
    cands = [Example(ex.prompt_ids, tuple(c), ex.label) for ex in examples for c in choices]
    s = _score_sequences(model, cands, pad_id, micro_batch_size)
    scores = s.logprob.view(len(examples), n_c)
    labels = torch.tensor([ex.label for ex in examples], dtype=torch.long)
    gold = scores.gather(1, labels[:, None])
    others = scores.clone()
    others.scatter_(1, labels[:, None], float("-inf"))
    correct = gold.squeeze(1) > others.max(dim=1).values
    accuracy = float(correct.float().mean())

    gold_is_choice = all(
        ex.label is not None and tuple(ex.answer_ids) == tuple(choices[ex.label]) for ex in examples
    )
    if gold_is_choice:
        # The gold answers were among the candidates: reuse their log-probabilities.
        n_tok = int(s.n_tokens.view(len(examples), n_c).gather(1, labels[:, None]).sum())
        loss = float(-gold.sum() / n_tok)
    else:
        g = _score_sequences(model, examples, pad_id, micro_batch_size)
        n_tok = int(g.n_tokens.sum())
        loss = float(-g.logprob.sum() / n_tok)
    return QueryScore(loss=loss, accuracy=accuracy, n=len(examples), n_answer_tokens=n_tok)
