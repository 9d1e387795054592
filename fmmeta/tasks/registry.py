"""The task builders a ``tasks.collection`` source may name, each one registration.

A builder is what turns a source's rows into tasks: its name (the source's ``builder`` key), its
own typed section (the source keys it takes, each with its default and doc, shown by ``--help``),
how it reads one dataset into the rows of its tasks, whether a folder is one task per file, and
the kind of format adapt reads a user's support and query files in (``fmmeta adapt``). The
collection (:mod:`fmmeta.tasks.collection`), its config (:mod:`fmmeta.tasks.collection_config`),
the help and adapt ask this registry; none of them names a builder.

A builder lives in one module that calls :func:`register` when imported; :data:`BUILDER_MODULES`
lists those modules, imported on the first question asked of the registry.

Example:
    >>> sorted(b.name for b in task_builders())[:2]
    ['classification', 'dataset']
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fmmeta.config import ConfigError, build_config

if TYPE_CHECKING:  # only types: the registry imports no builder at import time
    import datasets

    from fmmeta.tasks.spec import EpisodeSpec

BUILDER_MODULES: tuple[str, ...] = (
    "fmmeta.tasks.source_builders",
    "fmmeta.tasks.chat",
)
"""The modules that register builders (imported on the registry's first use)."""


@dataclass(frozen=True, kw_only=True)
class SourceRows:
    """What every builder reads a dataset with besides its own section's keys: the source's
    common keys (:class:`~fmmeta.tasks.collection_config.CollectionSource`).

    Attributes:
        name: the task's name (one task per dataset), from ``task_name`` or the file.
        spec: the episode shape.
        template: the prompt template (``None`` = the builder's default column).
        answer_template: the answer format.
        family: the tasks' family.
        drop_small: drop tasks or classes too small for an episode instead of refusing them.
    """

    name: str
    spec: EpisodeSpec
    template: str | None
    answer_template: str
    family: str
    drop_small: bool


@dataclass(frozen=True, kw_only=True)
class TaskBuilder:
    """One builder: everything the rest of fmmeta asks of it.

    Attributes:
        name: the value of a source's ``builder`` key.
        summary: one line saying what it makes (in messages and ``--help``).
        section: its keys, a keyword-only dataclass with a doc string under each field.
        rows: ``rows(dataset, keys, common)``: the checked rows of the tasks in one dataset
            (``keys``: an instance of ``section``); raises ValueError naming the fix.
        check: ``check(source, keys)``: problems found without data (the contract of
            ``validate()``: each starts with the key it is about).
        one_task_per_file: a source of several files makes one task of each file.
        letters: its answer template may name ``{letter}`` (the option's letter).
        adapt: the format ``fmmeta adapt`` reads a user's files in with this builder's keys
            (a key of ``fmmeta.adaptation.task_files.ADAPT_FORMATS``), or None: adapt refuses it.
    """

    name: str
    summary: str
    section: type
    rows: Callable[[datasets.Dataset, Any, SourceRows], Sequence[Any]]
    check: Callable[[Any, Any], list[str]] = lambda source, keys: []
    one_task_per_file: bool = False
    letters: bool = False
    adapt: str | None = None


_REGISTERED: dict[str, TaskBuilder] = {}


def register(builder: TaskBuilder) -> TaskBuilder:
    """Adds ``builder`` (a module's registration, run when it is imported).

    Raises:
        ValueError: a builder of that name is registered already.
    """
    if builder.name in _REGISTERED and _REGISTERED[builder.name] is not builder:
        raise ValueError(f"a task builder named {builder.name!r} is registered twice")
    _REGISTERED[builder.name] = builder
    return builder


def task_builders() -> list[TaskBuilder]:
    """Every registered builder: those of :data:`BUILDER_MODULES` in that order, then any other
    in registration order (so messages and ``--help`` list them alike whichever module a
    program happened to import first)."""
    for module in BUILDER_MODULES:
        importlib.import_module(module)
    rank = {module: i for i, module in enumerate(BUILDER_MODULES)}
    return sorted(_REGISTERED.values(), key=lambda b: rank.get(b.rows.__module__, len(rank)))


def builder_names() -> list[str]:
    """The names a source's ``builder`` key may take."""
    return [b.name for b in task_builders()]


def task_builder(name: str) -> TaskBuilder:
    """The builder called ``name``.

    Raises:
        KeyError: no builder has that name (the message lists those that do).
    """
    found = {b.name: b for b in task_builders()}
    if name not in found:
        raise KeyError(f"builder={name!r} is not a task builder: use one of {', '.join(found)}")
    return found[name]


def builder_sections() -> list[tuple[str, type]]:
    """(name, section) of every builder: the keys a source may set beside its common ones."""
    return [(b.name, b.section) for b in task_builders()]


def key_owners() -> dict[str, list[str]]:
    """Each builder key -> the builders whose section takes it."""
    out: dict[str, list[str]] = {}
    for name, section in builder_sections():
        for f in dataclasses.fields(section):
            out.setdefault(f.name, []).append(name)
    return out


def key_problems(builder: TaskBuilder, given: Mapping[str, Any], *, takes: Collection[str] | None = None,
                 also: Sequence[str] = ()) -> list[str]:
    """Each key of ``given`` that ``builder`` does not take: another builder's (naming those that
    take it) or no builder's (with the closest valid key); unset values (None, "") pass.

    Args:
        builder: the chosen builder.
        given: its keys as the user set them.
        takes: the keys it takes (default: its section's fields).
        also: the keys valid beside them (suggested for a misspelt key).
    """
    takes = sorted(takes if takes is not None else (f.name for f in dataclasses.fields(builder.section)))
    its = f"builder={builder.name!r} takes {', '.join(takes)}"
    owners = key_owners()
    problems = []
    for key, value in given.items():
        if key in takes or value is None or value == "":
            continue
        if key in owners:
            problems.append(f"{key}={value!r} does not apply to builder={builder.name!r} (only to "
                            f"{' / '.join(owners[key])}): remove it or change the builder ({its})")
        else:
            close = difflib.get_close_matches(key, [*takes, *also], n=1)
            problems.append(f"{key} is not a key of builder={builder.name!r}"
                            + (f" (did you mean {close[0]!r}?)" if close else "") + f": {its}")
    return problems


def build_section(builder: TaskBuilder, values: Mapping[str, Any]) -> Any:
    """``builder``'s section from ``values`` (its keys only), its defaults for the rest.

    Raises:
        ValueError: a value of the wrong type (the message names each key, value and type).
    """
    try:
        return build_config(builder.section, values)
    except ConfigError as err:
        raise ValueError("; ".join(err.problems)) from None


__all__ = ["BUILDER_MODULES", "SourceRows", "TaskBuilder", "build_section", "builder_names", "builder_sections",
           "key_owners", "key_problems", "register", "task_builder", "task_builders"]
