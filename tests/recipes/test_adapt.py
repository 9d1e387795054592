"""``fmmeta adapt`` against the evaluation it must reproduce, on a tiny trained run.

* Held-out episodes of the run, written out as support and query files (text, as a user would
  have them), adapted by every method of the run: per episode, the query loss equals the one the
  run's own evaluation recorded in ``eval.json`` (fp32, relative 1e-5), the accuracy too, and every
  query's chosen label is correct exactly where the evaluation's rule (gold strictly highest)
  counts it correct.
* Generation: greedy decoding returns the gold answer exactly on the queries that exact match
  under teacher forcing (the evaluation's scoring) counts correct, and only on those.
* The written adapter, loaded with plain peft on the base model, gives the fast weights'
  log-probabilities (relative 1e-5).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from tests._zygote import run_python
from tests.recipes import _recipe

ADAPT = _recipe.REPO / "recipes" / "adapt.py"
METHODS = ("base", "in_context", "fomaml", "metasgd", "reptile", "multitask", "metaicl", "anil")
RTOL = 1e-5


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke run with every method, trained and evaluated (about 15 s)."""
    out = tmp_path_factory.mktemp("adapt") / "run"
    # ANIL adapts the top one of the tiny model's layers (over both it would be FOMAML)
    _recipe.run("python", [f"output_dir={out}", "methods=[fomaml,metasgd,reptile,multitask,metaicl,anil]",
                           "algorithm.anil.layers=1"], timeout_s=180)
    return out


def _held_out_episodes(run: Path) -> tuple[list, object]:
    """Seed 0's held-out episodes, drawn exactly as the run's evaluation drew them."""
    from fmmeta.adaptation.method import load_run_config
    from fmmeta.evaluation.run import draw_episodes, evaluation_tasks
    from fmmeta.models import build_model_and_tokenizer
    from fmmeta.tasks.config import build_task_set

    cfg = load_run_config(run)
    _, tokenizer = build_model_and_tokenizer(cfg.model)
    suite = build_task_set(cfg.tasks, tokenizer)
    tasks = evaluation_tasks(suite.held_out, cfg.eval.query)
    return draw_episodes(tasks, cfg.tasks.seed, 1, cfg.eval.episodes_per_task), tokenizer


def _write_episode(ep, tokenizer, folder: Path) -> dict:
    """An episode as a user's support and query files (text; the answer words verbatim)."""
    folder.mkdir(parents=True)
    text = lambda ids: tokenizer.decode(list(ids))  # the byte tokenizer decodes and encodes exactly
    strip_eos = lambda ids: ids[:-1] if ids and ids[-1] == tokenizer.eos_token_id else ids
    if ep.choices is not None:
        labels = [text(strip_eos(c)) for c in ep.choices]
        rows = lambda exs: [{"text": text(ex.prompt_ids), "label": labels[ex.label]} for ex in exs]
        item = {"builder": "classification", "labels": labels}
    else:
        rows = lambda exs: [{"input": text(ex.prompt_ids), "output": text(strip_eos(ex.answer_ids))} for ex in exs]
        item = {"builder": "dataset"}
    for name, exs in (("support", ep.support), ("query", ep.query)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(exs)))
    return {"name": folder.name, "support": f"{folder.name}/support.jsonl", "query": f"{folder.name}/query.jsonl",
            "answer_template": "{answer}", **item}


def _adapt(args: list[str], *, as_a_user: bool) -> None:
    """``python recipes/adapt.py ARGS`` as a user types it, or its ``main`` in this process (the same
    code, without a new interpreter's imports: seconds per call)."""
    if not as_a_user:
        from fmmeta.recipes import adapt

        assert adapt.main(args) == 0
        return
    proc = run_python([str(ADAPT), *args], env=_recipe.environment(), cwd=_recipe.REPO, timeout_s=180)
    assert proc.returncode == 0, proc.stdout[-4000:]


def _by_task(predictions: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in predictions.read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["task"], []).append(row)
    return out


@pytest.mark.timeout(600)
def test_adapt_reproduces_the_runs_evaluation_for_every_method(tiny_run: Path, tmp_path: Path) -> None:
    episodes, tokenizer = _held_out_episodes(tiny_run)
    items = [_write_episode(ep, tokenizer, tmp_path / "tasks" / f"ep{i}") for i, ep in enumerate(episodes)]
    (tmp_path / "tasks" / "tasks.yaml").write_text(yaml.safe_dump(items))
    report = json.loads((tiny_run / "eval" / "eval.json").read_text())
    max_steps = report["max_steps"]
    assert {ep.choices is None for ep in episodes} == {True, False}  # both kinds are checked
    for method in METHODS:
        out = tmp_path / f"out_{method}"
        _adapt(["--run", str(tiny_run), "--method", method, "--tasks", str(tmp_path / "tasks" / "tasks.yaml"),
                "--out", str(out), "--max-new-tokens", "24"], as_a_user=method == METHODS[0])
        step = 0 if method in ("in_context", "metaicl") else max_steps
        recorded = {r["episode"]: r for r in report["records"]
                    if r["method"] == method and r["seed"] == 0 and r["step"] == step}
        predictions = _by_task(out / "predictions.jsonl")
        for i, ep in enumerate(episodes):
            rows, record = predictions[f"ep{i}"], recorded[i]
            assert record["task"] == ep.task and len(rows) == len(ep.query) == record["n"]
            loss = -sum(r["answer_logprob"] for r in rows) / sum(r["answer_tokens"] for r in rows)
            assert math.isclose(loss, record["loss"], rel_tol=RTOL), (method, i, loss, record["loss"])
            assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(record["accuracy"], abs=1e-9)
            for r in rows:
                if ep.choices is not None:  # the chosen label is right exactly where the evaluation counts it
                    strictly = r["logprobs"][r["label"]] > max(v for k, v in r["logprobs"].items() if k != r["label"])
                    assert r["correct"] == strictly and (r["prediction"] == r["label"]) == strictly, r
                else:  # greedy decoding equals the gold exactly where teacher-forced exact match says so
                    assert r["correct"] == r["exact_match"], r
        summary = json.loads((out / "summary.json").read_text())
        assert summary["tasks"] == len(episodes) and summary["steps"] == step


def test_the_report_has_a_row_and_a_budget_for_every_method(tiny_run: Path) -> None:
    report = json.loads((tiny_run / "eval" / "eval.json").read_text())
    assert set(METHODS) <= set(report["methods"])
    text = (tiny_run / "eval" / "eval.md").read_text()
    assert "anil: " in text and "adapting only the top 1 layers' adapter tensors" in text
    assert "| anil |" in text


SUPPORT = [{"input": "one", "output": "1"}, {"input": "two", "output": "2"}]
ADAPTATION = {"builder": "dataset", "answer_template": "{answer}", "steps": 1, "lr": 0.1}
"""One adaptation, used twice: the query never reaches adaptation, so both calls adapt alike."""


def _greedy_pairs(run: Path) -> list[dict]:
    """Prompts whose greedy continuation through the adapted weights is non-empty text ending at
    EOS: positives for exact match, found by decoding (the check scores them by teacher forcing)."""
    import fmmeta

    words = ("ab", "cd", "xyz", "Paris", "zz top", "q:", "hello", "7", "x=", "The", "a b c", "!?", "Mm", "city")
    prompts = [{"input": f"{w} {n}"} for w in words for n in range(20)]  # a random model rarely stops early
    adapted = fmmeta.adapt(run, "reptile", SUPPORT, prompts, max_new_tokens=4, **ADAPTATION)
    # text that re-encodes to the decoded tokens (a lone byte of a UTF-8 character does not)
    return [{"input": p["input"], "output": r["prediction"]} for p, r in zip(prompts, adapted.predictions)
            if r["stop"] == "eos" and r["prediction"].strip() and r["prediction"].isprintable()
            and "\ufffd" not in r["prediction"]]


@pytest.mark.timeout(300)
def test_greedy_decoding_matches_exact_match_and_the_saved_adapter_reloads(tiny_run: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    import fmmeta
    from fmmeta.adaptation.method import load_run_config
    from fmmeta.evaluation.scoring import score_query
    from fmmeta.models import build_model_and_tokenizer
    from fmmeta.tasks.episode import Example

    pairs = _greedy_pairs(tiny_run)
    assert len(pairs) >= 2, "no prompt decodes to text and EOS: pick other prompts"
    query = pairs[:4] + [{"input": p["input"], "output": p["output"] + "k"} for p in pairs[:2]]
    adapted = fmmeta.adapt(tiny_run, "reptile", SUPPORT, query, max_new_tokens=8, **ADAPTATION)
    rows = adapted.predictions
    flags = [r["exact_match"] for r in rows]
    assert [r["correct"] for r in rows] == flags
    assert any(flags[:4]) and flags[-2:] == [False, False]  # a longer gold than the greedy text: never exact
    folder = adapted.save(tmp_path / "adapter")
    cfg = load_run_config(tiny_run)
    base, tokenizer = build_model_and_tokenizer(cfg.model)
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    for ex, r in zip(adapted.task.episode.query, rows):  # plain peft, teacher forced: the fast weights' numbers
        score = score_query(model, [Example(ex.prompt_ids, ex.answer_ids)], tokenizer.pad_token_id)
        assert math.isclose(-score.loss * score.n_answer_tokens, r["answer_logprob"], rel_tol=RTOL)
        assert (score.accuracy == 1.0) == r["exact_match"]
    with torch.no_grad():  # and a classification task's candidates, through both
        cls = fmmeta.adapt(tiny_run, "fomaml", [{"text": "red", "label": "warm"}, {"text": "ice", "label": "cold"}],
                           [{"text": "fire"}, {"text": "snow"}])
    again = cls.predict([{"text": "fire"}, {"text": "snow"}])  # new rows, through the kept fast weights
    for a, b in zip(again, cls.predictions):
        assert all(math.isclose(a["logprobs"][w], b["logprobs"][w], rel_tol=RTOL) for w in cls.task.labels)
    cls.save(tmp_path / "cls")
    # the saved adapter, adapted again with no step, is the adapted model: its predictions again
    kept = fmmeta.adapt(tiny_run, "fomaml", cls.task.support_rows, [{"text": "fire"}, {"text": "snow"}],
                        adapter=tmp_path / "cls", steps=0)
    for a, b in zip(kept.predictions, cls.predictions):
        assert all(math.isclose(a["logprobs"][w], b["logprobs"][w], rel_tol=RTOL) for w in cls.task.labels)
    model = PeftModel.from_pretrained(build_model_and_tokenizer(cfg.model)[0], str(tmp_path / "cls")).eval()
    for ex, r in zip(cls.task.episode.query, cls.predictions):
        for word, choice in zip(cls.task.labels, cls.task.episode.choices):
            s = score_query(model, [Example(ex.prompt_ids, choice)], tokenizer.pad_token_id)
            assert math.isclose(-s.loss * s.n_answer_tokens, r["logprobs"][word], rel_tol=RTOL)
