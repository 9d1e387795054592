"""Training replicates at the recipe level (``train.replicates``).

Replicate ``r`` of a run must be, file for file, the one-replicate run with training seed
``train.seed + r``: the same per-step losses, the same adapter tensors and the same held-out
records, whether the replicates train side by side in worker processes or one after the other,
and after a SIGKILL in the middle of a replicate and a resume. Everything runs on one thread per
process, so every sum is taken in the same order and the comparison is bitwise. LoRA dropout is
on, so the torch RNG stream (seeded per replicate) is part of what must match.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.recipes import _recipe

ARGS = ["methods=[fomaml,multitask]", "train.meta_steps=4", "train.checkpoint_every=2", *_recipe.DROPOUT,
        "eval.max_steps=1", "eval.lr_grid=[0.1]"]
"""Two methods, 4 meta-steps (checkpoints after steps 1 and 3), dropout on, a short evaluation."""

@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Three replicates, two worker processes: replicates and methods train side by side."""
    out = tmp_path_factory.mktemp("replicates") / "three"
    proc = _recipe.run("python", [*ARGS, "train.replicates=3", "engine.workers=2", f"output_dir={out}"],
                       timeout_s=300)
    return out, proc


@pytest.fixture(scope="module")
def seed_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-replicate run with training seed 1 (replicate 1's), one process: this one, through
    train.py's main (a reference to compare with, no launcher's part)."""
    out = tmp_path_factory.mktemp("replicates") / "seed_one"
    _recipe.run_here([*ARGS, "train.seed=1", "engine.workers=1", f"output_dir={out}"])
    return out


def _records(run: Path, replicate: int) -> list[dict]:
    """One replicate's held-out records, without the replicate index (a one-replicate run's is 0)."""
    data = json.loads((run / "eval" / "eval.json").read_text())
    return [{k: v for k, v in r.items() if k != "replicate"} for r in data["records"] if r["replicate"] == replicate]


def _assert_same_replicate(got: Path, want: Path) -> None:
    """Metrics lines (timings aside) and adapters of one replicate's folder, bitwise."""
    assert _recipe.deterministic_records(got) == _recipe.deterministic_records(want) and len(_recipe.deterministic_records(got)) == 2 * 4
    for method in ("fomaml", "multitask"):
        a, b = _recipe.adapter(got / method / "adapter"), _recipe.adapter(want / method / "adapter")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in b), method


@pytest.mark.timeout(600)
def test_a_replicate_is_the_one_replicate_run_of_its_training_seed(side_by_side, seed_one: Path) -> None:
    three, proc = side_by_side
    assert "trained: 6/6 methods" in proc.stdout
    _assert_same_replicate(three / "replicate_1", seed_one)
    assert _records(three, 1) == _records(seed_one, 0) and _records(three, 1)
    # The replicates differ (other seeds), and were all scored on the same episodes.
    assert _recipe.deterministic_records(three / "replicate_0") != _recipe.deterministic_records(three / "replicate_1")
    episodes = [{(r["seed"], r["episode"], r["task"]) for r in _records(three, i)} for i in range(3)]
    assert episodes[0] == episodes[1] == episodes[2]
    report = json.loads((three / "eval" / "eval.json").read_text())
    assert report["train_seeds"] == [0, 1, 2] and len(report["replicate_lrs"]) == 3
    fomaml = next(c for c in report["comparisons"] if c["method"] == "fomaml" and c["baseline"] == "multitask"
                  and c["family"] == "overall")
    assert fomaml["accuracy_replicated"]["replicates"] == 3
    assert fomaml["accuracy_replicated"]["between_replicates"] is not None
    markdown = (three / "eval" / "eval.md").read_text()
    assert markdown.index("## What holds") < markdown.index("## Budgets")
    assert "3 training replicates (training seeds 0, 1, 2)" in markdown


@pytest.mark.timeout(600)
def test_kill_in_the_second_replicate_and_resume_gives_the_uninterrupted_files(side_by_side, tmp_path: Path) -> None:
    """One after the other (one process): SIGKILL while replicate 1 trains, then the same
    command; every replicate's files equal those of the uninterrupted run (side by side)."""
    three, _ = side_by_side
    out = tmp_path / "killed"
    args = [*ARGS, "train.replicates=3", "engine.workers=1", f"output_dir={out}"]
    _recipe.run_and_kill("python", args, out / "replicate_1" / "metrics.jsonl", at_step=2,
                         log=tmp_path / "killed.log")
    assert (out / "replicate_0" / "multitask" / "adapter").is_dir(), "replicate 0 finished before the kill"
    assert not (out / "replicate_2").exists() and not (out / "eval").exists()
    proc = _recipe.run_here(args)  # the same command, through train.py's main in this process
    assert "resumed from" in proc.stdout
    for r in range(3):
        _assert_same_replicate(out / f"replicate_{r}", three / f"replicate_{r}")
        assert _records(out, r) == _records(three, r)


@pytest.mark.timeout(300)
def test_a_run_keeps_its_number_of_replicates_and_evaluate_scores_them_all(side_by_side, tmp_path: Path) -> None:
    three, _ = side_by_side
    refused = _recipe.run_here([*ARGS, "train.replicates=1", f"output_dir={three}"], check=False)
    assert refused.returncode == 2 and "a run keeps its number of replicates" in refused.stdout
    # evaluate.py --run THREE, through its main in this process: stdout (the report paths) apart.
    evaluate = _recipe.main_here("evaluate", ["--run", str(three)], check=False, merge=False)
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    report = Path(evaluate.stdout.strip().splitlines()[0].split(": ", 1)[1])
    again = json.loads(report.read_text())
    first = json.loads((three / "eval" / "eval.json").read_text())
    assert again["records"] == first["records"] and again["train_seeds"] == [0, 1, 2]
