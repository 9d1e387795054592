"""The recipe with the metasgd method: learned inner lrs logged per step, saved next to the adapter
and in every checkpoint, and restored on resume so that a resumed run is bitwise the same.

The resume test removes the newest checkpoint and the final adapter of a finished run (what a crash
between two checkpoints leaves behind; the SIGKILL itself is tested for FOMAML in test_resume.py)
and resumes it: the step sizes and their Adam state must come back from the checkpoint, or the
last two steps' inner lrs, losses and adapter differ.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from fmmeta.algorithms.meta_sgd import load_step_sizes
from tests.recipes import _recipe

ARGS = [a for a in _recipe.SHORT if not a.startswith("methods=")] + ["methods=[metasgd]"]
LR_KEYS = ("inner_lr_mean", "inner_lr_min", "inner_lr_max")


@pytest.fixture(scope="module")
def metasgd_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recipe") / "metasgd"
    # 17 s alone; minutes when the 2 cores are shared with other test suites
    _recipe.run("python", [*ARGS, f"output_dir={out}"], timeout_s=180)
    return out


def _lr_records(metrics: Path) -> list[tuple]:
    return [tuple(r[k] for k in ("step", *LR_KEYS)) for r in _recipe.records(metrics)]


@pytest.mark.timeout(300)
def test_metasgd_logs_and_saves_its_learned_lrs(metasgd_run: Path) -> None:
    records = _lr_records(metasgd_run / "metrics.jsonl")
    assert [r[0] for r in records] == list(range(8))
    means = [r[1] for r in records]
    assert len(set(means)) == 8, means  # the step sizes move every step
    assert all(lo <= mean <= hi for _, mean, lo, hi in records)
    adapter = metasgd_run / "metasgd" / "adapter"
    lrs = load_step_sizes(adapter)
    assert lrs is not None and len(lrs) == len(_recipe.adapter(adapter))  # one per LoRA tensor
    assert sum(lrs) / len(lrs) == pytest.approx(means[-1], rel=1e-6)
    assert max(abs(math.log(lr / 0.1)) for lr in lrs) > 0.01  # moved away from algorithm.inner_lr
    # the last checkpoint holds the same step sizes, and its adapter folder the same file
    last = metasgd_run / "metasgd" / "checkpoints" / "step_00000007"
    state = json.loads((last / "state.json").read_text())["step_sizes"]
    assert state["t"] == 8
    assert [math.exp(x) for x in state["log_lr"]] == pytest.approx(lrs, rel=1e-6)
    assert load_step_sizes(last / "adapter") == lrs


@pytest.mark.timeout(420)
def test_metasgd_resume_restores_step_sizes_bitwise(tmp_path: Path, metasgd_run: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(metasgd_run, out)
    shutil.rmtree(out / "metasgd" / "checkpoints" / "step_00000007")
    shutil.rmtree(out / "metasgd" / "adapter")
    proc = _recipe.run("python", [*ARGS, f"output_dir={out}", "train.resume=auto"], timeout_s=180)
    assert "(meta-step 5 complete)" in proc.stdout, proc.stdout[-3000:]
    assert _lr_records(out / "metrics.jsonl") == _lr_records(metasgd_run / "metrics.jsonl")
    assert _recipe.losses(out / "metrics.jsonl") == _recipe.losses(metasgd_run / "metrics.jsonl")
    assert load_step_sizes(out / "metasgd" / "adapter") == load_step_sizes(metasgd_run / "metasgd" / "adapter")
    a = _recipe.adapter(out / "metasgd" / "adapter")
    b = _recipe.adapter(metasgd_run / "metasgd" / "adapter")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in b)
