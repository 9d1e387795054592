"""Files fmmeta ships next to its code: the DeepSpeed JSONs and the recipes' example configs.

The README's commands name them by repository path (``ds_configs/zero3.json``,
``recipes/configs/smoke.yaml``). An installed package (``pip install fmmeta``, no repository) has
them too, as ``fmmeta.ds_configs`` and ``fmmeta.recipes`` (setup.py), so the same commands work
from any folder: a relative path that does not exist there is looked up among the shipped files.
A file that does exist always wins, so a user's own ``ds_configs/zero3.json`` is never shadowed.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

__all__ = ["shipped_dir", "shipped_path", "with_shipped_paths"]

_PACKAGES = {"recipes": "fmmeta.recipes", "ds_configs": "fmmeta.ds_configs"}
"""Top folder of a repository path -> the package that ships that folder."""

_PATH_KEYS = ("engine.deepspeed_config",)
"""Overrides whose value is a file path that may name a shipped file."""


def shipped_dir(folder: str) -> Path | None:
    """Where the installed package keeps ``folder`` (``"recipes"`` or ``"ds_configs"``)."""
    name = _PACKAGES.get(folder)
    if name is None:
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:  # a checkout without an install: only the repository's own files exist
        return None
    return Path(module.__file__ or "").parent


def shipped_path(path: str) -> str:
    """``path`` itself if it exists or is absolute; else the shipped file it names, if there is one.

    Example:
        >>> shipped_path("ds_configs/zero3.json")  # from any folder  # doctest: +SKIP
        '/.../site-packages/fmmeta/ds_configs/zero3.json'
    """
    given = Path(path).expanduser()
    if given.exists() or given.is_absolute() or not given.parts:
        return path
    root = shipped_dir(given.parts[0])
    if root is None:
        return path
    candidate = root.joinpath(*given.parts[1:])
    return str(candidate) if candidate.is_file() else path


def with_shipped_paths(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with each file-path value (``engine.deepspeed_config=...``) resolved by
    :func:`shipped_path`."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        out.append(f"{key}={shipped_path(value)}" if sep and key.strip() in _PATH_KEYS else item)
    return out
