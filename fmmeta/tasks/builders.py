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

import dataclasses
import logging
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np

from fmmeta.tasks.source import Source, load_source
from fmmeta.tasks.task import (
    EpisodeSpec,
    OnTooLong,
    Task,
    check_texts,
    check_unique_names,
    encode,
    eos_ids,
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


def _column(ds: datasets.Dataset, name: str) -> list[Any]:
    """A whole column as a list, read in one slice (iterating a column formats row by row, about
    100x slower on a million rows)."""
    return list(ds[name][:])


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
    """Raises on None, blank or non-scalar values; numbers pass (CSV files read "1" as an int).
    A list or an object would otherwise become its Python repr in the answer text."""
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is empty: every {key} must be non-empty; "
                f"filter such rows first (dataset.filter(lambda r: r[{key!r}]))"
            )
        if isinstance(v, (list, tuple, dict)):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is a {type(v).__name__}, not one answer text: make each "
                f"row's {key!r} a single string (e.g. keep the first of several reference answers)"
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


# ---------------------------------------------------------------------------------------- rows


@dataclass(frozen=True, kw_only=True)
class TaskRows:
    """One task's checked, rendered texts: everything a :class:`Task` needs but the tokenizer.

    Builders stop here so tokenization can happen once, in one place, with or without a disk
    cache (:mod:`fmmeta.tasks.cache`); a generation task has ``answers``, a classification task
    ``labels`` and ``words``.

    Attributes:
        name: the task's unique name.
        domain: task family (diversity sampling, per-family reports); "" means ``name``.
        spec: episode shape.
        prompts: rendered prompt of each example.
        answers: generation: rendered answer of each example (answer template applied).
        labels: classification: class index of each example, into ``words``.
        words: classification: answer text of each class (answer template applied).
        class_names: classification: display name of each class.
        pool: classification with ``spec.remap_labels``: answer text of each pool word.
    """

    name: str
    domain: str
    spec: EpisodeSpec
    prompts: list[str]
    answers: list[str] | None = None
    labels: list[int] | None = None
    words: list[str] | None = None
    class_names: list[str] | None = None
    pool: list[str] | None = None

    @property
    def is_classification(self) -> bool:
        """True for a classification task (labels and class words), False for generation."""
        return self.labels is not None

    def subsample(self, max_examples: int | None, rng: np.random.Generator) -> "TaskRows":
        """At most ``max_examples`` rows, drawn by ``rng`` in their original order (None = all)."""
        n = len(self.prompts)
        if max_examples is None or n <= max_examples:
            return self
        keep = np.sort(rng.choice(n, size=max_examples, replace=False)).tolist()
        pick = lambda xs: None if xs is None else [xs[i] for i in keep]  # noqa: E731
        return dataclasses.replace(
            self, prompts=pick(self.prompts), answers=pick(self.answers), labels=pick(self.labels)
        )


def _classification(
    *,
    name: str,
    domain: str,
    spec: EpisodeSpec,
    prompts: list[str],
    raw_labels: list[Any],
    verbalizer: Sequence[str] | Mapping[Any, str] | None,
    feature_names: Sequence[str] | None,
    answer_template: str,
    drop_small_classes: bool,
    label_key: str,
    where: str,
) -> TaskRows:
    classes, words, names = _labels_to_classes(
        raw_labels, verbalizer=verbalizer, feature_names=feature_names, key=label_key, where=where
    )
    if len(names) < 2:
        raise ValueError(
            f"{where}: {label_key} has a single class {names}: classification needs at least 2 "
            "classes; point label_column at a column with several labels, or build a generation "
            "task instead"
        )
    keep = _check_class_sizes(classes, names, spec, drop_small_classes=drop_small_classes, where=where)
    # Renumber the kept classes 0..k-1 so the task sees only classes it can sample.
    new_index = {c: i for i, c in enumerate(sorted(keep))}
    rows = [i for i, c in enumerate(classes) if c in keep]
    check_texts([words[c] for c in sorted(keep)], key="verbalizer", where=where)
    return TaskRows(
        name=name,
        domain=domain,
        spec=spec,
        prompts=[prompts[i] for i in rows],
        labels=[new_index[classes[i]] for i in rows],
        words=[answer_template.format(answer=words[c]) for c in sorted(keep)],
        class_names=[names[c] for c in sorted(keep)],
        pool=[answer_template.format(answer=w) for w in spec.label_pool or ()]
        if spec.remap_labels
        else None,
    )


def classification_rows(
    ds: datasets.Dataset,
    *,
    spec: EpisodeSpec,
    name: str = "classification",
    text_column: str = "text",
    label_column: str = "label",
    template: str | None = None,
    answer_template: str = " {answer}",
    verbalizer: Sequence[str] | Mapping[Any, str] | None = None,
    drop_small_classes: bool = False,
    domain: str = "",
) -> TaskRows:
    """The checked texts of :func:`classification_tasks` (same arguments), not yet tokenized."""
    where = f"classification_tasks(name={name!r})"
    template = _resolve_template(template, text_column)
    fields = _template_fields(template, key="template")
    _require_columns(ds, [text_column, label_column, *fields], where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so the task has no examples")
    feature = ds.features.get(label_column)
    feature_names = feature.names if isinstance(feature, datasets.ClassLabel) else None
    cols = {f: _column(ds, f) for f in dict.fromkeys([text_column, *fields])}
    check_texts(cols[text_column], key=text_column, where=where)
    prompts = _render(template, {f: cols[f] for f in fields}, len(ds), where=where)
    return _classification(
        name=name, domain=domain, spec=spec, prompts=prompts, raw_labels=_column(ds, label_column),
        verbalizer=verbalizer, feature_names=feature_names, answer_template=answer_template,
        drop_small_classes=drop_small_classes, label_key=label_column, where=where,
    )  # fmt: skip


def _fixed_options(options: list[Any], outputs: list[Any]) -> list[str] | None:
    """The one option list shared by every row, if each row's output is among it; else None."""
    first = options[0]
    if not isinstance(first, (list, tuple)) or len(first) < 2:
        return None
    if any(list(o) != list(first) for o in options) or any(o not in first for o in outputs):
        return None
    return [str(o) for o in first]


def column_rows(
    ds: datasets.Dataset,
    *,
    spec: EpisodeSpec,
    task_column: str = "task",
    input_column: str = "input",
    output_column: str = "output",
    options_column: str | None = None,
    template: str | None = None,
    answer_template: str = " {answer}",
    name_prefix: str = "",
    drop_small_tasks: bool = False,
    domain: str = "",
) -> list[TaskRows]:
    """The checked texts of :func:`tasks_from_column` (same arguments), not yet tokenized.

    With ``options_column`` (MetaICL's ``options``), a task whose rows all share one option list
    that contains every output becomes a classification task over those options (answers are
    then ranked among them); every other task stays a generation task.
    """
    where = f"tasks_from_column(task_column={task_column!r})"
    template = _resolve_template(template, input_column)
    fields = _template_fields(template, key="template")
    needed = [task_column, input_column, output_column, *fields]
    _require_columns(ds, needed + ([options_column] if options_column else []), where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so there are no tasks")
    task_values = _column(ds, task_column)
    for i, v in enumerate(task_values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {task_column}[{i}]={v!r} is empty: every row needs a task name; "
                "filter such rows first"
            )
    prompts = _render(template, {f: _column(ds, f) for f in fields}, len(ds), where=where)
    outputs = _column(ds, output_column)
    _check_present(outputs, key=output_column, where=where)
    options = _column(ds, options_column) if options_column else None
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
    generation_spec = EpisodeSpec(shots=spec.shots, query=spec.query)
    out: list[TaskRows] = []
    for value, rows in groups.items():
        fixed = _fixed_options([options[i] for i in rows], [outputs[i] for i in rows]) if options else None
        if fixed is not None:
            out.append(_classification(
                name=names[value], domain=domain, spec=spec, prompts=[prompts[i] for i in rows],
                raw_labels=[outputs[i] for i in rows], verbalizer={w: w for w in fixed},
                feature_names=None, answer_template=answer_template,
                drop_small_classes=drop_small_tasks, label_key=output_column,
                where=f"{where} task {names[value]!r}",
            ))  # fmt: skip
            continue
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
        out.append(TaskRows(
            name=names[value], domain=domain, spec=generation_spec if options else spec,
            prompts=[prompts[i] for i in rows],
            answers=[answer_template.format(answer=outputs[i]) for i in rows],
        ))  # fmt: skip
    if not out:
        raise ValueError(
            f"{where}: every task was dropped as too small; no tasks remain: add examples, "
            f"lower shots/query (each task needs {spec.per_class}), or check {task_column!r}"
        )
    return out


def dataset_rows(
    ds: datasets.Dataset,
    *,
    name: str,
    spec: EpisodeSpec,
    input_column: str = "input",
    output_column: str = "output",
    template: str | None = None,
    answer_template: str = " {answer}",
    domain: str = "",
    where: str | None = None,
) -> TaskRows:
    """The checked texts of one :class:`DatasetSpec` task, not yet tokenized."""
    where = where or f"dataset task {name!r}"
    template = _resolve_template(template, input_column)
    fields = _template_fields(template, key="template")
    _require_columns(ds, [input_column, output_column, *fields], where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so the task has no examples")
    prompts = _render(template, {f: _column(ds, f) for f in fields}, len(ds), where=where)
    outputs = _column(ds, output_column)
    _check_present(outputs, key=output_column, where=where)
    return TaskRows(
        name=name, domain=domain, spec=spec, prompts=prompts,
        answers=[answer_template.format(answer=o) for o in outputs],
    )  # fmt: skip


def tasks_from_rows(
    rows: Sequence[TaskRows],
    tokenizer: Any,
    *,
    max_length: int = 256,
    on_too_long: OnTooLong = "drop",
    separator: str = "\n\n",
) -> list[Task]:
    """Tokenizes checked rows into tasks (no disk cache; :mod:`fmmeta.tasks.cache` has one)."""
    eos = list(eos_ids(tokenizer))
    separator_ids = encode(tokenizer, [separator])[0] if separator else []
    tasks: list[Task] = []
    for r in rows:
        where = f"task {r.name!r}"
        check_texts(r.prompts, key="prompt", where=where)
        prompt_ids = encode(tokenizer, r.prompts)
        if r.is_classification:
            answers = [a + eos for a in encode(tokenizer, [*r.words, *(r.pool or ())])]
            tasks.append(Task.from_labeled_ids(
                r.name, prompt_ids, r.labels, answers[: len(r.words)],
                class_names=r.class_names, spec=r.spec,
                pool_answers=answers[len(r.words):] if r.spec.remap_labels else None,
                domain=r.domain, max_length=max_length, separator_ids=separator_ids,
                prompt_texts=r.prompts,
            ))  # fmt: skip
        else:
            check_texts(r.answers, key="answer", where=where)
            tasks.append(Task.from_ids(
                r.name, prompt_ids, [a + eos for a in encode(tokenizer, r.answers)], spec=r.spec,
                domain=r.domain, max_length=max_length, on_too_long=on_too_long,
                separator_ids=separator_ids, prompt_texts=r.prompts,
            ))  # fmt: skip
    check_unique_names(tasks, where="task list")
    return tasks


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
    rows = classification_rows(
        load_source(source, split=split, name=config_name), spec=spec, name=name,
        text_column=text_column, label_column=label_column, template=template,
        answer_template=answer_template, verbalizer=verbalizer,
        drop_small_classes=drop_small_classes, domain=domain,
    )  # fmt: skip
    return tasks_from_rows(
        [rows], tokenizer, max_length=max_length, on_too_long=on_too_long, separator=separator
    )


def tasks_from_column(
    source: Source,
    tokenizer: Any,
    *,
    spec: EpisodeSpec,
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
    domain: str = "",
    max_length: int = 256,
    on_too_long: OnTooLong = "drop",
    separator: str = "\n\n",
) -> list[Task]:
    """One task per distinct value of ``task_column`` (an instruction mixture).

    Args:
        source: anything :func:`~fmmeta.tasks.source.load_source` accepts.
        tokenizer: a Hugging Face tokenizer.
        spec: episode shape (``shots``, ``query``; ``ways`` and remapping apply to the
            classification tasks ``options_column`` makes).
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
        domain: task family for every task (default: each task's own name).
        max_length: token budget of one example.
        on_too_long: ``"drop"`` or ``"error"`` for an answer over budget.
        separator: text between in-context demonstrations.

    Returns:
        Tasks in order of first appearance of their task value.
    """
    rows = column_rows(
        load_source(source, split=split, name=config_name), spec=spec, task_column=task_column,
        input_column=input_column, output_column=output_column, options_column=options_column,
        template=template, answer_template=answer_template, name_prefix=name_prefix,
        drop_small_tasks=drop_small_tasks, domain=domain,
    )  # fmt: skip
    return tasks_from_rows(
        rows, tokenizer, max_length=max_length, on_too_long=on_too_long, separator=separator
    )


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
    rows = [
        dataset_rows(
            load_source(s.source, split=s.split, name=s.config_name), name=s.name,
            spec=s.episode or spec, input_column=s.input_column, output_column=s.output_column,
            template=s.template, answer_template=s.answer_template, domain=s.domain,
            where=f"tasks_from_datasets specs[{k}] (name={s.name!r})",
        )  # fmt: skip
        for k, s in enumerate(specs)
    ]
    return tasks_from_rows(
        rows, tokenizer, max_length=max_length, on_too_long=on_too_long, separator=separator
    )


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
    return Task.from_labeled_texts(
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
        class_names=[names[c] for c in sorted(keep)],
    )


__all__ = [
    "DatasetSpec",
    "TaskRows",
    "classification_rows",
    "column_rows",
    "dataset_rows",
    "tasks_from_rows",
    "classification_tasks",
    "tasks_from_column",
    "tasks_from_datasets",
    "tasks_from_examples",
]
