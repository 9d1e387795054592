"""Cross-validation on a user's support rows: the folds, the scores and the choice, computed by hand."""

from __future__ import annotations

import math

import pytest

from fmmeta.adaptation.cross_validation import Score, below_base, choose, fold_count, folds
from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, read_task
from fmmeta.errors import UserInputError


def _texts(labels: list[str], name: str = "t"):  # noqa: ANN202 - TaskTexts
    rows = [{"text": f"w{i}", "label": label} for i, label in enumerate(labels)]
    return read_task(TaskFiles(name, rows, None, TaskFormat()))


def test_folds_are_stratified_cover_every_row_once_and_keep_every_label_in_training() -> None:
    texts = _texts(["a", "a", "a", "a", "b", "b", "b", "b", "b", "c", "c"])
    assert fold_count([texts], 4) == 2  # label c has two rows
    parts = folds(texts, 2)
    held = [p for f in parts for p in f.prompts[1]]
    assert sorted(held) == sorted(texts.prompts[0])  # each row held out exactly once
    for f in parts:
        assert set(f.answers[0]) == {"a", "b", "c"} and f.labels == texts.labels
        assert not set(f.prompts[0]) & set(f.prompts[1])
        assert [r["text"] for r in f.support] == f.prompts[0]  # rows and prompts stay aligned
    assert [len(f.prompts[1]) for f in parts] == [6, 5]
    assert parts[0].files.name == "t (fold 1 of 2)"
    generation = read_task(TaskFiles("g", [{"input": str(i), "output": "x"} for i in range(5)], None,
                                     TaskFormat(builder="dataset")))
    assert fold_count([generation], 4) == 4 and [len(f.prompts[1]) for f in folds(generation, 4)] == [2, 1, 1, 1]


def test_a_task_that_cannot_be_split_is_refused() -> None:
    with pytest.raises(UserInputError, match="--folds 1 is invalid"):
        fold_count([_texts(["a", "b", "a", "b"])], 1)
    with pytest.raises(UserInputError, match="task 'lone' has 1 support row of one of its labels"):
        fold_count([_texts(["a", "b", "a", "b"]), _texts(["a", "a", "b"], "lone")], 4)


def _score(correct: list[int], nats: list[float]) -> Score:
    return Score.of([{"correct": bool(c), "answer_logprob": -n, "answer_tokens": 2} for c, n in zip(correct, nats)], 0.0)


def test_scores_and_paired_differences_equal_a_hand_computation() -> None:
    a, b = _score([1, 1, 1, 0], [1.0, 2.0, 3.0, 6.0]), _score([1, 0, 0, 0], [2.0, 2.0, 2.0, 2.0])
    assert a.accuracy == 0.75 and a.loss == 12.0 / 8
    assert a.accuracy_se == pytest.approx(math.sqrt(0.25 / 4))  # sample sd 0.5 over 4 rows
    d = a.minus(b)
    diffs = [0.0, 1.0, 1.0, 0.0]
    sd = math.sqrt(sum((x - 0.5) ** 2 for x in diffs) / 3)
    assert d[0] == 0.5 and d[1] == pytest.approx(sd / 2)
    assert d[2] == pytest.approx(12 / 8 - 8 / 8)
    nats = [-1.0, 0.0, 1.0, 4.0]  # per row, a less b
    sd = math.sqrt(sum((x - 1.0) ** 2 for x in nats) / 3)
    assert d[3] == pytest.approx(sd / 2 * 4 / 8)


def test_the_best_wins_only_by_more_than_its_error_and_ties_go_to_the_simpler() -> None:
    good = _score([1] * 12, [1.0] * 12)
    chance = _score([1, 0] * 6, [3.0] * 12)
    assert choose({"base": chance, "in_context": chance, "reptile": good}, ["base", "in_context", "reptile"])[0] == "reptile"
    one_row_better = _score([1, 1] + [1, 0] * 5, [3.0] * 12)
    chosen, why = choose({"base": chance, "reptile": one_row_better}, ["base", "reptile"])
    assert chosen == "base" and "the lowest loss among them" in why  # one row is no evidence; equal loss
    lower_loss = _score([1, 0] * 6, [2.0] * 12)
    assert choose({"base": chance, "fomaml": lower_loss}, ["base", "fomaml"])[0] == "fomaml"  # by every row
    noisy = _score([1, 0] * 6, [1.0, 4.8] * 6)  # lower on average, within its error
    chosen, why = choose({"base": chance, "fomaml": noisy}, ["base", "fomaml"])
    assert chosen == "base" and "the simpler" in why


def test_a_method_below_the_base_model_is_said_in_one_line() -> None:
    base = _score([1, 1, 1, 0] * 3, [1.0] * 12)
    assert "is below the base model's 0.750" in below_base("reptile", {"base": base, "reptile": _score([0] * 12, [1.0] * 12)})
    assert below_base("reptile", {"base": base, "reptile": base}) is None
    assert below_base("base", {"base": base}) is None
    worse_loss = _score([1, 1, 1, 0] * 3, [2.0] * 12)
    assert "is above the base model's" in below_base("fomaml", {"base": base, "fomaml": worse_loss})
