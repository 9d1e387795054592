"""Builders: rows from anywhere -> lists of tokenized tasks.

Five ways to describe a task collection, all ending in the same cached, seeded episode machinery:

* :func:`classification_tasks`: N-way K-shot episodes from one labeled dataset;
* :func:`multiple_choice_tasks`: questions with their own options from one dataset (ARC, MMLU...);
* :func:`tasks_from_column`: one dataset whose rows carry a task name (an instruction mixture);
* :func:`tasks_from_datasets`: several datasets, one task each (MetaICL / CrossFit style);
* :func:`tasks_from_examples`: Python lists or a generator function (custom LLM task sets).

What differs between them is where rows come from and how they are read; how rows become tasks
(episode shape, token budget, overflow rule, separator, family) is one
:class:`~fmmeta.tasks.options.TaskOptions` they all take. Every builder checks its input before
tokenizing anything and raises one clear ``ValueError`` naming the key, the value and the fix, so
bad data never reaches a training run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fmmeta.tasks.choice_rows import AnswerFormat, multiple_choice_rows
from fmmeta.tasks.classification import ClassificationTask
from fmmeta.tasks.data import DatasetLike, read_dataset
from fmmeta.tasks.generation import GenerationTask
from fmmeta.tasks.labels import check_class_sizes, labels_to_classes
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.rows import (
    TaskRows,
    classification_rows,
    column_rows,
    dataset_rows,
    tasks_from_rows,
)
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.task import Task
from fmmeta.tasks.tokens import check_texts


def classification_tasks(
    data: DatasetLike,
    tokenizer: Any,
    options: TaskOptions,
    *,
    name: str = "classification",
    text_column: str = "text",
    label_column: str = "label",
    template: str | None = None,
    answer_template: str = " {answer}",
    verbalizer: Sequence[str] | Mapping[Any, str] | None = None,
    drop_small_classes: bool = False,
    split: str | None = None,
    config_name: str | None = None,
) -> list[Task]:
    """N-way K-shot classification from one labeled dataset.

    Each episode draws ``options.spec.ways`` classes and ``shots + query`` examples per class;
    labels become answer words through the verbalizer and, with ``spec.remap_labels``, through a
    fresh random word per class and episode.

    Args:
        data: anything :func:`~fmmeta.tasks.data.read_dataset` accepts.
        tokenizer: a Hugging Face tokenizer.
        options: episode shape (``ways``, ``shots``, ``query``, optional remapping), token budget,
            separator and family. ``on_too_long`` is only checked: label words serve every
            example, so a word over budget is always an error.
        name: the task's name.
        text_column: the column with the text to classify.
        label_column: the column with the labels (ClassLabel ints, strings, or ints + verbalizer).
        template: prompt format over column names; default ``"{<text_column>}"``.
        answer_template: answer format; ``{answer}`` is the label word.
        verbalizer: words per class: a list indexed by integer label or a mapping
            ``{label: word}``; default: ClassLabel names or the string labels themselves.
        drop_small_classes: drop (with a warning) classes too small for an episode instead of
            raising.
        split: split of a DatasetDict or hub dataset.
        config_name: hub dataset configuration.

    Returns:
        A one-task list (builders share the ``list[Task]`` return type).

    Example:
        >>> tasks = classification_tasks(ds, tok, TaskOptions(spec=EpisodeSpec(shots=2, query=2, ways=3)),
        ...     text_column="sentence", template="Review: {sentence}\\nSentiment:")  # doctest: +SKIP
    """
    rows = classification_rows(
        read_dataset(data, split=split, name=config_name), spec=options.spec, name=name,
        text_column=text_column, label_column=label_column, template=template,
        answer_template=answer_template, verbalizer=verbalizer,
        drop_small_classes=drop_small_classes, family=options.family,
    )  # fmt: skip
    return _tokenize([rows], tokenizer, options)


def multiple_choice_tasks(
    data: DatasetLike,
    tokenizer: Any,
    options: TaskOptions,
    *,
    name: str = "multiple_choice",
    template: str,
    options_column: str | None = None,
    option_columns: Sequence[str] | None = None,
    label_column: str = "label",
    answer_format: AnswerFormat = "auto",
    answer_template: str = " {answer}",
    split: str | None = None,
    config_name: str | None = None,
) -> list[Task]:
    """Multiple choice from one dataset: every question brings its own options.

    An episode's support is ``shots`` solved questions (trained on their gold option) and its
    query ``query`` questions, each scored by ranking its own options
    (:mod:`fmmeta.tasks.choice_rows` lists the layouts and answer encodings it reads).

    Args:
        data: anything :func:`~fmmeta.tasks.data.read_dataset` accepts.
        tokenizer: a Hugging Face tokenizer.
        options: episode shape (``shots``, ``query``), token budget, overflow rule, separator
            and family.
        name: the task's name.
        template: prompt format over column names; ``{options}`` shows the options as lettered
            lines.
        options_column: a column holding each row's options (a list, or ARC's ``{text, label}``).
        option_columns: instead, the columns that hold one option each (PIQA's sol1, sol2).
        label_column: the column naming the gold option.
        answer_format: how ``label_column`` names it: auto, index, number, letter, key or text.
        answer_template: an option's answer text; ``{answer}`` is the option, ``{letter}`` its letter.
        split: split of a DatasetDict or hub dataset.
        config_name: hub dataset configuration.

    Example:
        >>> arc = multiple_choice_tasks("arc_easy/", tok, TaskOptions(spec=EpisodeSpec(shots=4, query=4)),
        ...     template="Question: {question}\nAnswer:", options_column="choices",
        ...     label_column="answerKey")  # doctest: +SKIP
    """
    rows = multiple_choice_rows(
        read_dataset(data, split=split, name=config_name), name=name, spec=options.spec,
        template=template, options_column=options_column, option_columns=option_columns,
        label_column=label_column, answer_format=answer_format, answer_template=answer_template,
        family=options.family,
    )  # fmt: skip
    return _tokenize([rows], tokenizer, options)


def tasks_from_column(
    data: DatasetLike,
    tokenizer: Any,
    options: TaskOptions,
    *,
    task_column: str = "task",
    input_column: str = "input",
    output_column: str = "output",
    options_column: str | None = None,
    template: str | None = None,
    answer_template: str = " {answer}",
    name_prefix: str = "",
    drop_small_tasks: bool = False,
    split: str | None = None,
    config_name: str | None = None,
) -> list[Task]:
    """One task per distinct value of ``task_column`` (an instruction mixture).

    Args:
        data: anything :func:`~fmmeta.tasks.data.read_dataset` accepts.
        tokenizer: a Hugging Face tokenizer.
        options: episode shape (``shots``, ``query``; ``ways`` and remapping apply to the
            classification tasks ``options_column`` makes), token budget, overflow rule,
            separator, and the family of every task ("" = each task's own name).
        task_column: the column naming each row's task.
        input_column: the prompt column (used by the default template).
        output_column: the answer column.
        options_column: optional column of answer options (MetaICL): a task whose rows share one
            option list holding every output becomes a classification task over it.
        template: prompt format over column names; default ``"{<input_column>}"``.
        answer_template: answer format; ``{answer}`` is the output value.
        name_prefix: prepended to each task value to form the task name.
        drop_small_tasks: drop (with a warning) tasks with fewer than ``shots + query`` examples
            instead of raising.
        split: split of a DatasetDict or hub dataset.
        config_name: hub dataset configuration.

    Returns:
        Tasks in order of first appearance of their task value.
    """
    rows = column_rows(
        read_dataset(data, split=split, name=config_name), spec=options.spec,
        task_column=task_column, input_column=input_column, output_column=output_column,
        options_column=options_column, template=template, answer_template=answer_template,
        name_prefix=name_prefix, drop_small_tasks=drop_small_tasks, family=options.family,
    )  # fmt: skip
    return _tokenize(rows, tokenizer, options)


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """One dataset that becomes one task in :func:`tasks_from_datasets`.

    Attributes:
        name: the task's unique name.
        data: anything :func:`~fmmeta.tasks.data.read_dataset` accepts.
        input_column: the prompt column (used by the default template).
        output_column: the answer column.
        template: prompt format over column names; default ``"{<input_column>}"``.
        answer_template: answer format; ``{answer}`` is the output value.
        split: split of a DatasetDict or hub dataset.
        config_name: hub dataset configuration.
        family: task family (default: the builder's ``options.family``, else ``name``).
        episode: episode shape for this task only (default: the builder's ``options.spec``).
    """

    name: str
    data: DatasetLike
    input_column: str = "input"
    output_column: str = "output"
    template: str | None = None
    answer_template: str = " {answer}"
    split: str | None = None
    config_name: str | None = None
    family: str = ""
    episode: EpisodeSpec | None = None


def tasks_from_datasets(
    specs: Sequence[DatasetSpec], tokenizer: Any, options: TaskOptions
) -> list[Task]:
    """Several datasets, one generation task each (MetaICL / CrossFit style).

    Args:
        specs: one :class:`DatasetSpec` per task; names must be unique.
        tokenizer: a Hugging Face tokenizer.
        options: default episode shape and family (a ``DatasetSpec``'s ``episode`` and
            ``family`` override them), token budget, overflow rule and separator.

    Example:
        >>> tasks = tasks_from_datasets([
        ...     DatasetSpec(name="qa", data="qa.jsonl", input_column="question",
        ...                 output_column="answer", template="Q: {question}\\nA:"),
        ...     DatasetSpec(name="nli", data=nli_ds, input_column="premise", output_column="label_text"),
        ... ], tok, TaskOptions(spec=EpisodeSpec(shots=4, query=4)))  # doctest: +SKIP
    """
    counts: dict[str, int] = {}
    for s in specs:
        counts[s.name] = counts.get(s.name, 0) + 1
    dup = {n: c for n, c in counts.items() if c > 1}
    if dup:
        raise ValueError(
            f"tasks_from_datasets: duplicate task names {dup} (name: count): give each "
            "DatasetSpec a unique name"
        )
    if not specs:
        raise ValueError("tasks_from_datasets: specs is empty: pass at least one DatasetSpec")
    rows = [
        dataset_rows(
            read_dataset(s.data, split=s.split, name=s.config_name), name=s.name,
            spec=s.episode or options.spec, input_column=s.input_column,
            output_column=s.output_column, template=s.template, answer_template=s.answer_template,
            family=s.family or options.family,
            where=f"tasks_from_datasets specs[{k}] (name={s.name!r})",
        )  # fmt: skip
        for k, s in enumerate(specs)
    ]
    return _tokenize(rows, tokenizer, options)


ExampleItem = tuple[str, str] | Mapping[str, Any]


def tasks_from_examples(
    name: str,
    examples: Iterable[ExampleItem] | Callable[[], Iterable[ExampleItem]],
    tokenizer: Any,
    options: TaskOptions,
    *,
    verbalizer: Sequence[str] | Mapping[Any, str] | None = None,
    answer_template: str | None = None,
    drop_small_classes: bool = False,
) -> Task:
    """One task from Python data: the custom-task API.

    Items are ``(prompt, answer)`` pairs, ``{"prompt": ..., "answer": ...}`` dicts (generation),
    or ``{"prompt": ..., "label": ...}`` dicts (classification: ``spec.ways`` and the optional
    ``verbalizer`` / ``spec.remap_labels`` apply as in :func:`classification_tasks`).
    ``examples`` may also be a generator function, called once with no arguments.

    Args:
        name: the task's unique name.
        examples: the items, or a zero-argument callable returning them.
        tokenizer: a Hugging Face tokenizer.
        options: episode shape, token budget, overflow rule, separator and family
            ("" = ``name``).
        verbalizer: classification only: words per label (default: the labels as strings).
        answer_template: answer format; ``{answer}`` is the item's answer or label word. The
            default keeps generation answers verbatim (so include the leading space:
            ``" Paris"``) and puts a space before label words (``" {answer}"``).
        drop_small_classes: classification only: drop too-small classes with a warning.

    Returns:
        A :class:`~fmmeta.tasks.generation.GenerationTask` for answers, a
        :class:`~fmmeta.tasks.classification.ClassificationTask` for labels.

    Example:
        >>> tok = tiny_tokenizer()  # doctest: +SKIP
        >>> add3 = tasks_from_examples("add3", [(f"{a}+3=", f" {a + 3}") for a in range(40)],
        ...                            tok, TaskOptions(spec=EpisodeSpec(shots=4, query=4)))  # doctest: +SKIP
        >>> episode = add3.sample_episode(numpy.random.default_rng(0))  # doctest: +SKIP
    """
    where = f"tasks_from_examples(name={name!r})"
    prompts, answers, labels = _read_items(examples, where=where)
    check_texts(prompts, key="prompt", where=where)
    o = options
    if answers is not None:
        check_texts(answers, key="answer", where=where)
        return GenerationTask.from_texts(
            name, prompts, [(answer_template or "{answer}").format(answer=a) for a in answers],
            tokenizer, spec=o.spec, family=o.family, max_length=o.max_length,
            on_too_long=o.on_too_long, separator=o.separator,
        )  # fmt: skip
    classes, words, names = labels_to_classes(
        labels, verbalizer=verbalizer, feature_names=None, key="label", where=where
    )
    keep = check_class_sizes(classes, names, o.spec, drop_small_classes=drop_small_classes, where=where)
    new_index = {c: i for i, c in enumerate(sorted(keep))}
    rows = [i for i, c in enumerate(classes) if c in keep]
    return ClassificationTask.from_texts(
        name, [prompts[i] for i in rows], [new_index[classes[i]] for i in rows],
        [words[c] for c in sorted(keep)], tokenizer, spec=o.spec,
        answer_template=answer_template if answer_template is not None else " {answer}",
        family=o.family, max_length=o.max_length, on_too_long=o.on_too_long, separator=o.separator,
        class_names=[names[c] for c in sorted(keep)],
    )  # fmt: skip


def _read_items(
    examples: Iterable[ExampleItem] | Callable[[], Iterable[ExampleItem]], *, where: str
) -> tuple[list[Any], list[Any] | None, list[Any]]:
    """(prompts, answers or None for a classification task, labels) of the custom items.

    Raises:
        ValueError: for no items, an item of another shape, or items mixing answers and labels.
    """
    items = list(examples() if callable(examples) else examples)
    if not items:
        raise ValueError(
            f"{where}: the task has no examples: pass a non-empty list of (prompt, answer) "
            "pairs or dicts, or a generator function that yields them"
        )
    prompts: list[Any] = []
    answers: list[Any] = []
    labels: list[Any] = []
    kinds: set[str] = set()
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            if "prompt" not in item or ("answer" not in item and "label" not in item):
                raise ValueError(
                    f"{where}: item {i} has keys {sorted(item)}; a dict needs 'prompt' and "
                    "'answer' (generation) or 'prompt' and 'label' (classification)"
                )
            prompts.append(item["prompt"])
            kind = "answer" if "answer" in item else "label"
            kinds.add(kind)
            (answers if kind == "answer" else labels).append(item[kind])
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            kinds.add("answer")
            prompts.append(item[0])
            answers.append(item[1])
        else:
            raise ValueError(
                f"{where}: item {i}={item!r} is neither a (prompt, answer) pair nor a dict with "
                "'prompt' and 'answer'/'label'"
            )
    if len(kinds) > 1:
        raise ValueError(
            f"{where}: items mix 'answer' (generation) and 'label' (classification); "
            "a task is one or the other"
        )
    return prompts, (answers if "answer" in kinds else None), labels


def _tokenize(rows: Sequence[TaskRows], tokenizer: Any, options: TaskOptions) -> list[Task]:
    """The builders' rows as tasks, under the options' budget, overflow rule and separator."""
    return tasks_from_rows(
        rows, tokenizer, max_length=options.max_length, on_too_long=options.on_too_long,
        separator=options.separator,
    )  # fmt: skip


__all__ = [
    "DatasetSpec",
    "classification_tasks",
    "multiple_choice_tasks",
    "tasks_from_column",
    "tasks_from_datasets",
    "tasks_from_examples",
]
