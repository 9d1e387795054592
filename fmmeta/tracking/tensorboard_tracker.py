"""TensorBoard event files, written through torch's ``SummaryWriter`` (needs ``tensorboard``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np


class TensorBoardTracker:
    """One TensorBoard run: a folder of event files (``tensorboard --logdir <output_dir>/tensorboard``).

    Args:
        log_dir: this run's folder (one per method, so methods share charts, one curve each).
        first_step: events at or after this step from an earlier start are hidden (``purge_step``):
            a resumed run reads as if it had never stopped, like ``metrics.jsonl``.
    """

    def __init__(self, log_dir: Path, *, first_step: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=first_step)

    def log_step(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)
        # A killed run keeps every step logged so far (the writer would buffer up to 2 minutes).
        self.writer.flush()

    def log_evaluation(self, report_md: str, table: list[dict[str, Any]], images: Mapping[str, Path]) -> None:
        from PIL import Image

        # TensorBoard's text dashboard renders markdown, tables included: eval.md as written.
        self.writer.add_text("eval/report", report_md, global_step=0)
        for name, path in images.items():
            with Image.open(path) as img:
                pixels = np.asarray(img.convert("RGB"))
            self.writer.add_image(f"eval/{name}", pixels, global_step=0, dataformats="HWC")
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()
