"""Classes that no answer could tell apart are refused (docs/bad_inputs.md, issue 31): scoring
ranks the classes' answer words and counts a tie as wrong, so two classes with one word would
never be scored correct, and words that differ only in spaces are a typo in the data."""

from __future__ import annotations

import pytest

from fmmeta.tasks.classification import ClassificationTask
from fmmeta.tasks.labels import labels_to_classes
from fmmeta.tasks.spec import EpisodeSpec

SPEC = EpisodeSpec(shots=1, query=1, ways=2)


def _classes(values: list, verbalizer: dict | None = None) -> tuple[list[int], list[str], list[str]]:
    return labels_to_classes(values, verbalizer=verbalizer, feature_names=None, key="label", where="t")


def test_one_word_for_two_classes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"classes 'neg' and 'pos' have the same answer word \('bad', 'bad'\)"):
        _classes(["pos", "neg"] * 2, {"pos": "bad", "neg": "bad"})


def test_words_that_differ_only_in_spaces_are_refused() -> None:
    with pytest.raises(ValueError, match=r"classes 'yes' and 'yes ' have answer words that differ only in spaces"):
        _classes(["yes", "yes ", "no"] * 2)


def test_words_sharing_a_first_token_or_a_case_stay_apart() -> None:
    """Scoring compares whole answers, so a shared first token (or case) still tells them apart."""
    rows, words, names = _classes(["good", "goodness", "Good"] * 2)
    assert names == ["Good", "good", "goodness"] and words == names and rows[:3] == [1, 2, 0]


def test_a_tokenizer_that_makes_two_words_one_is_refused() -> None:
    """The answer ids are compared too: a tokenizer may map two written words to one sequence."""
    with pytest.raises(ValueError, match=r"task 'yn': classes 'yes' and 'Yes' have the same answer tokens"):
        ClassificationTask.from_ids("yn", [[5], [6]], [0, 1], [[7, 1], [7, 1]],
                                    class_names=["yes", "Yes"], spec=SPEC, max_length=8)
    task = ClassificationTask.from_ids("yn", [[5], [6], [5], [6]], [0, 1, 0, 1], [[7, 1], [8, 1]],
                                       class_names=["yes", "Yes"], spec=SPEC, max_length=8)
    assert len(task) == 4
