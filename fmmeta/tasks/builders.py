"""Builders: rows from anywhere -> lists of tokenized :class:`~fmmeta.tasks.task.Task`.

Four ways to describe a task collection, all ending in the same cached, seeded episode machinery:

* :func:`classification_tasks`: N-way K-shot episodes from one labeled dataset;
* :func:`tasks_from_column`: one dataset whose rows carry a task name (an instruction mixture);
* :func:`tasks_from_datasets`: several datasets, one task each (MetaICL / CrossFit style);
* :func:`tasks_from_examples`: Python lists or a generator function (custom LLM task sets).

Every builder checks its input before tokenizing anything and raises one clear ``ValueError``
naming the key, the value and the fix, so bad data never reaches a training run.
"""

from __future__ import annotations

import logging
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets

from fmmeta.tasks.source import Source, load_source
from fmmeta.tasks.task import (
    EpisodeSpec,
    OnTooLong,
    Task,
    check_texts,
    check_unique_names,
)

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------- helpers


def _template_fields(template: str, *, key: str) -> list[str]:
    """Column names a ``str.format`` template refers to."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"{key}={template!r} is not a valid format string: {err}") from err
    for _, field_name, _, _ in parsed:
        if field_name is None:
            continue
        base = field_name.split(".")[0].split("[")[0]
        if not base or base.isdigit():
            raise ValueError(
                f"{key}={template!r} has a positional field {{{field_name}}}: name the column, "
                "e.g. '{text}'"
            )
        if base not in fields:
            fields.append(base)
    return fields


def _require_columns(ds: datasets.Dataset, columns: Iterable[str], *, where: str) -> None:
    existing = list(ds.column_names)
    missing = [c for c in dict.fromkeys(columns) if c not in existing]
    if missing:
        raise ValueError(
            f"{where}: column(s) {missing} not found; the dataset has columns {existing}: "
            "pass the right column name(s) or rename the columns"
        )


def _render(template: str, cols: Mapping[str, list[Any]], n: int, *, where: str) -> list[str]:
    """Formats ``template`` for each of ``n`` rows, after checking referenced values."""
    for name, values in cols.items():
        for i, v in enumerate(values):
            if v is None or (isinstance(v, str) and not v.strip()):
                raise ValueError(
                    f"{where}: column {name!r} row {i} is {v!r}: every referenced text must be "
                    f"non-empty; filter such rows first (dataset.filter(lambda r: r[{name!r}]))"
                )
    names = list(cols)
    return [template.format(**{c: cols[c][i] for c in names}) for i in range(n)]


def _check_present(values: Sequence[Any], *, key: str, where: str) -> None:
    """Raises on None or blank values; numbers pass (CSV files read "1" as an int)."""
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is empty: every {key} must be non-empty; "
                f"filter such rows first (dataset.filter(lambda r: r[{key!r}]))"
            )


def _label_type(v: Any) -> str:
    return "bool" if isinstance(v, bool) else type(v).__name__


def _labels_to_classes(
    values: Sequence[Any],
    *,
    verbalizer: Sequence[str] | Mapping[Any, str] | None,
    feature_names: Sequence[str] | None,
    key: str,
    where: str,
) -> tuple[list[int], list[str], list[str]]:
    """Maps raw label values to class indices, verbalizer words and class names.

    Returns:
        (class index per row, verbalizer word per class, class name per class); classes are the
        distinct values present, in sorted order.
    """
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is an empty label: every row needs a label; "
                "filter unlabeled rows first"
            )
    types: dict[str, Any] = {}
    for v in values:
        types.setdefault(_label_type(v), v)
    if len(types) > 1:
        raise ValueError(
            f"{where}: {key} mixes label types {sorted(types)} (e.g. "
            f"{', '.join(repr(v) for v in types.values())}): use one type for every label, "
            "e.g. cast them all to str"
        )
    if not types:
        raise ValueError(f"{where}: no labels: the task has no examples")
    distinct = sorted(set(values))
    if feature_names is not None:
        names = [feature_names[v] for v in distinct]
    else:
        names = [str(v) for v in distinct]
    if verbalizer is None:
        if feature_names is None and not isinstance(distinct[0], str):
            raise ValueError(
                f"{where}: {key} holds {_label_type(distinct[0])} labels {distinct[:6]} without "
                "class names: pass verbalizer=[word per class index] or {label: word}"
            )
        words = names
    elif isinstance(verbalizer, Mapping):
        words = []
        missing = []
        for v, n in zip(distinct, names):
            if v in verbalizer:
                words.append(verbalizer[v])
            elif n in verbalizer:  # a ClassLabel's class name works as key too
                words.append(verbalizer[n])
            else:
                missing.append(v)
        if missing:
            raise ValueError(
                f"{where}: verbalizer has no word for label(s) {missing}; its keys are "
                f"{list(verbalizer)[:10]}: add them"
            )
    elif isinstance(verbalizer, Sequence) and not isinstance(verbalizer, str):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in distinct):
            raise ValueError(
                f"{where}: a list verbalizer needs integer labels but {key} holds "
                f"{_label_type(distinct[0])} values: pass a mapping {{label: word}} instead"
            )
        out_of_range = [v for v in distinct if not 0 <= v < len(verbalizer)]
        if out_of_range:
            raise ValueError(
                f"{where}: labels {out_of_range} have no entry in the {len(verbalizer)}-word "
                "verbalizer list: give one word per class index"
            )
        words = [verbalizer[v] for v in distinct]
    else:
        raise ValueError(
            f"{where}: verbalizer={verbalizer!r} must be a list of words or a mapping "
            "{label: word}"
        )
    index = {v: i for i, v in enumerate(distinct)}
    return [index[v] for v in values], [str(w) for w in words], names


def _check_class_sizes(
    class_of_row: list[int],
    names: list[str],
    spec: EpisodeSpec,
    *,
    drop_small_classes: bool,
    where: str,
) -> set[int]:
    """Returns the classes to keep; raises (or warns and drops) on classes too small to sample."""
    counts = [0] * len(names)
    for c in class_of_row:
        counts[c] += 1
    small = {c for c, n in enumerate(counts) if n < spec.per_class}
    if small:
        detail = ", ".join(f"{names[c]!r} has {counts[c]}" for c in sorted(small))
        if not drop_small_classes:
            raise ValueError(
                f"{where}: class(es) with fewer than shots + query = {spec.shots} + {spec.query} "
                f"= {spec.per_class} examples: {detail}. Add examples, lower shots/query, or "
                "pass drop_small_classes=True to drop them"
            )
        logger.warning("%s: dropping class(es) too small for an episode: %s", where, detail)
    keep = set(range(len(names))) - small
    ways = spec.ways if spec.ways is not None else len(names)
    if len(keep) < ways:
        raise ValueError(
            f"{where}: {len(keep)} class(es) can supply an episode but ways={ways}: lower ways "
            f"to at most {len(keep)} or add classes/examples"
        )
    return keep


def _resolve_template(template: str | None, input_column: str) -> str:
    return template if template is not None else "{" + input_column + "}"


# ---------------------------------------------------------------------------------------- builders


def classification_tasks(
    source: Source,
    tokenizer: Any,
    *,
    spec: EpisodeSpec,
    name: str = "classification",
    text_column: str = "text",
    label_column: str = "label",
    template: str | None = None,
    answer_template: str = " {answer}",
    verbalizer: Sequence[str] | Mapping[Any, str] | None = None,
    drop_small_classes: bool = False,
    split: str | None = None,
    config_name: str | None = None,
    domain: str = "",
    max_length: int = 256,
    on_too_long: OnTooLong = "drop",
    separator: str = "\n\n",
) -> list[Task]:
    """N-way K-shot classification from one labeled dataset.

    Each episode draws ``spec.ways`` classes and ``spec.shots + spec.query`` examples per class;
    labels become answer words through the verbalizer and, with ``spec.remap_labels``, through a
    fresh random word per class and episode.

    Args:
        source: anything :func:`~fmmeta.tasks.source.load_source` accepts.
        tokenizer: a Hugging Face tokenizer.
        spec: episode shape (``ways``, ``shots``, ``query``, optional remapping).
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
        domain: task family for diversity-aware sampling (default: ``name``).
        max_length: token budget of one example.
        on_too_long: unused for classification beyond the check that label words fit (they serve
            every example, so a word over budget is always an error); kept for a uniform API.
        separator: text between in-context demonstrations.

    Returns:
        A one-task list (builders share the ``list[Task]`` return type).

    Example:
        >>> tasks = classification_tasks(ds, tok, spec=EpisodeSpec(shots=2, query=2, ways=3),
        ...     text_column="sentence", template="Review: {sentence}\\nSentiment:")  # doctest: +SKIP
    """
    where = f"classification_tasks(name={name!r})"
    ds = load_source(source, split=split, name=config_name)
    template = _resolve_template(template, text_column)
    fields = _template_fields(template, key="template")
    _require_columns(ds, [text_column, label_column, *fields], where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so the task has no examples")
    feature = ds.features.get(label_column)
    feature_names = feature.names if isinstance(feature, datasets.ClassLabel) else None
    raw_labels = list(ds[label_column])
    classes, words, names = _labels_to_classes(
        raw_labels, verbalizer=verbalizer, feature_names=feature_names, key=label_column, where=where
    )
    keep = _check_class_sizes(
        classes, names, spec, drop_small_classes=drop_small_classes, where=where
    )
    cols = {f: list(ds[f]) for f in dict.fromkeys([text_column, *fields])}
    check_texts(cols[text_column], key=text_column, where=where)
    prompts = _render(template, {f: cols[f] for f in fields}, len(ds), where=where)
    # Renumber the kept classes 0..k-1 so the task sees only classes it can sample.
    new_index = {c: i for i, c in enumerate(sorted(keep))}
    rows = [i for i, c in enumerate(classes) if c in keep]
    task = Task.from_labeled_texts(
        name,
        [prompts[i] for i in rows],
        [new_index[classes[i]] for i in rows],
        [words[c] for c in sorted(keep)],
        tokenizer,
        spec=spec,
        answer_template=answer_template,
        domain=domain,
        max_length=max_length,
        on_too_long=on_too_long,
        separator=separator,
    )
    task.class_names = tuple(names[c] for c in sorted(keep))
    return [task]


def tasks_from_column(
    source: Source,
    tokenizer: Any,
    *,
    spec: EpisodeSpec,
    task_column: str = "task",
    input_column: str = "input",
    output_column: str = "output",
    template: str | None = None,
    answer_template: str = " {answer}",
    name_prefix: str = "",
    drop_small_tasks: bool = False,
    split: str | None = None,
    config_name: str | None = None,
    domain: str = "",
    max_length: int = 256,
    on_too_long: OnTooLong = "drop",
    separator: str = "\n\n",
) -> list[Task]:
    """One generation task per distinct value of ``task_column`` (an instruction mixture).

    Args:
        source: anything :func:`~fmmeta.tasks.source.load_source` accepts.
        tokenizer: a Hugging Face tokenizer.
        spec: episode shape (``shots``, ``query``).
        task_column: the column naming each row's task.
        input_column: the prompt column (used by the default template).
        output_column: the answer column.
        template: prompt format over column names; default ``"{<input_column>}"``.
        answer_template: answer format; ``{answer}`` is the output value.
        name_prefix: prepended to each task value to form the task name.
        drop_small_tasks: drop (with a warning) tasks with fewer than ``shots + query`` examples
            instead of raising.
        split: split of a DatasetDict or hub dataset.
        config_name: hub dataset configuration.
        domain: task family for every task (default: each task's own name).
        max_length: token budget of one example.
        on_too_long: ``"drop"`` or ``"error"`` for an answer over budget.
        separator: text between in-context demonstrations.

    Returns:
        Tasks in order of first appearance of their task value.
    """
    where = f"tasks_from_column(task_column={task_column!r})"
    ds = load_source(source, split=split, name=config_name)
    template = _resolve_template(template, input_column)
    fields = _template_fields(template, key="template")
    _require_columns(ds, [task_column, input_column, output_column, *fields], where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so there are no tasks")
    task_values = list(ds[task_column])
    for i, v in enumerate(task_values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {task_column}[{i}]={v!r} is empty: every row needs a task name; "
                "filter such rows first"
            )
    cols = {f: list(ds[f]) for f in fields}
    prompts = _render(template, cols, len(ds), where=where)
    outputs = list(ds[output_column])
    _check_present(outputs, key=output_column, where=where)
    groups: dict[Any, list[int]] = {}
    for i, v in enumerate(task_values):
        groups.setdefault(v, []).append(i)
    names = {v: f"{name_prefix}{v}" for v in groups}
    counts: dict[str, int] = {}
    for n in names.values():
        counts[n] = counts.get(n, 0) + 1
    clash = sorted(n for n, c in counts.items() if c > 1)
    if clash:
        raise ValueError(
            f"{where}: task values {clash} give duplicate task names (e.g. 1 and '1'): make the "
            f"{task_column!r} values distinct as strings"
        )
    tasks: list[Task] = []
    for value, rows in groups.items():
        if len(rows) < spec.per_class:
            msg = (
                f"{where}: task {names[value]!r} has {len(rows)} examples but an episode needs "
                f"shots + query = {spec.per_class}"
            )
            if not drop_small_tasks:
                raise ValueError(
                    msg + ": add examples, lower shots/query, or pass drop_small_tasks=True"
                )
            logger.warning("%s; dropping it", msg)
            continue
        tasks.append(
            Task.from_texts(
                names[value],
                [prompts[i] for i in rows],
                [answer_template.format(answer=outputs[i]) for i in rows],
                tokenizer,
                spec=spec,
                domain=domain,
                max_length=max_length,
                on_too_long=on_too_long,
                separator=separator,
            )
        )
    if not tasks:
        raise ValueError(
            f"{where}: every task was dropped as too small; no tasks remain: add examples, "
            f"lower shots/query (each task needs {spec.per_class}), or check {task_column!r}"
        )
    check_unique_names(tasks, where=where)
    return tasks


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """One dataset that becomes one task in :func:`tasks_from_datasets`.

    Attributes:
        name: the task's unique name.
        source: anything :func:`~fmmeta.tasks.source.load_source` accepts.
        input_column: the prompt column (used by the default template).
        output_column: the answer column.
        template: prompt format over column names; default ``"{<input_column>}"``.
        answer_template: answer format; ``{answer}`` is the output value.
        split: split of a DatasetDict or hub dataset.
        config_name: hub dataset configuration.
        domain: task family (default: ``name``).
        episode: episode shape for this task only (default: the builder's ``spec``).
    """

    name: str
    source: Source
    input_column: str = "input"
    output_column: str = "output"
    template: str | None = None
    answer_template: str = " {answer}"
    split: str | None = None
    config_name: str | None = None
    domain: str = ""
    episode: EpisodeSpec | None = None


def tasks_from_datasets(
    specs: Sequence[DatasetSpec],
    tokenizer: Any,
    *,
    spec: EpisodeSpec,
    max_length: int = 256,
    on_too_long: OnTooLong = "drop",
    separator: str = "\n\n",
) -> list[Task]:
    """Several datasets, one generation task each (MetaICL / CrossFit style).

    Args:
        specs: one :class:`DatasetSpec` per task; names must be unique.
        tokenizer: a Hugging Face tokenizer.
        spec: default episode shape (a ``DatasetSpec.episode`` overrides it).
        max_length: token budget of one example.
        on_too_long: ``"drop"`` or ``"error"`` for an answer over budget.
        separator: text between in-context demonstrations.

    Example:
        >>> tasks = tasks_from_datasets([
        ...     DatasetSpec(name="qa", source="qa.jsonl", input_column="question",
        ...                 output_column="answer", template="Q: {question}\\nA:"),
        ...     DatasetSpec(name="nli", source=nli_ds, input_column="premise", output_column="label_text"),
        ... ], tok, spec=EpisodeSpec(shots=4, query=4))  # doctest: +SKIP
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
    tasks: list[Task] = []
    for k, s in enumerate(specs):
        where = f"tasks_from_datasets specs[{k}] (name={s.name!r})"
        ds = load_source(s.source, split=s.split, name=s.config_name)
        template = _resolve_template(s.template, s.input_column)
        fields = _template_fields(template, key=f"specs[{k}].template")
        _require_columns(ds, [s.input_column, s.output_column, *fields], where=where)
        if len(ds) == 0:
            raise ValueError(f"{where}: the dataset has no rows, so the task has no examples")
        prompts = _render(template, {f: list(ds[f]) for f in fields}, len(ds), where=where)
        outputs = list(ds[s.output_column])
        _check_present(outputs, key=s.output_column, where=where)
        tasks.append(
            Task.from_texts(
                s.name,
                prompts,
                [s.answer_template.format(answer=o) for o in outputs],
                tokenizer,
                spec=s.episode or spec,
                domain=s.domain,
                max_length=max_length,
                on_too_long=on_too_long,
                separator=separator,
            )
        )
    return tasks


ExampleItem = tuple[str, str] | Mapping[str, Any]


def tasks_from_examples(
    name: str,
    examples: Iterable[ExampleItem] | Callable[[], Iterable[ExampleItem]],
    tokenizer: Any,
    *,
    spec: EpisodeSpec,
    verbalizer: Sequence[str] | Mapping[Any, str] | None = None,
    answer_template: str | None = None,
    drop_small_classes: bool = False,
    domain: str = "",
    max_length: int = 256,
    on_too_long: OnTooLong = "drop",
    separator: str = "\n\n",
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
        spec: episode shape.
        verbalizer: classification only: words per label (default: the labels as strings).
        answer_template: answer format; ``{answer}`` is the item's answer or label word. The
            default keeps generation answers verbatim (so include the leading space:
            ``" Paris"``) and puts a space before label words (``" {answer}"``).
        drop_small_classes: classification only: drop too-small classes with a warning.
        domain: task family for diversity-aware sampling (default: ``name``).
        max_length: token budget of one example.
        on_too_long: ``"drop"`` or ``"error"`` for an answer over budget.
        separator: text between in-context demonstrations.

    Example:
        >>> tok = tiny_tokenizer()  # doctest: +SKIP
        >>> add3 = tasks_from_examples("add3", [(f"{a}+3=", f" {a + 3}") for a in range(40)],
        ...                            tok, spec=EpisodeSpec(shots=4, query=4))  # doctest: +SKIP
        >>> episode = add3.sample_episode(numpy.random.default_rng(0))  # doctest: +SKIP
    """
    where = f"tasks_from_examples(name={name!r})"
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
            if "answer" in item:
                kinds.add("answer")
                answers.append(item["answer"])
            else:
                kinds.add("label")
                labels.append(item["label"])
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
    check_texts(prompts, key="prompt", where=where)
    if "answer" in kinds:
        check_texts(answers, key="answer", where=where)
        return Task.from_texts(
            name,
            prompts,
            [(answer_template or "{answer}").format(answer=a) for a in answers],
            tokenizer,
            spec=spec,
            domain=domain,
            max_length=max_length,
            on_too_long=on_too_long,
            separator=separator,
        )
    classes, words, names = _labels_to_classes(
        labels, verbalizer=verbalizer, feature_names=None, key="label", where=where
    )
    keep = _check_class_sizes(
        classes, names, spec, drop_small_classes=drop_small_classes, where=where
    )
    new_index = {c: i for i, c in enumerate(sorted(keep))}
    rows = [i for i, c in enumerate(classes) if c in keep]
    task = Task.from_labeled_texts(
        name,
        [prompts[i] for i in rows],
        [new_index[classes[i]] for i in rows],
        [words[c] for c in sorted(keep)],
        tokenizer,
        spec=spec,
        answer_template=answer_template if answer_template is not None else " {answer}",
        domain=domain,
        max_length=max_length,
        on_too_long=on_too_long,
        separator=separator,
    )
    task.class_names = tuple(names[c] for c in sorted(keep))
    return task


__all__ = [
    "DatasetSpec",
    "classification_tasks",
    "tasks_from_column",
    "tasks_from_datasets",
    "tasks_from_examples",
]
