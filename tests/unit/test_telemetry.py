"""RankWatch: a rank that is the slowest in every step of a window, by more than the margin, is
named once (with its host); noise that moves between ranks, a small excess or one rank is not."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from fmmeta.algorithms.gather import GatheredStep
from fmmeta.algorithms.meta_step import StepStats
from fmmeta.telemetry import RankWatch, merge_summaries, save_telemetry

HOSTS = ["node-a", "node-b", "node-c"]


def step(i: int, computes: list[float], tokens: list[int] | None = None) -> GatheredStep:
    """Meta-step ``i`` whose ranks took ``computes`` seconds of compute."""
    tokens = tokens or [100] * len(computes)
    return GatheredStep(tuple(
        StepStats(step=i, rank=r, outer_loss=1.0, query_loss_before=math.nan, query_loss_after=1.0,
                  n_real_tasks=1, n_tokens=tokens[r], n_padded_tokens=tokens[r], n_passes=1,
                  seconds=max(computes) + 0.1, compute_seconds=c, collective_seconds=max(computes) - c,
                  data_wait_seconds=0.01 * r, peak_memory_mb=100.0 + i)
        for r, c in enumerate(computes)), "max_rss_process")


def test_a_persistently_slow_rank_is_named_once_with_its_host(caplog: pytest.LogCaptureFixture) -> None:
    watch = RankWatch("fomaml", HOSTS, window=4, margin=0.25, rank=0)
    with caplog.at_level(logging.WARNING, logger="fmmeta.telemetry"):
        found = [watch.observe(step(i, [1.0, 1.6, 1.1], tokens=[100, 100, 100])) for i in range(7)]
    assert found[:3] == [None] * 3 and all(f is None for f in found[4:])
    hit = found[3]
    assert hit is not None and (hit.rank, hit.host, hit.first_step, hit.last_step) == (1, "node-b", 0, 3)
    assert hit.compute_s == pytest.approx(1.6) and hit.others_compute_s == pytest.approx(1.05)
    assert hit.token_share == pytest.approx(1 / 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "rank 1 (host node-b)" in warnings[0] and "meta-steps 0-3" in warnings[0] and "+52%" in warnings[0]
    assert watch.summary()["slow_rank"]["rank"] == 1


@pytest.mark.parametrize("computes", [
    [[1.0, 1.6], [1.6, 1.0]] * 4,  # the slowest rank changes: load noise, not a slow node
    [[1.0, 1.2]] * 8,  # always rank 1, but only 20% slower (margin 25%)
    [[1.0]] * 8,  # one rank: nothing to compare with
])
def test_no_warning_without_a_persistent_excess(computes: list[list[float]], caplog: pytest.LogCaptureFixture) -> None:
    watch = RankWatch("fomaml", HOSTS, window=4, margin=0.25)
    with caplog.at_level(logging.WARNING, logger="fmmeta.telemetry"):
        assert all(watch.observe(step(i, c)) is None for i, c in enumerate(computes))
    assert not caplog.records and watch.summary()["slow_rank"] is None


def test_a_slow_rank_after_a_fast_stretch_is_found_once_the_window_holds_only_slow_steps() -> None:
    watch = RankWatch("fomaml", HOSTS, window=3, margin=0.25)
    steps = [[1.0, 1.0]] * 2 + [[1.0, 2.0]] * 3
    found = [watch.observe(step(i, c)) for i, c in enumerate(steps)]
    assert found[:4] == [None] * 4 and found[4] is not None and found[4].first_step == 2


def test_only_rank_0_logs(caplog: pytest.LogCaptureFixture) -> None:
    watch = RankWatch("fomaml", HOSTS, window=2, margin=0.25, rank=1)
    with caplog.at_level(logging.INFO, logger="fmmeta.telemetry"):
        found = [watch.observe(step(i, [1.0, 2.0])) for i in range(2)]
        watch.log_summary()
    assert found[1] is not None and not caplog.records


def test_summary_means_per_rank_and_file_keeps_other_methods(tmp_path: Path) -> None:
    watch = RankWatch("reptile", HOSTS, window=10, margin=0.25)
    for i, c in enumerate([[1.0, 2.0], [3.0, 2.0]]):
        watch.observe(step(i, c, tokens=[10, 30]))
    s = watch.summary()
    assert s["meta_steps"] == 2 and s["peak_memory"] == "max_rss_process" and s["slow_rank"] is None
    r0, r1 = s["ranks"]
    assert (r0["rank"], r0["host"], r1["host"]) == (0, "node-a", "node-b")
    assert r0["compute_s"] == pytest.approx(2.0) and r1["compute_s"] == pytest.approx(2.0)
    assert r0["collective_s"] == pytest.approx(0.5) and r1["collective_s"] == pytest.approx(0.5)
    assert r1["data_wait_s"] == pytest.approx(0.01) and (r0["tokens"], r1["tokens"]) == (20, 60)
    assert r0["peak_memory_mb"] == 101.0
    path = tmp_path / "telemetry.json"
    save_telemetry(path, "fomaml", {"meta_steps": 1})
    save_telemetry(path, "reptile", s)
    assert set(json.loads(path.read_text())) == {"fomaml", "reptile"}


def test_bad_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="window must be >= 2"):
        RankWatch("fomaml", HOSTS, window=1, margin=0.25)


def test_a_rerun_keeps_the_runs_telemetry_and_a_resume_adds_to_it(tmp_path: Path) -> None:
    """A finished method run again trains no meta-step: its entry stays as it was (it used to be
    replaced by an empty one). A resumed one adds its meta-steps: means weighted by meta-steps."""
    first = RankWatch("fomaml", HOSTS, window=4, margin=0.25)
    for i in range(3):
        first.observe(step(i, [1.0, 2.0], tokens=[10, 30]))
    path = tmp_path / "telemetry.json"
    save_telemetry(path, "fomaml", first.summary())
    written = path.read_bytes()
    save_telemetry(path, "fomaml", RankWatch("fomaml", HOSTS, window=4, margin=0.25).summary())
    assert path.read_bytes() == written
    resumed = RankWatch("fomaml", HOSTS, window=4, margin=0.25)
    resumed.observe(step(3, [5.0, 2.0], tokens=[10, 30]))
    save_telemetry(path, "fomaml", resumed.summary())
    merged = json.loads(path.read_text())["fomaml"]
    assert merged["meta_steps"] == 4
    r0, r1 = merged["ranks"]
    assert r0["compute_s"] == pytest.approx((3 * 1.0 + 5.0) / 4) and r1["compute_s"] == pytest.approx(2.0)
    assert (r0["tokens"], r1["tokens"]) == (40, 120)
    # another world size: the earlier figures describe other ranks, so this process's stand
    one_rank = {"meta_steps": 1, "ranks": [{"rank": 0, "compute_s": 9.0, "tokens": 1, "peak_memory_mb": 1.0}]}
    assert merge_summaries(merged, one_rank) == one_rank
