"""The one error a configuration raises, and the check for sections built in code."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["ConfigError", "raise_if_invalid"]


class ConfigError(ValueError):
    """Every problem found in a configuration, raised once.

    Attributes:
        problems: one human-readable line per problem, each naming the key, the value, what is
            allowed and how to fix it.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: list[str] = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the configuration:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))

    def __reduce__(self) -> tuple[type, tuple[list[str]]]:
        # Rebuilt from its problems, not its message: a worker process sends it back pickled.
        return type(self), (self.problems,)


def raise_if_invalid(section: Any) -> None:
    """Raises :class:`ConfigError` with ``section.validate()``'s problems, if it has any.

    Why: sections never raise on construction (see the module docstring), so a sampler or an
    optimizer handed a section built in code, not by the loader, checks it here before use.
    """
    problems = _problems(section, "")
    if problems:
        raise ConfigError(problems)


def _problems(section: Any, path: str) -> list[str]:
    """``section.validate()``'s problems and those of the sections it holds, each prefixed with
    its section's path (as the loader reports them)."""
    problems = [f"{path}{p}" for p in section.validate()]
    for f in dataclasses.fields(section) if dataclasses.is_dataclass(section) else ():
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value) and callable(getattr(value, "validate", None)):
            problems.extend(_problems(value, f"{path}{f.name}."))
    return problems
