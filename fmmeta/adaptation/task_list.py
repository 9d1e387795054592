"""Many tasks in one call: a folder of task folders, or a YAML list of support/query pairs.

A hundred small tasks adapted in one process share the model load and the adaptation passes
(:class:`~fmmeta.adaptation.session.Adapter` groups them); these are the two ways to name them:

* a folder whose every sub-folder is a task, named by the folder, holding ``support.<ext>`` and
  ``query.<ext>`` (any format the task builders read);
* a YAML list of ``{name, support, query}`` mappings, each with any :class:`TaskFormat` key of
  its own (``template``, ``labels``, its builder's keys, ...); relative paths are relative to the YAML file.
"""

from __future__ import annotations

from pathlib import Path

from fmmeta.adaptation.task_files import TaskFiles, TaskFormat
from fmmeta.adaptation.task_format import format_keys
from fmmeta.errors import UserInputError

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow")


def _one(folder: Path, stem: str) -> Path:
    """The folder's ``stem.<ext>`` file (exactly one)."""
    found = [p for p in sorted(folder.iterdir()) if p.stem == stem and p.suffix in DATA_SUFFIXES]
    if len(found) != 1:
        raise UserInputError(f"task folder {str(folder)!r} has {len(found)} {stem} file(s) ({[p.name for p in found]}): "
                             f"each task folder needs exactly one {stem}.<{'|'.join(s[1:] for s in DATA_SUFFIXES)}>")
    return found[0]


def folder_tasks(root: Path, fmt: TaskFormat) -> list[TaskFiles]:
    """Every sub-folder of ``root`` as a task named by it (see the module docstring)."""
    folders = [p for p in sorted(root.iterdir()) if p.is_dir()]
    if not folders:
        raise UserInputError(f"--tasks {str(root)!r} has no task folders: put each task's support.<ext> and "
                             "query.<ext> in a folder of its own inside it (or give a YAML list)")
    return [TaskFiles(p.name, _one(p, "support"), _one(p, "query"), fmt) for p in folders]


def yaml_tasks(path: Path, fmt: TaskFormat) -> list[TaskFiles]:
    """The tasks of a YAML list (see the module docstring)."""
    import yaml

    try:
        items = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise UserInputError(f"--tasks {str(path)!r} cannot be read as YAML: {err}") from None
    if not isinstance(items, list) or not items:
        raise UserInputError(f"--tasks {str(path)!r} is not a YAML list of tasks: write one '- {{name: ..., "
                             "support: FILE, query: FILE}' per task")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "support" not in item or "query" not in item:
            raise UserInputError(f"--tasks {str(path)!r} item {i} is {item!r}: each task needs support and query "
                                 "files (and optionally name and the keys " + ", ".join(format_keys()) + ")")
        extra = {k: v for k, v in item.items() if k not in ("name", "support", "query")}
        name = str(item.get("name", f"task{i}"))
        out.append(TaskFiles(name, path.parent / str(item["support"]), path.parent / str(item["query"]),
                             fmt.replace(**extra)))
    return out


def task_list(path: Path, fmt: TaskFormat) -> list[TaskFiles]:
    """The tasks of ``--tasks``: a folder of task folders or a YAML list.

    Raises:
        UserInputError: a path that is neither, an item without its files, or duplicate names.
    """
    if path.is_dir():
        tasks = folder_tasks(path, fmt)
    elif path.is_file() and path.suffix in (".yaml", ".yml"):
        tasks = yaml_tasks(path, fmt)
    else:
        raise UserInputError(f"--tasks {str(path)!r} is neither a folder of task folders nor a .yaml list")
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserInputError(f"--tasks {str(path)!r} names tasks {twice} more than once: give each its own name")
    return tasks


__all__ = ["DATA_SUFFIXES", "folder_tasks", "task_list", "yaml_tasks"]
