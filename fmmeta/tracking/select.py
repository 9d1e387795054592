"""``train.report_to``: which trackers a run writes to, checked when the config is loaded.

The tracker packages are optional (``pip install fmmeta[tracking]``): a missing one is a config
problem, reported with every other before any model is built (exit code 2), not an ImportError
after minutes of training.
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import Any, Mapping

from fmmeta.tracking.protocol import Tracker
from fmmeta.tracking.records import evaluation_rows

__all__ = ["TRACKERS", "open_trackers", "report_evaluation", "report_to_problems", "tracker_names"]

TRACKERS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""Tracker name -> the package it needs (both in the ``tracking`` extra)."""

NONE = "none"
"""``report_to`` value that turns every tracker off (the default)."""


def tracker_names(report_to: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The trackers ``report_to`` selects, in order, each once; ``"none"`` selects none."""
    names = (report_to,) if isinstance(report_to, str) else tuple(report_to)
    return tuple(dict.fromkeys(n for n in names if n != NONE))


def report_to_problems(report_to: str | tuple[str, ...]) -> list[str]:
    """Problems with a ``train.report_to`` value: unknown names, ``none`` mixed with a tracker,
    and trackers whose package is not installed (with the extra that installs it)."""
    names = (report_to,) if isinstance(report_to, str) else tuple(report_to)
    allowed = [NONE, *TRACKERS]
    problems = []
    for name in names:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1)
            problems.append(
                f"report_to={report_to!r} is invalid: {name!r} is not a tracker; choose "
                f"{', '.join(map(repr, allowed))} or a list of trackers"
                + (f"; did you mean {close[0]!r}?" if close else "")
            )
    if NONE in names and len(set(names)) > 1:
        problems.append(f"report_to={report_to!r} is invalid: 'none' cannot be listed with a tracker")
    for name in tracker_names(report_to):
        if name in TRACKERS and importlib.util.find_spec(TRACKERS[name]) is None:
            problems.append(
                f"report_to={report_to!r} needs the {TRACKERS[name]!r} package, which is not "
                "installed: run `pip install fmmeta[tracking]` (or `pip install "
                f"{TRACKERS[name]}`), or set train.report_to=none"
            )
    return problems


def _open(name: str, out: Path, run: str, first_step: int, config: Mapping[str, Any] | None) -> Tracker:
    """One tracker run; the package is imported only here, when it is used."""
    if name == "tensorboard":
        from fmmeta.tracking.tensorboard_tracker import TensorBoardTracker

        return TensorBoardTracker(out / "tensorboard" / run, first_step=first_step)
    from fmmeta.tracking.wandb_tracker import WandbTracker

    return WandbTracker(out, run=run, config=config)


def open_trackers(
    report_to: str | tuple[str, ...], out: Path, *, run: str, first_step: int, rank: int,
    config: Mapping[str, Any] | None = None,
) -> list[Tracker]:
    """Opens one run named ``run`` in every tracker of ``report_to``, on rank 0 (others get none).

    Args:
        out: the run's output_dir; tracker files go under it.
        first_step: the first meta-step still to run; TensorBoard hides older events from this
            step on (a resume), as ``metrics.jsonl`` drops its lines after the checkpoint.
        config: the resolved config, shown with the run where the tracker keeps one (wandb).
    """
    if rank != 0:
        return []
    return [_open(name, out, run, first_step, config) for name in tracker_names(report_to)]


def report_evaluation(report_to: str | tuple[str, ...], out: Path, paths: Mapping[str, Path], *,
                      rank: int, config: Mapping[str, Any] | None = None) -> None:
    """Logs the held-out report (``eval.md``, ``eval.json``'s summary and the PNG plots, as
    ``write_report`` returned them) as one more tracker run named ``eval``, on rank 0."""
    trackers = open_trackers(report_to, out, run="eval", first_step=0, rank=rank, config=config)
    if not trackers:
        return
    report = paths["eval.md"].read_text() if "eval.md" in paths else ""
    table = evaluation_rows(paths["eval.json"]) if "eval.json" in paths else []
    images = {Path(name).stem: path for name, path in paths.items() if str(path).endswith(".png")}
    for tracker in trackers:
        try:
            tracker.log_evaluation(report, table, images)
        finally:
            tracker.close()
