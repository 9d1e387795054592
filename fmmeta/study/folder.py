"""The study folder's rules: one study process at a time, one declaration, one look at held-out tasks.

* The folder is locked (the run lock of :mod:`fmmeta.checkpoint.lock`, released by the kernel if
  the study is killed), so a trial Optuna still lists as running belongs to a dead study.
* ``study.yaml`` is the declaration the study started with. A resume must declare the same study:
  another space, scoring or base config would mix trials of two studies under one choice; only
  ``trials`` may grow.
* ``held_out/`` is created, with a ``started.json`` in it, before any held-out episode is drawn,
  and a study whose folder has one refuses to run: scoring the held-out tasks a second time,
  after seeing them, would make them validation tasks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from fmmeta.atomic import replace_text
from fmmeta.checkpoint.lock import RunLock
from fmmeta.config import to_dict
from fmmeta.errors import UserInputError
from fmmeta.study.config import StudyConfig

__all__ = ["CHOICE_FILE", "DECLARATION", "HELD_OUT_DIR", "HeldOutScoredError", "claim_study_dir",
           "refuse_second_look", "start_held_out"]

DECLARATION = "study.yaml"
CHOICE_FILE = "choice.json"
HELD_OUT_DIR = "held_out"
STARTED = "started.json"

FREE_TO_CHANGE = ("trials", "output_dir")
"""Declaration keys a resumed study may change (more trials; the folder may have moved)."""


class HeldOutScoredError(UserInputError):
    """The study's held-out tasks were already scored (or their scoring began)."""


def refuse_second_look(folder: Path) -> None:
    """Refuses a study whose held-out tasks were scored, or began to be.

    Raises:
        HeldOutScoredError: naming when, and what to do instead.
    """
    started = folder / HELD_OUT_DIR / STARTED
    if not (folder / HELD_OUT_DIR).exists():
        return
    try:
        when = json.loads(started.read_text(encoding="utf-8")).get("started", "unknown time")
    except (OSError, ValueError):
        when = "unknown time"
    done = (folder / HELD_OUT_DIR / "eval.json").is_file()
    raise HeldOutScoredError(
        f"the held-out tasks of the study in {str(folder)!r} were "
        + ("scored" if done else "being scored (the scoring did not finish; no score was written)")
        + f" at {when} ({HELD_OUT_DIR}/): a study scores them once, after its choice, and a second "
        "look would make them validation tasks. The report is study.md; to study other settings "
        "start a new study (another output_dir)"
    )


def claim_study_dir(study: StudyConfig) -> tuple[Path, RunLock]:
    """Creates and locks the study folder, refuses a second look at held-out tasks and a resume
    that declares another study, and writes ``study.yaml`` on the first run.

    Raises:
        UserInputError: another study process holds the folder, or the resume differs.
        HeldOutScoredError: the held-out tasks were already scored.
    """
    folder = Path(study.output_dir).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"output_dir={study.output_dir!r} cannot be created ({err.strerror}): "
                             "choose a folder you can write to") from None
    lock = RunLock.acquire(folder)
    try:
        refuse_second_look(folder)
        _check_declaration(folder, study)
    except BaseException:
        lock.release()
        raise
    return folder, lock


def _check_declaration(folder: Path, study: StudyConfig) -> None:
    now = {k: v for k, v in to_dict(study).items() if k not in FREE_TO_CHANGE}
    path = folder / DECLARATION
    if path.is_file():
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        changed = [f"{k}: {saved.get(k)!r} when the study began, {v!r} now"
                   for k, v in now.items() if _plain(saved.get(k)) != _plain(v)]
        if changed:
            raise UserInputError(
                f"the study in {str(folder)!r} was declared otherwise ({DECLARATION}): "
                + "; ".join(changed) + ". A resume must declare the same study (only trials may "
                "change): restore these values, or start a new study (another output_dir)"
            )
    replace_text(path, yaml.safe_dump(to_dict(study), sort_keys=False))


def _plain(value: Any) -> Any:
    """Tuples as lists, as YAML reads them back."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def start_held_out(folder: Path, choice: dict[str, Any]) -> Path:
    """Creates ``held_out/`` with ``started.json`` (when, and the choice it scores); returns it.

    Raises:
        HeldOutScoredError: the folder exists already.
    """
    refuse_second_look(folder)
    out = folder / HELD_OUT_DIR
    out.mkdir()
    record = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "choice": choice}
    replace_text(out / STARTED, json.dumps(record, indent=2) + "\n")
    return out
