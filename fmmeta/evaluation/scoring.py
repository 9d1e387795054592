"""Scoring a query set: mean loss per answer token and accuracy.

Accuracy depends on the task family:

* **classification** (the episode has ``choices``): verbalizer ranking. Every candidate answer is
  scored by the sum of its tokens' log-probabilities given the prompt; a query is correct when the
  gold candidate's score is strictly the highest (a tie counts as wrong, so a model that cannot tell
  the candidates apart never scores above zero by luck of the tie-break).
* **multiple choice** (each query carries its own ``Example.options``): the same ranking over
  the query's own options. Options differ in length, so accuracy is also reported by the mean
  log-probability per option token (``accuracy_per_token``, lm-eval-harness's length-normalised
  variant, by tokens rather than bytes); the summed log-probability stays the headline
  (``accuracy``), as for classification, since the options end with EOS and per-token means favour
  long options the model merely continues well.
* **generation** (no ``choices``, no options): exact match under teacher forcing. A query is correct when every
  answer token is the argmax of the model's next-token distribution given the prompt and the gold
  answer tokens before it. By induction this is the same event as greedy decoding producing exactly
  the answer: the first answer token is the greedy choice after the prompt; if the first ``i`` greedy
  tokens equal the gold ones, the greedy model sees the same prefix as teacher forcing, so token
  ``i + 1`` agrees too. Because the task layer ends every answer with EOS, greedy decoding also stops
  right after the answer, so no trailing text can hide behind a matching prefix. One forward pass per
  micro-batch replaces a token-by-token decode.

Each forward pass scores ``micro_batch_size`` queries with all their candidates as one row in which
every shared prefix is encoded once (:mod:`fmmeta.evaluation.prefix_tree`): a prompt once for all
its label words, and in-context demonstrations once for all the queries that carry them. The
scores equal one sequence per candidate up to float rounding.

The loss is the mean negative log-likelihood per answer token over the whole query set (gold answers),
in fp32: the same quantity the meta-algorithms report as the query loss.

Scoring runs under ``torch.no_grad()`` with the model in eval mode (dropout off), and puts the
model's train/eval flag back afterwards. Its number of forward passes depends only on the examples
and ``micro_batch_size``, so ranks of a ZeRO-3 run that score the same episodes stay in lockstep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# One unwrapping rule (engine/peft wrappers) for both loss paths.
from fmmeta.algorithms.answer_loss import logits_at
from fmmeta.evaluation.prefix_tree import build_tree, count_nodes, tree_inputs
from fmmeta.tasks.episode import Episode, Example

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
        accuracy_per_token: for ranked candidates (classification, multiple choice), the accuracy
            when each candidate is ranked by its mean log-probability per token; ``None`` for
            generation.
        correct: per query, whether it was answered correctly (what ``accuracy`` averages).
        gold_logprob: per query, the summed log-probability of its gold answer's tokens.
    """

    loss: float
    accuracy: float
    n: int
    n_answer_tokens: int = 0
    accuracy_per_token: float | None = None
    correct: tuple[bool, ...] = ()
    gold_logprob: tuple[float, ...] = ()


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


def _model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the model computes in (what an additive attention mask must have)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


_Sequence = tuple[tuple[int, ...], tuple[int, ...]]
Route = Callable[[torch.Tensor], None]
"""Called before each pass with the query set (task) of each of its rows: how a caller that
holds several tasks' fast weights (:class:`~fmmeta.algorithms.task_lora.TaskLoRA`) routes them."""


def _score_trees(model: nn.Module, rows: Sequence[Sequence[_Sequence]], tasks: Sequence[int],
                 route: Route | None) -> list[_SequenceScores]:
    """One forward pass: row ``i`` holds the sequences ``rows[i]`` as a prefix tree
    (:mod:`.prefix_tree`) and belongs to query set ``tasks[i]``; returns each row's teacher-forced
    log-probability and argmax agreement per sequence."""
    trees = [build_tree(seqs) for seqs in rows]
    device = _model_device(model)
    inputs = tree_inputs(trees, _model_dtype(model), device)
    if route is not None:
        route(torch.tensor(list(tasks), dtype=torch.long, device=device))
    width = inputs["input_ids"].shape[1]
    # One head row per predictor node; several answer tokens may share one (the last prompt
    # token predicts the first token of every candidate).
    flat = [i * width + t.predictor for i, t in enumerate(trees)]
    nodes, index = np.unique(np.concatenate(flat), return_inverse=True)
    need = torch.zeros(len(trees) * width, dtype=torch.bool)
    need[torch.from_numpy(nodes)] = True
    logits = logits_at(model, need.view(len(trees), width).to(device), use_cache=False, **inputs)
    logprob = F.log_softmax(logits.float(), dim=-1)  # [U, V], only the needed positions
    argmax = logprob.argmax(dim=-1)
    out: list[_SequenceScores] = []
    lo = 0
    for t in trees:
        hi = lo + t.predictor.shape[0]
        at = torch.from_numpy(index.reshape(-1)[lo:hi]).to(device)
        tgt = torch.from_numpy(t.target).to(device)
        seq = torch.from_numpy(t.sequence).to(device)
        n_seq = int(t.sequence.max()) + 1
        token_logprob = logprob[at, tgt]
        wrong = (argmax[at] != tgt).float()
        out.append(_SequenceScores(
            torch.zeros(n_seq, device=device).index_add_(0, seq, token_logprob).cpu(),
            torch.bincount(seq, minlength=n_seq).cpu(),
            (torch.zeros(n_seq, device=device).index_add_(0, seq, wrong) == 0).cpu(),
        ))
        lo = hi
    return out


SCORE_PASS_TOKENS = 4096
"""Padded tokens (rows x widest row) per scoring pass, or one row if it is wider. A pass's
attention is dense over its row (``rows x heads x width^2`` scores), so rows of demonstrations
and long passages grouped 16 episodes to a pass held gigabytes; with this bound a pass of short
rows still holds every episode of its group, and long rows go a few to a pass."""


def _chunks(per_set: Sequence[Sequence[Sequence[_Sequence]]], micro_batch_size: int
            ) -> list[list[Sequence[Sequence[_Sequence]]]]:
    """Per set, its queries in consecutive chunks of ``micro_batch_size`` (one row each)."""
    return [[qs[i : i + micro_batch_size] for i in range(0, len(qs), micro_batch_size)] for qs in per_set]


def _passes(chunks: Sequence[Sequence[Sequence[Sequence[_Sequence]]]], max_tokens: int
            ) -> list[tuple[int, list[int]]]:
    """``(k, sets)`` per pass: chunk ``k`` of every set that has one, cut into passes of at most
    ``max_tokens`` padded tokens (one row at least). A pure function of the sequences, so every
    rank plans the same passes."""
    out: list[tuple[int, list[int]]] = []
    for k in range(max(len(c) for c in chunks)):
        current: list[int] = []
        width = 0
        for j in (j for j, c in enumerate(chunks) if k < len(c)):
            w = count_nodes([seq for q in chunks[j][k] for seq in q])
            if current and (len(current) + 1) * max(width, w) > max_tokens:
                out.append((k, current))
                current, width = [], 0
            current.append(j)
            width = max(width, w)
        out.append((k, current))
    return out


def _score_sets(model: nn.Module, per_set: Sequence[Sequence[Sequence[_Sequence]]],
                micro_batch_size: int, route: Route | None, max_tokens: int) -> list[list[_SequenceScores]]:
    """Scores every query's sequences of every set; a pass holds the ``k``-th chunk of
    ``micro_batch_size`` queries of several sets, a row each (:func:`_passes`). Returns, per set
    and per query, that query's sequences' scores."""
    chunks = _chunks(per_set, micro_batch_size)
    out: list[list[_SequenceScores]] = [[] for _ in per_set]
    for k, tasks in _passes(chunks, max_tokens):
        rows = [[seq for q in chunks[j][k] for seq in q] for j in tasks]
        for j, s in zip(tasks, _score_trees(model, rows, tasks, route)):
            bounds = np.cumsum([0, *(len(q) for q in chunks[j][k])])
            out[j].extend(
                _SequenceScores(s.logprob[lo:hi], s.n_tokens[lo:hi], s.all_argmax[lo:hi])
                for lo, hi in zip(bounds[:-1], bounds[1:])
            )
    return out


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


@dataclass(frozen=True)
class QuerySet:
    """Query examples to score together, and the candidates of a classification task."""

    examples: Sequence[Example]
    choices: Sequence[Sequence[int]] | None = None

    @classmethod
    def of(cls, episode_or_examples: Episode | Sequence[Example],
           choices: Sequence[Sequence[int]] | None = None) -> QuerySet:
        """An episode's query (and its ``choices`` unless given), or the examples themselves."""
        if isinstance(episode_or_examples, Episode):
            return cls(episode_or_examples.query,
                       episode_or_examples.choices if choices is None else choices)
        return cls(episode_or_examples, choices)

    def check(self) -> None:
        """Refuses what cannot be scored (see :func:`score_query`)."""
        if len(self.examples) == 0:
            raise ValueError("score_query() got no query examples: an episode needs >= 1 query")
        for i, ex in enumerate(self.examples):
            if len(ex.answer_ids) == 0 or len(ex.prompt_ids) == 0:
                raise ValueError(
                    f"query[{i}] has {len(ex.prompt_ids)} prompt and {len(ex.answer_ids)} answer "
                    "tokens: scoring needs >= 1 of each (the first answer token is predicted from "
                    "the prompt)"
                )
        with_options = [ex.options is not None for ex in self.examples]
        if any(with_options) and (not all(with_options) or self.choices is not None):
            raise ValueError(
                "a query set mixes multiple-choice questions (their own options) with "
                + ("a task's choices" if self.choices is not None else "queries without options")
                + ": score each kind of task in its own query set"
            )
        if self.choices is not None:
            _check_classification(self.examples, self.choices)

    def _candidates(self, ex: Example) -> list[tuple[int, ...]] | None:
        """The answers ``ex`` is ranked among: the task's choices, its own options, or None."""
        if self.choices is not None:
            return [tuple(c) for c in self.choices]
        return None if ex.options is None else [tuple(o) for o in ex.options]

    def sequences(self) -> list[list[_Sequence]]:
        """Per query, the sequences its score needs: the gold answer (generation); every
        candidate, then the gold answer where it is none of them (classification, multiple
        choice)."""
        out: list[list[_Sequence]] = []
        for ex in self.examples:
            prompt, gold, cands = tuple(ex.prompt_ids), tuple(ex.answer_ids), self._candidates(ex)
            if cands is None:
                out.append([(prompt, gold)])
            else:
                out.append([(prompt, c) for c in cands] + ([] if gold in cands else [(prompt, gold)]))
        return out

    def summarise(self, per_query: Sequence[_SequenceScores]) -> QueryScore:
        """The set's score from its queries' sequence scores (in :meth:`sequences` order)."""
        if self._candidates(self.examples[0]) is None:
            n_tok = int(sum(int(q.n_tokens.sum()) for q in per_query))
            matched = [bool(q.all_argmax.all()) for q in per_query]
            return QueryScore(
                loss=float(-sum(float(q.logprob.sum()) for q in per_query) / n_tok),
                accuracy=float(np.mean(matched)),
                n=len(self.examples), n_answer_tokens=n_tok, correct=tuple(matched),
                gold_logprob=tuple(float(q.logprob.sum()) for q in per_query),
            )
        correct, per_token, gold_logprob, n_tok = 0, 0, 0.0, 0
        each_correct: list[bool] = []
        each_gold: list[float] = []
        for ex, q in zip(self.examples, per_query):
            cands = self._candidates(ex)
            assert ex.label is not None and cands is not None  # checked by check()
            scores = q.logprob[: len(cands)]
            each_correct.append(bool(_ranked_first(scores, ex.label)))
            correct += each_correct[-1]
            per_token += _ranked_first(scores / q.n_tokens[: len(cands)], ex.label)
            gold = tuple(ex.answer_ids)
            g = cands.index(gold) if gold in cands else len(cands)
            each_gold.append(float(q.logprob[g]))
            gold_logprob += each_gold[-1]
            n_tok += int(q.n_tokens[g])
        n = len(self.examples)
        return QueryScore(loss=-gold_logprob / n_tok, accuracy=correct / n, n=n,
                          n_answer_tokens=n_tok, accuracy_per_token=per_token / n,
                          correct=tuple(each_correct), gold_logprob=tuple(each_gold))


def _ranked_first(scores: torch.Tensor, label: int) -> int:
    """1 when candidate ``label`` scores strictly above every other (a tie counts as wrong)."""
    others = torch.cat([scores[:label], scores[label + 1 :]])
    return int(bool(scores[label] > others.max()))


def _check_micro_batch(micro_batch_size: int) -> None:
    if micro_batch_size < 1:
        raise ValueError(
            f"micro_batch_size={micro_batch_size} is invalid: it must be >= 1 (queries per pass)"
        )


def score_query_sets(
    model: nn.Module,
    sets: Sequence[QuerySet],
    *,
    micro_batch_size: int = 8,
    route: Route | None = None,
    max_tokens: int = SCORE_PASS_TOKENS,
) -> list[QueryScore]:
    """Scores several query sets together: a pass holds chunk ``k`` (``micro_batch_size``
    queries) of every set, one row per set, as many rows as fit ``max_tokens`` padded tokens,
    and ``route`` (if given) is told each row's set before the pass. Each result equals
    :func:`score_query` of that set alone, up to float rounding; several episodes' adapted fast
    weights are scored this way in one pass."""
    _check_micro_batch(micro_batch_size)
    if not sets:
        raise ValueError("score_query_sets() got no query sets")
    for qs in sets:
        qs.check()
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            scored = _score_sets(model, [qs.sequences() for qs in sets], micro_batch_size, route, max_tokens)
    finally:
        model.train(was_training)
    return [qs.summarise(per_query) for qs, per_query in zip(sets, scored)]


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
            ``input_ids``, ``position_ids`` and a 4D ``attention_mask`` and returns ``logits``.
        episode_or_examples: an episode (its ``query`` is scored and its ``choices`` used unless
            ``choices`` is given) or the query examples themselves, e.g.
            ``episode.in_context_query()`` for in-context scoring.
        pad_id: padding token id (unused: every pass is one row without padding; kept so that
            the scoring and training calls read alike).
        choices: candidate answers for verbalizer ranking; ``None`` scores by exact match.
        micro_batch_size: queries per forward pass (each with all its candidates).

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
    del pad_id
    return score_query_sets(model, [QuerySet.of(episode_or_examples, choices)],
                            micro_batch_size=micro_batch_size)[0]


def score_passes(sets: Sequence[QuerySet], *, micro_batch_size: int = 8,
                 max_tokens: int = SCORE_PASS_TOKENS) -> int:
    """The number of forward passes :func:`score_query_sets` runs with the same arguments (at
    least the largest set's number of chunks; more where long rows do not fit one pass).

    Known before scoring, so ranks of a ZeRO-3 run can agree on how many passes to run (the one
    with fewer pads with dummy passes) before any of them starts.
    """
    if not sets:
        return 0
    return len(_passes(_chunks([qs.sequences() for qs in sets], micro_batch_size), max_tokens))


SequenceScores = _SequenceScores
"""Teacher-forced scores of sequences: per sequence, the summed answer-token log-probability,
its token count and whether every answer token is the argmax (exact match)."""


def score_sequences(model: nn.Module, per_set: Sequence[Sequence[Sequence[_Sequence]]], *,
                    micro_batch_size: int = 8, route: Route | None = None,
                    max_tokens: int = SCORE_PASS_TOKENS) -> list[list[SequenceScores]]:
    """Per set, per query, the scores of that query's ``(prompt_ids, answer_ids)`` sequences, in
    the passes :func:`score_query_sets` runs (``route`` tells each pass its rows' sets): the
    numbers behind its accuracy and loss, for a caller that needs every candidate's
    log-probability rather than a summary (``fmmeta adapt``'s predictions)."""
    _check_micro_batch(micro_batch_size)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return _score_sets(model, per_set, micro_batch_size, route, max_tokens)
    finally:
        model.train(was_training)
