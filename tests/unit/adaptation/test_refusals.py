"""Every bad input to ``fmmeta adapt`` is one clear message before any model loads.

The run folders here are fakes (a config, empty adapter files, an ``eval.json``): the refusals
read only those, so a test that loaded a model would show the check came too late.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fmmeta.adaptation.method import resolve_method
from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, build_task, read_task
from fmmeta.adaptation.task_list import task_list
from fmmeta.errors import UserInputError
from fmmeta.tasks.testing import tiny_tokenizer

REPO = Path(__file__).resolve().parents[3]
SUPPORT = [{"text": "Paris", "label": "fr"}, {"text": "Berlin", "label": "de"}]
QUERY = [{"text": "Lyon"}]


def _run(tmp_path: Path, methods: str = "[fomaml,metasgd,metaicl]", lrs: dict | None = None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    text = (REPO / "recipes" / "configs" / "smoke.yaml").read_text()
    (run / "config.yaml").write_text(text + f"methods: {methods}\n")
    for m in ("fomaml", "metasgd", "metaicl"):
        (run / m / "adapter").mkdir(parents=True)
        (run / m / "adapter" / "adapter_model.safetensors").write_bytes(b"")
    (run / "metasgd" / "adapter" / "step_sizes.json").write_text(json.dumps({"order": ["a"], "step_sizes": {"a": 0.1}}))
    if lrs is not None:
        (run / "eval").mkdir()
        (run / "eval" / "eval.json").write_text(json.dumps({"inner_lrs": lrs, "max_steps": 3}))
    return run


def _refused(match: str, fn, *args, **kwargs) -> str:  # noqa: ANN001 - the call under test
    with pytest.raises(UserInputError, match=match) as err:
        fn(*args, **kwargs)
    return str(err.value)


def test_run_and_method_refusals(tmp_path: Path) -> None:
    run = _run(tmp_path, lrs={"fomaml": 0.3, "base": 0.1})
    _refused("not a folder", resolve_method, tmp_path / "nowhere", "fomaml")
    _refused("is not a method of the run", resolve_method, run, "reptile")
    _refused("replicate", resolve_method, run, "fomaml", replicate=1)
    _refused("drop --steps and --lr", resolve_method, run, "metaicl", steps=2)
    _refused("drop --lr", resolve_method, run, "metasgd", lr=0.1)
    _refused("must be >= 0", resolve_method, run, "fomaml", steps=-1)
    _refused("must be > 0", resolve_method, run, "fomaml", lr=0.0)
    shutil.rmtree(run / "fomaml" / "adapter")
    _refused("did not finish that method", resolve_method, run, "fomaml")


def test_the_evaluations_choice_is_used_and_its_absence_refused(tmp_path: Path) -> None:
    run = _run(tmp_path, lrs={"fomaml": 0.3, "base": 0.1})
    plan = resolve_method(run, "fomaml")
    assert (plan.lr, plan.steps) == (0.3, 3) and "eval.json" in plan.lr_source
    assert resolve_method(run, "fomaml", lr=0.05, steps=1).lr == 0.05
    assert resolve_method(run, "metasgd").lr is None  # its learned step sizes
    assert resolve_method(run, "metaicl").steps == 0
    (run / "eval" / "eval.json").unlink()
    _refused("no evaluation that chose its adaptation lr", resolve_method, run, "fomaml")
    assert resolve_method(run, "fomaml", lr=0.1).lr == 0.1


def _files(support: list | None = None, query: list | None = None, **fmt: object) -> TaskFiles:
    return TaskFiles("t", SUPPORT if support is None else support, QUERY if query is None else query,
                     TaskFormat().replace(**fmt))


def test_task_row_refusals() -> None:
    _refused("support label\\(s\\) \\['it'\\] are not in the label set", read_task,
             _files(SUPPORT + [{"text": "Rome", "label": "it"}], labels="fr,de"))
    _refused("query label\\(s\\) \\['es'\\] are not in the label set", read_task,
             _files(query=[{"text": "Madrid", "label": "es"}]))
    _refused("has 1 label\\(s\\)", read_task, _files([{"text": "Paris", "label": "fr"}]))
    _refused("have no support row", read_task, _files(labels="fr,de,it"))
    _refused("has no 'label'", read_task, _files([{"text": "Paris"}, *SUPPORT]))
    _refused("has no rows", read_task, _files([]))
    _refused("column\\(s\\) \\['sentence'\\] not found", read_task, _files(template="S: {sentence}"))
    _refused("does not exist", read_task, TaskFiles("t", Path("/nonexistent/s.csv"), QUERY))
    _refused("builder='task_column' is invalid", TaskFormat().replace, builder="task_column")
    _refused("unknown task key", TaskFormat().replace, colour="red")


def test_token_budget_refusals() -> None:
    tok = tiny_tokenizer()
    long = [{"input": "a", "output": "x" * 40}, {"input": "b", "output": "y"}]
    _refused("its answer takes", build_task, _files(long, [{"input": "c"}], builder="dataset"), tok, max_length=16)
    words = [{"text": "a", "label": "w" * 20}, {"text": "b", "label": "v"}]
    _refused("a label word takes", build_task, _files(words, QUERY), tok, max_length=16)


def test_task_list_refusals(tmp_path: Path) -> None:
    fmt = TaskFormat()
    (tmp_path / "empty").mkdir()
    _refused("has no task folders", task_list, tmp_path / "empty", fmt)
    (tmp_path / "many" / "a").mkdir(parents=True)
    (tmp_path / "many" / "a" / "support.csv").write_text("text,label\nx,1\n")
    _refused("needs exactly one query", task_list, tmp_path / "many", fmt)
    listed = tmp_path / "tasks.yaml"
    listed.write_text("- {name: a, support: s.csv, query: q.csv}\n- {name: a, support: s.csv, query: q.csv}\n")
    _refused("more than once", task_list, listed, fmt)
    listed.write_text("name: a\n")
    _refused("not a YAML list", task_list, listed, fmt)
    listed.write_text("- {name: a, support: s.csv}\n")
    _refused("needs support and query", task_list, listed, fmt)
    _refused("neither a folder", task_list, tmp_path / "x.txt", fmt)


def test_recipe_refuses_with_exit_2_before_the_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import recipes.adapt as recipe

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(recipe, "Adapter", no_model)
    run = _run(tmp_path, lrs={"fomaml": 0.3})
    (tmp_path / "s.csv").write_text("text,label\nParis,fr\nBerlin,de\nRome,it\n")
    (tmp_path / "q.csv").write_text("text\nLyon\n")
    (tmp_path / "lone.csv").write_text("text,label\nParis,fr\nLyon,fr\nBerlin,de\n")
    base = ["--run", str(run), "--method", "fomaml", "--support", str(tmp_path / "s.csv"), "--query",
            str(tmp_path / "q.csv"), "--out", str(tmp_path / "out")]
    cases = [
        (["--labels", "fr,de"], "support label(s) ['it'] are not in the label set"),
        (["--method", "reptile"], "is not a method of the run"),
        (["--source", "topics"], "is not a source of the run's config"),
        (["--tasks", str(tmp_path)], "give either --support FILE"),
    ]
    for extra, message in cases:
        assert recipe.main(base + extra) == 2
        err = capsys.readouterr().err
        assert "error: " in err and message in err, err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    assert recipe.main(base) == 2 and "is not an empty folder" in capsys.readouterr().err


def test_a_replicate_adapts_its_own_adapter_at_its_own_lr(tmp_path: Path) -> None:
    import yaml

    run = tmp_path / "run"
    cfg = yaml.safe_load((REPO / "recipes" / "configs" / "smoke.yaml").read_text())
    cfg["methods"] = ["fomaml"]
    cfg["train"]["replicates"] = 2
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    for r in (0, 1):
        (run / f"replicate_{r}" / "fomaml" / "adapter").mkdir(parents=True)
        (run / f"replicate_{r}" / "fomaml" / "adapter" / "adapter_model.safetensors").write_bytes(b"")
    (run / "eval").mkdir()
    (run / "eval" / "eval.json").write_text(json.dumps(
        {"inner_lrs": {"fomaml": 0.1}, "replicate_lrs": [{"fomaml": 0.1}, {"fomaml": 0.3}], "max_steps": 2}))
    plan = resolve_method(run, "fomaml", replicate=1)
    assert plan.lr == 0.3 and plan.adapter == run / "replicate_1" / "fomaml" / "adapter"
    assert plan.cfg.train.seed == cfg["train"].get("seed", 0) + 1  # its initial adapter is its own seed's
    assert resolve_method(run, "fomaml").lr == 0.1
    _refused("numbered 0..1", resolve_method, run, "fomaml", replicate=2)


def test_an_adapter_made_with_another_model_or_lora_is_refused_in_trainings_words(tmp_path: Path) -> None:
    run = _run(tmp_path, lrs={"fomaml": 0.3})
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text((run / "config.yaml").read_text().replace("tiny_hidden_size: 32",
                                                                               "tiny_hidden_size: 64"))
    mine = other / "fomaml" / "adapter"
    mine.mkdir(parents=True)
    (mine / "adapter_model.safetensors").write_bytes(b"")
    (mine / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}))
    message = _refused("was made with other settings", resolve_method, run, "fomaml", adapter=mine)
    assert "lora.r: 8 in the adapter, 4 now" in message
    assert "model.tiny_hidden_size: 64 in" in message and "32 now" in message
    _refused("base and in_context use the run's initial adapter", resolve_method, run, "base", adapter=mine)
    _refused("has no adapter_model.safetensors", resolve_method, run, "fomaml", adapter=tmp_path)
    (mine / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"]}))
    (other / "config.yaml").write_text((run / "config.yaml").read_text())
    assert resolve_method(run, "fomaml", adapter=mine).adapter == mine  # the same shape, the same model


def test_multiple_choice_row_refusals() -> None:
    rows = [{"q": "2+2=", "opts": ["4", "5"], "answer": 0}, {"q": "1+1=", "opts": ["3", "2"], "answer": 1}]
    mc = {"builder": "multiple_choice", "label_column": "answer"}
    _refused("needs --template", read_task, _files(rows, rows, options_column="opts", **mc))
    _refused("exactly one of --options-column", read_task, _files(rows, rows, template="{q}", **mc))
    bad = [*rows, {"q": "3+3=", "opts": ["6", "7"], "answer": 5}]
    _refused("row 2 \\(answer\\): the answer 5 is not one of the row's 2 options", read_task,
             _files(bad, rows, template="{q}", options_column="opts", **mc))
    _refused("row 0 has options \\['4'\\]", read_task,
             _files([{"q": "2+2=", "opts": ["4"], "answer": 0}], rows, template="{q}", options_column="opts", **mc))


def _digest(*folders: Path) -> dict[str, str]:
    import hashlib

    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


def test_task_names_never_become_paths_outside_out_and_nothing_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task named like a path (the run's own adapter folder, the data's folder, an absolute
    path, ``..``) or two names one folder apart in case are refused before anything is written:
    the run and the user's data are byte for byte what they were, and --out was never made."""
    import recipes.adapt as recipe

    monkeypatch.setattr(recipe, "Adapter", lambda *a, **k: (_ for _ in ()).throw(AssertionError("model loaded")))
    run = _run(tmp_path, lrs={"fomaml": 0.3})
    data = tmp_path / "data"
    data.mkdir()
    (data / "s.csv").write_text("text,label\nParis,fr\nBerlin,de\n")
    (data / "q.csv").write_text("text\nLyon\n")
    (data / "README.md").write_text("the user's notes\n")
    before = _digest(run, data)
    listed = data / "tasks.yaml"
    out = tmp_path / "out"
    for names, message in [
        (["../../run/fomaml/adapter"], "cannot be a folder name: it holds '/'"),
        ([str(data)], "cannot be a folder name: it holds '/'"),
        ([".."], "names a folder that already exists"),
        (["t", "T"], "would share one folder where case is not told apart"),
        (["t."], "ends with a dot"),
    ]:
        listed.write_text("".join(f"- {{name: {json.dumps(n)}, support: s.csv, query: q.csv}}\n" for n in names))
        before = {**before, str(listed): _digest(data)[str(listed)]}
        argv = ["--run", str(run), "--method", "fomaml", "--tasks", str(listed), "--out", str(out)]
        assert recipe.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert not out.exists() and _digest(run, data) == before
    one = ["--run", str(run), "--method", "fomaml", "--support", str(data / "s.csv"), "--query", str(data / "q.csv")]
    assert recipe.main([*one, "--name", "../../x", "--out", str(out)]) == 2
    assert "task name '../../x' cannot be a folder name" in capsys.readouterr().err and not out.exists()
    # --out inside the run: training owns that folder
    assert recipe.main([*one, "--out", str(run / "replicate_1")]) == 2
    assert "is inside the run" in capsys.readouterr().err and not (run / "replicate_1").exists()
    assert _digest(run, data) == before


def test_an_out_folder_another_adapt_is_writing_is_refused(tmp_path: Path) -> None:
    import recipes.adapt as recipe

    run = _run(tmp_path)
    out = tmp_path / "out"
    assert recipe.out_folder(out, run) == out and (out / recipe.CLAIM).exists()
    _refused("is being written by another fmmeta adapt", recipe.out_folder, out, run)
    (out / recipe.CLAIM).unlink()
    (out / "predictions.jsonl").write_text("")
    _refused("is not an empty folder", recipe.out_folder, out, run)


def test_numbers_adapt_takes_are_range_checked_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import recipes.adapt as recipe

    monkeypatch.setattr(recipe, "Adapter", lambda *a, **k: (_ for _ in ()).throw(AssertionError("model loaded")))
    run = _run(tmp_path, lrs={"fomaml": 0.3})
    (tmp_path / "s.csv").write_text("text,label\nParis,fr\nBerlin,de\n")
    (tmp_path / "q.csv").write_text("text\nLyon\n")
    (tmp_path / "lone.csv").write_text("text,label\nParis,fr\nLyon,fr\nBerlin,de\n")
    (tmp_path / "two.csv").write_text("text,label\nParis,fr\nLyon,fr\nBerlin,de\nBonn,de\n")
    base = ["--run", str(run), "--method", "fomaml", "--support", str(tmp_path / "s.csv"), "--query",
            str(tmp_path / "q.csv"), "--out", str(tmp_path / "out")]
    for extra, message in [
        (["--max-new-tokens", "0"], "--max-new-tokens 0 is invalid: must be >= 1 and <= the run's tasks.max_length="),
        (["--max-new-tokens", "100000"], "--max-new-tokens 100000 is invalid"),
        (["--tasks-per-pass", "-1"], "--tasks-per-pass -1 is invalid: must be >= 1"),
        (["--lr", "inf"], "--lr inf is invalid: must be > 0 and <= 1000"),
        (["--lr", "1e30"], "--lr 1e+30 is invalid"),
        (["--lr", "nan"], "--lr nan is invalid"),
        (["--out", str(tmp_path / "/".join(["o" * 200] * 20))], "leaving less than the 255 bytes the files written"),
        (["--folds", "3"], "--folds 3 with --method fomaml: folds are for cross-validation"),
        (["--compare", "--folds", "1"], "--folds 1 is invalid: cross-validation needs >= 2 folds"),
        (["--method", "auto", "--lr", "0.1"], "--method auto compares the run's methods as its evaluation adapts them"),
        (["--method", "auto", "--support", str(tmp_path / "lone.csv")], "has 1 support row of one of its labels"),
        (["--cv-metric", "loss"], "--cv-metric loss with --method fomaml: the metric is for cross-validation; add "
                                  "--compare, or use --method auto"),
        (["--method", "auto", "--support", str(tmp_path / "two.csv"), "--cv-metric", "acuracy"],
         "--cv-metric 'acuracy' is not a registered metric (did you mean 'accuracy'?): cross-validation of these "
         "tasks can choose by accuracy, loss"),
        (["--compare", "--support", str(tmp_path / "two.csv"), "--cv-metric", "accuracy_per_token"],
         "--cv-metric 'accuracy_per_token' does not score classification tasks' held-out rows"),
    ]:
        assert recipe.main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert not (tmp_path / "out").exists()


def test_a_run_still_training_or_evaluated_before_its_adapter_is_refused(tmp_path: Path) -> None:
    """adapt reads a consistent run: not one a training holds (its adapters are not final), and not
    an lr its evaluation chose for an earlier adapter (the run extended after it was evaluated)."""
    import os

    from fmmeta.checkpoint.lock import RunLock

    run = _run(tmp_path, lrs={"fomaml": 0.3})
    lock = RunLock.acquire(run)  # a training of the run
    try:
        _refused("is in use .* not final while it trains", resolve_method, run, "fomaml")
    finally:
        lock.release()
    assert resolve_method(run, "fomaml").lr == 0.3
    adapter = run / "fomaml" / "adapter" / "adapter_model.safetensors"
    later = (run / "eval" / "eval.json").stat().st_mtime_ns + 10**9
    os.utime(adapter, ns=(later, later))  # trained on after the evaluation
    _refused("is older than the adapter .* evaluate the run again", resolve_method, run, "fomaml")
    assert resolve_method(run, "fomaml", lr=0.05).lr == 0.05  # an lr of one's own still adapts
    # evaluated again (fmmeta evaluate --run writes eval-<time>/): that newest evaluation's lr
    (run / "eval-2").mkdir()
    (run / "eval-2" / "eval.json").write_text(json.dumps({"inner_lrs": {"fomaml": 0.1}, "max_steps": 3}))
    os.utime(run / "eval-2" / "eval.json", ns=(later + 10**9, later + 10**9))
    assert resolve_method(run, "fomaml").lr == 0.1


def test_prompts_cut_to_the_budget_are_counted_and_said(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    rows = [{"text": "word " * 40 + str(i), "label": "ab"[i % 2]} for i in range(4)]
    files = TaskFiles("long", rows, [{"text": "short"}, {"text": "word " * 40}], TaskFormat())
    with caplog.at_level(logging.WARNING, logger="fmmeta.adaptation.task_files"):
        task = build_task(files, tiny_tokenizer(), max_length=32)
    assert task.n_cut == 5  # the 4 support rows and the long query row
    assert "task 'long': cut 4 of 4 support and 1 of 2 query prompts from the left to fit tasks.max_length=32" in caplog.text
    assert build_task(files, tiny_tokenizer(), max_length=1000).n_cut == 0


def test_a_misspelt_answer_template_field_is_refused_before_the_model_loads() -> None:
    bad = TaskFiles("t", SUPPORT, QUERY, TaskFormat(answer_template=" {anwser}"))
    _refused(r"--answer-template=' \{anwser\}' names \{anwser\}: an answer template takes \{answer\} "
             r"\(did you mean \{answer\}\?\)", read_task, bad)
    _refused("names no field, so every answer would be the same text", read_task,
             TaskFiles("t", SUPPORT, QUERY, TaskFormat(answer_template=" yes")))


def test_integer_labels_with_unlabelled_query_rows_read_as_the_integers(tmp_path: Path) -> None:
    """A CSV query whose label column has blanks is read as floats (0.0, 1.0); the labels are still
    the support's integers (it was refused: '0.0' not in ['0', '1'])."""
    (tmp_path / "s.csv").write_text("text,label\nParis,0\nBerlin,1\nRome,0\nBonn,1\n")
    (tmp_path / "q.csv").write_text("text,label\nLyon,0\nKoeln,\nMilan,1\n")
    texts = read_task(TaskFiles("t", tmp_path / "s.csv", tmp_path / "q.csv", TaskFormat()))
    assert texts.labels == ("0", "1") and texts.answers[1] == ["0", None, "1"]


def test_a_run_whose_config_was_edited_after_training_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from fmmeta.adaptation.method import load_run_config
    from fmmeta.checkpoint import CheckpointManager
    from fmmeta.checkpoint.resume import RESUME_FACTS, resume_facts

    run = _run(tmp_path, lrs={"fomaml": 0.3})
    adapter = run / "fomaml" / "adapter"
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}))
    cfg = load_run_config(run)
    CheckpointManager(run / "fomaml" / "checkpoints").save(1, lambda writer: None,
                                                           meta={RESUME_FACTS: resume_facts(cfg, "fomaml")})
    assert resolve_method(run, "fomaml").adapter == adapter  # as training wrote it
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("tiny_hidden_size: 32", "tiny_hidden_size: 64"))
    message = _refused("its config.yaml no longer fits its fomaml adapter", resolve_method, run, "fomaml")
    assert "model.tiny_hidden_size: 32 in its checkpoint" in message and "64 in config.yaml" in message
    (run / "config.yaml").write_text(text.replace("  r: 4", "  r: 8"))
    _refused("lora.r: 4 in the adapter, 8 in config.yaml", resolve_method, run, "fomaml")
