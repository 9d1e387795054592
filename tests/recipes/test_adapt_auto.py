"""``fmmeta adapt --method auto`` / ``--compare`` on a tiny run whose answer is known by construction.

The run's FOMAML adapter is replaced by one that knows a task T (a LoRA adapted for many steps
on all of T's rows, as a very good meta-training would leave it) and its evaluation is kept:

* on T, FOMAML leads every candidate in cross-validation, and auto picks it;
* on T with its labels swapped, the same adapter is confidently wrong, the base model beats it,
  and auto picks base (or in_context); ``--compare --method fomaml`` says it trails the base model.

Each candidate's cross-validated numbers are checked against a plain computation: the held rows
of each fold adapted as one ``fmmeta.adapt`` call of that fold's rows.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest

from fmmeta.errors import UserInputError
from tests.recipes import _recipe

LEFT, RIGHT = "abcde", "vwxyz"


def _rows(n: int, seed: int, swap: bool = False) -> list[dict]:
    """Words of the letters a-e (label "west") or v-z ("east"), labels of one length, alternating; ``swap`` swaps the labels."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        letters, label = (LEFT, "west") if i % 2 == 0 else (RIGHT, "east")
        if swap:
            label = "east" if label == "west" else "west"
        rows.append({"text": "".join(rng.choice(letters) for _ in range(5)), "label": label})
    return rows


def _write(folder: Path, support: list[dict], query: list[dict]) -> tuple[Path, Path]:
    folder.mkdir(parents=True)
    for name, rows in (("support", support), ("query", query)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "support.jsonl", folder / "query.jsonl"


def _teach(run: Path, rows: list[dict], folder: Path) -> None:
    """A LoRA of the run's model and shape trained with Adam on ``rows`` until it ranks their
    labels right (the tiny model's frozen head keeps its loss high: its logits span little),
    saved in peft format into ``folder``."""
    import torch

    from fmmeta.adaptation.method import load_run_config
    from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, build_task
    from fmmeta.models import add_lora, build_model_and_tokenizer
    from fmmeta.tasks.episode import collate

    cfg = load_run_config(run)
    base, tokenizer = build_model_and_tokenizer(cfg.model)
    model = add_lora(base, cfg.lora, seed=cfg.train.seed)
    task = build_task(TaskFiles("t", rows, None, TaskFormat()), tokenizer, max_length=cfg.tasks.max_length)
    batch = collate(task.episode.support, tokenizer.pad_token_id)
    torch.manual_seed(0)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    for _ in range(120):
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(str(folder))


@pytest.fixture(scope="module")
def knowing_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke run with FOMAML, whose adapter then learned task T from all its rows."""
    out = tmp_path_factory.mktemp("auto") / "run"
    _recipe.run("python", [f"output_dir={out}", "methods=[fomaml]"], timeout_s=180)
    adapter = out / "fomaml" / "adapter"
    shutil.rmtree(adapter)
    _teach(out, _rows(40, seed=1), adapter)
    evaluation = out / "eval" / "eval.json"  # the evaluation still chose the lrs: keep it the newer
    stamp = (adapter / "adapter_model.safetensors").stat().st_mtime_ns + 1_000_000
    os.utime(evaluation, ns=(stamp, stamp))
    return out


def _auto(run: Path, out: Path, support: Path, query: Path, *extra: str) -> tuple[dict, str]:
    import recipes.adapt as recipe

    code = recipe.main(["--run", str(run), "--support", str(support), "--query", str(query), "--out", str(out),
                        "--folds", "4", *extra])
    assert code == 0
    return json.loads((out / "summary.json").read_text()), out


@pytest.mark.timeout(600)
def test_auto_picks_the_adapter_that_knows_the_task_and_the_base_model_where_it_is_wrong(
    knowing_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s, q = _write(tmp_path / "t", _rows(8, seed=2), _rows(6, seed=3))
    summary, _ = _auto(knowing_run, tmp_path / "out_t", s, q, "--method", "auto")
    cv = summary["cross_validation"]
    assert set(cv["candidates"]) == {"base", "in_context", "fomaml"} and cv["folds"] == 4
    scores = {m: c["accuracy"] for m, c in cv["candidates"].items()}
    assert scores["fomaml"] > max(scores["base"], scores["in_context"]), cv
    assert summary["method"] == cv["chosen"] == "fomaml" and summary["warning"] is None
    assert summary["accuracy"] == 1.0  # the query, adapted with the chosen method
    printed = capsys.readouterr().out
    assert "auto chose fomaml" in printed and "<- best" in printed
    import fmmeta

    adapted = fmmeta.adapt(knowing_run, "auto", _rows(8, seed=2), _rows(6, seed=3), folds=4)  # the API alike
    assert adapted.comparison is not None and adapted.comparison.chosen == "fomaml"
    assert adapted.comparison.as_dict()["candidates"] == cv["candidates"] | {
        m: {**c, "seconds": adapted.comparison.scores[m].as_dict()["seconds"]} for m, c in cv["candidates"].items()}
    with pytest.raises(UserInputError, match="no_such_metric"):  # checked before the model loads
        fmmeta.adapt(knowing_run, "auto", _rows(8, seed=2), folds=4, cv_metric="no_such_metric")
    with pytest.raises(UserInputError, match="for method='auto' only"):
        fmmeta.adapt(knowing_run, "fomaml", _rows(8, seed=2), cv_metric="loss")

    s, q = _write(tmp_path / "swapped", _rows(8, seed=2, swap=True), _rows(6, seed=3, swap=True))
    summary, _ = _auto(knowing_run, tmp_path / "out_swapped", s, q, "--method", "auto")
    cv = summary["cross_validation"]
    scores = {m: c["accuracy"] for m, c in cv["candidates"].items()}
    assert max(scores["base"], scores["in_context"]) > scores["fomaml"], cv
    assert summary["method"] in ("base", "in_context") and summary["warning"] is None
    summary, _ = _auto(knowing_run, tmp_path / "out_named", s, q, "--method", "fomaml", "--compare")
    assert summary["method"] == "fomaml" and "below the base model's" in summary["warning"]
    assert "warning: fomaml's cross-validated accuracy" in capsys.readouterr().out


@pytest.mark.timeout(600)
def test_cross_validated_scores_equal_each_fold_adapted_on_its_own(knowing_run: Path, tmp_path: Path) -> None:
    """The folds of every task adapted together score as each fold adapted alone, through the API."""
    import fmmeta
    from fmmeta.adaptation.cross_validation import Score, folds
    from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, read_task

    support = _rows(8, seed=4, swap=True)
    s, q = _write(tmp_path / "t", support, _rows(2, seed=5))
    summary, _ = _auto(knowing_run, tmp_path / "out", s, q, "--method", "fomaml", "--compare", "--no-adapters")
    texts = read_task(TaskFiles("t", support, None, TaskFormat()))
    for method, got in summary["cross_validation"]["candidates"].items():
        rows = []
        for fold in folds(texts, 4):
            train = [dict(r) for r in fold.support]
            held = [{"text": p, "label": a} for p, a in zip(fold.prompts[1], fold.answers[1])]
            rows += fmmeta.adapt(knowing_run, method, train, held, labels=list(texts.labels)).predictions
        want = Score.of(rows, 0.0)
        assert got["rows"] == len(support) == want.rows
        assert got["accuracy"] == pytest.approx(want.value("accuracy"), abs=1e-4), method
        assert got["loss"] == pytest.approx(want.value("loss"), rel=1e-4, abs=1e-4), method
