"""Multiple-choice tasks: every layout and answer encoding public datasets use, read the same way.

Rows are written here as ``datasets`` holds them (a list column, ARC's ``{text, label}`` dict column,
one column per option; answers as 0-based indices, 1-based numbers, letters, keys and option texts),
through the Python builder, a YAML collection over ``save_to_disk`` folders and the token cache.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
import yaml

from fmmeta.config import ConfigError, load_config
from fmmeta.evaluation.result import MULTIPLE_CHOICE, kind_of
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.builders import classification_tasks, multiple_choice_tasks
from fmmeta.tasks.choice_rows import multiple_choice_rows
from fmmeta.tasks.config import build_task_set
from fmmeta.tasks.multiple_choice import MultipleChoiceTask
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.task import EpisodeSpec
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()
SPEC = EpisodeSpec(shots=2, query=2)
OPTIONS = [["red", "green", "blue"], ["cat", "dog", "cow"], ["one", "two", "three"], ["up", "down", "left"],
           ["hot", "cold", "warm"], ["sea", "sky", "sand"]]
GOLD = [2, 0, 1, 1, 2, 0]


def _layouts() -> dict[str, tuple[datasets.Dataset, dict]]:
    """The same six questions in every layout and answer encoding the builder reads."""
    q = [f"question {i}" for i in range(6)]
    letters = ["ABC"[g] for g in GOLD]
    per_column = {f"o{j}": [o[j] for o in OPTIONS] for j in range(3)}
    return {
        "list + index": (datasets.Dataset.from_dict({"q": q, "opts": OPTIONS, "label": GOLD}),
                         {"options_column": "opts"}),
        "list + digit index": (datasets.Dataset.from_dict({"q": q, "opts": OPTIONS, "label": [str(g) for g in GOLD]}),
                               {"options_column": "opts", "answer_format": "index"}),
        "columns + number": (datasets.Dataset.from_dict({"q": q, **per_column, "label": [str(g + 1) for g in GOLD]}),
                             {"option_columns": ["o0", "o1", "o2"], "answer_format": "number"}),
        "list + letter": (datasets.Dataset.from_dict({"q": q, "opts": OPTIONS, "label": letters}),
                          {"options_column": "opts"}),
        "dict + key": (datasets.Dataset.from_dict({
            "q": q, "choices": [{"text": o, "label": ["1", "2", "3"] if i % 2 else ["A", "B", "C"]}
                                for i, o in enumerate(OPTIONS)],
            "answerKey": [("123" if i % 2 else "ABC")[g] for i, g in enumerate(GOLD)]}),
            {"options_column": "choices", "label_column": "answerKey"}),
        "columns + text": (datasets.Dataset.from_dict({"q": q, **per_column, "answer": [o[g] for o, g in zip(OPTIONS, GOLD)]}),
                           {"option_columns": ["o0", "o1", "o2"], "label_column": "answer"}),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_every_layout_and_answer_encoding_reads_the_same_gold_option(layout: str) -> None:
    ds, keys = _layouts()[layout]
    rows = multiple_choice_rows(ds, name="t", spec=SPEC, template="Q: {q}\nA:", **keys)
    assert rows.labels == GOLD
    assert rows.options == [[f" {o}" for o in opts] for opts in OPTIONS]
    (task,) = multiple_choice_tasks(ds, TOK, TaskOptions(spec=SPEC), name="t", template="Q: {q}\nA:", **keys)
    assert isinstance(task, MultipleChoiceTask)
    for ex, opts, g in zip(task.examples, OPTIONS, GOLD):
        assert ex.options is not None and [TOK.decode(o) for o in ex.options] == [f" {o}</s>" for o in opts]
        assert ex.label == g and ex.answer_ids == ex.options[g]  # training reads the gold option


def test_a_shown_option_list_and_letter_answers() -> None:
    ds, keys = _layouts()["list + index"]
    rows = multiple_choice_rows(ds, name="t", spec=SPEC, template="{q}\n{options}\nAnswer:",
                                answer_template=" {letter}", **keys)
    assert rows.prompts[0] == "question 0\nA. red\nB. green\nC. blue\nAnswer:"
    assert rows.options[0] == [" A", " B", " C"]


@pytest.mark.parametrize("answer, fmt, match", [
    ("7", "index", "row 2 .*not one of the row's 3 options"),
    ("3", "auto", "row 2 .*digit string.*index .0-based. or number .1-based."),
    ("purple", "auto", "row 2 .*'purple' is not one of"),
    ("D", "letter", "row 2 .*'D' is not one of"),
])
def test_an_answer_not_among_its_options_is_refused_with_the_row_named(answer: str, fmt: str, match: str) -> None:
    others = {"index": ["0", "1", "2", "0", "1"], "letter": ["A", "B", "C", "A", "B"]}.get(
        fmt, ["red", "cat", "up", "hot", "sea"])
    labels = [*others[:2], answer, *others[2:]]
    ds = datasets.Dataset.from_dict({"q": [f"q{i}" for i in range(6)], "opts": OPTIONS, "label": labels})
    with pytest.raises(ValueError, match=match):
        multiple_choice_rows(ds, name="t", spec=SPEC, template="{q}", options_column="opts", answer_format=fmt)  # type: ignore[arg-type]


def test_questions_with_one_option_or_repeated_options() -> None:
    ds = datasets.Dataset.from_dict({"q": ["a", "b"], "opts": [["x"], ["y", "z"]], "label": [0, 0]})
    with pytest.raises(ValueError, match="row 0 has options \\['x'\\]: a question needs 2 to 26"):
        multiple_choice_rows(ds, name="t", spec=SPEC, template="{q}", options_column="opts")
    # Repeated options (SciQ has some) can never be ranked first: the question is dropped, counted.
    ids = [[5, 6], [7, 8], [9, 10], [11, 12], [13, 14]]
    opts = [[[20, 2], [21, 2]], [[20, 2], [20, 2]], [[22, 2], [23, 2]], [[24, 2], [25, 2]], [[26, 2], [27, 2]]]
    task = MultipleChoiceTask.from_ids("t", ids, opts, [0, 1, 1, 0, 1], spec=SPEC)
    assert len(task) == 4 and task.n_dropped == 1


def test_episodes_keep_each_questions_options_through_in_context_demonstrations() -> None:
    ds, keys = _layouts()["list + index"]
    (task,) = multiple_choice_tasks(ds, TOK, TaskOptions(spec=SPEC), name="t", template="{q}", **keys)
    ep = task.sample_episode(np.random.default_rng(0))
    assert kind_of(ep) == MULTIPLE_CHOICE and ep.choices is None
    for plain, icl in zip(ep.query, ep.in_context_query()):
        assert icl.options == plain.options and icl.label == plain.label
        assert icl.prompt_ids[-len(plain.prompt_ids):] == plain.prompt_ids
        assert icl.prompt_ids[: len(ep.support[0].prompt_ids)] == ep.support[0].prompt_ids


def test_a_yaml_collection_of_saved_multiple_choice_folders_through_the_token_cache(tmp_path: Path) -> None:
    for name, (ds, _) in (("letters", _layouts()["list + letter"]), ("digits", _layouts()["list + digit index"]),
                          ("more", _layouts()["list + letter"])):
        ds.save_to_disk(str(tmp_path / "data" / name / "validation"))
    raw = {"tasks": {"cache_dir": str(tmp_path / "cache"), "collection": [
        {"path": str(tmp_path / "data" / "letters"), "builder": "multiple_choice", "template": "Q: {q}\nA:",
         "options_column": "opts", "shots": 2, "query": 2, "family": "quiz"},
        {"path": str(tmp_path / "data" / "digits"), "builder": "multiple_choice", "template": "Q: {q}\nA:",
         "options_column": "opts", "answer_format": "index", "shots": 2, "query": 2},
        {"path": str(tmp_path / "data" / "more"), "builder": "multiple_choice", "template": "Q: {q}\nA:",
         "options_column": "opts", "shots": 2, "query": 2}],
        "split": {"held_out": ["digits"], "validation": ["more"]}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(RecipeConfig, str(tmp_path / "c.yaml"), [])
    fresh = build_task_set(cfg.tasks, TOK)
    cached = build_task_set(cfg.tasks, TOK)  # read back from the cache
    for suite in (fresh, cached):
        assert [t.name for t in suite.meta_train] == ["letters"] and [t.name for t in suite.held_out] == ["digits"]
        assert all(isinstance(t, MultipleChoiceTask) for t in (*suite.meta_train, *suite.held_out))
    assert [e.options for e in fresh.meta_train[0].examples] == [e.options for e in cached.meta_train[0].examples]
    assert [e.label for e in cached.held_out[0].examples] == GOLD


@pytest.mark.parametrize("keys, match", [
    ({"options_column": "opts"}, "template is missing"),
    ({"template": "{q}"}, "exactly one of options_column"),
    ({"template": "{q}", "options_column": "opts", "ways": 2}, "ways and remap_labels do not apply"),
    ({"template": "{q}", "options_column": "opts", "answer_format": "roman"}, "answer_format"),
])
def test_a_multiple_choice_source_without_its_keys_is_refused_before_reading(tmp_path: Path, keys: dict, match: str) -> None:
    _layouts()["list + index"][0].save_to_disk(str(tmp_path / "quiz"))
    raw = {"tasks": {"collection": [{"path": str(tmp_path / "quiz"), "builder": "multiple_choice", **keys}]}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=match):
        load_config(RecipeConfig, str(tmp_path / "c.yaml"), [])


def test_sentence_pairs_and_yes_no_answers_classify_through_the_template() -> None:
    """RTE's two sentences and BoolQ's bool answers, with no text column and no preprocessing."""
    pairs = datasets.Dataset.from_dict(
        {"sentence1": [f"premise {i}" for i in range(8)], "sentence2": [f"claim {i}" for i in range(8)],
         "label": [i % 2 for i in range(8)]},
        features=datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["entailment", "not_entailment"])}))
    (rte,) = classification_tasks(pairs, TOK, TaskOptions(spec=EpisodeSpec(shots=1, query=1)), name="rte",
                                  template="{sentence1}\nQ: {sentence2}?\nA:", verbalizer=["True", "False"])
    assert TOK.decode(rte.examples[0].prompt_ids) == "premise 0\nQ: claim 0?\nA:"
    assert [TOK.decode(rte.examples[i].answer_ids) for i in (0, 1)] == [" True</s>", " False</s>"]
    yes_no = datasets.Dataset.from_dict({"passage": [f"p{i}" for i in range(8)], "question": [f"q{i}" for i in range(8)],
                                         "answer": [bool(i % 2) for i in range(8)]})
    (boolq,) = classification_tasks(yes_no, TOK, TaskOptions(spec=EpisodeSpec(shots=1, query=1)), name="boolq",
                                    template="{passage}\n{question}?", label_column="answer",
                                    verbalizer={"False": "no", "True": "yes"})
    assert [TOK.decode(boolq.examples[i].answer_ids) for i in (0, 1)] == [" no</s>", " yes</s>"]


def test_answers_that_read_two_ways_are_refused_with_both_readings() -> None:
    """Each was read one way without a word: 1-based integers as 0-based, a letter that is also an
    option's text as that text, a key two options share as the first, a text two options match
    once spaces are stripped as the first."""
    import pytest

    from fmmeta.tasks.choice_rows import check_answer_column, gold_index, question_options

    with pytest.raises(ValueError, match=r"integers from 1 to 3 and never 0, which reads two ways: 0-based .* "
                                         r"1-based .* set answer_format to index \(0-based\) or number"):
        check_answer_column([1, 3, 2, 1], "auto", where="t")
    check_answer_column([1, 0, 3], "auto", where="t")  # a 0: 0-based
    check_answer_column([1, 3], "number", where="t")  # said
    with pytest.raises(ValueError, match=r"'A' reads two ways: as a letter it is option A \('C'\), as text it is "
                                         r"option B \('A'\)"):
        gold_index("A", ["C", "A", "B"], None, "auto", where="t")
    assert gold_index("A", ["A", "B", "C"], None, "auto", where="t") == 0  # both readings agree
    assert gold_index("A", ["C", "A", "B"], None, "text", where="t") == 1  # said
    with pytest.raises(ValueError, match=r"\['A'\] name more than one option"):
        question_options({"text": ["x", "y", "z"], "label": ["A", "B", "A"]}, where="t")
    with pytest.raises(ValueError, match=r"'yes' is the text of options \['yes ', ' yes'\]"):
        gold_index("yes", ["yes ", "no", " yes"], None, "auto", where="t")
    assert gold_index("yes", ["yes ", "no", "yes"], None, "text", where="t") == 2  # the exact one
