"""What every experiment tracker offers the recipe: one meta-step record, one evaluation, close."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol


class Tracker(Protocol):
    """One tracker run (a method's meta-training, or the evaluation), written on rank 0 only."""

    def log_step(self, step: int, scalars: Mapping[str, float]) -> None:
        """Logs one meta-step's numbers (tags such as ``train/outer_loss``) at ``step``."""

    def log_evaluation(self, report_md: str, table: list[dict[str, Any]], images: Mapping[str, Path]) -> None:
        """Logs the held-out report: its markdown, its summary rows and its PNG plots."""

    def close(self, failed: bool = False) -> None:
        """Flushes and ends the run; ``failed`` marks a run that stopped on an exception."""
