"""Built-in task suites, by name: ``build_suite("cldr", tokenizer, seed=0)``.

A suite is a function ``(tokenizer, **kw) -> TaskSet`` giving disjoint meta-train, meta-validation
and meta-test task lists. ``"cldr"`` is the embedded default (country names from CLDR via
``babel``, no network); ``"synthetic"`` is a tiny arithmetic suite for tests.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from fmmeta.tasks.suites.cldr import SuiteSplit, build_cldr_suite
from fmmeta.tasks.suites.synthetic import build_synthetic_suite
from fmmeta.tasks.task import TaskSet

SuiteBuilder = Callable[..., TaskSet]

_SUITES: dict[str, SuiteBuilder] = {
    "cldr": build_cldr_suite,
    "synthetic": build_synthetic_suite,
}


def register_suite(name: str, builder: SuiteBuilder) -> None:
    """Makes ``builder`` available as ``build_suite(name, ...)`` (e.g. from a recipe config).

    Raises:
        ValueError: if ``name`` is already registered.
    """
    if name in _SUITES:
        raise ValueError(f"suite {name!r} is already registered: pick another name")
    _SUITES[name] = builder


def available_suites() -> list[str]:
    """Names accepted by :func:`build_suite`."""
    return sorted(_SUITES)


def build_suite(name: str, tokenizer: Any, **kwargs: Any) -> TaskSet:
    """Builds the registered suite ``name`` with ``tokenizer``; ``kwargs`` go to its builder.

    Raises:
        ValueError: for an unknown name, listing the known ones and the closest match.

    Example:
        >>> suite = build_suite("synthetic", tiny_tokenizer(), seed=0)  # doctest: +SKIP
    """
    if name not in _SUITES:
        close = difflib.get_close_matches(name, list(_SUITES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown task suite {name!r}: choose one of {available_suites()}.{hint}")
    return _SUITES[name](tokenizer, **kwargs)


__all__ = [
    "SuiteSplit",
    "available_suites",
    "build_cldr_suite",
    "build_suite",
    "build_synthetic_suite",
    "register_suite",
]
