"""The YAML types of a task collection: its sources (:class:`CollectionSource`) and its split.

These are the keys users write under ``tasks.collection`` and ``tasks.split``; their checks need
no data (:meth:`CollectionSource.validate`, :meth:`CollectionSplit.validate`), and
:meth:`CollectionSource.task_options` is the one place a source's keys become the builders'
:class:`~fmmeta.tasks.options.TaskOptions`. A source's keys are its common ones (this class's
fields) and its builder's own, written beside them in the YAML and validated by the builder's
section (:mod:`fmmeta.tasks.registry`). Reading and building are in :mod:`fmmeta.tasks.collection`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fmmeta.tasks.columns import answer_template_problem
from fmmeta.tasks.data import FORMATS
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.registry import (
    SourceRows,
    TaskBuilder,
    build_section,
    builder_names,
    builder_sections,
    key_owners,
    key_problems,
    task_builder,
)
from fmmeta.tasks.spec import EpisodeSpec

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


@dataclass(kw_only=True, init=False)
class CollectionSource:
    """One source of tasks: where its rows are and which builder turns them into tasks.

    Its builder's own keys (``text_column``, ``options_column``, ...) are written beside these
    and kept in :attr:`keys`; ``CollectionSource(path=..., builder="classification",
    text_column="sentence")`` takes them as keywords too, and reads them back as attributes.
    """

    path: str
    """Hub dataset id, local .jsonl/.json/.csv/.parquet/.arrow file, a save_to_disk folder, a folder of
    those (one task each with builder: dataset), or a glob."""
    builder: str | None = None
    """The task builder (its keys are listed below, by builder); null = the preset's."""
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
    template: str | None = None
    """Prompt format over column names, e.g. "Review: {text}\\nSentiment:"; null = the input column
    (multiple_choice: required; {options} shows the options as lettered lines)."""
    answer_template: str = " {answer}"
    """Answer format; {answer} is the output value, the label word or the option ({letter}: its letter)."""
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
    keys: dict[str, Any] = field(default_factory=dict, metadata={"sections": builder_sections})
    """The builder's own keys, written beside the keys above (not under a key of their own)."""

    def __init__(self, **given: Any) -> None:
        """The common keys by name; every other keyword is a builder key (see :attr:`keys`).

        Raises:
            TypeError: ``path`` is missing.
        """
        for f in dataclasses.fields(self):
            if f.name == "keys":
                continue
            if f.name in given:
                value = given.pop(f.name)
            elif f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                raise TypeError(f"CollectionSource needs {f.name}")
            setattr(self, f.name, value)
        self.keys = {**given.pop("keys", {}), **given}

    def __getattr__(self, key: str) -> Any:
        """A builder key's value (its builder's default if not set; None where another builder
        takes it), as the source's attribute."""
        if key.startswith("_") or key == "keys" or key not in key_owners():
            raise AttributeError(key)
        return self.resolved().get(key)

    @property
    def task_builder(self) -> TaskBuilder | None:
        """The source's builder (its own or its preset's); None if it names none (or a wrong one)."""
        name = self.builder or PRESETS.get(self.preset or "", {}).get("builder")
        try:
            return task_builder(name) if name is not None else None
        except KeyError:
            return None

    def section(self) -> Any:
        """The builder's section: the preset's values, then this source's keys, then its defaults.

        Raises:
            ValueError: no builder, or a key of the wrong type (the config check reports both first).
        """
        builder = self.task_builder
        if builder is None:
            raise ValueError(f"builder={self.builder!r} is not a task builder")
        names = {f.name for f in dataclasses.fields(builder.section)}
        given = {**PRESETS.get(self.preset or "", {}), **{k: v for k, v in self.keys.items() if v is not None}}
        return build_section(builder, {k: v for k, v in given.items() if k in names})

    def resolved(self) -> dict[str, Any]:
        """The builder's name, the template and the builder's keys, as one mapping."""
        builder = self.task_builder
        template = self.template if self.template is not None else PRESETS.get(self.preset or "", {}).get("template")
        out: dict[str, Any] = {"builder": builder.name if builder else None, "template": template}
        if builder is not None:
            try:
                out.update(dataclasses.asdict(self.section()))
            except ValueError:
                pass  # a key of the wrong type: validate() reports it
        return out

    def common(self, name: str, spec: EpisodeSpec) -> SourceRows:
        """What the builder reads a dataset with besides its section: the task name and the
        common keys."""
        return SourceRows(name=name, spec=spec, template=self.resolved()["template"],
                          answer_template=self.answer_template, family=self.family, drop_small=self.drop_small)

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
        problems = self._builder_problems()
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

    def _builder_problems(self) -> list[str]:
        """The builder is known, each builder key is one of its section's, and its own checks pass."""
        builder = self.task_builder
        if builder is None:
            named, names = self.builder or PRESETS.get(self.preset or "", {}).get("builder"), builder_names()
            if named is None:
                return [f"builder is missing: set builder to {', '.join(names[:-1])} or {names[-1]}, or preset to "
                        "metaicl or natural_instructions"]
            close = difflib.get_close_matches(named, names, n=1)
            return [f"builder={named!r} is invalid: allowed values are {', '.join(map(repr, names))}"
                    + (f"; did you mean {close[0]!r}?" if close else "")]
        problems = key_problems(builder, self.keys, also=[f.name for f in dataclasses.fields(self)])
        if problems:
            return problems
        try:
            keys = self.section()
        except ValueError as err:
            return [str(err)]
        problems.extend(builder.check(self, keys))
        answer = answer_template_problem(self.answer_template, multiple_choice=builder.letters)
        return problems + ([answer] if answer is not None else [])


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


__all__ = ["PRESETS", "CollectionSource", "CollectionSplit", "Preset", "is_local", "read_task_list"]
