"""How adapt reads a user's task files: a task builder's name and that builder's own section of keys.

A YAML task source is its common keys and its builder's section (:mod:`fmmeta.tasks.registry`);
a user's task is read the same way, so every key the builder's section has (the chat builder's
``messages_column`` as much as classification's ``text_column``) can be set from ``fmmeta adapt``,
a ``--tasks`` list and :func:`fmmeta.adapt`, is checked by the same types, and a key of another
builder is refused as the YAML source refuses it.

Example:
    >>> fmt = TaskFormat().replace(builder="chat", messages_column="turns")  # doctest: +SKIP
    >>> fmt.keys.messages_column  # doctest: +SKIP
    'turns'
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from fmmeta.config.describe import field_docs
from fmmeta.config.schema import hints
from fmmeta.errors import UserInputError
from fmmeta.tasks.registry import TaskBuilder, build_section, key_problems, task_builder, task_builders

COMMON_KEYS = ("builder", "template", "answer_template", "labels")
"""The keys of every format, whatever its builder (its section's keys come beside them)."""

SOURCE_ONLY = {"task_name": "a user's task is named by --name, its folder or its name in a --tasks list"}
"""Keys of a builder's section that only a YAML source takes, and why adapt does not."""


def adapt_builders() -> list[str]:
    """The task builders adapt reads a user's files with (those registered with an ``adapt`` format)."""
    return [b.name for b in task_builders() if b.adapt is not None]


def section_keys(builder: TaskBuilder) -> list[str]:
    """The keys of ``builder``'s section that adapt takes (all but :data:`SOURCE_ONLY`)."""
    return [f.name for f in dataclasses.fields(builder.section) if f.name not in SOURCE_ONLY]


def format_keys() -> dict[str, list[str]]:
    """Every key a format may set -> the builders that take it (``[]``: every builder)."""
    out: dict[str, list[str]] = {k: [] for k in COMMON_KEYS}
    for b in task_builders():
        if b.adapt is not None:
            for key in section_keys(b):
                out.setdefault(key, []).append(b.name)
    return out


def key_help() -> dict[str, str]:
    """Each builder key adapt takes -> its help: the builders that take it, its doc, and for a list
    or mapping how to write one as text."""
    out: dict[str, str] = {}
    for key, builders in format_keys().items():
        if not builders:
            continue
        section = task_builder(builders[0]).section
        doc = field_docs(section).get(key, "")
        text = "" if _takes_text(hints(section)[key]) else " (comma-separated, or YAML flow: [a, b] / {0: a, 1: b})"
        out[key] = f"{' / '.join(builders)}: {doc}{text}"
    return out


def _adapt_builder(name: str) -> TaskBuilder:
    """The builder called ``name``, refused unless adapt reads files with it."""
    if name not in adapt_builders():
        listed = ", ".join(f"{b.name} ({b.summary})" for b in task_builders() if b.adapt is not None)
        raise UserInputError(f"builder={name!r} is invalid: {listed}")
    return task_builder(name)


def _takes_text(tp: Any) -> bool:
    """Whether a key of type ``tp`` takes a string as it is (else a string is a list or mapping)."""
    members = typing.get_args(tp) if typing.get_origin(tp) not in (Literal, None) else (tp,)
    return any(m is str or typing.get_origin(m) is Literal for m in members)


def _from_text(section: type, values: dict[str, Any]) -> dict[str, Any]:
    """Command-line text of a key that takes a list or a mapping, as one: YAML flow
    (``[a, b]``, ``{0: neg, 1: pos}``) or comma-separated words."""
    types = hints(section)
    out = dict(values)
    for key, value in values.items():
        if isinstance(value, str) and not _takes_text(types[key]):
            text = value.strip()
            out[key] = yaml.safe_load(text) if text[:1] in ("[", "{") else [
                w.strip() for w in text.split(",") if w.strip()]
    return out


@dataclass(frozen=True, kw_only=True)
class TaskFormat:
    """How rows become examples: a task builder and the keys of a YAML task source that apply to one task.

    Attributes:
        builder: a task builder of :mod:`fmmeta.tasks.registry` that adapt reads files with
            (:func:`adapt_builders`): ``"classification"`` (a label per row; the answer is its
            label word), ``"dataset"`` (generation: the answer is the output column's text),
            ``"multiple_choice"`` (each row its own options; ``label_column`` names the gold one),
            ``"chat"`` (conversations through the tokenizer's chat template).
        template: prompt format over column names; ``None`` = the text (or input) column alone.
        answer_template: answer format; ``{answer}`` is the label word or the output text.
        labels: classification's label set, in order; ``None`` = the verbalizer's words, else the
            support's labels in order of first appearance. A support label outside the set is refused.
        keys: the builder's own keys, an instance of its section (its columns, ...); ``None`` =
            the section's defaults.
    """

    builder: str = "classification"
    template: str | None = None
    answer_template: str = " {answer}"
    labels: tuple[str, ...] | None = None
    keys: Any = None

    def __post_init__(self) -> None:
        section = _adapt_builder(self.builder).section
        if self.keys is None:
            object.__setattr__(self, "keys", section())
        elif not isinstance(self.keys, section):
            raise TypeError(f"TaskFormat(builder={self.builder!r}) needs keys of {section.__name__}, "
                            f"not {type(self.keys).__name__}")

    @classmethod
    def from_source(cls, source: Any) -> TaskFormat:
        """The format of a ``tasks.collection`` source of the run's config (its resolved keys).

        Raises:
            UserInputError: the source's builder reads one file as many tasks (``task_column``).
        """
        builder = source.task_builder
        if builder is None or builder.adapt is None:
            raise UserInputError(f"source {describe_source(source)!r} has builder={getattr(builder, 'name', None)!r}: "
                                 f"a user's task is one task per support file; use a source of "
                                 f"{' / '.join(adapt_builders())}, or give --builder and the columns yourself")
        values = dataclasses.asdict(source.section())
        return cls(builder=builder.name, template=source.resolved()["template"],
                   answer_template=source.answer_template,
                   keys=build_section(builder, {k: values[k] for k in section_keys(builder)}))

    def replace(self, **changes: Any) -> TaskFormat:
        """This format with ``changes`` (``None`` values are ignored: an option not given); the
        keys of the builder's section it shares with the current one are kept.

        Raises:
            UserInputError: a builder adapt does not read with, a key that builder does not take,
                or a value of the wrong type.
        """
        given = {k: v for k, v in changes.items() if v is not None}
        builder = _adapt_builder(given.pop("builder", self.builder))
        common = {k: given.pop(k) for k in COMMON_KEYS[1:] if k in given}
        if isinstance(common.get("labels"), str):
            common["labels"] = tuple(w.strip() for w in common["labels"].split(",") if w.strip())
        elif "labels" in common:
            common["labels"] = tuple(str(w) for w in common["labels"])
        takes = section_keys(builder)
        problems = [f"{k}={v!r} is not a key of adapt: {SOURCE_ONLY[k]}" for k, v in given.items() if k in SOURCE_ONLY]
        problems += key_problems(builder, {k: v for k, v in given.items() if k not in SOURCE_ONLY}, takes=takes,
                                 also=COMMON_KEYS)
        if problems:
            raise UserInputError(f"unknown task key(s) {sorted(set(given) - set(takes))} for builder="
                                 f"{builder.name!r}: " + "; ".join(problems))
        kept = {k: v for k, v in dataclasses.asdict(self.keys).items() if k in takes}
        try:
            keys = build_section(builder, {**kept, **_from_text(builder.section, given)})
        except ValueError as err:
            raise UserInputError(str(err)) from None
        return dataclasses.replace(self, builder=builder.name, keys=keys, **common)


def describe_source(source: Any) -> str:
    """A source's name as ``--source`` takes it: its task_name, else its path's file stem."""
    return str(source.task_name or Path(str(source.path)).stem)


__all__ = ["COMMON_KEYS", "SOURCE_ONLY", "TaskFormat", "adapt_builders", "describe_source", "format_keys",
           "key_help", "section_keys"]
