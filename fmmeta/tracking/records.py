"""From the records the recipe writes to what a tracker logs: numbers with tags, table rows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

STEP_PREFIX = "train/"
"""Tag prefix of a meta-step's scalars: trackers group charts by it."""

PER_RANK_PREFIX = "per_rank/"
"""Tag prefix of per-rank lists in a record: ``per_rank/<key>/rank<i>``, one curve per rank."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def step_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A ``metrics.jsonl`` record as tagged numbers.

    Numbers become ``train/<key>``; a list of numbers (one value per rank) becomes
    ``per_rank/<key>/rank<i>``; ``step`` is the x axis, not a value; text and non-finite numbers
    are left out (a tracker cannot chart ``None``, and ``nan`` breaks wandb's summaries).
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step":
            continue
        if _number(value) and math.isfinite(value):
            out[STEP_PREFIX + key] = float(value)
        elif isinstance(value, (list, tuple)) and value and all(_number(v) for v in value):
            out.update({f"{PER_RANK_PREFIX}{key}/rank{i}": float(v)
                        for i, v in enumerate(value) if math.isfinite(v)})
    return out


def evaluation_rows(eval_json: Path) -> list[dict[str, Any]]:
    """One row per (method, family, adaptation step) of ``eval.json``'s summary: the numbers of
    ``eval.md``'s tables in a shape a tracker's table shows and sorts. Every metric the cell holds
    (``<metric>_interval``, see :mod:`fmmeta.evaluation.metrics`) gives ``<metric>`` (the mean
    over episodes), ``<metric>_low``, ``<metric>_high`` and ``<metric>_worst_seed``."""
    summary = json.loads(eval_json.read_text())["summary"]
    rows = []
    for method, families in summary.items():
        for family, steps in families.items():
            for step, cell in steps.items():
                row: dict[str, Any] = {"method": method, "family": family, "step": int(step)}
                for key, interval in cell.items():
                    if key.endswith("_interval"):
                        name = key[: -len("_interval")]
                        row.update({name: interval["estimate"], f"{name}_low": interval["low"],
                                    f"{name}_high": interval["high"]})
                        if f"{name}_worst" in cell:
                            row[f"{name}_worst_seed"] = cell[f"{name}_worst"]
                rows.append({**row, "episodes": cell["n_episodes"]})
    return rows
