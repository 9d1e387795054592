"""The YAML types of a task collection: its sources (:class:`CollectionSource`) and its split.

These are the keys users write under ``tasks.collection`` and ``tasks.split``; their checks need
no data (:meth:`CollectionSource.validate`, :meth:`CollectionSplit.validate`), and
:meth:`CollectionSource.task_options` is the one place a source's keys become the builders'
:class:`~fmmeta.tasks.options.TaskOptions`. Reading and building are in
:mod:`fmmeta.tasks.collection`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fmmeta.tasks.columns import answer_template_problem
from fmmeta.tasks.data import FORMATS
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.spec import EpisodeSpec

Builder = Literal["classification", "task_column", "dataset", "multiple_choice"]
Preset = Literal["metaicl", "natural_instructions"]

PRESETS: dict[str, dict[str, Any]] = {
    # MetaICL (github.com/facebookresearch/MetaICL; on the hub as allenai/metaicl-data): one
    # JSON line per example, {"task", "input", "output", "options"}; options is [] for
    # generation tasks and the class words for classification tasks.
    "metaicl": {
        "builder": "task_column", "task_column": "task", "input_column": "input",
        "output_column": "output", "options_column": "options",
    },
    # Super-NaturalInstructions (github.com/allenai/natural-instructions; on the hub as
    # Muennighoff/natural-instructions): {"task_name", "definition", "inputs", "targets"}; the
    # task's definition (its instruction) opens every prompt.
    "natural_instructions": {
        "builder": "task_column", "task_column": "task_name", "input_column": "inputs",
        "output_column": "targets", "template": "{definition}\n\nInput: {inputs}\nOutput:",
    },
}  # fmt: skip
"""Column names and templates of collection layouts people already have, by preset name."""

_ONLY_FOR: dict[str, tuple[str, ...]] = {
    "text_column": ("classification",),
    "label_column": ("classification", "multiple_choice"),
    "verbalizer": ("classification",),
    "task_column": ("task_column",),
    "options_column": ("task_column", "multiple_choice"),
    "option_columns": ("multiple_choice",),
    "answer_format": ("multiple_choice",),
    "name_prefix": ("task_column",),
    "input_column": ("task_column", "dataset"),
    "output_column": ("task_column", "dataset"),
    "task_name": ("classification", "dataset", "multiple_choice"),
}
"""Source keys that only one or two builders take (setting one for another builder is an error)."""

_DEFAULTS: dict[str, Any] = {
    "text_column": "text", "label_column": "label", "task_column": "task",
    "input_column": "input", "output_column": "output",
}  # fmt: skip


@dataclass(kw_only=True)
class CollectionSource:
    """One source of tasks: where its rows are and which builder turns them into tasks."""

    path: str
    """Hub dataset id, local .jsonl/.json/.csv/.parquet/.arrow file, a save_to_disk folder, a folder of
    those (one task each with builder: dataset), or a glob."""
    builder: Builder | None = None
    """"classification" (one N-way task), "task_column" (a task per value of a column),
    "dataset" (one task per file) or "multiple_choice" (questions with their own options, one task
    per file); null = the preset's."""
    preset: Preset | None = None
    """Known layout: "metaicl" (task, input, output, options) or "natural_instructions"
    (task_name, definition, inputs, targets)."""
    name: str | None = None
    """Hub dataset configuration (load_dataset's name); hub ids only."""
    split: str | None = None
    """Split to read; required for hub ids and saved DatasetDicts of several splits, checked against a
    saved Dataset's own split, ignored for local files (their rows are one split)."""
    data_files: list[str] | None = None
    """Hub ids only: which of the dataset's files to read (load_dataset's data_files)."""
    task_name: str | None = None
    """classification / dataset: the task's name; null = the file's stem (or the hub id)."""
    task_column: str | None = None
    """task_column: the column naming each row's task (default "task")."""
    input_column: str | None = None
    """task_column / dataset: the prompt column used by the default template (default "input")."""
    output_column: str | None = None
    """task_column / dataset: the answer column (default "output")."""
    options_column: str | None = None
    """task_column: answer options per row; a task with one fixed option list becomes classification.
    multiple_choice: the column of each question's options (a list, or {text, label} like ARC's)."""
    option_columns: list[str] | None = None
    """multiple_choice: instead of options_column, the columns holding one option each (e.g. [sol1, sol2])."""
    answer_format: Literal["auto", "index", "number", "letter", "key", "text"] | None = None
    """multiple_choice: how label_column names the gold option: a 0-based index, a 1-based number, a
    letter, a key of the options' label list, the option's text; null = auto (refuses digit strings)."""
    text_column: str | None = None
    """classification: the text column used by the default template (default "text")."""
    label_column: str | None = None
    """classification: the label column (default "label"); at least 2 classes. multiple_choice: the
    column naming the gold option (default "label")."""
    template: str | None = None
    """Prompt format over column names, e.g. "Review: {text}\\nSentiment:"; null = the input column
    (multiple_choice: required; {options} shows the options as lettered lines)."""
    answer_template: str = " {answer}"
    """Answer format; {answer} is the output value, the label word or the option ({letter}: its letter)."""
    verbalizer: list[str] | dict[int | str, str] | None = None
    """classification: words per class, a list by integer label or a {label: word} mapping."""
    name_prefix: str = ""
    """task_column: prepended to each task value to form the task name."""
    family: str = ""
    """Family of every task of this source (diversity sampling, held-out families); "" = each
    task's own name."""
    shots: int = 4
    """Support examples per episode (per class for classification), >= 1."""
    query: int = 4
    """Query examples per episode (per class for classification), >= 1."""
    ways: int | None = None
    """Classification: classes per episode (>= 2); null = every class."""
    remap_labels: bool = False
    """Classification: map each episode's classes to random words from label_pool."""
    label_pool: list[str] | None = None
    """Words for remap_labels (at least ways, distinct)."""
    max_examples: int | None = None
    """Keep at most this many examples per task (a seeded draw; >= shots + query); null = all."""
    drop_small: bool = False
    """Drop (with a warning) tasks or classes too small for an episode instead of refusing them."""
    on_too_long: Literal["drop", "error"] = "drop"
    """An example whose answer cannot fit tasks.max_length: "drop" it (counted) or "error"."""

    def resolved(self) -> dict[str, Any]:
        """The builder's arguments: the preset's values, then this source's, then the defaults."""
        out: dict[str, Any] = dict(PRESETS.get(self.preset or "", {}))
        for key in ("builder", *_ONLY_FOR, "template"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key, value in _DEFAULTS.items():
            if out.get("builder") in _ONLY_FOR[key]:
                out.setdefault(key, value)
        return out

    def spec(self) -> EpisodeSpec:
        """The episode shape (raises ValueError naming the bad value)."""
        return EpisodeSpec(
            shots=self.shots, query=self.query, ways=self.ways, remap_labels=self.remap_labels,
            label_pool=tuple(self.label_pool) if self.label_pool is not None else None,
        )  # fmt: skip

    def task_options(self, *, max_length: int, separator: str = "\n\n") -> TaskOptions:
        """This source's keys as the builders' options.

        Args:
            max_length: the section's ``tasks.max_length`` (one budget for every source).
            separator: text between in-context demonstrations.

        Raises:
            ValueError: for an invalid episode shape or budget, naming the value.
        """
        return TaskOptions(
            spec=self.spec(), max_length=max_length, on_too_long=self.on_too_long,
            separator=separator, family=self.family,
        )  # fmt: skip

    def validate(self) -> list[str]:
        """Checks that need no data: a builder, keys that fit it, the episode shape, the path."""
        problems: list[str] = []
        args = self.resolved()
        builder = args.get("builder")
        if builder is None:
            problems.append(
                "builder is missing: set builder to classification, task_column, dataset or "
                "multiple_choice, or "
                "preset to metaicl or natural_instructions"
            )
        for key, builders in _ONLY_FOR.items():
            if builder is not None and getattr(self, key) not in (None, "") and builder not in builders:
                problems.append(
                    f"{key}={getattr(self, key)!r} does not apply to builder={builder!r} (only to "
                    f"{' / '.join(builders)}): remove it or change the builder"
                )
        if builder == "multiple_choice":
            problems.extend(self._multiple_choice_problems())
        answer = answer_template_problem(self.answer_template, multiple_choice=builder == "multiple_choice")
        if answer is not None:
            problems.append(answer)
        try:
            self.spec()
        except ValueError as err:
            problems.append(str(err).replace("EpisodeSpec.", ""))
        if self.max_examples is not None and self.max_examples < self.shots + self.query:
            problems.append(
                f"max_examples={self.max_examples} is invalid: a task needs at least shots + "
                f"query = {self.shots + self.query} examples; raise it or set it to null"
            )
        if not self.path:
            problems.append("path is empty: give a hub id, a local file, a folder or a glob")
        elif self.data_files is not None and is_local(self.path):
            problems.append(
                f"data_files is set but path={self.path!r} is local: data_files picks files of a "
                "hub dataset; point path at the files instead"
            )
        return problems


    def _multiple_choice_problems(self) -> list[str]:
        """A multiple-choice source's own keys: a template, and one way of naming the options."""
        problems = []
        if self.template is None:
            problems.append("template is missing: builder multiple_choice needs a prompt template, "
                            "e.g. 'Question: {question}\\nAnswer:' ({options} shows the options)")
        if (self.options_column is None) == (not self.option_columns):
            problems.append("give exactly one of options_column (a list or {text, label} column) and "
                            "option_columns (one column per option) for builder multiple_choice")
        if self.ways is not None or self.remap_labels:
            problems.append("ways and remap_labels do not apply to builder multiple_choice (each "
                            "question brings its own options): remove them")
        return problems


def is_local(path: str) -> bool:
    """True if ``path`` names local data (an existing path, a glob, or a path-like string)."""
    from fmmeta.config import looks_like_local_path

    expanded = os.path.expanduser(path)
    return (
        os.path.exists(expanded) or any(ch in expanded for ch in "*?[")
        or looks_like_local_path(expanded) or Path(expanded).suffix.lower() in FORMATS
    )


@dataclass(kw_only=True)
class CollectionSplit:
    """Which collection tasks are held out: names, families, files of names, or seeded shares."""

    held_out: list[str] = field(default_factory=list)
    """Task names for held-out (touched only by the final evaluation)."""
    validation: list[str] = field(default_factory=list)
    """Task names for validation (choose each method's adaptation lr)."""
    held_out_families: list[str] = field(default_factory=list)
    """Families whose every task goes to held-out."""
    format_shift_families: list[str] = field(default_factory=list)
    """Held-out families whose template and label words no meta-training task has (a user's
    task of another format): the report scores them apart, every method against the base model."""
    validation_families: list[str] = field(default_factory=list)
    """Families whose every task goes to validation."""
    held_out_file: str | None = None
    """File of held-out task names: .txt (one per line, # comments) or .json (a list, or
    MetaICL's {"test": [...]})."""
    validation_file: str | None = None
    """File of validation task names, same formats as held_out_file."""
    held_out_fraction: float | None = None
    """Share in [0, 1) of the tasks named nowhere drawn for held-out (seeded by tasks.seed);
    null = 0.1 if nothing names a held-out task, else 0."""
    validation_fraction: float | None = None
    """Share in [0, 1) of the tasks named nowhere drawn for validation; null = 0.1 if
    nothing names a validation task, else 0."""

    def validate(self) -> list[str]:
        """Checks that need no data: shares in range, files that exist and parse."""
        problems: list[str] = []
        for key in ("held_out_fraction", "validation_fraction"):
            value = getattr(self, key)
            if value is not None and not 0.0 <= value < 1.0:
                problems.append(f"{key}={value} is invalid: must be in [0, 1) (a share of the tasks)")
        for key in ("held_out_file", "validation_file"):
            path = getattr(self, key)
            if path is not None:
                try:
                    read_task_list(path)
                except ValueError as err:
                    problems.append(f"{key}={path!r}: {err}")
        loose = [f for f in self.format_shift_families if f not in self.held_out_families]
        if loose:
            problems.append(f"format_shift_families={loose} is invalid: each must be one of held_out_families "
                            f"{self.held_out_families} (a family scored as out of format is held out whole); add "
                            "it there")
        return problems


def read_task_list(path: str) -> list[str]:
    """Task names from a .txt file (one per line, # comments) or a .json list / {"test": [...]}.

    Raises:
        ValueError: if the file is missing or holds something else, with the fix.
    """
    file = Path(os.path.expanduser(path))
    if not file.is_file():
        raise ValueError(f"the file does not exist (working directory {os.getcwd()!r}): check the path")
    text = file.read_text(encoding="utf-8")
    if file.suffix.lower() != ".json":
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err}): fix the file") from err
    if isinstance(data, dict) and "test" in data:
        data = data["test"]  # MetaICL's config/<setting>.json: {"train": [...], "test": [...]}
    if not isinstance(data, list) or not all(isinstance(n, str) for n in data):
        raise ValueError(
            'must hold a JSON list of task names or an object {"test": [names]}: fix the file'
        )
    return data


__all__ = ["PRESETS", "Builder", "CollectionSource", "CollectionSplit", "Preset", "is_local", "read_task_list"]
