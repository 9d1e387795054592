"""A study's declaration: strict keys, errors that name the key, the value and the fix, and every
range end checked by the train recipe before a trial runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fmmeta.config import ConfigError, load_config
from fmmeta.study import StudyConfig, recipe_problems, searched_keys
from fmmeta.study.config import key_type, trial_overrides

REPO = Path(__file__).resolve().parents[3]
SMOKE = str(REPO / "recipes" / "configs" / "smoke.yaml")


def _load(tmp_path: Path, declaration: dict, overrides: list[str] = ()) -> StudyConfig:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"config": SMOKE, **declaration}))
    return load_config(StudyConfig, path, list(overrides))


def _problems(tmp_path: Path, declaration: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, declaration)
    return err.value.problems


def test_the_shipped_example_declares_a_valid_study() -> None:
    study = load_config(StudyConfig, REPO / "recipes" / "configs" / "study_smoke.yaml")
    assert list(study.space) == ["fomaml", "reptile", "multitask"]
    assert set(searched_keys(study.space["fomaml"], "fomaml")) == {"algorithm.inner_lr", "algorithm.inner_steps"}
    assert searched_keys(study.space["reptile"], "reptile")["optim.outer_lr"].log is True
    assert recipe_problems(study) == []


def test_the_default_suite_study_is_valid_at_every_end_of_its_ranges() -> None:
    """recipes/configs/study_default.yaml (docs/research/study_default.md) runs on the embedded
    default config: every value it can draw is one the train recipe accepts."""
    study = load_config(StudyConfig, REPO / "recipes" / "configs" / "study_default.yaml")
    assert study.config is None and study.meta_steps == 100 and list(study.space) == ["fomaml", "reptile", "multitask"]
    assert recipe_problems(study) == []


def test_an_unknown_key_names_the_closest_one(tmp_path: Path) -> None:
    problems = _problems(tmp_path, {"space": {"fomaml": {"algorithm": {"inner_lrr": {"low": 0.1, "high": 0.2}}}}})
    assert len(problems) == 1
    assert "space.fomaml.algorithm.inner_lrr" in problems[0] and "did you mean" in problems[0]
    assert "inner_lr" in problems[0].split("did you mean")[1]


def test_a_key_that_is_not_searchable_is_refused(tmp_path: Path) -> None:
    # eval.* would change how every trial is scored: not part of a space.
    problems = _problems(tmp_path, {"space": {"fomaml": {"eval": {"max_steps": {"choices": [1, 2]}}}}})
    assert any("unknown key 'space.fomaml.eval'" in p for p in problems), problems


@pytest.mark.parametrize(("entry", "expected"), [
    ({"low": 0.3, "high": 0.1}, "low=0.3 is invalid: above high=0.1"),
    ({"low": 0.0, "high": 0.1, "log": True}, "a log scale needs low > 0"),
    ({"low": 0.1, "high": 0.2, "choices": [0.1]}, "not both"),
    ({"low": 0.1}, "give both low and high"),
    ({"choices": [0.1], "log": True}, "log=true is invalid with choices"),
])
def test_a_malformed_range_names_its_key_and_the_fix(tmp_path: Path, entry: dict, expected: str) -> None:
    problems = _problems(tmp_path, {"space": {"fomaml": {"algorithm": {"inner_lr": entry}}}})
    assert len(problems) == 1 and problems[0].startswith("space.fomaml.algorithm.inner_lr.")
    assert expected in problems[0]


def test_study_level_problems_are_reported_together(tmp_path: Path) -> None:
    problems = _problems(tmp_path, {
        "seeds": 2, "trials": 0, "overrides": ["methods=[fomaml]", "train.meta_steps=9"],
        "space": {"fomaml": {"train": {"meta_steps": {"choices": [2.5, 4]}},
                             "settings": {"step_size_lr": {"low": 0.01, "high": 0.1}}}},
    })
    text = "\n".join(problems)
    assert "seeds=2 is invalid: must be >= 3" in text
    assert "trials=0 is invalid: must be >= 1" in text
    assert "overrides[0]='methods=[fomaml]' is invalid: the study sets methods" in text
    assert "overrides[1]='train.meta_steps=9' is invalid" in text
    assert "space.fomaml.train.meta_steps=[2.5, 4.0] is invalid" in text and "whole number" in text
    assert "space.fomaml.settings.step_size_lr is invalid: fomaml has no settings of its own" in text
    assert len(problems) == 6, problems


def test_a_methods_own_settings_are_searched_under_its_section(tmp_path: Path) -> None:
    study = _load(tmp_path, {"space": {"metasgd": {"settings": {"step_size_lr": {"low": 0.01, "high": 0.1}}}}})
    keys = searched_keys(study.space["metasgd"], "metasgd")
    assert list(keys) == ["algorithm.metasgd.step_size_lr"] and key_type(*keys) is float
    anil = _load(tmp_path, {"space": {"anil": {"settings": {"layers": {"choices": [0, 2]}}}}})
    assert key_type("algorithm.anil.layers") is int
    assert recipe_problems(anil) == ["space.anil.algorithm.anil.layers=0: the train recipe refuses it: "
                                     "algorithm.anil.layers=0 is invalid: must be >= 1 (the top decoder layers "
                                     "the inner loop adapts; ANIL's paper adapts only the head)"]
    problems = _problems(tmp_path, {"space": {
        "metasgd": {"settings": {"step_size": {"low": 0.01, "high": 0.1}}},
        "reptile": {"algorithm": {"step_size_lr": {"low": 0.01, "high": 0.1}}}}})
    assert problems == [
        "space.reptile.algorithm.step_size_lr has moved to space.metasgd.settings.step_size_lr: write it "
        "there (same value)",
        "space.metasgd.settings.step_size is invalid: metasgd has the settings ['step_size_lr']; remove it",
    ], problems


def test_an_empty_space_is_refused(tmp_path: Path) -> None:
    assert any(p.startswith("space={} is invalid") for p in _problems(tmp_path, {}))


def test_the_recipe_checks_every_end_of_every_range(tmp_path: Path) -> None:
    study = _load(tmp_path, {"space": {
        "reptil": {},
        "fomaml": {"algorithm": {"inner_lr": {"low": -0.1, "high": 0.3}, "inner_steps": {"choices": [2, -1]}}},
    }})
    problems = recipe_problems(study)
    assert any(p.startswith("space.reptil: the train recipe refuses it: methods=['reptil'] is invalid")
               for p in problems), problems
    assert any(p.startswith("space.fomaml.algorithm.inner_lr=-0.1: the train recipe refuses it: "
                            "algorithm.inner_lr=-0.1") for p in problems), problems
    assert any(p.startswith("space.fomaml.algorithm.inner_steps=-1:") for p in problems), problems
    # The ends the recipe accepts raise nothing.
    assert not any("inner_lr=0.3" in p or "inner_steps=2:" in p for p in problems), problems


def test_a_bad_base_config_is_said_once_not_per_method(tmp_path: Path) -> None:
    study = _load(tmp_path, {"overrides": ["optim.outer_lr=-1"],
                             "space": {"fomaml": {}, "reptile": {}}})
    problems = recipe_problems(study)
    assert len(problems) == 1 and "optim.outer_lr=-1" in problems[0], problems


def test_a_trial_is_one_method_without_held_out_evaluation(tmp_path: Path) -> None:
    study = _load(tmp_path, {"overrides": ["lora.r=2"], "space": {"fomaml": {}}})
    argv = trial_overrides(study, "fomaml", {"algorithm.inner_steps": 2.0, "algorithm.inner_lr": 0.05,
                                             "train.meta_steps": 8}, 4, tmp_path / "t")
    assert argv[0] == "lora.r=2"
    assert "algorithm.inner_steps=2" in argv and "algorithm.inner_lr=0.05" in argv
    assert "methods=[fomaml]" in argv and "eval.enabled=false" in argv and "train.resume=auto" in argv
    # The segment's meta-steps, not the trial's total, and never two values for one key.
    assert [a for a in argv if a.startswith("train.meta_steps=")] == ["train.meta_steps=4"]
    assert argv[-1] == f"output_dir={tmp_path / 't'}"


def test_fmmeta_study_refuses_a_bad_declaration_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fmmeta.cli import main

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"config": SMOKE, "output_dir": str(tmp_path / "out"),
                                    "space": {"fomaml": {"optim": {"outer_lr": {"low": 0.1, "high": 0.01}}}}}))
    assert main(["study", "--config", str(path)]) == 2
    assert "space.fomaml.optim.outer_lr.low=0.1 is invalid: above high=0.01" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before the folder is made


def test_inner_format_is_searched_by_its_words(tmp_path: Path) -> None:
    study = _load(tmp_path, {"space": {"fomaml": {"algorithm": {"inner_format": {"choices": ["plain", "in_context"]}}}}})
    assert searched_keys(study.space["fomaml"], "fomaml")["algorithm.inner_format"].choices == ("plain", "in_context")
    assert recipe_problems(study) == []
    argv = trial_overrides(study, "fomaml", {"algorithm.inner_format": "in_context"}, 4, tmp_path / "t")
    assert "algorithm.inner_format=in_context" in argv


def test_a_misspelt_format_is_refused_by_the_recipe_before_a_trial(tmp_path: Path) -> None:
    study = _load(tmp_path, {"space": {"fomaml": {"algorithm": {"inner_format": {"choices": ["plain", "in_contxt"]}}}}})
    problems = recipe_problems(study)
    assert len(problems) == 1, problems
    assert problems[0].startswith("space.fomaml.algorithm.inner_format=in_contxt: the train recipe refuses it")
    assert "in_context" in problems[0]


@pytest.mark.parametrize(("algorithm", "expected"), [
    ({"inner_format": {"low": 0.0, "high": 1.0}}, "inner_format is a word; give its choices"),
    ({"inner_format": {"choices": [1]}}, "inner_format is a word; give its choices"),
    ({"inner_lr": {"choices": [0.1, "fast"]}}, "inner_lr is a number, got ['fast']"),
])
def test_a_value_of_the_wrong_kind_is_refused(tmp_path: Path, algorithm: dict, expected: str) -> None:
    problems = _problems(tmp_path, {"space": {"fomaml": {"algorithm": algorithm}}})
    assert len(problems) == 1 and expected in problems[0], problems
