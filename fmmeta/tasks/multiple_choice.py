"""Multiple-choice tasks: questions that bring their own options; the answer is the gold option.

ARC, OpenBookQA, PIQA, HellaSwag, MMLU and their kind give every question its own candidate
answers, so unlike a :class:`~fmmeta.tasks.classification.ClassificationTask` there is no label
set shared by the task. A :class:`MultipleChoiceTask` keeps each question's options (token ids,
EOS included) on its :class:`~fmmeta.tasks.episode.Example`; the example's answer is its gold
option, so every method trains on it unchanged (answer-only loss, in-context demonstrations that
show the gold option), and scoring ranks the question's own options
(:mod:`fmmeta.evaluation.scoring`). An episode draws ``shots`` solved questions as support and
``query`` questions to answer, without overlap, like a generation task.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from fmmeta.tasks.episode import Example
from fmmeta.tasks.generation import ExamplePool
from fmmeta.tasks.ragged import RaggedIds
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.tokens import (
    OnTooLong,
    as_ids,
    check_budget,
    check_nonempty_ids,
    fit_prompt,
    log_cut,
    log_dropped,
    too_long_error,
)

logger = logging.getLogger(__name__)


class MultipleChoiceTask(ExamplePool):
    """A named collection of tokenized questions, each with its options and gold option.

    Build one with :meth:`from_ids` (which fits prompts to the token budget) or with
    :func:`~fmmeta.tasks.builders.multiple_choice_tasks`; the constructor takes ids already fitted.

    Args:
        name: unique task name.
        prompts: token ids of each question's prompt.
        options: per question, the token ids of each option (EOS included); at least 2, distinct.
        labels: per question, the index of its gold option.
        spec: episode shape: ``shots`` and ``query`` (``ways`` and remapping are refused).
        family: the family the task belongs to; "" means ``name``.
        separator_ids: tokens between in-context demonstrations.
        n_dropped: questions dropped while building because an option could not fit.
        n_cut: prompts cut from the left while building to fit the token budget.

    Raises:
        ValueError: if the task has no questions, a question has fewer than 2 options, repeated
            options or a label outside them, or the task cannot supply one episode of ``spec``.
    """

    def __init__(
        self,
        name: str,
        *,
        prompts: Sequence[Sequence[int]],
        options: Sequence[Sequence[Sequence[int]]],
        labels: Sequence[int],
        spec: EpisodeSpec,
        family: str = "",
        separator_ids: Sequence[int] = (),
        n_dropped: int = 0,
        n_cut: int = 0,
    ) -> None:
        self._begin(name, spec, family=family, separator_ids=separator_ids, n_dropped=n_dropped, n_cut=n_cut,
                    n_prompts=len(prompts), kind="multiple-choice")
        if not len(prompts) == len(options) == len(labels):
            raise ValueError(
                f"task {name!r}: {len(prompts)} prompts, {len(options)} option lists and "
                f"{len(labels)} labels; give one of each per question"
            )
        # Questions stay Example objects: each carries its own options, and multiple-choice sets
        # (ARC, MMLU, HellaSwag) are thousands of rows, not millions.
        self._questions = tuple(_question(name, i, p, opts, label)
                                for i, (p, opts, label) in enumerate(zip(prompts, options, labels)))
        self._keep(RaggedIds.from_lists([q.prompt_ids for q in self._questions]),
                   RaggedIds.from_lists([q.answer_ids for q in self._questions]), "questions")

    def _example(self, i: int) -> Example:
        return self._questions[i]

    @classmethod
    def from_ids(
        cls,
        name: str,
        prompt_ids: Sequence[Sequence[int]],
        option_ids: Sequence[Sequence[Sequence[int]]],
        labels: Sequence[int],
        *,
        spec: EpisodeSpec,
        family: str = "",
        max_length: int = 256,
        on_too_long: OnTooLong = "drop",
        separator_ids: Sequence[int] = (),
        prompt_texts: Sequence[str] | None = None,
        tail_tokens: int = 0,
    ) -> MultipleChoiceTask:
        """A multiple-choice task from token ids (options with EOS), fitted to ``max_length``.

        A prompt is cut from the left so that it fits with the question's *longest* option (every
        option is scored after the same prompt; a cut that keeps no more than the template's
        ending, ``tail_tokens``, is refused); a question whose longest option cannot fit is
        dropped (counted and logged) or, with ``on_too_long="error"``, refused. A question with
        two options of the same tokens is dropped with a warning: public data has a few (SciQ's
        distractors repeat its answer), and a tie counts as wrong, so it could never be answered.
        """
        where = f"task {name!r}"
        check_budget(max_length, on_too_long)
        kept: list[tuple[Sequence[int], Sequence[Sequence[int]], int]] = []
        dropped = cut = repeated = 0
        shortest = max_length
        for i, (p, opts, label) in enumerate(zip(prompt_ids, option_ids, labels)):
            check_nonempty_ids(where, i, p, prompt_texts[i] if prompt_texts is not None else None)
            if len({tuple(o) for o in opts}) < len(opts):
                repeated += 1
                continue
            longest = max((len(o) for o in opts), default=0)
            fitted = fit_prompt(p, longest, max_length)
            if fitted is None:
                if on_too_long == "error":
                    raise too_long_error(where, i, longest, max_length)
                dropped += 1
                continue
            kept.append((fitted, opts, label))
            if len(fitted) < len(p):
                cut, shortest = cut + 1, min(shortest, len(fitted))
        if repeated:
            logger.warning("%s: %d of %d questions dropped: two of their options have the same tokens, "
                           "so no model could rank the gold one first", where, repeated, len(prompt_ids))
        log_dropped(where, dropped, len(prompt_ids), max_length)
        log_cut(where, cut, len(prompt_ids), max_length, shortest=shortest, tail_tokens=tail_tokens)
        return cls(
            name, prompts=[k[0] for k in kept], options=[k[1] for k in kept],
            labels=[k[2] for k in kept], spec=spec, family=family, separator_ids=separator_ids,
            n_dropped=dropped + repeated, n_cut=cut,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"MultipleChoiceTask({self.name!r}, {len(self)} questions, family={self.family!r})"

    def with_spec(self, spec: EpisodeSpec) -> MultipleChoiceTask:
        """The same cached ids with another episode shape (e.g. more queries to evaluate)."""
        ex = self._questions
        return MultipleChoiceTask(
            self.name, prompts=[e.prompt_ids for e in ex], options=[e.options or () for e in ex],
            labels=[-1 if e.label is None else e.label for e in ex], spec=spec, family=self.family,
            separator_ids=self.separator_ids, n_dropped=self.n_dropped, n_cut=self.n_cut,
        )  # fmt: skip


def _question(name: str, i: int, prompt: Sequence[int], options: Sequence[Sequence[int]], label: Any
              ) -> Example:
    """One checked question: at least 2 distinct non-empty options and a label among them."""
    opts = tuple(as_ids(o) for o in options)
    where = f"task {name!r} question {i}"
    if len(opts) < 2:
        raise ValueError(f"{where} has {len(opts)} option(s): a multiple-choice question needs at least 2")
    if any(len(o) == 0 for o in opts):
        raise ValueError(f"{where} has an empty option: every option needs at least one token")
    if len(set(opts)) < len(opts):
        raise ValueError(
            f"{where} has two options with the same tokens: they cannot be told apart; remove the "
            "repeated option from the data"
        )
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)) or not 0 <= label < len(opts):
        raise ValueError(f"{where}: label={label!r} is not an index into its {len(opts)} options")
    return Example(as_ids(prompt), opts[int(label)], int(label), opts)


__all__ = ["MultipleChoiceTask"]
