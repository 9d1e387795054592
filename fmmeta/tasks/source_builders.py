"""The four built-in task builders of ``tasks.collection``, each its section and its registration.

``classification`` (one N-way task), ``task_column`` (a task per value of a column), ``dataset``
(one generation task per file) and ``multiple_choice`` (questions with their own options, one task
per file). Each section's fields are the source keys that builder takes (validated by
:meth:`~fmmeta.tasks.collection_config.CollectionSource.validate`, listed by ``--help``); the rows
themselves are read by :mod:`fmmeta.tasks.rows` and :mod:`fmmeta.tasks.choice_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fmmeta.tasks.choice_rows import multiple_choice_rows
from fmmeta.tasks.registry import SourceRows, TaskBuilder, register
from fmmeta.tasks.rows import TaskRows, classification_rows, column_rows, dataset_rows

if TYPE_CHECKING:  # types only: a run on a built-in suite never imports datasets (fmmeta.tasks.data says why)
    import datasets


@dataclass(kw_only=True)
class ClassificationKeys:
    """classification: one N-way task of the source's rows, a label per row."""

    task_name: str | None = None
    """The task's name; null = the file's stem (or the hub id)."""
    text_column: str = "text"
    """The text column used by the default template."""
    label_column: str = "label"
    """The label column; at least 2 classes."""
    verbalizer: list[str] | dict[int | str, str] | None = None
    """Words per class, a list by integer label or a {label: word} mapping; null = the labels."""


def _classification(ds: datasets.Dataset, keys: ClassificationKeys, common: SourceRows) -> list[TaskRows]:
    return [classification_rows(
        ds, name=common.name, text_column=keys.text_column, label_column=keys.label_column,
        verbalizer=keys.verbalizer, drop_small_classes=common.drop_small, spec=common.spec,
        template=common.template, answer_template=common.answer_template, family=common.family,
    )]  # fmt: skip


@dataclass(kw_only=True)
class TaskColumnKeys:
    """task_column: a task per value of a column (MetaICL, Super-NaturalInstructions)."""

    task_column: str = "task"
    """The column naming each row's task."""
    input_column: str = "input"
    """The prompt column used by the default template."""
    output_column: str = "output"
    """The answer column."""
    options_column: str | None = None
    """Answer options per row; a task with one fixed option list becomes classification."""
    name_prefix: str = ""
    """Prepended to each task value to form the task name."""


def _task_column(ds: datasets.Dataset, keys: TaskColumnKeys, common: SourceRows) -> list[TaskRows]:
    return column_rows(
        ds, task_column=keys.task_column, input_column=keys.input_column, output_column=keys.output_column,
        options_column=keys.options_column, name_prefix=keys.name_prefix, drop_small_tasks=common.drop_small,
        spec=common.spec, template=common.template, answer_template=common.answer_template, family=common.family,
    )  # fmt: skip


@dataclass(kw_only=True)
class DatasetKeys:
    """dataset: one generation task per file (a folder: one task each)."""

    task_name: str | None = None
    """The task's name; null = the file's stem (or the hub id)."""
    input_column: str = "input"
    """The prompt column used by the default template."""
    output_column: str = "output"
    """The answer column."""


def _dataset(ds: datasets.Dataset, keys: DatasetKeys, common: SourceRows) -> list[TaskRows]:
    return [dataset_rows(
        ds, name=common.name, input_column=keys.input_column, output_column=keys.output_column,
        spec=common.spec, template=common.template, answer_template=common.answer_template, family=common.family,
    )]  # fmt: skip


@dataclass(kw_only=True)
class MultipleChoiceKeys:
    """multiple_choice: questions with their own options, one task per file."""

    task_name: str | None = None
    """The task's name; null = the file's stem (or the hub id)."""
    label_column: str = "label"
    """The column naming the gold option."""
    options_column: str | None = None
    """The column of each question's options (a list, or {text, label} like ARC's)."""
    option_columns: list[str] | None = None
    """Instead of options_column, the columns holding one option each (e.g. [sol1, sol2])."""
    answer_format: Literal["auto", "index", "number", "letter", "key", "text"] | None = None
    """How label_column names the gold option: a 0-based index, a 1-based number, a letter, a key of
    the options' label list, the option's text; null = auto (refuses digit strings)."""


def _multiple_choice(ds: datasets.Dataset, keys: MultipleChoiceKeys, common: SourceRows) -> list[TaskRows]:
    return [multiple_choice_rows(
        ds, name=common.name, spec=common.spec, template=common.template, options_column=keys.options_column,
        option_columns=keys.option_columns, label_column=keys.label_column,
        answer_format=keys.answer_format or "auto", answer_template=common.answer_template, family=common.family,
    )]  # fmt: skip


def _multiple_choice_problems(source: Any, keys: MultipleChoiceKeys) -> list[str]:
    """A multiple-choice source's own keys: a template, and one way of naming the options."""
    problems = []
    if source.template is None:
        problems.append("template is missing: builder multiple_choice needs a prompt template, "
                        "e.g. 'Question: {question}\\nAnswer:' ({options} shows the options)")
    if (keys.options_column is None) == (not keys.option_columns):
        problems.append("give exactly one of options_column (a list or {text, label} column) and "
                        "option_columns (one column per option) for builder multiple_choice")
    if source.ways is not None or source.remap_labels:
        problems.append("ways and remap_labels do not apply to builder multiple_choice (each "
                        "question brings its own options): remove them")
    return problems


CLASSIFICATION = register(TaskBuilder(
    name="classification", summary="one N-way task of the source's rows", section=ClassificationKeys,
    rows=_classification, adapt="classification",
))
TASK_COLUMN = register(TaskBuilder(
    name="task_column", summary="a task per value of a column", section=TaskColumnKeys, rows=_task_column,
))
DATASET = register(TaskBuilder(
    name="dataset", summary="one generation task per file", section=DatasetKeys, rows=_dataset,
    one_task_per_file=True, adapt="generation",
))
MULTIPLE_CHOICE = register(TaskBuilder(
    name="multiple_choice", summary="questions with their own options, one task per file",
    section=MultipleChoiceKeys, rows=_multiple_choice, check=_multiple_choice_problems,
    one_task_per_file=True, letters=True, adapt="multiple_choice",
))

__all__ = ["CLASSIFICATION", "DATASET", "MULTIPLE_CHOICE", "TASK_COLUMN", "ClassificationKeys", "DatasetKeys",
           "MultipleChoiceKeys", "TaskColumnKeys"]
