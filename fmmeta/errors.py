"""The one exception type for bad input found after the config is loaded.

Why a type of its own: the recipes turn it into a one-paragraph message and exit code 2 (as for
a bad config), while any other exception is a bug and keeps its traceback. Raise it where user
input (a data file, a run folder, a checkpoint) is refused; the message names the value, where it
came from (file and line for data files) and the fix.
"""

from __future__ import annotations

__all__ = ["UserInputError"]


class UserInputError(RuntimeError):
    """Input the user gave cannot be used; the message says which and how to fix it."""
