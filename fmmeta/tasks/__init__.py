"""The task layer: datasets -> tokenized tasks -> few-shot episodes.

Import from the submodules (``fmmeta.tasks.task``, ``fmmeta.tasks.builders``,
``fmmeta.tasks.suites``; ``fmmeta.tasks.config`` for the recipe's ``tasks`` section, with
collections declared in YAML in ``fmmeta.tasks.collection`` and their tokenization cache in
``fmmeta.tasks.cache``); this package re-exports the names most callers need.
"""

from fmmeta.tasks.episode import IGNORE_INDEX, Batch, Episode, Example, collate
from fmmeta.tasks.task import EpisodeSpec, Task, TaskSet, ensure_pad_token, split_tasks

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "Episode",
    "EpisodeSpec",
    "Example",
    "Task",
    "TaskSet",
    "collate",
    "ensure_pad_token",
    "split_tasks",
]
