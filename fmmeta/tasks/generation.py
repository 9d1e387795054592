"""Generation tasks: (prompt, answer) pairs; an episode draws ``shots`` + ``query`` of them.

A :class:`GenerationTask` tokenizes its examples once, when it is built, and keeps only token ids.
Sampling an episode is then a gather of cached ids driven by a generator the caller owns, so
episode assembly never waits on a tokenizer and is reproducible from a seed. It has no label
fields at all: classes, verbalizers and label remapping belong to
:class:`~fmmeta.tasks.classification.ClassificationTask`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fmmeta.tasks.episode import Episode, Example
from fmmeta.tasks.ragged import LazyExamples, RaggedIds
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.tokens import (
    OnTooLong,
    check_budget,
    check_rows,
    check_texts,
    encode,
    eos_ids,
    log_cut,
    log_dropped,
)


def check_task_name(name: Any) -> str:
    """Returns ``name`` if it is a usable task name (names key samplers, logs and splits)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"Task name={name!r} is invalid: a task needs a non-empty str name")
    return name


def no_examples_error(name: str, n_dropped: int) -> ValueError:
    """The refusal of a task left with no examples (saying how many ``max_length`` dropped)."""
    return ValueError(
        f"task {name!r} has no examples"
        + (f" ({n_dropped} dropped as too long for max_length)" if n_dropped else "")
        + ": give it at least shots + query examples, or remove it from the task list"
    )


class ExamplePool:
    """What the task types that draw ``shots + query`` examples without overlap share (generation
    and multiple choice): the examples' ids, their lengths and the episode draw. A subclass sets
    ``name``, ``spec``, ``separator_ids`` and, through :meth:`_keep`, the examples, when it is built.

    The ids stay as :class:`~fmmeta.tasks.ragged.RaggedIds` (a view of the memory-mapped cache for
    a task read from it); an episode makes ``Example`` objects of the rows it draws only.
    """

    name: str
    spec: EpisodeSpec
    separator_ids: tuple[int, ...]
    _prompts: RaggedIds
    _answers: RaggedIds
    _lengths: np.ndarray

    def _begin(self, name: str, spec: EpisodeSpec, *, family: str, separator_ids: Sequence[int], n_dropped: int,
               n_cut: int, n_prompts: int, kind: str) -> None:
        """Sets the fields every pool has and refuses what needs no example to refuse: no prompts,
        or a classification shape (``ways``, remapping) for a ``kind`` task."""
        self.name = check_task_name(name)
        self.family = family or name
        self.spec = spec
        self.separator_ids = tuple(int(t) for t in separator_ids)
        self.n_dropped = n_dropped
        self.n_cut = n_cut
        if not n_prompts:
            raise no_examples_error(name, n_dropped)
        if spec.ways is not None or spec.remap_labels:
            raise ValueError(
                f"task {name!r} is a {kind} task but its spec has ways={spec.ways}, "
                f"remap_labels={spec.remap_labels}: these apply to classification only; "
                "use EpisodeSpec(shots=..., query=...)"
            )

    def _keep(self, prompts: RaggedIds, answers: RaggedIds, noun: str) -> None:
        """Keeps the examples' ids (``noun``: what the message calls them), refusing too few for
        one episode."""
        self._prompts, self._answers = prompts, answers
        spec = self.spec
        if len(prompts) < spec.per_class:
            raise ValueError(
                f"task {self.name!r} has {len(prompts)} {noun} but an episode needs "
                f"shots + query = {spec.shots} + {spec.query} = {spec.per_class} without "
                "overlap" + (f" ({self.n_dropped} dropped as too long for max_length)" if self.n_dropped else "")
                + f": add {noun}, lower shots/query, or drop the task"
            )
        self._lengths = prompts.lengths + answers.lengths

    def _example(self, i: int) -> Example:
        """Example ``i``, made from its ids."""
        return Example(self._prompts.row(i), self._answers.row(i))

    def __len__(self) -> int:
        return len(self._prompts)

    @property
    def examples(self) -> Sequence[Example]:
        """All examples (each made when read)."""
        return LazyExamples(len(self), self._example)

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each example (prompt + answer), for cost models."""
        return self._lengths

    @property
    def episode_size(self) -> tuple[int, int]:
        """(support, query) sequences per episode under :attr:`spec`."""
        return self.spec.shots, self.spec.query

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """Draws one episode: ``shots`` support and ``query`` query examples, without overlap.

        Each call draws fresh examples from ``rng``, so resampling a task gives a new episode
        (and the same seed the same episode).

        Args:
            rng: the caller's generator; the only source of randomness.
        """
        spec = self.spec
        idx = rng.choice(len(self), size=spec.per_class, replace=False)
        return Episode(
            task=self.name,
            support=tuple(self._example(i) for i in idx[: spec.shots]),
            query=tuple(self._example(i) for i in idx[spec.shots :]),
            shots=spec.shots,
            separator_ids=self.separator_ids,
        )


class GenerationTask(ExamplePool):
    """A named collection of tokenized (prompt, answer) examples that samples episodes.

    Build one with :meth:`from_texts` or :meth:`from_ids`, or with the builders in
    :mod:`fmmeta.tasks.builders`; the constructor takes ids already fitted to the budget.

    Args:
        name: unique task name.
        prompts: token ids of each example's prompt.
        answers: token ids of each example's answer (EOS included).
        spec: episode shape: ``shots`` and ``query`` (``ways`` and remapping are refused).
        family: the family the task belongs to (for diversity-aware sampling); "" means ``name``.
        separator_ids: tokens between in-context demonstrations.
        n_dropped: examples dropped while building because their answer could not fit.
        n_cut: prompts cut from the left while building to fit the token budget.

    Raises:
        ValueError: if the task has no examples or cannot supply one episode of ``spec``.
    """

    def __init__(
        self,
        name: str,
        *,
        prompts: RaggedIds | Sequence[Sequence[int]],
        answers: RaggedIds | Sequence[Sequence[int]],
        spec: EpisodeSpec,
        family: str = "",
        separator_ids: Sequence[int] = (),
        n_dropped: int = 0,
        n_cut: int = 0,
    ) -> None:
        self._begin(name, spec, family=family, separator_ids=separator_ids, n_dropped=n_dropped, n_cut=n_cut,
                    n_prompts=len(prompts), kind="generation")
        if len(answers) != len(prompts):
            raise ValueError(
                f"task {name!r}: {len(prompts)} prompts but {len(answers)} answers; "
                "give one answer per prompt"
            )
        self._keep(RaggedIds.of(prompts), RaggedIds.of(answers), "examples")

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_texts(
        cls,
        name: str,
        prompts: Sequence[str],
        answers: Sequence[str],
        tokenizer: Any,
        *,
        spec: EpisodeSpec,
        family: str = "",
        max_length: int = 256,
        on_too_long: OnTooLong = "drop",
        separator: str = "\n\n",
    ) -> GenerationTask:
        """Tokenizes a generation task once: (prompt, answer) texts -> cached ids.

        The answer gets the tokenizer's EOS appended so the model learns where to stop. Prompts
        longer than the budget are cut from the left (the end of a prompt, next to the answer,
        matters most); the answer is never cut.

        Args:
            name: unique task name.
            prompts: prompt texts (non-empty).
            answers: answer texts, exactly as they follow the prompt (usually with a leading
                space, e.g. ``" Paris"``).
            tokenizer: a Hugging Face tokenizer.
            spec: episode shape.
            family: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example (prompt + answer + EOS).
            on_too_long: ``"drop"`` (count and log) or ``"error"`` for an answer that cannot fit.
            separator: text between in-context demonstrations.

        Raises:
            ValueError: on empty text, a task with no examples, or (``on_too_long="error"``) an
                answer longer than the budget.

        Example:
            >>> add3 = GenerationTask.from_texts("add3", ["1+3="], [" 4"], tok,
            ...                                  spec=EpisodeSpec(shots=1, query=1))  # doctest: +SKIP
        """
        where = f"task {name!r}"
        check_budget(max_length, on_too_long)
        if len(prompts) != len(answers):
            raise ValueError(
                f"{where}: {len(prompts)} prompts but {len(answers)} answers; give one per prompt"
            )
        check_texts(prompts, key="prompt", where=where)
        check_texts(answers, key="answer", where=where)
        eos = list(eos_ids(tokenizer))
        return cls.from_ids(
            name,
            encode(tokenizer, prompts),
            [a + eos for a in encode(tokenizer, answers)],
            spec=spec,
            family=family,
            max_length=max_length,
            on_too_long=on_too_long,
            separator_ids=encode(tokenizer, [separator])[0] if separator else (),
            prompt_texts=prompts,
        )

    @classmethod
    def from_ids(
        cls,
        name: str,
        prompt_ids: RaggedIds | Sequence[Sequence[int]],
        answer_ids: RaggedIds | Sequence[Sequence[int]],
        *,
        spec: EpisodeSpec,
        family: str = "",
        max_length: int = 256,
        on_too_long: OnTooLong = "drop",
        separator_ids: Sequence[int] = (),
        prompt_texts: Sequence[str] | None = None,
        tail_tokens: int = 0,
    ) -> GenerationTask:
        """A generation task from token ids already computed (e.g. read from a disk cache).

        The one place where prompts are fitted to ``max_length`` (cut from the left) and answers
        that cannot fit are dropped or refused, so cached and freshly tokenized tasks agree.

        Args:
            name: unique task name.
            prompt_ids: token ids of each prompt.
            answer_ids: token ids of each answer, EOS included.
            spec: episode shape.
            family: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example (prompt + answer + EOS).
            on_too_long: ``"drop"`` (count and log) or ``"error"`` for an answer that cannot fit.
            separator_ids: tokens between in-context demonstrations.
            prompt_texts: the prompts as text, only to quote in error messages.
            tail_tokens: tokens of the template's fixed ending; a cut that keeps no more is refused.
        """
        where = f"task {name!r}"
        check_budget(max_length, on_too_long)
        if len(prompt_ids) != len(answer_ids):
            raise ValueError(
                f"{where}: {len(prompt_ids)} prompts but {len(answer_ids)} answers; give one per prompt"
            )
        prompts, answers = RaggedIds.of(prompt_ids), RaggedIds.of(answer_ids)
        room = max_length - answers.lengths  # a causal LM needs one prompt token before the answer
        fits = room >= 1
        check_rows(where, prompts.lengths, None if on_too_long == "drop" else fits, answers.lengths,
                   max_length, prompt_texts)
        dropped = int((~fits).sum())
        if dropped:
            prompts, answers, room = prompts.take(fits), answers.take(fits), room[fits]
        over = prompts.lengths > room
        cut = int(over.sum())
        log_dropped(where, dropped, len(prompt_ids), max_length)
        log_cut(where, cut, len(prompt_ids), max_length, shortest=int(room[over].min()) if cut else max_length,
                tail_tokens=tail_tokens)
        return cls(
            name, prompts=prompts.keep_last(room) if cut else prompts, answers=answers, spec=spec,
            family=family, separator_ids=separator_ids, n_dropped=dropped, n_cut=cut,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"GenerationTask({self.name!r}, {len(self)} examples, family={self.family!r})"

    def with_spec(self, spec: EpisodeSpec) -> GenerationTask:
        """The same cached ids with another episode shape (e.g. more queries to evaluate).

        Raises:
            ValueError: if the task cannot supply an episode of ``spec``.
        """
        return GenerationTask(
            self.name, prompts=self._prompts, answers=self._answers, spec=spec, family=self.family,
            separator_ids=self.separator_ids, n_dropped=self.n_dropped,
            n_cut=self.n_cut,
        )  # fmt: skip


__all__ = ["ExamplePool", "GenerationTask", "check_task_name", "no_examples_error"]
