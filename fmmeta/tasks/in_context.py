"""Tasks in the in-context format, for an inner loop that adapts on in-context rows.

MAML-en-LLM (Sinha et al., KDD 2024) meta-trains with the inner loop on episodes in the format
the model is then used in: each row carries demonstrations. fmmeta's adapters otherwise adapt on
plain rows and may be scored with demonstrations, a mismatch that cost adapted multi-task 13
points on held-out language identification. With ``algorithm.inner_format=in_context`` the
methods that adapt (FOMAML, Meta-SGD, Reptile) draw their episodes through :class:`InContextTask`:
each support example gets the other support examples as demonstrations (leave one out) and each
query all of them (:meth:`~fmmeta.tasks.episode.Episode.in_context`).

Formatting the episode, not the passes, keeps everything after it unchanged: the planner packs
and prices the longer rows as they are, the one inner loop adapts on them, and the loss still
covers only each row's own answer tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fmmeta.tasks.episode import Episode

__all__ = ["INNER_FORMATS", "InContextTask"]

INNER_FORMATS = ("plain", "in_context")
"""Row formats of the inner loop: plain rows, or rows with the support as demonstrations."""


@dataclass(frozen=True)
class InContextTask:
    """A task whose episodes come in the in-context format (an episode source like the task).

    Attributes:
        task: the task drawn from (anything with ``name``, ``family`` and ``sample_episode``).
        max_length: longest row (demonstrations + example) in tokens; longer rows lose their
            oldest demonstration tokens (``algorithm.icl_max_length``).

    Example:
        >>> episode = InContextTask(task, max_length=1024).sample_episode(np.random.default_rng(0))
    """

    task: Any
    max_length: int

    @property
    def name(self) -> str:
        """The task's name: observations and logs name the task, not the format."""
        return str(self.task.name)

    @property
    def family(self) -> str:
        """The task's family."""
        return str(self.task.family)

    def __len__(self) -> int:
        return len(self.task)

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """The task's episode for ``rng``, in the in-context format (the same draw as plain)."""
        return self.task.sample_episode(rng).in_context(self.max_length)
