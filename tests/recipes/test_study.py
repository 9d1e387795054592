"""``fmmeta study`` end to end on the smoke config's tiny model: a study of two trials, killed with
SIGKILL while its second trial trains and resumed, against the same study run straight through;
held-out tasks untouched until the choice is on disk; a second held-out look refused.

The kill is real: the study runs as a subprocess (``python recipes/study.py``, as a user runs it)
and its whole process group gets SIGKILL once the second trial's training has logged a meta-step
of its second segment, so the kill lands inside a trial, with the trial's first validation score
and some of its checkpoints on disk.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests._zygote import Forked, run_python, start_python
from tests.recipes import _recipe

pytest.importorskip("optuna")

STUDY = _recipe.REPO / "recipes" / "study.py"
FAST_EVAL = ["sampler.fit_cost=false", "eval.max_steps=1", "eval.lr_grid=[0.1]", "eval.in_context=false"]
"""Shared train overrides: a bit-for-bit resumable plan, and a short evaluation protocol."""


def _declaration(tmp_path: Path, name: str, **extra: object) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "config": str(_recipe.SMOKE), "output_dir": str(tmp_path / name), "overrides": FAST_EVAL,
        "trials": 2, "meta_steps": 4, "report_every": 2, "metric": "loss",
        "space": {"fomaml": {"algorithm": {"inner_lr": {"low": 0.03, "high": 0.3, "log": True}}}},
        **extra,
    }))
    return path


def _start(declaration: Path, log: Path) -> Forked | subprocess.Popen[Any]:
    with log.open("w") as fh:
        return start_python([str(STUDY), "--config", str(declaration)], env=_recipe.environment(),
                            cwd=_recipe.REPO, stdout=fh)


def _run(declaration: Path, log: Path, timeout_s: float = 150) -> int:
    """The study to its end (forked from the preloaded interpreter, tests/_zygote.py); its output in ``log``."""
    try:
        done = run_python([str(STUDY), "--config", str(declaration)], env=_recipe.environment(), cwd=_recipe.REPO,
                          timeout_s=timeout_s)
    except subprocess.TimeoutExpired as e:
        log.write_text(e.output or "")
        raise AssertionError(f"study ran past {timeout_s}s:\n{log.read_text()[-3000:]}") from None
    log.write_text(done.stdout)
    return done.returncode


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study run straight through: the reference."""
    tmp = tmp_path_factory.mktemp("study")
    rc = _run(_declaration(tmp, "straight"), tmp / "straight.log")
    assert rc == 0, (tmp / "straight.log").read_text()[-4000:]
    return tmp / "straight"


def test_a_study_shows_no_library_warning_a_user_cannot_act_on(straight: Path) -> None:
    """The study's own process routes library warnings as the recipes do, so those no user can act
    on (``fmmeta.library_warnings.NOT_ACTIONABLE``) are dropped: peft's read of transformers'
    deprecated ``is_gradient_checkpointing`` opened every study's log."""
    log = (straight.parent / "straight.log").read_text()
    assert "is_gradient_checkpointing" not in log, log[:3000]


def _kill_during_second_trial(declaration: Path, out: Path, log: Path) -> None:
    proc = _start(declaration, log)
    metrics = out / "fomaml" / "trial_001" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    try:
        while max(_recipe.steps(metrics), default=-1) < 2:  # meta-step 2: the second segment
            assert proc.poll() is None, f"study ended (rc={proc.returncode}) before the kill:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _states(out: Path) -> list[str]:
    with sqlite3.connect(out / "study.db") as db:
        return [s for (s,) in db.execute("SELECT state FROM trials ORDER BY number")]


@pytest.mark.timeout(300)
def test_a_killed_study_resumes_to_the_same_choice_and_scores(straight: Path, tmp_path: Path) -> None:
    declaration = _declaration(tmp_path, "resumed")
    out = tmp_path / "resumed"
    _kill_during_second_trial(declaration, out, tmp_path / "killed.log")
    assert not (out / "choice.json").exists() and not (out / "held_out").exists()
    assert _states(out) == ["COMPLETE", "RUNNING"]  # the kill left the second trial running
    assert (out / "fomaml" / "trial_001" / "validation" / "step_000002.json").is_file()

    # The same command again, through study.py's main in this process (the kill above was real).
    log = _recipe.main_here("study", ["--config", str(declaration)]).stdout
    assert "fomaml trial 1 was interrupted by a kill: running it again" in log
    assert "resumed from" in log  # the rerun continued the killed trial's checkpoints
    assert _states(out) == ["COMPLETE", "FAIL", "COMPLETE"]

    ref, got = (json.loads((d / "study.json").read_text()) for d in (straight, out))
    assert got["choice"] == ref["choice"]  # folder, values and validation score, exactly
    assert [(r["folder"], r["params"], r["value"], r["curve"]) for r in got["trials"]["fomaml"] if r["state"] == "complete"] \
        == [(r["folder"], r["params"], r["value"], r["curve"]) for r in ref["trials"]["fomaml"]]
    assert [r["state"] for r in got["trials"]["fomaml"]] == ["complete", "interrupted (run again)", "complete"]
    assert got["held_out"]["summary"] == ref["held_out"]["summary"]
    assert "interrupted (run again)" in (out / "study.md").read_text()


@pytest.mark.timeout(120)
def test_held_out_tasks_are_scored_once(straight: Path, tmp_path: Path) -> None:
    report = json.loads((straight / "study.json").read_text())
    assert report["held_out"]["n_seeds"] == 3 and set(report["held_out"]["summary"]) == {"base", "fomaml"}
    assert report["choice"]["fomaml"]["folder"] in ("trial_000", "trial_001")
    md = (straight / "study.md").read_text()
    assert "## Held-out (scored once)" in md and f"Chosen: {report['choice']['fomaml']['why']}." in md

    before = {p: p.stat().st_mtime_ns for p in (straight / "held_out").iterdir()}
    declaration = tmp_path / "again.yaml"
    declaration.write_text((straight.parent / "straight.yaml").read_text().replace("trials: 2", "trials: 3"))
    again = _recipe.main_here("study", ["--config", str(declaration)], check=False)  # in this process
    assert again.returncode == 2, again.stdout[-3000:]
    assert "held-out tasks of the study" in again.stdout and "were scored at" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in (straight / "held_out").iterdir()} == before
    assert _states(straight) == ["COMPLETE", "COMPLETE"]  # no trial was added either


def test_held_out_tasks_are_not_touched_before_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, so every episode drawn and every scoring call can be counted."""
    from fmmeta.config import load_config
    from fmmeta.evaluation import held_out as held_out_module
    from fmmeta.models import build_model_and_tokenizer
    from fmmeta.recipe_config import RecipeConfig
    from fmmeta.recipes import study as recipe
    from fmmeta.study import scoring
    from fmmeta.tasks.classification import ClassificationTask
    from fmmeta.tasks.config import build_task_set
    from fmmeta.tasks.generation import GenerationTask

    # The shipped example study, with the short evaluation protocol.
    example = _recipe.REPO / "recipes" / "configs" / "study_smoke.yaml"
    args = ["--config", str(example), f"output_dir={tmp_path / 'spied'}", f"overrides={json.dumps(FAST_EVAL)}"]
    out = tmp_path / "spied"
    draws: list[tuple[str, bool]] = []  # (task, was the choice on disk)
    scorings: list[tuple[set[str], bool]] = []
    confirmed: list[bool] = []  # were the choices' replicates all trained

    for cls in (ClassificationTask, GenerationTask):
        original = cls.sample_episode

        def spy(self, rng, _original=original):
            draws.append((self.name, (out / "choice.json").is_file()))
            return _original(self, rng)

        monkeypatch.setattr(cls, "sample_episode", spy)
    evaluate = held_out_module.evaluate_methods

    def counted(model, params, methods, episodes_per_seed, *args, **kwargs):
        scorings.append(({ep.task for eps in episodes_per_seed for ep in eps}, (out / "choice.json").is_file()))
        confirmed.append(all((out / m / "replicates" / f"replicate_{r}" / m / "adapter").is_dir()
                             for m in ("fomaml", "reptile", "multitask") for r in (1, 2)))
        return evaluate(model, params, methods, episodes_per_seed, *args, **kwargs)

    monkeypatch.setattr(held_out_module, "evaluate_methods", counted)  # the held-out scoring's
    monkeypatch.setattr(scoring, "evaluate_methods", counted)  # the trials' validation scoring

    assert recipe.main(args) == 0
    study = load_config(recipe.StudyConfig, example)
    base = load_config(RecipeConfig, _recipe.SMOKE, FAST_EVAL)
    names = build_task_set(base.tasks, build_model_and_tokenizer(base.model)[1]).names()
    held_out, validation = set(names["held_out"]), set(names["validation"])

    assert held_out and validation and not held_out & validation
    assert [t for t, chosen in draws if t in held_out and not chosen] == []
    assert {t for t, chosen in draws if t in held_out} == held_out  # then every one was drawn
    assert {t for t, chosen in draws if t in validation and not chosen} == validation
    on_held_out = [(chosen, done) for (tasks, chosen), done in zip(scorings, confirmed) if tasks & held_out]
    # The held-out scoring: one call per training replicate of the choices, after the choice was
    # written and every replicate was trained (the held-out episodes drawn once, checked above).
    assert study.replicates == 3 and on_held_out == [(True, True)] * study.replicates
    # One validation scoring per segment of every trial, all before the choice.
    segments = len(study.space) * study.trials * (study.meta_steps // study.report_every)
    assert sum(1 for tasks, chosen in scorings if tasks <= validation and not chosen) == segments == 12
    pairs = json.loads((out / "study.json").read_text())["held_out"]["comparisons"]
    assert {(c["method"], c["baseline"]) for c in pairs} >= {("fomaml", "multitask"), ("reptile", "multitask")}


def test_a_searched_inner_format_is_scored_in_the_format_it_trained_in(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial that drew ``inner_format=in_context`` trains on in-context rows and is scored, on
    validation and held out, adapted on in-context rows with demonstrations; the plain baseline is not."""
    from fmmeta.evaluation import held_out as held_out_module
    from fmmeta.recipes import study as recipe
    from fmmeta.study import scoring

    declaration = _declaration(tmp_path, "formats", trials=1, meta_steps=2, report_every=0, space={
        "fomaml": {"algorithm": {"inner_format": {"choices": ["in_context"]}}}, "multitask": {}})
    seen: list[tuple[str, dict[str, tuple[bool, bool]]]] = []  # (where, method -> (in-context support, demos))

    def spy(where: str, evaluate):  # noqa: ANN001, ANN202 - wraps evaluate_methods
        def counted(model, params, methods, *args, **kwargs):
            seen.append((where, {m: (e.in_context_support, e.demonstrations) for m, e in methods.items()}))
            return evaluate(model, params, methods, *args, **kwargs)
        return counted

    monkeypatch.setattr(held_out_module, "evaluate_methods", spy("held_out", held_out_module.evaluate_methods))
    monkeypatch.setattr(scoring, "evaluate_methods", spy("validation", scoring.evaluate_methods))
    assert recipe.main(["--config", str(declaration)]) == 0

    trial = yaml.safe_load((tmp_path / "formats" / "fomaml" / "trial_000" / "config.yaml").read_text())
    assert trial["algorithm"]["inner_format"] == "in_context"
    assert ("validation", {"fomaml": (True, True)}) in seen
    assert ("validation", {"multitask": (False, False)}) in seen
    held = [methods for where, methods in seen if where == "held_out"]
    # One held-out scoring per training replicate of the choice (3 by default), each in its format.
    assert len(held) == 3 and all(h["fomaml"] == (True, True) and h["multitask"] == (False, False) for h in held)
    replicate = yaml.safe_load((tmp_path / "formats" / "fomaml" / "replicates" / "replicate_2" / "config.yaml").read_text())
    assert replicate["algorithm"]["inner_format"] == "in_context" and replicate["train"]["seed"] == 2
    choice = json.loads((tmp_path / "formats" / "choice.json").read_text())
    assert choice["fomaml"]["params"] == {"algorithm.inner_format": "in_context"}


@pytest.mark.timeout(400)
def test_methods_searched_side_by_side_choose_and_score_as_one_after_the_other(tmp_path: Path) -> None:
    """``engine.workers=2``: two methods' searches run in two worker processes (each has its own
    Optuna study in the one storage); every trial, the choice and the held-out scores equal the
    study run in one process (that one through study.py's main in this process: it forks no workers)."""
    space = {"fomaml": {"algorithm": {"inner_lr": {"low": 0.03, "high": 0.3, "log": True}}},
             "reptile": {"optim": {"outer_lr": {"low": 0.003, "high": 0.03, "log": True}}}}
    reports = {}
    for workers in (1, 2):
        name = f"workers{workers}"
        declaration = _declaration(tmp_path, name, space=space, overrides=[*FAST_EVAL, f"engine.workers={workers}"])
        if workers == 1:
            _recipe.main_here("study", ["--config", str(declaration)])
        else:
            log = tmp_path / f"{name}.log"
            assert _run(declaration, log, timeout_s=180) == 0, log.read_text()[-4000:]
        reports[workers] = json.loads((tmp_path / name / "study.json").read_text())
    one, two = reports[1], reports[2]
    assert two["choice"] == one["choice"] and set(two["choice"]) == {"fomaml", "reptile"}
    for method in ("fomaml", "reptile"):
        assert [(r["folder"], r["params"], r["value"], r["curve"]) for r in two["trials"][method]] \
            == [(r["folder"], r["params"], r["value"], r["curve"]) for r in one["trials"][method]]
    assert two["held_out"]["summary"] == one["held_out"]["summary"]
