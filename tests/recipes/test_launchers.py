"""The same recipe under ``deepspeed`` and ``accelerate launch`` (2 processes, ZeRO-3, CPU/gloo)
gives the same adapter as one plain process: the meta-gradient is averaged over ranks, so in fp32
only the summation order differs. With packed passes it differs in every matmul, not only in the
all-reduce: one process packs all of a meta-batch's tasks into shared passes, two ranks pack each
rank's tasks, so rows meet other rows; over 8 Adam steps that rounding grows to ~1e-5 of the
adapter (measured 1.2e-5), hence 5e-5 here. Per-step agreement at 1e-5 with identical passes on
every engine is tests/distributed/test_equivalence.py's job; a wrong average would be off by ~1e-1.

The ``deepspeed`` launcher appends ``--local_rank=N`` to the script's arguments; that this run
succeeds at all is the check that the recipe tolerates it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recipes import _recipe

RTOL = 5e-5


@pytest.mark.timeout(300)
def test_deepspeed_zero3_matches_one_process(local_short: Path, deepspeed_short: Path) -> None:
    diff = _recipe.max_relative_diff(_recipe.adapter(deepspeed_short / "fomaml" / "adapter"),
                                     _recipe.adapter(local_short / "fomaml" / "adapter"))
    assert diff <= RTOL, diff
    ds, local = _recipe.losses(deepspeed_short / "metrics.jsonl"), _recipe.losses(local_short / "metrics.jsonl")
    assert [r[0] for r in ds] == list(range(8))
    for a, b in zip(ds, local, strict=True):
        assert a[0] == b[0] and a[5:] == b[5:]  # same step, tasks and tokens
        for x, y in zip(a[1:5], b[1:5]):
            assert (x is None and y is None) or abs(x - y) <= RTOL * abs(y), (a, b)


@pytest.mark.timeout(300)
def test_accelerate_zero3_matches_deepspeed(tmp_path: Path, local_short: Path, deepspeed_short: Path) -> None:
    out = tmp_path / "accelerate"
    proc = _recipe.run("accelerate", [*_recipe.SHORT, f"output_dir={out}"], nprocs=2, timeout_s=180)
    assert "world size 2 | ZeRO stage 3" in proc.stdout, proc.stdout[-3000:]
    acc = _recipe.adapter(out / "fomaml" / "adapter")
    assert _recipe.max_relative_diff(acc, _recipe.adapter(deepspeed_short / "fomaml" / "adapter")) <= RTOL
    assert _recipe.max_relative_diff(acc, _recipe.adapter(local_short / "fomaml" / "adapter")) <= RTOL
    assert [r[:2] for r in _recipe.losses(out / "metrics.jsonl")] == \
        [r[:2] for r in _recipe.losses(deepspeed_short / "metrics.jsonl")]


@pytest.mark.timeout(300)
def test_rows_across_ranks_in_the_recipe_matches_one_process(tmp_path: Path, local_short: Path) -> None:
    """The user's path of rows across ranks: ``sampler.placement=rows`` under 2 ZeRO-3 ranks trains
    the adapter one process trains, says so in the banner and in every metrics line."""
    out = tmp_path / "rows"
    proc = _recipe.run("deepspeed", [*_recipe.SHORT, "sampler.placement=rows", f"output_dir={out}"],
                       nprocs=2, timeout_s=180)
    assert "placement rows | rows across ranks would hold" in proc.stdout, proc.stdout[-3000:]
    assert [r["placement"] for r in _recipe.records(out / "metrics.jsonl")] == ["rows"] * 8
    diff = _recipe.max_relative_diff(_recipe.adapter(out / "fomaml" / "adapter"),
                                     _recipe.adapter(local_short / "fomaml" / "adapter"))
    assert diff <= RTOL, diff
