"""Tasks: the two task types behind one name, and the meta-train / val / test split of a list.

A task is a named collection of tokenized examples that samples few-shot episodes; it is one of
three types, each built complete by its own constructors:

* :class:`~fmmeta.tasks.generation.GenerationTask`: (prompt, answer) pairs; an episode draws
  ``shots`` support and ``query`` query examples without overlap;
* :class:`~fmmeta.tasks.classification.ClassificationTask`: prompts with a class each; an episode
  draws ``ways`` classes, answers are verbalizer words (optionally remapped per episode);
* :class:`~fmmeta.tasks.multiple_choice.MultipleChoiceTask`: questions that bring their own
  options (``Example.options``); an episode draws ``shots`` solved questions and ``query`` more.

All satisfy the sampler's :class:`~fmmeta.sampling.source.EpisodeSource` protocol (``name``,
``family``, ``sample_episode(rng)``); code that needs the kind asks the type
(``isinstance(task, ClassificationTask)``), never a ``None`` field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from fmmeta.tasks.classification import ClassificationTask
from fmmeta.tasks.generation import GenerationTask
from fmmeta.tasks.multiple_choice import MultipleChoiceTask
from fmmeta.tasks.ragged import RaggedIds
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.tokens import OnTooLong, check_texts, encode, ensure_pad_token, eos_ids

Task = Union[GenerationTask, ClassificationTask, MultipleChoiceTask]
"""Any task type: what task lists, splits and the samplers hold (``isinstance`` works on it)."""


def tasks_fingerprint(tasks: Iterable[Any]) -> str:
    """An xxh3 digest of every task's name and examples' token ids, in order: the meta-training
    data as the model sees it, so a checkpoint can record what it was trained on and a resume
    over changed data is named (tasks without ``examples``, e.g. a suite's own type, count by
    name only)."""
    import xxhash

    digest = xxhash.xxh3_64()
    for task in tasks:
        digest.update(task.name.encode("utf-8") + b"\0")
        prompts = getattr(task, "_prompts", None)
        if isinstance(prompts, RaggedIds) and not isinstance(task, ClassificationTask):
            answers = task._answers  # read from the ids, not through a million Example objects
            for i in range(len(prompts)):
                digest.update(prompts.row_bytes(i) + b"|" + answers.row_bytes(i) + b";")
            continue
        for example in getattr(task, "examples", ()):
            digest.update(np.asarray(example.prompt_ids, dtype=np.int64).tobytes() + b"|")
            digest.update(np.asarray(example.answer_ids, dtype=np.int64).tobytes() + b";")
    return digest.hexdigest()


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


RENAMED_SPLITS = {"meta_val": "validation", "meta_test": "held_out"}
"""The task splits' earlier names -> today's (STYLE: meta-training, validation, held_out)."""


def _renamed_splits_message(where: str, names: Mapping[str, Any]) -> str:
    """The refusal of earlier split names: which names, and what they are called now."""
    known = {k: RENAMED_SPLITS[k] for k in names if k in RENAMED_SPLITS}
    other = sorted(set(names) - set(known))
    if other:
        return f"{where} got unknown keyword(s) {other}: the splits are meta_train, validation, held_out"
    fix = ", ".join(f"{old} -> {new}" for old, new in known.items())
    return f"{where}: the splits were renamed ({fix}); use meta_train, validation and held_out"


@dataclass(frozen=True, init=False)
class TaskSet:
    """Disjoint meta-train, validation and held-out task lists.

    Attributes:
        meta_train: tasks the meta-learner trains on.
        validation: tasks for choosing hyper-parameters (e.g. the adaptation lr).
        held_out: held-out tasks, touched only for the final evaluation.
        format_shift: held-out families whose template and label words no meta-training task
            has (a user's task of another format): the report scores them apart, against the
            base model.
    """

    meta_train: list[Task] = field(default_factory=list)
    validation: list[Task] = field(default_factory=list)
    held_out: list[Task] = field(default_factory=list)
    format_shift: list[str] = field(default_factory=list)

    def __init__(self, meta_train: Sequence[Task] = (), validation: Sequence[Task] = (),
                 held_out: Sequence[Task] = (), format_shift: Sequence[str] = (), **renamed: Any) -> None:
        # Written out (init=False) only to refuse the splits' earlier names with the fix: a suite
        # builder of the user's that still says meta_val= would otherwise get a bare TypeError.
        if renamed:
            raise TypeError(_renamed_splits_message("TaskSet()", renamed))
        object.__setattr__(self, "meta_train", list(meta_train))
        object.__setattr__(self, "validation", list(validation))
        object.__setattr__(self, "held_out", list(held_out))
        object.__setattr__(self, "format_shift", list(format_shift))
        self.__post_init__()

    def __post_init__(self) -> None:
        check_unique_names(
            [*self.meta_train, *self.validation, *self.held_out],
            where="TaskSet (meta_train + validation + held_out)",
        )
        held = {t.family for t in self.held_out}
        missing = [f for f in self.format_shift if f not in held]
        if missing:
            raise ValueError(f"format_shift families {missing} have no held-out task (held-out families: "
                             f"{sorted(held)}): only a held-out family can be scored as out of format")

    def names(self) -> dict[str, list[str]]:
        """Task names per split."""
        return {
            "meta_train": [t.name for t in self.meta_train],
            "validation": [t.name for t in self.validation],
            "held_out": [t.name for t in self.held_out],
        }


def split_tasks(
    tasks: Sequence[Task],
    *,
    seed: int,
    fractions: tuple[float, float, float] | None = (0.8, 0.1, 0.1),
    names: Mapping[str, Sequence[str]] | None = None,
) -> TaskSet:
    """Splits tasks into disjoint meta-train / validation / held-out lists.

    Args:
        tasks: tasks with unique names.
        seed: seeds the shuffle for ``fractions`` (the same seed gives the same split).
        fractions: (train, val, test) shares summing to 1; each non-zero share gets >= 1 task.
        names: explicit split instead of fractions: ``{"validation": [...], "held_out": [...]}``
            and optionally ``"meta_train"``; tasks not named go to meta-train.

    Raises:
        ValueError: on duplicate names, unknown names, a task named in two splits, or bad fractions.
    """
    check_unique_names(tasks)
    if names is not None:
        return _split_by_names(tasks, names)
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
            f"split_tasks: {n} tasks are too few for fractions={fractions} (validation {n_val}, "
            f"held_out {n_test}, nothing left to train on): add tasks or change fractions"
        )
    order = np.random.default_rng(seed).permutation(n)
    shuffled = [tasks[i] for i in order]
    return TaskSet(
        meta_train=shuffled[n_val + n_test :],
        validation=shuffled[:n_val],
        held_out=shuffled[n_val : n_val + n_test],
    )


def _split_by_names(tasks: Sequence[Task], names: Mapping[str, Sequence[str]]) -> TaskSet:
    """The explicit split of :func:`split_tasks`: named tasks where named, the rest meta-train."""
    by_name = {t.name: t for t in tasks}
    allowed = ("meta_train", "validation", "held_out")
    if set(names) & set(RENAMED_SPLITS):
        raise ValueError(_renamed_splits_message("split_tasks(names=...)", {k: 0 for k in names if k in RENAMED_SPLITS}))
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
    return TaskSet(out.get("meta_train", ()), out.get("validation", ()), out.get("held_out", ()))


__all__ = [
    "ClassificationTask",
    "EpisodeSpec",
    "GenerationTask",
    "MultipleChoiceTask",
    "OnTooLong",
    "Task",
    "TaskSet",
    "check_texts",
    "check_unique_names",
    "encode",
    "ensure_pad_token",
    "eos_ids",
    "split_tasks",
    "tasks_fingerprint",
]
