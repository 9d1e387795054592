"""Progress a person can watch in a log: items done of total, rate and time left.

A tqdm bar needs a terminal and one process; a run's long loops also run in worker processes and
under launchers, whose output is a log file. So long work reports through :class:`Progress` as
log lines, from the process that collects the results (a worker pool's parent, rank 0), at most
one every ``every_s`` seconds and always at the end.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

__all__ = ["Progress"]

logger = logging.getLogger("fmmeta.progress")


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Logs ``what: done/total unit (pct), rate, ~time left`` as work is done.

    Args:
        what: what the work is, the line's start (``"evaluating"``, ``"trained"``).
        total: items in all (> 0; with 0 nothing is logged).
        unit: the items' name (``"episodes"``).
        every_s: fewest seconds between two lines (0: a line per call); the last item logs one
            unless all the work took less (work that short needs no progress).
        clock: the time source (tests pass a fake one).

    Example:
        >>> progress = Progress("evaluating", 400, "episodes")
        >>> progress.advance(16)  # logs at most every 30 s: "evaluating: 16/400 episodes (4%), ..."
    """

    def __init__(self, what: str, total: int, unit: str, *, every_s: float = 30.0,
                 clock: Callable[[], float] | None = None) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self._clock = clock or time.monotonic
        self.done = 0
        self._start = self._clock()
        self._last = self._start

    def line(self) -> str:
        """The progress as one line (what :meth:`advance` logs)."""
        elapsed = self._clock() - self._start
        text = f"{self.what}: {self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%)"
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            shown = f"{rate:.2f} {self.unit}/s" if rate >= 1 else f"{_duration(1 / rate)} each"
            left = (self.total - self.done) / rate
            text += f", {shown}, {_duration(elapsed)} so far" + (f", ~{_duration(left)} left" if left else "")
        return text

    def advance(self, n: int = 1) -> None:
        """Counts ``n`` more items done; logs a line when ``every_s`` has passed since the last one,
        or all are done after at least ``every_s``."""
        if self.total <= 0:
            return
        self.done = min(self.total, self.done + n)
        now = self._clock()
        if now - self._last >= self.every_s or (self.done == self.total and now - self._start >= self.every_s):
            self._last = now
            logger.info("%s", self.line())
