"""Names that become file or folder names: checked once, here, before anything is written.

A task's name from a user's YAML became ``<out>/adapters/<name>`` as it was: an absolute name or
one with ``..`` wrote anywhere (a finished run's adapter, a user's README were replaced), and
``t`` and ``t/.`` shared a folder. Every name a command turns into a path goes through
:func:`check_path_names` first: one path component, no separator, not ``.`` or ``..``, nothing a
file system reads specially, and unique after the normalisation a file system may apply (Unicode
NFC and case, as on macOS and Windows).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence

__all__ = ["FOLDER_ROOM", "check_path_names", "folder_room_problem", "path_name_problem"]

_FORBIDDEN = frozenset('/\\\0:*?"<>|')
"""Characters a name must not hold: separators on any system, NUL, and what Windows refuses."""


def path_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be one folder or file name, or None when it can."""
    if not isinstance(name, str) or not name.strip():
        return "it is empty"
    if name in (".", ".."):
        return f"{name!r} names a folder that already exists (the current or the parent one)"
    bad = sorted({c for c in name if c in _FORBIDDEN or ord(c) < 32})
    if bad:
        return f"it holds {''.join(bad)!r} (separators and control characters are not allowed in a name)"
    if name != name.strip() or name.endswith("."):
        return "it starts or ends with a space, or ends with a dot (file systems drop those)"
    if len(name.encode("utf-8")) > 200:
        return f"it is {len(name.encode('utf-8'))} bytes long (at most 200, a folder name's room)"
    return None


def check_path_names(names: Sequence[str], *, what: str) -> list[str]:
    """Every problem with ``names`` as names of sibling folders (empty when all can be).

    Args:
        names: the names, each to become one folder or file inside the same folder.
        what: how messages call them (``"--tasks task name"``).

    Returns:
        One message per problem, each naming the name and the fix.

    Example:
        >>> check_path_names(["a", "B", "b"], what="task name")
        ["task names 'B' and 'b' would share one folder where case is not told apart: give them names that differ in more than case"]
    """
    problems = []
    seen: dict[str, str] = {}
    for name in names:
        problem = path_name_problem(name)
        if problem is not None:
            problems.append(f"{what} {name!r} cannot be a folder name: {problem}; rename it")
            continue
        key = unicodedata.normalize("NFC", name).casefold()
        if key in seen and seen[key] != name:
            problems.append(f"{what}s {seen[key]!r} and {name!r} would share one folder where case is not told "
                            "apart: give them names that differ in more than case")
        seen.setdefault(key, name)
    return problems


FOLDER_ROOM = 255
"""Bytes a command's output folder must leave below the system's path limit for what it writes
inside: a run's deepest file (``replicate_<r>/<method>/checkpoints/.tmp_step_<n>/adapter/
adapter_model.safetensors``) is under 100 bytes, DeepSpeed's ZeRO shards and an evaluation's
``eval-<name>`` folder add less than one more folder name (255)."""


def folder_room_problem(folder: str, *, what: str) -> str | None:
    """Why files cannot be written inside ``folder`` (to :data:`FOLDER_ROOM` bytes deep), or None.

    An ``output_dir`` near the path-length limit failed only when training wrote its first
    checkpoint, with a fix ("free space and rerun") that failed again."""
    path = os.path.abspath(os.path.expanduser(folder))
    probe = path
    while not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    try:
        path_max, name_max = os.pathconf(probe, "PC_PATH_MAX"), os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError):  # a system without pathconf: Linux's limits
        path_max, name_max = 4096, 255
    long_names = [n for n in path.split(os.sep) if len(os.fsencode(n)) > name_max]
    if long_names:
        return (f"{what}={folder!r} holds a folder name of {len(os.fsencode(long_names[0]))} bytes, longer than this "
                f"file system's {name_max}: give a shorter name")
    size = len(os.fsencode(path))
    if size + FOLDER_ROOM > path_max:
        return (f"{what}={folder!r} is {size} bytes long as an absolute path, leaving less than the {FOLDER_ROOM} "
                f"bytes the files written inside it need below this system's path limit ({path_max}): give a "
                "shorter path")
    return None
