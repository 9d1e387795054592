"""Per-rank telemetry of a 2-process run (deepspeed, ZeRO-3): per-rank lists in metrics.jsonl, the
telemetry summary, and the slow-rank warning: given when rank 1 is slowed (a test-only wrapper,
``slow_rank_train.py``), not given in the normal run with the same window."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.recipes import _recipe

LISTS = ("rank_compute_s", "rank_collective_s", "rank_data_wait_s", "rank_tokens", "rank_peak_memory_mb")


@pytest.mark.timeout(300)
def test_metrics_have_sane_per_rank_lists(deepspeed_short: Path) -> None:
    for r in _recipe.records(deepspeed_short / "metrics.jsonl"):
        assert all(len(r[k]) == 2 for k in LISTS), r
        assert sum(r["rank_tokens"]) == r["tokens"] and min(r["rank_tokens"]) > 0
        assert r["peak_memory"] == "max_rss_process" and min(r["rank_peak_memory_mb"]) > 10
        for c, w, d in zip(r["rank_compute_s"], r["rank_collective_s"], r["rank_data_wait_s"], strict=True):
            assert 0 < c and 0 <= w and 0 <= d and c + w <= r["step_s"] + 1e-6, r
    summary = json.loads((deepspeed_short / "telemetry.json").read_text())["fomaml"]
    assert summary["meta_steps"] == 8 and [x["rank"] for x in summary["ranks"]] == [0, 1]
    assert sum(x["tokens"] for x in summary["ranks"]) == sum(
        r["tokens"] for r in _recipe.records(deepspeed_short / "metrics.jsonl"))
    # the normal run: no rank was persistently slower, under the same window as the slowed run
    assert summary["slow_rank"] is None and summary["slow_rank_rule"]["window"] == 4


@pytest.mark.timeout(300)
def test_every_step_records_the_meta_gradients_noise(deepspeed_short: Path) -> None:
    """FOMAML on 2 ZeRO-3 ranks: each step's per-task statistics, recomputed from the record's own
    fields, and B_noise as the ratio of their moving averages."""
    from fmmeta.sampling.noise_scale import GradientNoise, NoiseScale

    scale, placements = NoiseScale(), []
    for r in _recipe.records(deepspeed_short / "metrics.jsonl"):
        placements.append(r["placement"])
        if r["placement"] == "rows":  # a task's gradient is split over the ranks: none recorded
            assert "grad_task_sq" not in r and "noise_scale" not in r
            continue
        noise = GradientNoise(r["tasks"], r["grad_task_sq"], r["grad_norm"] ** 2)
        assert r["grad_task_sq"] > 0 and r["grad_noise_trace"] == pytest.approx(noise.trace, rel=1e-9)
        assert r["grad_signal_sq"] == pytest.approx(noise.signal, rel=1e-9, abs=1e-12)
        want = scale.observe(noise)
        assert (r["noise_scale"] is None and math.isnan(want)) or r["noise_scale"] == pytest.approx(want, rel=1e-9)
    assert "tasks" in placements, placements


@pytest.mark.timeout(400)
def test_a_slowed_rank_is_named_once_with_its_host(tmp_path: Path) -> None:
    out = tmp_path / "slow"
    proc = _recipe.run("deepspeed", [*_recipe.SHORT, f"output_dir={out}"], nprocs=2, timeout_s=360,
                       script_path=Path(__file__).with_name("slow_rank_train.py"))
    warnings = [line for line in proc.stdout.splitlines() if "was the slowest of 2 ranks" in line]
    assert len(warnings) == 1, proc.stdout[-4000:]
    assert "[rank0] WARNING" in warnings[0] and "rank 1 (host " in warnings[0]
    summary = json.loads((out / "telemetry.json").read_text())["fomaml"]
    assert summary["slow_rank"]["rank"] == 1 and summary["slow_rank"]["host"] == summary["ranks"][1]["host"]
    r0, r1 = summary["ranks"]
    assert r1["compute_s"] - r0["compute_s"] > 0.5  # the 1 s delay lands in rank 1's compute
    assert r0["collective_s"] - r1["collective_s"] > 0.5  # and rank 0 waits for it at the outer step
    assert "rank 1 (" in proc.stdout and "per-rank telemetry" in proc.stdout
    assert all(math.isfinite(x) for x in (r0["data_wait_s"], r1["data_wait_s"]))
