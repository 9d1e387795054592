"""Tasks: named collections of tokenized examples that sample few-shot episodes.

A :class:`Task` tokenizes its examples once, when it is built, and keeps only token ids. Sampling
an episode is then a gather of cached ids driven by a generator the caller owns, so episode
assembly never waits on a tokenizer and is reproducible from a seed.

Two kinds of task share one class:

* generation tasks: each example is a (prompt, answer) pair; an episode draws ``shots`` support
  and ``query`` query examples without overlap;
* classification tasks: each example is a prompt and a class; the answer is the class's verbalizer
  word. An episode draws ``ways`` classes and ``shots + query`` examples per class without overlap,
  and renumbers the drawn classes ``0..ways-1`` so ``Example.label`` indexes ``Episode.choices``.
  With ``remap_labels`` every episode also maps its classes to fresh random words from a pool
  (learn2learn's ``RemapLabels`` idea for text), so only the support set tells the model which
  word means which class.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fmmeta.tasks.episode import Episode, Example

logger = logging.getLogger(__name__)

OnTooLong = Literal["drop", "error"]
_ON_TOO_LONG = ("drop", "error")


@dataclass(frozen=True, kw_only=True)
class EpisodeSpec:
    """The shape of the episodes a task samples.

    Attributes:
        shots: support examples per class (classification) or support size (generation); >= 1.
        query: query examples per class (classification) or query size (generation); >= 1.
        ways: classes per episode for classification (>= 2, at most the task's classes);
            ``None`` means every class for classification and is required for generation tasks.
        remap_labels: classification only: map each episode's classes to random words drawn from
            ``label_pool`` so the model must read the support set to know the answer words.
        label_pool: words for ``remap_labels`` (at least ``ways``, distinct, non-empty).
    """

    shots: int
    query: int
    ways: int | None = None
    remap_labels: bool = False
    label_pool: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shots, bool) or not isinstance(self.shots, int) or self.shots < 1:
            raise ValueError(
                f"EpisodeSpec.shots={self.shots!r} is invalid: shots must be an int >= 1 "
                "(support examples per class, or per episode for generation tasks)"
            )
        if isinstance(self.query, bool) or not isinstance(self.query, int) or self.query < 1:
            raise ValueError(
                f"EpisodeSpec.query={self.query!r} is invalid: query must be an int >= 1 "
                "(query examples per class, or per episode for generation tasks)"
            )
        if self.ways is not None and (
            isinstance(self.ways, bool) or not isinstance(self.ways, int) or self.ways < 2
        ):
            raise ValueError(
                f"EpisodeSpec.ways={self.ways!r} is invalid: ways must be an int >= 2 "
                "(classes per episode) or None (all classes / a generation task)"
            )
        if self.label_pool is not None:
            pool = tuple(self.label_pool)
            object.__setattr__(self, "label_pool", pool)
            bad = [w for w in pool if not isinstance(w, str) or not w.strip()]
            if bad:
                raise ValueError(
                    f"EpisodeSpec.label_pool contains empty or non-string words {bad!r}: "
                    "every remapping word must be a non-empty string"
                )
            dup = sorted({w for w in pool if pool.count(w) > 1})
            if dup:
                raise ValueError(
                    f"EpisodeSpec.label_pool has duplicate words {dup!r}: remapped classes must "
                    "get distinct words, so list each word once"
                )
        if self.remap_labels:
            if not self.label_pool:
                raise ValueError(
                    "EpisodeSpec.remap_labels=True needs label_pool: pass the words classes are "
                    "remapped to, e.g. label_pool=('apple', 'river', 'stone', 'cloud')"
                )
            if self.ways is not None and len(self.label_pool) < self.ways:
                raise ValueError(
                    f"EpisodeSpec.label_pool has {len(self.label_pool)} words but ways={self.ways}: "
                    f"remapping needs at least {self.ways} distinct words; add words to the pool"
                )

    @property
    def per_class(self) -> int:
        """Examples one class (or a generation task) must supply per episode."""
        return self.shots + self.query


def ensure_pad_token(tokenizer: Any) -> int:
    """Gives ``tokenizer`` a pad token if it has none (EOS reused) and returns the pad id.

    Many causal-LM tokenizers (Llama, GPT-2) ship without a pad token. Padding is never labelled
    (see :func:`fmmeta.tasks.episode.collate`), so reusing EOS as pad is safe and keeps the
    vocabulary (and the model's embedding matrix) unchanged. A tokenizer with neither is refused:
    adding a new ``<pad>`` would need the model's embeddings resized, which nothing here does.

    Args:
        tokenizer: a Hugging Face tokenizer; modified in place.

    Returns:
        The pad token id.

    Raises:
        ValueError: if the tokenizer has neither a pad nor an EOS token.
    """
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token is None:
        raise ValueError(
            "the tokenizer has neither a pad nor an eos token; use a tokenizer that defines one"
        )
    tokenizer.pad_token = tokenizer.eos_token
    logger.info("tokenizer has no pad token: using its EOS token %r as pad", tokenizer.eos_token)
    # Setting pad_token sets pad_token_id; mypy still narrows it to the None tested above.
    return int(tokenizer.pad_token_id)  # type: ignore[call-overload]


def _ids(seq: Sequence[int]) -> tuple[int, ...]:
    """Token ids as a tuple of Python ints (fast path for the lists tokenizers return)."""
    if isinstance(seq, tuple):
        return seq
    if isinstance(seq, list):
        return tuple(seq)
    return tuple(map(int, seq))  # numpy arrays, tensors: plain ints hash and compare cheaply


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """The EOS id appended to every answer, or nothing for a tokenizer without one."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return () if eos is None else (int(eos),)


def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Batch-encodes ``texts`` without special tokens (fast tokenizers run this in Rust).

    A fast tokenizer whose backend neither truncates nor pads is called directly: the same ids
    as ``tokenizer(texts)``, without building a ``BatchEncoding`` (a third of the time on a
    million short texts).
    """
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        return [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]
    return list(tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def check_texts(values: Sequence[Any], *, key: str, where: str) -> None:
    """Raises if any value is None, not a string, or empty after stripping whitespace.

    Args:
        values: the texts to check.
        key: what the values are (a column name, ``"prompt"``), named in the error.
        where: the task or dataset they belong to, named in the error.

    Raises:
        ValueError: naming the first bad row, its value and the fix.
    """
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is empty: every {key} must be non-empty text; "
                f"filter such rows first (e.g. dataset.filter(lambda r: r[{key!r}])) "
            )
        if not isinstance(v, str):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} has type {type(v).__name__}: {key} must be str; "
                "convert it (or name the right column)"
            )


def _fit(
    prompt: list[int], answer_len: int, max_length: int
) -> list[int] | None:
    """Left-truncates ``prompt`` so prompt + answer fit ``max_length``; None if the answer can't."""
    room = max_length - answer_len
    if room < 1:  # a causal LM needs at least one prompt token to predict the first answer token
        return None
    return prompt[-room:] if len(prompt) > room else prompt


def _too_long_error(where: str, i: int, answer_len: int, max_length: int) -> ValueError:
    return ValueError(
        f"{where}: example {i} has an answer of {answer_len} tokens (EOS included) but "
        f"max_length={max_length} leaves no room for it plus one prompt token: raise max_length "
        f"to at least {answer_len + 1}, shorten the answer, or pass on_too_long='drop'"
    )


class Task:
    """A named collection of tokenized examples that samples episodes of one shape.

    Build tasks with :meth:`from_texts` (generation) or :meth:`from_labeled_texts`
    (classification), or with the builders in :mod:`fmmeta.tasks.builders`; the constructor takes
    already tokenized ids.

    Args:
        name: unique task name.
        prompts: token ids of each example's prompt.
        spec: episode shape (validated against the data here, before any training).
        answers: generation tasks: token ids of each example's answer (EOS included).
        labels: classification tasks: class index of each example.
        class_answers: classification tasks: answer ids (EOS included) of each class's verbalizer.
        class_names: classification tasks: display name of each class (for messages).
        pool_answers: answer ids of each ``spec.label_pool`` word, for ``remap_labels``.
        domain: family the task belongs to (for diversity-aware sampling).
        separator_ids: tokens between in-context demonstrations.
        n_dropped: examples dropped while building because their answer could not fit.

    Raises:
        ValueError: if the task has no examples or cannot supply one episode of ``spec``.
    """

    def __init__(
        self,
        name: str,
        *,
        prompts: Sequence[Sequence[int]],
        spec: EpisodeSpec,
        answers: Sequence[Sequence[int]] | None = None,
        labels: Sequence[int] | None = None,
        class_answers: Sequence[Sequence[int]] | None = None,
        class_names: Sequence[str] | None = None,
        pool_answers: Sequence[Sequence[int]] | None = None,
        domain: str = "",
        separator_ids: Sequence[int] = (),
        n_dropped: int = 0,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"Task name={name!r} is invalid: a task needs a non-empty str name")
        self.name = name
        self.domain = domain or name
        self.spec = spec
        self.separator_ids = tuple(int(t) for t in separator_ids)
        self.n_dropped = n_dropped
        self._prompts = [_ids(p) for p in prompts]
        if not self._prompts:
            raise ValueError(
                f"task {name!r} has no examples"
                + (f" ({n_dropped} dropped as too long for max_length)" if n_dropped else "")
                + ": give it at least shots + query examples, or remove it from the task list"
            )
        self.is_classification = labels is not None
        if self.is_classification:
            if class_answers is None or answers is not None:
                raise ValueError(
                    f"task {name!r}: a classification task takes labels and class_answers "
                    "(one verbalizer per class), not answers"
                )
            self._init_classification(labels, class_answers, class_names, pool_answers)
        else:
            if answers is None:
                raise ValueError(f"task {name!r}: a generation task needs answers (one per prompt)")
            if len(answers) != len(self._prompts):
                raise ValueError(
                    f"task {name!r}: {len(self._prompts)} prompts but {len(answers)} answers; "
                    "give one answer per prompt"
                )
            if spec.ways is not None or spec.remap_labels:
                raise ValueError(
                    f"task {name!r} is a generation task but its spec has ways={spec.ways}, "
                    f"remap_labels={spec.remap_labels}: these apply to classification only; "
                    "use EpisodeSpec(shots=..., query=...)"
                )
            self._answers = [_ids(a) for a in answers]
            self._examples = tuple(
                Example(p, a) for p, a in zip(self._prompts, self._answers)
            )
            if len(self._examples) < spec.per_class:
                raise ValueError(
                    f"task {name!r} has {len(self._examples)} examples but an episode needs "
                    f"shots + query = {spec.shots} + {spec.query} = {spec.per_class} without "
                    "overlap" + (f" ({n_dropped} dropped as too long for max_length)" if n_dropped else "")
                    + ": add examples, lower shots/query, or drop the task"
                )
            self.class_names: tuple[str, ...] | None = None
            self.ways: int | None = None
        self._lengths = np.fromiter(
            (ex.n_tokens for ex in self._examples), dtype=np.int64, count=len(self._examples)
        )

    def _init_classification(
        self,
        labels: Sequence[int],
        class_answers: Sequence[Sequence[int]],
        class_names: Sequence[str] | None,
        pool_answers: Sequence[Sequence[int]] | None,
    ) -> None:
        name, spec = self.name, self.spec
        if len(labels) != len(self._prompts):
            raise ValueError(
                f"task {name!r}: {len(self._prompts)} prompts but {len(labels)} labels; "
                "give one label per prompt"
            )
        n_classes = len(class_answers)
        self._labels = np.asarray(labels, dtype=np.int64)
        if self._labels.size and (self._labels.min() < 0 or self._labels.max() >= n_classes):
            raise ValueError(
                f"task {name!r}: labels must be class indices in [0, {n_classes}); got "
                f"min={self._labels.min()}, max={self._labels.max()}"
            )
        self._class_answers = tuple(_ids(a) for a in class_answers)
        self.class_names = (
            tuple(class_names) if class_names is not None else tuple(str(i) for i in range(n_classes))
        )
        # Only classes that can supply a whole episode take part; the builder decides (and warns)
        # whether small classes are an error or dropped, so here they are simply excluded.
        self._by_class = [np.flatnonzero(self._labels == c) for c in range(n_classes)]
        self._usable = np.array(
            [c for c in range(n_classes) if self._by_class[c].size >= spec.per_class], dtype=np.int64
        )
        ways = spec.ways if spec.ways is not None else n_classes
        self.ways = ways
        if self._usable.size < ways:
            counts = {self.class_names[c]: int(self._by_class[c].size) for c in range(n_classes)}
            raise ValueError(
                f"task {name!r} has {self._usable.size} classes with at least shots + query = "
                f"{spec.per_class} examples but ways={ways}; examples per class: {counts}. "
                "Lower ways, shots or query, or add examples"
            )
        if spec.remap_labels:
            if pool_answers is None or len(pool_answers) != len(spec.label_pool or ()):
                raise ValueError(
                    f"task {name!r}: remap_labels needs pool_answers, the token ids of each "
                    "label_pool word (Task.from_labeled_texts builds them)"
                )
            if len(pool_answers) < ways:
                raise ValueError(
                    f"task {name!r}: label_pool has {len(pool_answers)} words but ways={ways}: "
                    "add words to the pool"
                )
            self._pool_answers: tuple[tuple[int, ...], ...] = tuple(_ids(a) for a in pool_answers)
        else:
            self._pool_answers = ()
        self._examples = tuple(
            Example(p, self._class_answers[c], int(c)) for p, c in zip(self._prompts, self._labels)
        )

    # ------------------------------------------------------------------ construction from text

    @classmethod
    def from_texts(
        cls,
        name: str,
        prompts: Sequence[str],
        answers: Sequence[str],
        tokenizer: Any,
        *,
        spec: EpisodeSpec,
        domain: str = "",
        max_length: int = 256,
        on_too_long: OnTooLong = "drop",
        separator: str = "\n\n",
    ) -> Task:
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
            domain: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example (prompt + answer + EOS).
            on_too_long: ``"drop"`` (count and log) or ``"error"`` for an answer that cannot fit.
            separator: text between in-context demonstrations.

        Raises:
            ValueError: on empty text, a task with no examples, or (``on_too_long="error"``) an
                answer longer than the budget.
        """
        where = f"task {name!r}"
        _check_budget(max_length, on_too_long)
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
            domain=domain,
            max_length=max_length,
            on_too_long=on_too_long,
            separator_ids=encode(tokenizer, [separator])[0] if separator else (),
            prompt_texts=prompts,
        )

    @classmethod
    def from_ids(
        cls,
        name: str,
        prompt_ids: Sequence[Sequence[int]],
        answer_ids: Sequence[Sequence[int]],
        *,
        spec: EpisodeSpec,
        domain: str = "",
        max_length: int = 256,
        on_too_long: OnTooLong = "drop",
        separator_ids: Sequence[int] = (),
        prompt_texts: Sequence[str] | None = None,
    ) -> Task:
        """A generation task from token ids already computed (e.g. read from a disk cache).

        The one place where prompts are fitted to ``max_length`` (cut from the left) and answers
        that cannot fit are dropped or refused, so cached and freshly tokenized tasks agree.

        Args:
            name: unique task name.
            prompt_ids: token ids of each prompt.
            answer_ids: token ids of each answer, EOS included.
            spec: episode shape.
            domain: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example (prompt + answer + EOS).
            on_too_long: ``"drop"`` (count and log) or ``"error"`` for an answer that cannot fit.
            separator_ids: tokens between in-context demonstrations.
            prompt_texts: the prompts as text, only to quote in error messages.
        """
        where = f"task {name!r}"
        _check_budget(max_length, on_too_long)
        if len(prompt_ids) != len(answer_ids):
            raise ValueError(
                f"{where}: {len(prompt_ids)} prompts but {len(answer_ids)} answers; give one per prompt"
            )
        kept_p: list[Sequence[int]] = []
        kept_a: list[Sequence[int]] = []
        dropped = 0
        for i, (p, a) in enumerate(zip(prompt_ids, answer_ids)):
            _check_nonempty_ids(where, i, p, prompt_texts[i] if prompt_texts is not None else None)
            fitted = _fit(p, len(a), max_length)
            if fitted is None:
                if on_too_long == "error":
                    raise _too_long_error(where, i, len(a), max_length)
                dropped += 1
                continue
            kept_p.append(fitted)
            kept_a.append(a)
        _log_dropped(where, dropped, len(prompt_ids), max_length)
        return cls(
            name,
            prompts=kept_p,
            answers=kept_a,
            spec=spec,
            domain=domain,
            separator_ids=separator_ids,
            n_dropped=dropped,
        )

    @classmethod
    def from_labeled_texts(
        cls,
        name: str,
        prompts: Sequence[str],
        labels: Sequence[int],
        verbalizer: Sequence[str],
        tokenizer: Any,
        *,
        spec: EpisodeSpec,
        answer_template: str = " {answer}",
        domain: str = "",
        max_length: int = 256,
        on_too_long: OnTooLong = "drop",
        separator: str = "\n\n",
        class_names: Sequence[str] | None = None,
    ) -> Task:
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
            domain: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example (prompt + answer + EOS).
            on_too_long: ``"drop"`` (count and log) or ``"error"`` for an answer that cannot fit.
            separator: text between in-context demonstrations.
            class_names: display name of each class (default: the verbalizer words).

        Raises:
            ValueError: on empty text, bad labels, too few classes, or an answer over budget.
        """
        where = f"task {name!r}"
        _check_budget(max_length, on_too_long)
        if len(prompts) != len(labels):
            raise ValueError(
                f"{where}: {len(prompts)} prompts but {len(labels)} labels; give one per prompt"
            )
        check_texts(prompts, key="prompt", where=where)
        check_texts(list(verbalizer), key="verbalizer", where=where)
        eos = list(eos_ids(tokenizer))
        words = list(verbalizer)
        pool = list(spec.label_pool or ()) if spec.remap_labels else []
        answer_ids = [
            a + eos for a in encode(tokenizer, [answer_template.format(answer=w) for w in words + pool])
        ]
        class_answers, pool_answers = answer_ids[: len(words)], answer_ids[len(words) :]
        return cls.from_labeled_ids(
            name,
            encode(tokenizer, prompts),
            list(labels),
            class_answers,
            class_names=list(class_names) if class_names is not None else [str(w) for w in words],
            pool_answers=pool_answers if spec.remap_labels else None,
            spec=spec,
            domain=domain,
            max_length=max_length,
            separator_ids=encode(tokenizer, [separator])[0] if separator else (),
            prompt_texts=prompts,
        )

    @classmethod
    def from_labeled_ids(
        cls,
        name: str,
        prompt_ids: Sequence[Sequence[int]],
        labels: Sequence[int],
        class_answers: Sequence[Sequence[int]],
        *,
        class_names: Sequence[str],
        spec: EpisodeSpec,
        pool_answers: Sequence[Sequence[int]] | None = None,
        domain: str = "",
        max_length: int = 256,
        separator_ids: Sequence[int] = (),
        prompt_texts: Sequence[str] | None = None,
    ) -> Task:
        """A classification task from token ids already computed (e.g. read from a disk cache).

        Prompts are cut from the left to leave room for the longest answer (class word or pool
        word), so every episode fits ``max_length`` whichever words it draws.

        Args:
            name: unique task name.
            prompt_ids: token ids of each prompt.
            labels: class index of each prompt, into ``class_answers``.
            class_answers: answer ids (EOS included) of each class's verbalizer word.
            class_names: display name of each class.
            spec: episode shape.
            pool_answers: answer ids of each ``spec.label_pool`` word (for ``remap_labels``).
            domain: task family for diversity-aware sampling (defaults to ``name``).
            max_length: token budget of one example.
            separator_ids: tokens between in-context demonstrations.
            prompt_texts: the prompts as text, only to quote in error messages.
        """
        where = f"task {name!r}"
        _check_budget(max_length, "drop")
        if len(prompt_ids) != len(labels):
            raise ValueError(
                f"{where}: {len(prompt_ids)} prompts but {len(labels)} labels; give one per prompt"
            )
        longest = max(len(a) for a in [*class_answers, *(pool_answers or ())])
        if longest + 1 > max_length:
            # The same answer words serve every example, so no example could fit: always an error.
            raise ValueError(
                f"{where}: the longest answer word takes {longest} tokens (EOS included) but "
                f"max_length={max_length} leaves no room for it plus one prompt token: raise "
                f"max_length to at least {longest + 1} or use shorter label words"
            )
        kept_p: list[Sequence[int]] = []
        for i, p in enumerate(prompt_ids):
            _check_nonempty_ids(where, i, p, prompt_texts[i] if prompt_texts is not None else None)
            kept_p.append(p[-(max_length - longest) :])  # room >= 1 checked above
        return cls(
            name,
            prompts=kept_p,
            labels=list(labels),
            class_answers=class_answers,
            class_names=list(class_names),
            pool_answers=pool_answers,
            spec=spec,
            domain=domain,
            separator_ids=separator_ids,
        )

    # ------------------------------------------------------------------ access

    def __len__(self) -> int:
        return len(self._examples)

    def __repr__(self) -> str:
        kind = f"{len(self._class_answers)}-class" if self.is_classification else "generation"
        return f"Task({self.name!r}, {kind}, {len(self)} examples, domain={self.domain!r})"

    @property
    def examples(self) -> tuple[Example, ...]:
        """All cached examples (classification labels index :attr:`class_names`)."""
        return self._examples

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each example (prompt + answer), for cost models."""
        return self._lengths

    @property
    def episode_size(self) -> tuple[int, int]:
        """(support, query) sequences per episode under :attr:`spec`."""
        k = self.ways if self.is_classification else 1
        return self.spec.shots * k, self.spec.query * k

    def with_spec(self, spec: EpisodeSpec) -> Task:
        """The same cached ids with another episode shape (e.g. more queries to evaluate).

        No tokenizer is needed; remapping to words other than the build-time ``label_pool``
        needs those words tokenized, so rebuild the task for that.

        Raises:
            ValueError: if the task cannot supply an episode of ``spec``.
        """
        if not self.is_classification:
            return Task(
                self.name, prompts=self._prompts, answers=self._answers, spec=spec,
                domain=self.domain, separator_ids=self.separator_ids, n_dropped=self.n_dropped,
            )  # fmt: skip
        if spec.remap_labels and spec.label_pool != self.spec.label_pool:
            raise ValueError(
                f"task {self.name!r}: with_spec() cannot remap to label_pool={spec.label_pool!r} "
                "(its words were not tokenized at build time); rebuild the task with that pool"
            )
        return Task(
            self.name, prompts=self._prompts, labels=self._labels, spec=spec,
            class_answers=self._class_answers, class_names=self.class_names,
            pool_answers=self._pool_answers if spec.remap_labels else None,
            domain=self.domain, separator_ids=self.separator_ids, n_dropped=self.n_dropped,
        )  # fmt: skip

    # ------------------------------------------------------------------ sampling

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """Draws one episode: a gather of cached ids driven by ``rng``.

        Support and query never share an example, and each call draws fresh examples from
        ``rng``, so resampling a task gives a new episode (and the same seed the same episode).

        Args:
            rng: the caller's generator; the only source of randomness.
        """
        spec = self.spec
        if not self.is_classification:
            idx = rng.choice(len(self._examples), size=spec.per_class, replace=False)
            ex = self._examples
            return Episode(
                task=self.name,
                support=tuple(ex[i] for i in idx[: spec.shots]),
                query=tuple(ex[i] for i in idx[spec.shots :]),
                shots=spec.shots,
                separator_ids=self.separator_ids,
            )
        ways = self.ways
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
            support.extend(Example(prompts[i], answer, local) for i in picked[: spec.shots])
            query.extend(Example(prompts[i], answer, local) for i in picked[spec.shots :])
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


def _check_budget(max_length: int, on_too_long: str) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(
            f"max_length={max_length!r} is invalid: it must be an int >= 2 (tokens per example: "
            "at least one prompt token plus the answer)"
        )
    if on_too_long not in _ON_TOO_LONG:
        raise ValueError(
            f"on_too_long={on_too_long!r} is invalid: use 'drop' (skip and count such examples) "
            "or 'error'"
        )


def _check_nonempty_ids(where: str, i: int, ids: Sequence[int], text: str | None) -> None:
    if not len(ids):
        shown = f"={text!r}" if text is not None else ""
        raise ValueError(f"{where}: prompt[{i}]{shown} tokenizes to no tokens: give it visible text")


def _log_dropped(where: str, dropped: int, total: int, max_length: int) -> None:
    if dropped:
        logger.warning(
            "%s: dropped %d of %d examples whose answer does not fit max_length=%d",
            where, dropped, total, max_length,
        )  # fmt: skip


def check_unique_names(tasks: Iterable[Task], *, where: str = "task list") -> None:
    """Raises if two tasks share a name (names key samplers, logs and splits).

    Raises:
        ValueError: naming each duplicate and how to fix it.
    """
    seen: dict[str, int] = {}
    for t in tasks:
        seen[t.name] = seen.get(t.name, 0) + 1
    dup = {n: c for n, c in seen.items() if c > 1}
    if dup:
        raise ValueError(
            f"{where} has duplicate task names {dup} (name: count): task names must be unique; "
            "rename the tasks (e.g. pass name=... or a name prefix to the builder)"
        )


@dataclass(frozen=True)
class TaskSet:
    """Disjoint meta-train, meta-validation and meta-test task lists.

    Attributes:
        meta_train: tasks the meta-learner trains on.
        meta_val: tasks for choosing hyper-parameters (e.g. the adaptation lr).
        meta_test: held-out tasks, touched only for the final evaluation.
    """

    meta_train: list[Task] = field(default_factory=list)
    meta_val: list[Task] = field(default_factory=list)
    meta_test: list[Task] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_unique_names(
            [*self.meta_train, *self.meta_val, *self.meta_test],
            where="TaskSet (meta_train + meta_val + meta_test)",
        )

    def names(self) -> dict[str, list[str]]:
        """Task names per split."""
        return {
            "meta_train": [t.name for t in self.meta_train],
            "meta_val": [t.name for t in self.meta_val],
            "meta_test": [t.name for t in self.meta_test],
        }


def split_tasks(
    tasks: Sequence[Task],
    *,
    seed: int,
    fractions: tuple[float, float, float] | None = (0.8, 0.1, 0.1),
    names: Mapping[str, Sequence[str]] | None = None,
) -> TaskSet:
    """Splits tasks into disjoint meta-train / meta-validation / meta-test lists.

    Args:
        tasks: tasks with unique names.
        seed: seeds the shuffle for ``fractions`` (the same seed gives the same split).
        fractions: (train, val, test) shares summing to 1; each non-zero share gets >= 1 task.
        names: explicit split instead of fractions: ``{"meta_val": [...], "meta_test": [...]}``
            and optionally ``"meta_train"``; tasks not named go to meta-train.

    Raises:
        ValueError: on duplicate names, unknown names, a task named in two splits, or bad fractions.
    """
    check_unique_names(tasks)
    by_name = {t.name: t for t in tasks}
    if names is not None:
        allowed = ("meta_train", "meta_val", "meta_test")
        unknown_keys = sorted(set(names) - set(allowed))
        if unknown_keys:
            raise ValueError(f"split_tasks names has keys {unknown_keys}: allowed keys are {allowed}")
        where: dict[str, str] = {}
        for split, ns in names.items():
            for n in ns:
                if n not in by_name:
                    raise ValueError(
                        f"split_tasks names[{split!r}] has unknown task {n!r}; known tasks: "
                        f"{sorted(by_name)[:20]}"
                    )
                if n in where:
                    raise ValueError(
                        f"task {n!r} is named in both {where[n]!r} and {split!r}: splits must be "
                        "disjoint; keep it in one"
                    )
                where[n] = split
        if "meta_train" not in names:
            for t in tasks:
                where.setdefault(t.name, "meta_train")
        out: dict[str, list[Task]] = {k: [] for k in allowed}
        for t in tasks:
            if t.name in where:
                out[where[t.name]].append(t)
        return TaskSet(**out)
    if fractions is None or len(fractions) != 3 or any(f < 0 for f in fractions):
        raise ValueError(
            f"split_tasks fractions={fractions!r} is invalid: give three shares >= 0 "
            "(train, val, test), or pass names=..."
        )
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"split_tasks fractions={fractions!r} sum to {sum(fractions)}, not 1")
    n = len(tasks)
    n_val = max(1, round(fractions[1] * n)) if fractions[1] > 0 else 0
    n_test = max(1, round(fractions[2] * n)) if fractions[2] > 0 else 0
    if n_val + n_test >= n and fractions[0] > 0:
        raise ValueError(
            f"split_tasks: {n} tasks are too few for fractions={fractions} (meta_val {n_val}, "
            f"meta_test {n_test}, nothing left to train on): add tasks or change fractions"
        )
    order = np.random.default_rng(seed).permutation(n)
    shuffled = [tasks[i] for i in order]
    return TaskSet(
        meta_train=shuffled[n_val + n_test :],
        meta_val=shuffled[:n_val],
        meta_test=shuffled[n_val : n_val + n_test],
    )


__all__ = [
    "EpisodeSpec",
    "Task",
    "TaskSet",
    "check_texts",
    "check_unique_names",
    "ensure_pad_token",
    "split_tasks",
]
