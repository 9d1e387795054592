"""What the recipes' command lines share: ``--import MODULE``, and ``--config`` given once.

A task suite registered from Python (:func:`fmmeta.tasks.suites.register_suite`) exists only in a
process that imported the module registering it. ``--import`` imports it on every rank before the
config is checked, so ``tasks.suite`` can name it in training and when ``evaluate --run``
re-evaluates such a run.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any, Sequence

from fmmeta.errors import UserInputError

__all__ = ["IMPORT_HELP", "OneConfig", "import_modules"]


class OneConfig(argparse.Action):
    """``--config`` that may be given once: argparse keeps the last of two, and the first file's
    settings were dropped without a word (a run reads one config file)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None:
            parser.error(f"--config given twice ({before!r}, then {values!r}): a run reads one config "
                         "file; merge them, or give the second one's values as section.key=value overrides")
        setattr(namespace, self.dest, values)

IMPORT_HELP = ("import MODULE before the config is checked (repeatable): e.g. a module that "
               "registers the task suite tasks.suite names (fmmeta.tasks.suites.register_suite)")


def import_modules(names: list[str]) -> None:
    """Imports each ``--import`` module (on every rank), so the suites they register exist before
    the config is checked.

    Raises:
        UserInputError: a module that does not import, naming it and the fix.
    """
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise UserInputError(f"--import {name!r} failed ({err}): check the module name and that "
                                 "its folder is on PYTHONPATH (or installed)") from None
