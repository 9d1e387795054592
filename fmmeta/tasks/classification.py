"""Classification tasks: prompts with a class each; the answer is the class's verbalizer word.

An episode draws ``ways`` classes and ``shots + query`` examples per class without overlap, and
renumbers the drawn classes ``0..ways-1`` so ``Example.label`` indexes ``Episode.choices``. With
``remap_labels`` every episode also maps its classes to fresh random words from a pool
(learn2learn's ``RemapLabels`` idea for text), so only the support set tells the model which word
means which class.

Everything only a classification task has (class names, class answers, ``ways``, the remapping
pool) lives on :class:`ClassificationTask` and is required when it is built, so no field is
``None`` "for the other kind" and nothing is set after construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fmmeta.tasks.episode import Episode, Example
from fmmeta.tasks.generation import check_task_name, no_examples_error
from fmmeta.tasks.ragged import LazyExamples, RaggedIds
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.tokens import (
    OnTooLong,
    as_ids,
    check_budget,
    check_rows,
    check_texts,
    encode,
    eos_ids,
    log_cut,
)


class ClassificationTask:
    """A named collection of tokenized, labelled prompts that samples N-way K-shot episodes.

    Build one with :meth:`from_texts` or :meth:`from_ids`, or with the builders in
    :mod:`fmmeta.tasks.builders`; the constructor takes ids already fitted to the budget.

    Args:
        name: unique task name.
        prompts: token ids of each example's prompt.
        labels: class index of each example, into ``class_answers``.
        class_answers: answer ids (EOS included) of each class's verbalizer word.
        class_names: display name of each class (for messages and reports); one per class.
        spec: episode shape (``ways`` None means every class).
        pool_answers: answer ids of each ``spec.label_pool`` word; required with
            ``spec.remap_labels``, ignored without.
        family: the family the task belongs to (for diversity-aware sampling); "" means ``name``.
        separator_ids: tokens between in-context demonstrations.

    Raises:
        ValueError: if the task has no examples, its labels or names do not match its classes,
            or it cannot supply one episode of ``spec``.
    """

    def __init__(
        self,
        name: str,
        *,
        prompts: RaggedIds | Sequence[Sequence[int]],
        labels: Sequence[int] | np.ndarray,
        class_answers: Sequence[Sequence[int]],
        class_names: Sequence[str],
        spec: EpisodeSpec,
        pool_answers: Sequence[Sequence[int]] = (),
        family: str = "",
        separator_ids: Sequence[int] = (),
        n_cut: int = 0,
    ) -> None:
        self.name = check_task_name(name)
        self.family = family or name
        self.spec = spec
        self.separator_ids = tuple(int(t) for t in separator_ids)
        self.n_cut = n_cut  # prompts cut from the left while building, to fit the token budget
        if not len(prompts):
            raise no_examples_error(name, 0)
        self._prompts = RaggedIds.of(prompts)
        self._labels = _check_labels(name, labels, len(prompts), len(class_answers))
        self._class_answers = tuple(as_ids(a) for a in class_answers)
        self.class_names: tuple[str, ...] = _check_class_names(name, class_names, len(class_answers))
        # Only classes that can supply a whole episode take part; the builder decides (and warns)
        # whether small classes are an error or dropped, so here they are simply excluded.
        self._by_class = [np.flatnonzero(self._labels == c) for c in range(len(class_answers))]
        self._usable = np.array(
            [c for c, m in enumerate(self._by_class) if m.size >= spec.per_class], dtype=np.int64
        )
        self.ways: int = spec.ways if spec.ways is not None else len(class_answers)
        if self._usable.size < self.ways:
            counts = {self.class_names[c]: int(m.size) for c, m in enumerate(self._by_class)}
            raise ValueError(
                f"task {name!r} has {self._usable.size} classes with at least shots + query = "
                f"{spec.per_class} examples but ways={self.ways}; examples per class: {counts}. "
                "Lower ways, shots or query, or add examples"
            )
        self._pool_answers = _check_pool(name, spec, pool_answers, self.ways)
        answer_lengths = np.array([len(a) for a in self._class_answers], dtype=np.int64)
        self._lengths = self._prompts.lengths + answer_lengths[self._labels]

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_texts(
        cls,
        name: str,
        prompts: Sequence[str],
        labels: Sequence[int],
        verbalizer: Sequence[str],
        tokenizer: Any,
        *,
        spec: EpisodeSpec,
        answer_template: str = " {answer}",
        family: str = "",
        max_length: int = 256,
        on_too_long: OnTooLong = "drop",
        separator: str = "\n\n",
        class_names: Sequence[str] | None = None,
    ) -> ClassificationTask:
        """Tokenizes a classification task once: prompts + class indices -> cached ids.

        Every verbalizer word and every ``spec.label_pool`` word is tokenized once (through
        ``answer_template``), so a remapped episode only swaps cached answer ids. The prompt budget
        is set by the longest possible answer, so every episode fits ``max_length``.

        Args:
            name: unique task name.
            prompts: prompt texts (non-empty).
            labels: class index of each prompt, into ``verbalizer``.
            verbalizer: the answer word of each class.
            tokenizer: a Hugging Face tokenizer.
            spec: episode shape (``ways``, ``remap_labels``, ``label_pool``).
            answer_template: turns a word into answer text; ``{answer}`` is replaced.
            family: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example (prompt + answer + EOS).
            on_too_long: checked like a generation task's; an answer word over budget is always an
                error (the same words serve every example).
            separator: text between in-context demonstrations.
            class_names: display name of each class (default: the verbalizer words).

        Raises:
            ValueError: on empty text, bad labels, too few classes, or an answer over budget.

        Example:
            >>> task = ClassificationTask.from_texts("parity", ["1", "2", "3", "4"], [1, 0, 1, 0],
            ...     ["even", "odd"], tok, spec=EpisodeSpec(shots=1, query=1))  # doctest: +SKIP
        """
        where = f"task {name!r}"
        check_budget(max_length, on_too_long)
        if len(prompts) != len(labels):
            raise ValueError(
                f"{where}: {len(prompts)} prompts but {len(labels)} labels; give one per prompt"
            )
        check_texts(prompts, key="prompt", where=where)
        check_texts(list(verbalizer), key="verbalizer", where=where)
        words = list(verbalizer)
        pool = list(spec.label_pool or ()) if spec.remap_labels else []
        answer_ids = answer_word_ids(tokenizer, [answer_template.format(answer=w) for w in words + pool])
        return cls.from_ids(
            name, encode(tokenizer, prompts), list(labels), answer_ids[: len(words)],
            class_names=list(class_names) if class_names is not None else [str(w) for w in words],
            pool_answers=answer_ids[len(words) :], spec=spec, family=family, max_length=max_length,
            separator_ids=encode(tokenizer, [separator])[0] if separator else (), prompt_texts=prompts,
        )  # fmt: skip

    @classmethod
    def from_ids(
        cls,
        name: str,
        prompt_ids: RaggedIds | Sequence[Sequence[int]],
        labels: Sequence[int] | np.ndarray,
        class_answers: Sequence[Sequence[int]],
        *,
        class_names: Sequence[str],
        spec: EpisodeSpec,
        pool_answers: Sequence[Sequence[int]] = (),
        family: str = "",
        max_length: int = 256,
        separator_ids: Sequence[int] = (),
        prompt_texts: Sequence[str] | None = None,
        tail_tokens: int = 0,
    ) -> ClassificationTask:
        """A classification task from token ids already computed (e.g. read from a disk cache).

        Prompts are cut from the left to leave room for the longest answer (class word or, with
        ``spec.remap_labels``, pool word), so every episode fits ``max_length`` whichever words it
        draws.

        Args:
            name: unique task name.
            prompt_ids: token ids of each prompt.
            labels: class index of each prompt, into ``class_answers``.
            class_answers: answer ids (EOS included) of each class's verbalizer word.
            class_names: display name of each class.
            spec: episode shape.
            pool_answers: answer ids of each ``spec.label_pool`` word (used with ``remap_labels``).
            family: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example.
            separator_ids: tokens between in-context demonstrations.
            prompt_texts: the prompts as text, only to quote in error messages.
            tail_tokens: tokens of the template's fixed ending; a cut that keeps no more is refused.
        """
        where = f"task {name!r}"
        check_budget(max_length, "drop")
        if len(prompt_ids) != len(labels):
            raise ValueError(
                f"{where}: {len(prompt_ids)} prompts but {len(labels)} labels; give one per prompt"
            )
        pool = pool_answers if spec.remap_labels else ()
        twins = _same_answers(class_answers)
        if twins is not None:  # a tie counts as wrong: neither class could ever be scored correct
            raise ValueError(
                f"{where}: classes {class_names[twins[0]]!r} and {class_names[twins[1]]!r} have the "
                "same answer tokens, so no answer could tell them apart: give each class its own word"
            )
        longest = max(len(a) for a in [*class_answers, *pool])
        if longest + 1 > max_length:
            # The same answer words serve every example, so no example could fit: always an error.
            raise ValueError(
                f"{where}: the longest answer word takes {longest} tokens (EOS included) but "
                f"max_length={max_length} leaves no room for it plus one prompt token: raise "
                f"max_length to at least {longest + 1} or use shorter label words"
            )
        prompts = RaggedIds.of(prompt_ids)
        room = max_length - longest  # >= 1, checked above
        check_rows(where, prompts.lengths, None, np.zeros(len(prompts), dtype=np.int64), max_length, prompt_texts)
        cut = int((prompts.lengths > room).sum())
        log_cut(where, cut, len(prompt_ids), max_length, shortest=room, tail_tokens=tail_tokens)
        return cls(
            name, prompts=prompts.keep_last(room) if cut else prompts, labels=labels,
            class_answers=class_answers, class_names=list(class_names), pool_answers=pool, spec=spec,
            family=family, separator_ids=separator_ids, n_cut=cut,
        )  # fmt: skip

    # ------------------------------------------------------------------ access

    def __len__(self) -> int:
        return len(self._prompts)

    def __repr__(self) -> str:
        return (
            f"ClassificationTask({self.name!r}, {len(self._class_answers)}-class, {len(self)} "
            f"examples, family={self.family!r})"
        )

    @property
    def examples(self) -> Sequence[Example]:
        """All examples, each made when read (labels index :attr:`class_names`)."""
        return LazyExamples(len(self), self._example)

    def _example(self, i: int) -> Example:
        """Example ``i``: its prompt, its class's answer and its class."""
        c = int(self._labels[i])
        return Example(self._prompts.row(i), self._class_answers[c], c)

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each example (prompt + answer), for cost models."""
        return self._lengths

    @property
    def episode_size(self) -> tuple[int, int]:
        """(support, query) sequences per episode under :attr:`spec`."""
        return self.spec.shots * self.ways, self.spec.query * self.ways

    def with_spec(self, spec: EpisodeSpec) -> ClassificationTask:
        """The same cached ids with another episode shape (e.g. more queries to evaluate).

        No tokenizer is needed; remapping to words other than the build-time ``label_pool``
        needs those words tokenized, so rebuild the task for that.

        Raises:
            ValueError: if the task cannot supply an episode of ``spec``.
        """
        if spec.remap_labels and spec.label_pool != self.spec.label_pool:
            raise ValueError(
                f"task {self.name!r}: with_spec() cannot remap to label_pool={spec.label_pool!r} "
                "(its words were not tokenized at build time); rebuild the task with that pool"
            )
        return ClassificationTask(
            self.name, prompts=self._prompts, labels=self._labels,
            class_answers=self._class_answers, class_names=self.class_names, spec=spec,
            pool_answers=self._pool_answers if spec.remap_labels else (), family=self.family,
            separator_ids=self.separator_ids, n_cut=self.n_cut,
        )  # fmt: skip

    # ------------------------------------------------------------------ sampling

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """Draws one episode: ``ways`` classes, ``shots + query`` examples of each, interleaved.

        Support and query never share an example, and each call draws fresh classes and examples
        from ``rng``, so resampling a task gives a new episode (and the same seed the same one).

        Args:
            rng: the caller's generator; the only source of randomness.
        """
        spec, ways = self.spec, self.ways
        classes = self._usable[rng.choice(self._usable.size, size=ways, replace=False)]
        if spec.remap_labels:
            words = rng.choice(len(self._pool_answers), size=ways, replace=False)
            choices = tuple(self._pool_answers[w] for w in words)
        else:
            choices = tuple(self._class_answers[c] for c in classes)
        prompts = self._prompts
        support: list[Example] = []
        query: list[Example] = []
        for local, c in enumerate(classes):
            members = self._by_class[c]
            picked = members[rng.choice(members.size, size=spec.per_class, replace=False)]
            answer = choices[local]
            support.extend(Example(prompts.row(i), answer, local) for i in picked[: spec.shots])
            query.extend(Example(prompts.row(i), answer, local) for i in picked[spec.shots :])
        # Interleave classes in a random order so a support set is not sorted by class.
        s_order = rng.permutation(len(support))
        q_order = rng.permutation(len(query))
        return Episode(
            task=self.name,
            support=tuple(support[i] for i in s_order),
            query=tuple(query[i] for i in q_order),
            shots=spec.shots,
            ways=ways,
            choices=choices,
            separator_ids=self.separator_ids,
        )


def answer_word_ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of answer words (label or pool words, template applied), EOS appended."""
    eos = list(eos_ids(tokenizer))
    return [a + eos for a in encode(tokenizer, texts)]


def _check_labels(name: str, labels: Sequence[int] | np.ndarray, n_prompts: int, n_classes: int) -> np.ndarray:
    """The labels as an int array, after checking one per prompt, each a class index."""
    if len(labels) != n_prompts:
        raise ValueError(
            f"task {name!r}: {n_prompts} prompts but {len(labels)} labels; "
            "give one label per prompt"
        )
    out = np.asarray(labels, dtype=np.int64)
    if out.size and (out.min() < 0 or out.max() >= n_classes):
        raise ValueError(
            f"task {name!r}: labels must be class indices in [0, {n_classes}); got "
            f"min={out.min()}, max={out.max()}"
        )
    return out


def _check_class_names(name: str, class_names: Sequence[str], n_classes: int) -> tuple[str, ...]:
    """The class names as a tuple, after checking there is one non-empty str per class."""
    if class_names is None or isinstance(class_names, str) or len(class_names) != n_classes:
        raise ValueError(
            f"task {name!r}: class_names={class_names!r} is invalid: a classification task needs "
            f"one display name per class ({n_classes} classes), e.g. its verbalizer words"
        )
    bad = [n for n in class_names if not isinstance(n, str) or not n]
    if bad:
        raise ValueError(f"task {name!r}: class_names has empty or non-str names {bad!r}: name every class")
    return tuple(class_names)


def _check_pool(
    name: str, spec: EpisodeSpec, pool_answers: Sequence[Sequence[int]], ways: int
) -> tuple[tuple[int, ...], ...]:
    """The remapping words' ids when ``spec.remap_labels`` is on (checked), else empty."""
    if not spec.remap_labels:
        return ()
    if len(pool_answers) != len(spec.label_pool or ()):
        raise ValueError(
            f"task {name!r}: remap_labels needs pool_answers, the token ids of each "
            "label_pool word (ClassificationTask.from_texts builds them)"
        )
    if len(pool_answers) < ways:
        raise ValueError(
            f"task {name!r}: label_pool has {len(pool_answers)} words but ways={ways}: "
            "add words to the pool"
        )
    return tuple(as_ids(a) for a in pool_answers)


def _same_answers(answers: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """The first two classes whose answer ids are identical (the tokenizer may make two written
    words one), or None."""
    seen: dict[tuple[int, ...], int] = {}
    for c, ids in enumerate(answers):
        first = seen.setdefault(tuple(ids), c)
        if first != c:
            return first, c
    return None


__all__ = ["ClassificationTask", "answer_word_ids"]
