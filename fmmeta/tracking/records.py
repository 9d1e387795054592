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
    ``eval.md``'s tables in a shape a tracker's table shows and sorts."""
    summary = json.loads(eval_json.read_text())["summary"]
    rows = []
    for method, families in summary.items():
        for family, steps in families.items():
            for step, cell in steps.items():
                acc, loss = cell["accuracy_interval"], cell["loss_interval"]
                rows.append({
                    "method": method, "family": family, "step": int(step),
                    "accuracy": acc["estimate"], "accuracy_low": acc["low"], "accuracy_high": acc["high"],
                    "accuracy_worst_seed": cell["accuracy_worst"], "loss": loss["estimate"],
                    "loss_low": loss["low"], "loss_high": loss["high"], "episodes": cell["n_episodes"],
                })
    return rows
