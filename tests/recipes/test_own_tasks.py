"""``recipes/configs/own_tasks.yaml`` (a task collection declared in YAML, with a held-out
family) end to end on a tiny model: one process, and two DeepSpeed ranks where rank 0 tokenizes
into the cache and rank 1 reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fmmeta.recipe_config import RecipeConfig
from tests.recipes import _recipe

CONFIG = _recipe.REPO / "recipes" / "configs" / "own_tasks.yaml"
TINY = [
    "model.tiny=true", "model.tokenizer=bytes", "model.tiny_hidden_size=32",
    "model.tiny_intermediate_size=64", "tasks.max_length=96", "train.meta_steps=2",
    "train.checkpoint_every=0", "eval.seeds=2", "engine.collective_timeout_s=60",
]
HELD_OUT = {"add_ten", "double", "next_number"}  # the arithmetic family: one task per file


def _check_report(out: Path) -> None:
    report = json.loads((out / "eval" / "eval.json").read_text())
    assert {r["task"] for r in report["records"]} == HELD_OUT
    assert set(report["methods"]) >= {"base", *RecipeConfig().methods}
    text = (out / "eval" / "eval.md").read_text()
    assert "## generation: query accuracy" in text  # the held-out family's table
    assert "Chosen on validation tasks hot_or_cold, uppercase" in text
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["method"], r["step"]) for r in lines] == [
        (m, s) for m in RecipeConfig().methods for s in (0, 1)
    ]


@pytest.mark.timeout(240)
def test_own_tasks_yaml_one_process(tmp_path: Path) -> None:
    out, network = tmp_path / "run", tmp_path / "network.log"
    # With every look-up and connect off this machine refused and recorded: a folder of files, local
    # JSON lines and a CSV are read, trained on and evaluated without asking the network anything.
    proc = _recipe.run("python", ["--config", str(CONFIG), *TINY, f"output_dir={out}",
                                  f"tasks.cache_dir={tmp_path / 'cache'}"], timeout_s=180,
                       env=_recipe.offline(network))
    assert not network.exists(), network.read_text()
    assert "collection: 4 sources (0 from the cache" in proc.stdout
    assert "6/2/3 meta-train/val/test tasks" in proc.stdout
    _check_report(out)
    again = _recipe.run_here(["--config", str(CONFIG), *TINY, "methods=[fomaml]", "eval.enabled=false",
                              f"output_dir={tmp_path / 'again'}", f"tasks.cache_dir={tmp_path / 'cache'}"])
    assert "collection: 4 sources (4 from the cache" in again.stdout


@pytest.mark.timeout(300)
def test_own_tasks_yaml_deepspeed_two_ranks(tmp_path: Path) -> None:
    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = _recipe.run("deepspeed", ["--config", str(CONFIG), *TINY, f"output_dir={out}",
                                     f"tasks.cache_dir={cache}"], nprocs=2, timeout_s=240)
    assert "world size 2 | ZeRO stage 3" in proc.stdout
    # Rank 0 wrote one complete cache folder per source and no half-written one.
    folders = sorted(p.name for p in (cache / "tokenized").iterdir())
    assert len(folders) == 4 and not any(name.startswith(".") for name in folders), folders
    _check_report(out)
