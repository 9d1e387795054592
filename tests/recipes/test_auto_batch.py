"""``sampler.meta_batch_size=auto`` in a real run: the B it plans follows the B_noise the run
recorded (one step late), the banner and the log say so, and a killed run resumes to the same choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recipes import _recipe

AUTO = [
    "sampler.meta_batch_size=auto", "sampler.auto_batch_min=2", "sampler.auto_batch_max=7",
    "sampler.auto_batch_warmup=2", "sampler.auto_batch_every=3", *_recipe.DROPOUT,
]


def _expected(noise_scale: float | None) -> int:
    """What the rule makes of a recorded B_noise (2 kept while there is none)."""
    return 2 if noise_scale is None else min(max(round(noise_scale), 2), 7)


@pytest.mark.timeout(360)
def test_auto_plans_the_recorded_noise_scale_and_resumes_to_the_same_choices(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    done = _recipe.run("python", [*_recipe.SHORT, *AUTO, f"output_dir={reference}"], timeout_s=150)
    assert "tasks per meta-step auto (2 for 2 steps, then B_noise within 2-7, again every 3)" in done.stdout
    records = _recipe.records(reference / "metrics.jsonl")
    tasks = [r["tasks"] for r in records]
    # the choice after step 1 (end of the warm-up) plans steps 3-5; the one after step 4, steps 6-7
    first, second = _expected(records[1]["noise_scale"]), _expected(records[4]["noise_scale"])
    assert tasks == [2, 2, 2, first, first, first, second, second], (tasks, [r["noise_scale"] for r in records])
    seen = records[1]["noise_scale"]
    said = f"{seen:.1f}" if seen is not None else "not measured yet (B kept)"
    assert f"fomaml: meta_batch_size auto: B_noise {said} after meta-step 1 -> {first} tasks per meta-step from meta-step 3" in done.stdout
    assert f"-> {second} tasks per meta-step from meta-step 6" in done.stdout
    assert {first, second} != {2}, "B_noise never moved B: the test would not see a lost choice"

    resumed = tmp_path / "resumed"
    args = [*_recipe.SHORT, *AUTO, f"output_dir={resumed}", "train.resume=auto"]
    _recipe.run_and_kill("python", args, resumed / "metrics.jsonl", at_step=4)
    _recipe.run("python", args, timeout_s=150)
    assert _recipe.losses(resumed / "metrics.jsonl") == _recipe.losses(reference / "metrics.jsonl")
    assert [r["tasks"] for r in _recipe.records(resumed / "metrics.jsonl")] == tasks
