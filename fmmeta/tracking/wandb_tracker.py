"""Weights & Biases runs, offline unless the user chose a mode (needs ``wandb``)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Mapping


class WandbTracker:
    """One wandb run under ``<output_dir>/wandb``, named after the method (or ``eval``), grouped
    by the run folder's name so a run's methods are shown together.

    The mode is ``WANDB_MODE`` when set, else ``offline``: training nodes often have no network,
    and an online start would wait for it; ``wandb sync <output_dir>/wandb/offline-run-*``
    uploads later. ``WANDB_PROJECT`` names the project (default ``fmmeta``).
    """

    def __init__(self, out: Path, *, run: str, config: Mapping[str, Any] | None = None) -> None:
        # Typed as Any: mypy runs with and without the optional package installed.
        self._wandb: Any = importlib.import_module("wandb")
        out.mkdir(parents=True, exist_ok=True)
        self.run = self._wandb.init(
            project=os.environ.get("WANDB_PROJECT", "fmmeta"), dir=str(out),
            mode=os.environ.get("WANDB_MODE", "offline"),
            name=run, group=out.resolve().name, job_type="eval" if run == "eval" else "train",
            config=dict(config) if config is not None else None, reinit="create_new",
        )

    def log_step(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def log_evaluation(self, report_md: str, table: list[dict[str, Any]], images: Mapping[str, Path]) -> None:
        logged: dict[str, Any] = {f"eval/{name}": self._wandb.Image(str(path)) for name, path in images.items()}
        if table:
            columns = list(table[0])
            logged["eval/summary"] = self._wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in table])
        self.run.log(logged, step=0)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)
