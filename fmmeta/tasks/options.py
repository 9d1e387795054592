"""The options every builder takes: episode shape, token budget, overflow rule, separator, family.

The four builders of :mod:`fmmeta.tasks.builders` differ in where rows come from and how they are
read; how those rows become tasks is the same for all of them, so it is one small value object,
validated once when it is made (every problem at once), instead of the same keyword arguments
repeated and checked four times. The YAML collection maps each source onto it in one place
(:meth:`fmmeta.tasks.collection.CollectionSource.task_options`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.tokens import OnTooLong, budget_problems


@dataclass(frozen=True, kw_only=True)
class TaskOptions:
    """How rows become tasks, shared by every builder.

    Attributes:
        spec: episode shape (``shots``, ``query``; ``ways`` and remapping for classification).
        max_length: token budget of one example (prompt + answer + EOS), >= 2; longer prompts are
            cut from the left, never the answer.
        on_too_long: ``"drop"`` (count and log) or ``"error"`` for an example whose answer cannot
            fit ``max_length``.
        separator: text between in-context demonstrations.
        family: task family for diversity-aware sampling and per-family reports; "" means each
            task's own name.

    Raises:
        ValueError: listing every invalid value, each with what is allowed.

    Example:
        >>> options = TaskOptions(spec=EpisodeSpec(shots=4, query=4), max_length=64)
        >>> options.on_too_long
        'drop'
    """

    spec: EpisodeSpec
    max_length: int = 256
    on_too_long: OnTooLong = "drop"
    separator: str = "\n\n"
    family: str = ""

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.spec, EpisodeSpec):
            problems.append(
                f"spec={self.spec!r} is invalid: pass an EpisodeSpec, e.g. EpisodeSpec(shots=4, query=4)"
            )
        problems.extend(budget_problems(self.max_length, self.on_too_long))
        if not isinstance(self.separator, str):
            problems.append(
                f"separator={self.separator!r} is invalid: it must be a str (\"\" for none)"
            )
        if not isinstance(self.family, str):
            problems.append(f"family={self.family!r} is invalid: it must be a str (\"\" = the task's name)")
        if problems:
            raise ValueError("TaskOptions: " + "; ".join(problems))


__all__ = ["TaskOptions"]
