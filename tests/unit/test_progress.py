"""Progress lines: items done of total, rate and time left, at most one per interval, always the last."""

from __future__ import annotations

import logging

import pytest

from fmmeta.progress import Progress


def test_progress_logs_rate_and_time_left_at_most_every_interval_and_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    progress = Progress("evaluating", 10, "episodes", every_s=30, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="fmmeta.progress"):
        now[0] = 110.0
        progress.advance(2)  # 10 s in: no line yet
        now[0] = 140.0
        progress.advance(2)  # 40 s in, 4 done: 0.1/s, 60 s left
        now[0] = 150.0
        progress.advance(1)  # 10 s after the last line: none
        now[0] = 190.0
        progress.advance(5)  # all done: always a line
        fast = Progress("choosing lrs", 100, "episodes", every_s=0, clock=lambda: now[0])
        now[0] = 192.0
        fast.advance(50)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "evaluating: 4/10 episodes (40%), 10s each, 40s so far, ~1m00s left",
        "evaluating: 10/10 episodes (100%), 9s each, 1m30s so far",
        "choosing lrs: 50/100 episodes (50%), 25.00 episodes/s, 2s so far, ~2s left",
    ]


def test_progress_with_nothing_to_do_or_on_another_rank_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fmmeta.progress"):
        Progress("evaluating", 0, "episodes").advance(3)
    assert caplog.records == []
