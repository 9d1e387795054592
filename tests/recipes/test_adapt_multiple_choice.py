"""``fmmeta adapt`` on multiple-choice tasks: held-out questions of a tiny run, written out with their
own options, adapted by several methods, reproduce the run's evaluation (loss to 1e-5, accuracy,
and the chosen option is right exactly where the evaluation counts it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import datasets
import pytest
import yaml

from tests.recipes import _recipe
from tests.recipes.test_adapt import RTOL, _adapt, _by_task, _held_out_episodes

METHODS = ("base", "in_context", "reptile", "metaicl")


@pytest.fixture(scope="module")
def mc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run on four multiple-choice tasks of its own, one held out."""
    root = tmp_path_factory.mktemp("adapt_mc")
    for k in range(4):
        rows = [{"q": f"{a}+{k}=", "opts": [str(a + k + j) for j in ((0, 1, 2) if a % 2 else (2, 0, 1))],
                 "answer": str(a + k)} for a in range(12)]
        datasets.Dataset.from_list(rows).save_to_disk(str(root / "data" / f"add{k}"))
    raw = {"output_dir": str(root / "run"), "methods": ["reptile", "metaicl"],
           "sampler": {"meta_batch_size": 2},
           "tasks": {"max_length": 32, "cache_dir": str(root / "cache"), "collection": [
               {"path": str(root / "data"), "builder": "multiple_choice", "template": "{q}",
                "options_column": "opts", "label_column": "answer", "answer_format": "text", "shots": 2, "query": 3}],
               "split": {"held_out": ["add3"], "validation": ["add2"]}},
           "train": {"meta_steps": 2, "checkpoint_every": 0}, "eval": {"seeds": 1, "max_steps": 1}}
    (root / "mc.yaml").write_text(yaml.safe_dump(raw))
    _recipe.run("python", ["--config", str(root / "mc.yaml"), "model.tiny=true", "model.tokenizer=bytes",
                           "model.dtype=float32", "model.tiny_hidden_size=32", "model.tiny_intermediate_size=64"],
                timeout_s=180)
    return root / "run"


@pytest.mark.timeout(600)
def test_adapt_reproduces_the_evaluation_of_held_out_multiple_choice_questions(mc_run: Path, tmp_path: Path) -> None:
    episodes, tokenizer = _held_out_episodes(mc_run)
    text = lambda ids: tokenizer.decode(list(ids[:-1]))  # the options without EOS, as the data held them
    items = []
    for i, ep in enumerate(episodes):
        folder = tmp_path / "tasks" / f"ep{i}"
        folder.mkdir(parents=True)
        for name, exs in (("support", ep.support), ("query", ep.query)):
            rows = [{"q": tokenizer.decode(list(ex.prompt_ids)), "opts": [text(o) for o in ex.options],
                     "answer": ex.label} for ex in exs]
            (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        items.append({"name": f"ep{i}", "support": f"ep{i}/support.jsonl", "query": f"ep{i}/query.jsonl",
                      "builder": "multiple_choice", "template": "{q}", "options_column": "opts",
                      "label_column": "answer", "answer_format": "index", "answer_template": "{answer}"})
    (tmp_path / "tasks" / "tasks.yaml").write_text(yaml.safe_dump(items))
    report = json.loads((mc_run / "eval" / "eval.json").read_text())
    for method in METHODS:
        out = tmp_path / f"out_{method}"
        _adapt(["--run", str(mc_run), "--method", method, "--tasks", str(tmp_path / "tasks" / "tasks.yaml"),
                "--out", str(out)], as_a_user=method == METHODS[0])  # the rest in this process
        step = 0 if method in ("in_context", "metaicl") else report["max_steps"]
        recorded = {r["episode"]: r for r in report["records"]
                    if r["method"] == method and r["seed"] == 0 and r["step"] == step}
        predictions = _by_task(out / "predictions.jsonl")
        for i, ep in enumerate(episodes):
            rows, record = predictions[f"ep{i}"], recorded[i]
            assert record["kind"] == "multiple_choice" and len(rows) == len(ep.query)
            loss = -sum(r["answer_logprob"] for r in rows) / sum(r["answer_tokens"] for r in rows)
            assert math.isclose(loss, record["loss"], rel_tol=RTOL), (method, i, loss, record["loss"])
            assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(record["accuracy"], abs=1e-9)
            for r, ex in zip(rows, ep.query):
                assert sorted(r["logprobs"]) == sorted(text(o) for o in ex.options)  # its own options, named
                strictly = r["logprobs"][r["label"]] > max(v for k, v in r["logprobs"].items() if k != r["label"])
                assert r["correct"] == strictly and (r["prediction"] == r["label"]) == strictly, r
