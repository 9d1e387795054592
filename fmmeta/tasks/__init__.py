"""The task layer: datasets -> tokenized tasks -> few-shot episodes.

A task is a :class:`GenerationTask`, a :class:`ClassificationTask` or a
:class:`MultipleChoiceTask` (``Task`` names any); all are what the sampler calls an episode source (``name``, ``family``, ``sample_episode``).
Import from the submodules (``fmmeta.tasks.task``, ``fmmeta.tasks.builders`` with its
:class:`TaskOptions`, ``fmmeta.tasks.suites``; ``fmmeta.tasks.config`` for the recipe's ``tasks``
section, with collections declared in YAML in ``fmmeta.tasks.collection`` and their tokenization
cache in ``fmmeta.tasks.cache``); this package re-exports the names most callers need.
"""

from fmmeta.tasks.episode import IGNORE_INDEX, Batch, Episode, Example, collate
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.task import (
    ClassificationTask,
    EpisodeSpec,
    GenerationTask,
    MultipleChoiceTask,
    Task,
    TaskSet,
    ensure_pad_token,
    split_tasks,
)

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "ClassificationTask",
    "Episode",
    "EpisodeSpec",
    "Example",
    "GenerationTask",
    "MultipleChoiceTask",
    "Task",
    "TaskOptions",
    "TaskSet",
    "collate",
    "ensure_pad_token",
    "split_tasks",
]
