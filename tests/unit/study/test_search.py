"""Optuna's side of a study: resumable folders and draws, trials left by a kill, the choice, and
the folder rules (one declaration, one look at held-out tasks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fmmeta.errors import UserInputError
from fmmeta.study import Range, StudyConfig
from fmmeta.study.config import MethodSpace
from fmmeta.study.folder import HeldOutScoredError, claim_study_dir, refuse_second_look, start_held_out
from fmmeta.study.report import choose
from fmmeta.study.search import (
    FOLDER,
    finished,
    import_optuna,
    next_folder,
    open_study,
    requeue_interrupted,
    seed_sampler,
    suggest,
)

optuna = pytest.importorskip("optuna")
KEYS = {"algorithm.inner_lr": Range(low=0.01, high=0.3, log=True), "algorithm.inner_steps": Range(choices=(1.0, 2.0, 4.0))}


def _study(tmp_path: Path, **kw) -> StudyConfig:
    return StudyConfig(output_dir=str(tmp_path), space={"fomaml": MethodSpace()}, **kw)


def _draws(tmp_path: Path, name: str, n: int, kill_at: int | None = None) -> list[dict]:
    """The values of ``n`` finished trials, optionally reopening the storage (a resume) before
    trial ``kill_at`` after leaving that trial running, as a SIGKILL would."""
    study = _study(tmp_path / name)
    (tmp_path / name).mkdir()
    opt = open_study(optuna, tmp_path / name, "fomaml", study)
    while len(finished(optuna, opt)) < n:
        seed_sampler(optuna, opt, study, "fomaml", len(finished(optuna, opt)))
        trial = opt.ask()
        trial.set_user_attr(FOLDER, trial.user_attrs.get(FOLDER) or next_folder(opt))
        values = suggest(trial, KEYS)
        if len(finished(optuna, opt)) == kill_at:
            kill_at = None  # left RUNNING; a new process opens the storage
            opt = open_study(optuna, tmp_path / name, "fomaml", study)
            assert requeue_interrupted(optuna, opt) == [trial.number]
            continue
        opt.tell(trial, values["algorithm.inner_lr"])
    return [{"folder": t.user_attrs[FOLDER], **t.params} for t in finished(optuna, opt)]


def test_a_resumed_study_draws_and_names_what_an_uninterrupted_one_does(tmp_path: Path) -> None:
    straight = _draws(tmp_path, "straight", 4)
    resumed = _draws(tmp_path, "resumed", 4, kill_at=1)
    assert resumed == straight
    assert [d["folder"] for d in straight] == ["trial_000", "trial_001", "trial_002", "trial_003"]
    assert all(isinstance(d["algorithm.inner_steps"], int) for d in straight)
    assert len({d["algorithm.inner_lr"] for d in straight}) == 4  # draws, not one value repeated


def test_a_trial_left_running_is_failed_and_enqueued_again_with_its_folder(tmp_path: Path) -> None:
    opt = open_study(optuna, tmp_path, "fomaml", _study(tmp_path))
    trial = opt.ask()
    trial.set_user_attr(FOLDER, "trial_000")
    lr = trial.suggest_float("algorithm.inner_lr", 0.01, 0.3)
    assert requeue_interrupted(optuna, opt) == [0]
    states = [t.state for t in opt.get_trials()]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    again = opt.ask()
    assert again.user_attrs[FOLDER] == "trial_000" and again.user_attrs["rerun_of"] == 0
    assert again.suggest_float("algorithm.inner_lr", 0.01, 0.3) == lr
    assert finished(optuna, opt) == []  # a killed trial does not count towards trials


def _row(folder: str, value: float | None, state: str = "complete") -> dict:
    return {"folder": folder, "value": value, "state": state, "params": {"x": folder}}


def test_the_choice_is_the_best_validation_score_ties_to_the_earlier_trial() -> None:
    rows = [_row("trial_000", 0.5), _row("trial_001", 0.7), _row("trial_002", 0.7), _row("trial_003", None, "pruned")]
    acc = choose("fomaml", rows, StudyConfig(metric="accuracy"))
    assert acc["folder"] == "trial_001" and "next trial_002 at 0.7000 (+0.0000)" in acc["why"]
    loss = choose("fomaml", rows, StudyConfig(metric="loss"))
    assert loss["folder"] == "trial_000" and loss["why"].startswith("trial_000: lowest mean validation loss")
    with pytest.raises(UserInputError, match="no trial of fomaml finished"):
        choose("fomaml", [_row("trial_000", None, "pruned")], StudyConfig())


def test_trials_within_one_standard_error_of_the_best_are_reported_as_tied() -> None:
    rows = [{**_row("trial_000", 0.50), "standard_error": 0.04}, {**_row("trial_001", 0.60), "standard_error": 0.05},
            {**_row("trial_002", 0.56), "standard_error": 0.05}, {**_row("trial_003", 0.58), "standard_error": 0.05}]
    acc = choose("fomaml", rows, StudyConfig(metric="accuracy"))
    # The best's own standard error (0.05) decides: 0.56 and 0.58 are within it, 0.50 is not.
    assert acc["folder"] == "trial_001" and acc["standard_error"] == 0.05
    assert acc["tied"] == ["trial_003", "trial_002"]  # best first
    assert "(standard error 0.0500)" in acc["why"] and "tied with trial_003, trial_002" in acc["why"]
    assert choose("fomaml", [r for r in rows if r["folder"] != "trial_002" and r["folder"] != "trial_003"],
                  StudyConfig(metric="accuracy"))["tied"] == []


def test_held_out_tasks_are_scored_once_per_folder(tmp_path: Path) -> None:
    refuse_second_look(tmp_path)  # nothing scored yet
    start_held_out(tmp_path, {"fomaml": {"folder": "trial_000"}})
    with pytest.raises(HeldOutScoredError, match="did not finish; no score was written"):
        refuse_second_look(tmp_path)
    (tmp_path / "held_out" / "eval.json").write_text("{}")
    with pytest.raises(HeldOutScoredError, match="were scored at .* start a new study"):
        start_held_out(tmp_path, {})
    assert json.loads((tmp_path / "held_out" / "started.json").read_text())["choice"]["fomaml"]["folder"] == "trial_000"


def test_a_resume_must_declare_the_same_study_but_may_add_trials(tmp_path: Path) -> None:
    study = _study(tmp_path, trials=2, seeds=3)
    _, lock = claim_study_dir(study)
    lock.release()
    _, lock = claim_study_dir(_study(tmp_path, trials=5, seeds=3))
    lock.release()
    with pytest.raises(UserInputError, match=r"declared otherwise \(study.yaml\): seeds: 3 when the study began, 4 now"):
        claim_study_dir(_study(tmp_path, trials=5, seeds=4))


def test_a_second_process_cannot_hold_the_study(tmp_path: Path) -> None:
    _, lock = claim_study_dir(_study(tmp_path))
    try:
        with pytest.raises(UserInputError, match="pid"):
            claim_study_dir(_study(tmp_path))
    finally:
        lock.release()


def test_optuna_is_imported_with_its_verbosity_down() -> None:
    assert import_optuna() is optuna
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING


def test_without_optuna_the_message_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)  # `import optuna` raises ImportError
    with pytest.raises(UserInputError, match=r"pip install 'fmmeta\[study\]'"):
        import_optuna()


def test_the_pruner_stops_a_trial_whose_validation_curve_trails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmmeta.recipes import study as recipe

    study = _study(tmp_path, metric="loss", meta_steps=6, report_every=2, pruner_startup_trials=1)
    opt = open_study(optuna, tmp_path, "fomaml", study)
    curves = {0: {2: 1.0, 4: 0.8, 6: 0.7}, 1: {2: 5.0, 4: 0.1, 6: 0.1}, 2: {2: 0.9, 4: 0.7, 6: 0.6}}
    trained: list[tuple[int, int]] = []

    def segment(study, method, values, steps, trial_dir, scorer):
        trained.append((trial.number, steps))
        return curves[trial.number][steps]

    monkeypatch.setattr(recipe, "segment", segment)
    outcomes = []
    for _ in range(3):
        trial = opt.ask()
        outcomes.append(recipe.run_trial(study, "fomaml", {}, tmp_path, None, trial))
        done = outcomes[-1][0] == "complete"  # as the study tells Optuna
        opt.tell(trial, outcomes[-1][1] if done else None, state=None if done else optuna.trial.TrialState.PRUNED)
    assert outcomes == [("complete", 0.7), ("pruned", 5.0), ("complete", 0.6)]
    # The pruned trial was not trained past its first validation score.
    assert trained == [(0, 2), (0, 4), (0, 6), (1, 2), (2, 2), (2, 4), (2, 6)]
    assert recipe.rungs(6, 2) == [2, 4, 6] and recipe.rungs(5, 2) == [2, 4, 5] and recipe.rungs(5, 0) == [5]


def test_a_word_key_is_drawn_among_its_words(tmp_path: Path) -> None:
    study = _study(tmp_path)
    opt = open_study(optuna, tmp_path, "fomaml", study)
    drawn = set()
    for n in range(6):
        seed_sampler(optuna, opt, study, "fomaml", n)
        trial = opt.ask()
        value = suggest(trial, {"algorithm.inner_format": Range(choices=("plain", "in_context"))})["algorithm.inner_format"]
        opt.tell(trial, float(n))
        drawn.add(value)
    assert drawn <= {"plain", "in_context"} and all(isinstance(v, str) for v in drawn)
    assert len(drawn) == 2  # six seeded draws of two words reach both
