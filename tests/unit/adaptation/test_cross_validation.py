"""Cross-validation on a user's support rows: the folds, the scores and the choice, computed by hand; a
metric registered here (and nowhere else) chooses."""

from __future__ import annotations

import math
from typing import Iterator

import pytest

from fmmeta.adaptation.cross_validation import (
    Score,
    below_base,
    choose,
    cross_validate,
    cv_metric,
    fold_count,
    folds,
    kind_of,
    scorable,
)
from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, read_task
from fmmeta.errors import UserInputError
from fmmeta.evaluation.metrics import METRICS, Metric, register_metric


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
    assert a.value("accuracy") == 0.75 and a.value("loss") == 12.0 / 8
    assert a.se("accuracy") == pytest.approx(math.sqrt(0.25 / 4))  # sample sd 0.5 over 4 rows
    accuracy, accuracy_se = a.minus(b, "accuracy")
    diffs = [0.0, 1.0, 1.0, 0.0]
    sd = math.sqrt(sum((x - 0.5) ** 2 for x in diffs) / 3)
    assert accuracy == 0.5 and accuracy_se == pytest.approx(sd / 2)
    loss, loss_se = a.minus(b, "loss")
    assert loss == pytest.approx(12 / 8 - 8 / 8)
    nats = [-1.0, 0.0, 1.0, 4.0]  # per row, a less b
    sd = math.sqrt(sum((x - 1.0) ** 2 for x in nats) / 3)
    assert loss_se == pytest.approx(sd / 2 * 4 / 8)
    assert a.as_dict() == {"accuracy": 0.75, "accuracy_se": 0.25, "loss": 1.5, "rows": 4, "seconds": 0.0,
                           "loss_se": round(math.sqrt(sum(r * r for r in [-2, -1, 0, 3]) / 3 / 4) * 4 / 8, 4)}
    # answers of unequal length: the paired error is still that of the row-by-row nats, per token
    tokens = [1, 3, 1, 3]
    c, d = (Score.of([{"correct": True, "answer_logprob": -n, "answer_tokens": t} for n, t in zip(nats, tokens)], 0.0)
            for nats in ([1.0, 2.0, 3.0, 6.0], [2.0, 2.0, 2.0, 2.0]))
    loss, loss_se = c.minus(d, "loss")
    assert loss == pytest.approx(12 / 8 - 8 / 8) and loss_se == pytest.approx(sd / 2 * 4 / 8)


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


GOLD = "gold_probability"


@pytest.fixture
def gold_probability() -> Iterator[Metric]:
    """A toy metric registered here only: the mean probability of the gold answer (higher is better)."""
    metric = register_metric(Metric(
        name=GOLD, compute=lambda s: sum(math.exp(lp) for lp in s.gold_logprob) / s.n, higher_is_better=True))
    try:
        yield metric
    finally:
        METRICS.pop(GOLD, None)


def _by_probability(correct: list[int], probability: list[float]) -> Score:
    return Score.of([{"correct": bool(c), "answer_logprob": math.log(p), "answer_tokens": 1}
                     for c, p in zip(correct, probability)], 0.0)


def _mean_and_se(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def test_a_registered_metric_chooses_in_its_direction_with_the_same_tie_rule(gold_probability: Metric) -> None:
    """fomaml answers every row right at a low gold probability; base and in_context half the rows
    at a higher one. Accuracy picks fomaml; the toy metric picks base, in_context tied with it (the
    same probabilities, row by row a paired difference of mean 0) and the loss equal: the simpler."""
    base = _by_probability([1, 0] * 4, [0.5, 0.6] * 4)
    in_context = _by_probability([0, 1] * 4, [0.6, 0.5] * 4)
    fomaml = _by_probability([1] * 8, [0.3, 0.2] * 4)
    scores, order = {"base": base, "in_context": in_context, "fomaml": fomaml}, ["base", "in_context", "fomaml"]
    assert choose(scores, order)[0] == "fomaml"  # accuracy 1.0 against 0.5, paired error 0.189

    mean, se = _mean_and_se([0.5, 0.6] * 4)
    assert base.value(GOLD) == pytest.approx(mean) and base.se(GOLD) == pytest.approx(se)
    difference, paired_se = base.minus(fomaml, GOLD)
    assert (difference, paired_se) == pytest.approx(_mean_and_se([0.2, 0.4] * 4))
    assert base.as_dict()[GOLD] == 0.55 and base.as_dict()[f"{GOLD}_se"] == round(se, 4)
    chosen, why = choose(scores, order, GOLD)
    loss = -(math.log(0.5) + math.log(0.6)) / 2
    assert chosen == "base"
    assert why == (f"cross-validated {GOLD} 0.550 ± {se:.3f}, loss {loss:.4f}; in_context within one paired "
                   f"standard error of the best {GOLD}: the lowest loss among them")
    assert choose({"base": base, "fomaml": fomaml}, ["base", "fomaml"], GOLD)[1].endswith(
        "ahead of every other candidate by more than the paired standard error")
    assert below_base("fomaml", scores) is None
    assert below_base("fomaml", scores, GOLD) == (
        f"fomaml's cross-validated {GOLD} on your support rows, 0.250, is below the base model's 0.550 by 0.300 ± "
        f"{paired_se:.3f}: its meta-training does not fit this task; --method base (or auto) adapts the base model "
        "instead")


def test_the_metric_is_one_that_scores_the_tasks_kinds_or_refused_with_those_that_do() -> None:
    texts = _texts(["a", "b", "a", "b"])
    assert cv_metric("loss", [texts]).higher_is_better is False
    assert scorable(frozenset({"multiple_choice"})) == ["accuracy", "loss"]  # the held rows rank by sums only
    with pytest.raises(UserInputError, match=r"--cv-metric 'acuracy' is not a registered metric \(did you mean "
                                             r"'accuracy'\?\): cross-validation of these tasks can choose by accuracy, loss"):
        cv_metric("acuracy", [texts])
    with pytest.raises(UserInputError, match="'accuracy_per_token' does not score classification tasks' held-out rows"):
        cv_metric("accuracy_per_token", [texts])


def test_a_metric_of_one_kind_scores_the_rows_of_that_kind_only() -> None:
    """Registered for generation only: cross-validation of a generation task scores it, of a
    classification task refuses it; its value is its compute on the held rows of every fold."""
    metric = register_metric(Metric(name="wrong_rows", compute=lambda s: float(s.n - sum(s.correct)),
                                    higher_is_better=False, kinds=frozenset({"generation"})))
    try:
        generation = read_task(TaskFiles("g", [{"input": str(i), "output": "x"} for i in range(5)], None,
                                         TaskFormat(builder="dataset")))
        assert kind_of(generation) == "generation" and cv_metric(metric.name, [generation]) is metric
        with pytest.raises(UserInputError, match="'wrong_rows' does not score classification tasks'"):
            cv_metric(metric.name, [_texts(["a", "b", "a", "b"])])

        def adapt_with(name: str, fold_tasks: list) -> list[list[dict]]:  # every other held row right
            return [[{"correct": i % 2 == 0, "answer_logprob": -1.0, "answer_tokens": 2} for i in range(len(t.prompts[1]))]
                    for t in fold_tasks]

        scores = cross_validate(adapt_with, ["base"], [generation], 4, lambda: 0.0)
        assert scores["base"].kinds == {"generation"}
        assert scores["base"].metrics == {"accuracy": 0.8, "loss": 0.5, "wrong_rows": 1.0}  # folds of 2, 1, 1, 1 rows
    finally:
        METRICS.pop("wrong_rows", None)
