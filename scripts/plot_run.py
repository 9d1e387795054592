#!/usr/bin/env python
"""Redraws a run's meta-training curves from its ``metrics.jsonl``, each curve only where it differs.

Why this script: the report's plot draws the outer loss and the query loss before and after
adaptation for every method. Where two of them are the same number at every meta-step (in the
committed default run the outer loss *is* the query loss after adaptation for every method, and
multi-task and MetaICL do not adapt, so their query loss before equals the one after), the later
line hides the earlier one exactly and the legend names a line no reader can see. This script
drops such a curve from a method's panel and lets :func:`fmmeta.evaluation.report.plot_training_curves`
draw the rest, so the picture in ``docs/default_run/`` comes from the committed metrics alone:

    python scripts/plot_run.py docs/default_run/metrics.jsonl docs/default_run/training_curves.png
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from fmmeta.evaluation.report import plot_training_curves

KEPT = "query_loss_after"
"""The curve always drawn: the loss the meta-learners optimise, and the one a reader compares."""

DROPPABLE: tuple[str, ...] = ("outer_loss", "query_loss_before")
"""Curves drawn only where they differ from :data:`KEPT` at some meta-step of the method."""


def read_records(metrics: Path) -> list[dict]:
    """Every JSON object of ``metrics``, one per non-empty line, in file order."""
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def repeated_curves(records: list[dict]) -> dict[str, list[str]]:
    """Method -> the :data:`DROPPABLE` keys equal to :data:`KEPT` on every record that has both.

    Equality is exact: the curves hidden this way are the same float, not nearly the same, and a
    curve that differs anywhere stays whole (a line with gaps would read as missing data).
    """
    out: dict[str, list[str]] = {}
    methods = list(dict.fromkeys(str(r.get("method", "")) for r in records))
    for method in methods:
        rows = [r for r in records if str(r.get("method", "")) == method and KEPT in r]
        out[method] = [key for key in DROPPABLE
                       if any(key in r for r in rows) and all(r[key] == r[KEPT] for r in rows if key in r)]
    return out


def without_repeated_curves(records: list[dict]) -> tuple[list[dict], dict[str, list[str]]]:
    """``records`` with each method's repeated curves removed, and what was removed per method."""
    dropped = repeated_curves(records)
    kept = [{k: v for k, v in r.items() if k not in dropped.get(str(r.get("method", "")), [])} for r in records]
    return kept, dropped


def main(argv: list[str] | None = None) -> int:
    """Writes the PNG and prints, per method, which curves were left out because they repeat another."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("png", type=Path, help="where to write the meta-training curves")
    args = parser.parse_args(argv)
    records, dropped = without_repeated_curves(read_records(args.metrics))
    with tempfile.TemporaryDirectory() as tmp:
        filtered = Path(tmp) / "metrics.jsonl"
        filtered.write_text("".join(json.dumps(r) + "\n" for r in records))
        plot_training_curves(filtered, args.png)
    for method, keys in dropped.items():
        if keys:
            print(f"{method}: not drawn, equal to {KEPT} at every meta-step: {', '.join(keys)}")
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
