"""Rows: one task's checked, rendered texts, and the one place they are tokenized into a task.

The builders (:mod:`fmmeta.tasks.builders`) and the YAML collection (:mod:`fmmeta.tasks.collection`)
stop at rows, so tokenization happens once, in :func:`tasks_from_rows` or through the disk cache
(:mod:`fmmeta.tasks.cache`). Like the tasks, rows come in three types: :class:`GenerationRows`
(prompts and answers), :class:`ClassificationRows` (prompts, labels and class words) and
:class:`~fmmeta.tasks.choice_rows.MultipleChoiceRows` (prompts, each with its options and gold).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Union

import numpy as np

from fmmeta.tasks.choice_rows import MultipleChoiceRows
from fmmeta.tasks.classification import ClassificationTask, answer_word_ids
from fmmeta.tasks.columns import (
    check_present,
    column,
    draw_rows,
    render,
    require_columns,
    resolve_template,
    template_fields,
    template_tail,
)
from fmmeta.tasks.generation import GenerationTask
from fmmeta.tasks.labels import check_class_sizes, labels_to_classes
from fmmeta.tasks.multiple_choice import MultipleChoiceTask
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.task import Task, check_unique_names
from fmmeta.tasks.tokens import OnTooLong, check_texts, encode, eos_ids

if TYPE_CHECKING:  # types only: a run on a built-in suite never imports datasets (fmmeta.tasks.data says why)
    import datasets

logger = logging.getLogger(__name__)

@dataclass(frozen=True, kw_only=True)
class GenerationRows:
    """One generation task's checked texts: everything a :class:`GenerationTask` needs but the
    tokenizer.

    Attributes:
        name: the task's unique name.
        family: task family (diversity sampling, per-family reports); "" means ``name``.
        spec: episode shape.
        prompts: rendered prompt of each example.
        answers: rendered answer of each example (answer template applied).
        template_tail: the prompt template's fixed ending (a cut may not keep only that).
    """

    name: str
    family: str
    spec: EpisodeSpec
    prompts: list[str]
    answers: list[str]
    template_tail: str = ""
    KIND: ClassVar[str] = "generation"
    """The kind of task these rows make (what the token cache stores and restores)."""

    def prompt_texts(self, tokenizer: Any, a: int = 0, b: int | None = None) -> list[str]:
        """Rows ``a:b``'s prompts as the text to tokenize (a builder's rows may render them with
        the tokenizer, e.g. its chat template)."""
        return self.prompts[a:b]

    def subsample(self, max_examples: int | None, rng: np.random.Generator) -> GenerationRows:
        """At most ``max_examples`` rows, drawn by ``rng`` in their original order (None = all)."""
        keep = draw_rows(len(self.prompts), max_examples, rng)
        if keep is None:
            return self
        return dataclasses.replace(
            self, prompts=[self.prompts[i] for i in keep], answers=[self.answers[i] for i in keep]
        )


@dataclass(frozen=True, kw_only=True)
class ClassificationRows:
    """One classification task's checked texts: everything a :class:`ClassificationTask` needs
    but the tokenizer.

    Attributes:
        name: the task's unique name.
        family: task family (diversity sampling, per-family reports); "" means ``name``.
        spec: episode shape.
        prompts: rendered prompt of each example.
        labels: class index of each example, into ``words``.
        words: answer text of each class (answer template applied).
        class_names: display name of each class.
        pool: answer text of each ``spec.label_pool`` word with ``spec.remap_labels``, else empty.
        template_tail: the prompt template's fixed ending (a cut may not keep only that).
    """

    name: str
    family: str
    spec: EpisodeSpec
    prompts: list[str]
    labels: list[int]
    words: list[str]
    class_names: list[str]
    pool: list[str] = field(default_factory=list)
    template_tail: str = ""
    KIND: ClassVar[str] = "classification"
    """The kind of task these rows make (what the token cache stores and restores)."""

    def prompt_texts(self, tokenizer: Any, a: int = 0, b: int | None = None) -> list[str]:
        """Rows ``a:b``'s prompts as the text to tokenize (a builder's rows may render them with
        the tokenizer, e.g. its chat template)."""
        return self.prompts[a:b]

    def subsample(self, max_examples: int | None, rng: np.random.Generator) -> ClassificationRows:
        """At most ``max_examples`` rows, drawn by ``rng`` in their original order (None = all)."""
        keep = draw_rows(len(self.prompts), max_examples, rng)
        if keep is None:
            return self
        return dataclasses.replace(
            self, prompts=[self.prompts[i] for i in keep], labels=[self.labels[i] for i in keep]
        )


TaskRows = Union[GenerationRows, ClassificationRows, MultipleChoiceRows]
"""Any row type: what a source's reading returns and the cache stores."""


def _classification_rows(
    *,
    name: str,
    family: str,
    spec: EpisodeSpec,
    prompts: list[str],
    raw_labels: list[Any],
    verbalizer: Sequence[str] | Mapping[Any, str] | None,
    feature_names: Sequence[str] | None,
    answer_template: str,
    drop_small_classes: bool,
    label_key: str,
    where: str,
    template_tail: str = "",
) -> ClassificationRows:
    """Checked class rows of one task from its prompts and raw label values."""
    classes, words, names = labels_to_classes(
        raw_labels, verbalizer=verbalizer, feature_names=feature_names, key=label_key, where=where
    )
    if len(names) < 2:
        raise ValueError(
            f"{where}: {label_key} has a single class {names}: classification needs at least 2 "
            "classes; point label_column at a column with several labels, or build a generation "
            "task instead"
        )
    keep = check_class_sizes(classes, names, spec, drop_small_classes=drop_small_classes, where=where)
    # Renumber the kept classes 0..k-1 so the task sees only classes it can sample.
    new_index = {c: i for i, c in enumerate(sorted(keep))}
    rows = [i for i, c in enumerate(classes) if c in keep]
    check_texts([words[c] for c in sorted(keep)], key="verbalizer", where=where)
    return ClassificationRows(
        name=name,
        family=family,
        spec=spec,
        prompts=[prompts[i] for i in rows],
        labels=[new_index[classes[i]] for i in rows],
        words=[answer_template.format(answer=words[c]) for c in sorted(keep)],
        class_names=[names[c] for c in sorted(keep)],
        pool=[answer_template.format(answer=w) for w in spec.label_pool or ()] if spec.remap_labels else [],
        template_tail=template_tail,
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
    family: str = "",
) -> ClassificationRows:
    """The checked texts of :func:`classification_tasks` (same arguments), not yet tokenized."""
    import datasets

    where = f"classification_tasks(name={name!r})"
    # A template names the columns it reads (a sentence pair: "{sentence1} ... {sentence2}"), so
    # text_column is only the default template's column and is not required beside one.
    fields = template_fields(resolve_template(template, text_column), key="template")
    require_columns(ds, [label_column, *fields], where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so the task has no examples")
    feature = ds.features.get(label_column)
    feature_names = feature.names if isinstance(feature, datasets.ClassLabel) else None
    cols = {f: column(ds, f) for f in fields}
    if template is None:
        check_texts(cols[text_column], key=text_column, where=where)
    prompts = render(resolve_template(template, text_column), cols, len(ds), where=where)
    return _classification_rows(
        name=name, family=family, spec=spec, prompts=prompts, raw_labels=column(ds, label_column),
        verbalizer=verbalizer, feature_names=feature_names, answer_template=answer_template,
        drop_small_classes=drop_small_classes, label_key=label_column, where=where,
        template_tail=template_tail(resolve_template(template, text_column)),
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
    family: str = "",
) -> list[TaskRows]:
    """The checked texts of :func:`tasks_from_column` (same arguments), not yet tokenized.

    With ``options_column`` (MetaICL's ``options``), a task whose rows all share one option list
    that contains every output becomes a classification task over those options (answers are
    then ranked among them); every other task stays a generation task.
    """
    where = f"tasks_from_column(task_column={task_column!r})"
    template = resolve_template(template, input_column)
    fields = template_fields(template, key="template")
    needed = [task_column, input_column, output_column, *fields]
    require_columns(ds, needed + ([options_column] if options_column else []), where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so there are no tasks")
    task_values = column(ds, task_column)
    names, groups = _group_by_task(task_values, name_prefix, task_column=task_column, where=where)
    prompts = render(template, {f: column(ds, f) for f in fields}, len(ds), where=where)
    outputs = column(ds, output_column)
    check_present(outputs, key=output_column, where=where)
    options = column(ds, options_column) if options_column else None
    generation_spec = EpisodeSpec(shots=spec.shots, query=spec.query)
    out: list[TaskRows] = []
    for value, rows in groups.items():
        fixed = _fixed_options([options[i] for i in rows], [outputs[i] for i in rows]) if options else None
        if fixed is not None:
            out.append(_classification_rows(
                name=names[value], family=family, spec=spec, prompts=[prompts[i] for i in rows],
                raw_labels=[outputs[i] for i in rows], verbalizer={w: w for w in fixed},
                feature_names=None, answer_template=answer_template,
                drop_small_classes=drop_small_tasks, label_key=output_column,
                where=f"{where} task {names[value]!r}", template_tail=template_tail(template),
            ))  # fmt: skip
            continue
        if not _large_enough(names[value], len(rows), spec, drop_small_tasks, where=where):
            continue
        out.append(GenerationRows(
            name=names[value], family=family, spec=generation_spec if options else spec,
            prompts=[prompts[i] for i in rows],
            answers=[answer_template.format(answer=outputs[i]) for i in rows],
            template_tail=template_tail(template),
        ))  # fmt: skip
    if not out:
        raise ValueError(
            f"{where}: every task was dropped as too small; no tasks remain: add examples, "
            f"lower shots/query (each task needs {spec.per_class}), or check {task_column!r}"
        )
    return out


def _large_enough(name: str, n_rows: int, spec: EpisodeSpec, drop_small: bool, *, where: str) -> bool:
    """Whether a generation task has an episode's worth of rows; a smaller one is refused, or
    dropped with a warning when ``drop_small``."""
    if n_rows >= spec.per_class:
        return True
    msg = f"{where}: task {name!r} has {n_rows} examples but an episode needs shots + query = {spec.per_class}"
    if not drop_small:
        raise ValueError(msg + ": add examples, lower shots/query, or pass drop_small_tasks=True")
    logger.warning("%s; dropping it", msg)
    return False


def _group_by_task(
    task_values: list[Any], name_prefix: str, *, task_column: str, where: str
) -> tuple[dict[Any, str], dict[Any, list[int]]]:
    """(task name of each task value, row indices of each task value), in order of first row.

    Raises:
        ValueError: for a row without a task value, or two values that give one name (1 and '1').
    """
    for i, v in enumerate(task_values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {task_column}[{i}]={v!r} is empty: every row needs a task name; "
                "filter such rows first"
            )
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
    return names, groups


def dataset_rows(
    ds: datasets.Dataset,
    *,
    name: str,
    spec: EpisodeSpec,
    input_column: str = "input",
    output_column: str = "output",
    template: str | None = None,
    answer_template: str = " {answer}",
    family: str = "",
    where: str | None = None,
) -> GenerationRows:
    """The checked texts of one :class:`DatasetSpec` task, not yet tokenized."""
    where = where or f"dataset task {name!r}"
    template = resolve_template(template, input_column)
    fields = template_fields(template, key="template")
    require_columns(ds, [input_column, output_column, *fields], where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so the task has no examples")
    prompts = render(template, {f: column(ds, f) for f in fields}, len(ds), where=where)
    outputs = column(ds, output_column)
    check_present(outputs, key=output_column, where=where)
    return GenerationRows(
        name=name, family=family, spec=spec, prompts=prompts,
        answers=[answer_template.format(answer=o) for o in outputs], template_tail=template_tail(template),
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
        prompt_ids = encode(tokenizer, r.prompt_texts(tokenizer))
        tail = tail_tokens(tokenizer, r.template_tail)
        if isinstance(r, MultipleChoiceRows):
            tasks.append(MultipleChoiceTask.from_ids(
                r.name, prompt_ids, _option_ids(tokenizer, r.options), r.labels, spec=r.spec,
                family=r.family, max_length=max_length, on_too_long=on_too_long,
                separator_ids=separator_ids, prompt_texts=r.prompts, tail_tokens=tail,
            ))  # fmt: skip
        elif isinstance(r, ClassificationRows):
            answers = answer_word_ids(tokenizer, [*r.words, *r.pool])
            tasks.append(ClassificationTask.from_ids(
                r.name, prompt_ids, r.labels, answers[: len(r.words)],
                class_names=r.class_names, spec=r.spec, pool_answers=answers[len(r.words):],
                family=r.family, max_length=max_length, separator_ids=separator_ids,
                prompt_texts=r.prompts, tail_tokens=tail,
            ))  # fmt: skip
        else:
            check_texts(r.answers, key="answer", where=where)
            tasks.append(GenerationTask.from_ids(
                r.name, prompt_ids, [a + eos for a in encode(tokenizer, r.answers)], spec=r.spec,
                family=r.family, max_length=max_length, on_too_long=on_too_long,
                separator_ids=separator_ids, prompt_texts=r.prompts, tail_tokens=tail,
            ))  # fmt: skip
    check_unique_names(tasks, where="task list")
    return tasks


def tail_tokens(tokenizer: Any, tail: str) -> int:
    """Tokens of a template's fixed ending (0 for none, or one of only spaces and newlines, which a
    cut keeping a word of the row's text cannot be mistaken for)."""
    return len(encode(tokenizer, [tail])[0]) if tail.strip() else 0


def _option_ids(tokenizer: Any, options: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """Every question's options tokenized with EOS, in one tokenizer call."""
    flat = answer_word_ids(tokenizer, [o for opts in options for o in opts])
    bounds = np.cumsum([0, *(len(opts) for opts in options)])
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


__all__ = [
    "ClassificationRows",
    "GenerationRows",
    "TaskRows",
    "classification_rows",
    "column_rows",
    "dataset_rows",
    "tasks_from_rows",
]
