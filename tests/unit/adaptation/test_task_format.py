"""Adapt's format (fmmeta/adaptation/task_format.py): a builder and that builder's own section of
keys, set from the API, a --tasks list or a flag, each refused where the builder does not take it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, read_task
from fmmeta.adaptation.task_format import format_keys
from fmmeta.errors import UserInputError
from fmmeta.tasks.collection_config import CollectionSource
from fmmeta.tasks.registry import task_builder


@pytest.mark.parametrize("keys, match", [
    ({"builder": "chat", "text_column": "q"},
     "text_column='q' does not apply to builder='chat' (only to classification): remove it or change the builder "
     "(builder='chat' takes completion_column, messages_column, prompt_column)"),
    ({"builder": "dataset", "options_column": "choices"},
     "options_column='choices' does not apply to builder='dataset' (only to task_column / multiple_choice)"),
    ({"messages_colum": "turns"}, "messages_colum is not a key of builder='classification' (did you mean"),
    ({"task_name": "x"}, "task_name='x' is not a key of adapt: a user's task is named by --name"),
])  # fmt: skip
def test_a_key_the_builder_does_not_take_is_refused_naming_its_keys(keys: dict, match: str) -> None:
    with pytest.raises(UserInputError) as err:
        TaskFormat().replace(**keys)
    assert match in str(err.value)
    assert "unknown task key(s)" in str(err.value)


def test_every_key_of_every_adapt_builders_section_is_a_format_key() -> None:
    keys = format_keys()
    assert keys["messages_column"] == ["chat"] and keys["label_column"] == ["classification", "multiple_choice"]
    assert "task_name" not in keys and "task_column" not in keys  # task_column: no adapt format
    fmt = TaskFormat().replace(builder="chat", **{k: "c" for k in ("messages_column", "prompt_column",
                                                                  "completion_column")})
    assert fmt.keys == task_builder("chat").section(messages_column="c", prompt_column="c", completion_column="c")


def test_text_values_become_the_section_types_and_shared_keys_carry_over() -> None:
    fmt = TaskFormat().replace(builder="multiple_choice", option_columns="sol1, sol2", label_column="gold",
                               answer_format="index", template="{goal}")
    assert (fmt.keys.option_columns, fmt.keys.answer_format) == (["sol1", "sol2"], "index")
    assert TaskFormat().replace(verbalizer="{0: neg, 1: pos}").keys.verbalizer == {0: "neg", 1: "pos"}
    assert fmt.replace(builder="classification").keys.label_column == "gold"
    with pytest.raises(UserInputError, match="answer_format='idx' is invalid"):
        fmt.replace(answer_format="idx")


def test_the_verbalizer_names_the_labels_from_the_api_and_from_a_source(tmp_path: Path) -> None:
    support = [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]
    query = [{"text": "fine", "label": 1}]
    for fmt in (TaskFormat().replace(verbalizer="neg,pos"),
                TaskFormat.from_source(CollectionSource(path=str(tmp_path), builder="classification",
                                                        verbalizer={0: "neg", 1: "pos"}))):
        texts = read_task(TaskFiles("t", support, query, fmt))
        assert texts.labels == ("neg", "pos") and texts.answers == (["pos", "neg"], ["pos"])


def test_from_source_refuses_a_builder_of_many_tasks_per_file(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="has builder='task_column': a user's task is one task per support file"):
        TaskFormat.from_source(CollectionSource(path=str(tmp_path), builder="task_column"))


def test_the_adapt_flags_are_the_builders_keys(tmp_path: Path) -> None:
    import recipes.adapt as recipe

    args = recipe.parse_args(["--run", str(tmp_path), "--method", "fomaml", "--support", "s.jsonl", "--query",
                              "q.jsonl", "--builder", "chat", "--messages-column", "turns"])
    [files] = recipe.task_files(args)
    assert (files.format.builder, files.format.keys.messages_column) == ("chat", "turns")
    args.text_column = "q"
    with pytest.raises(UserInputError, match="text_column='q' does not apply to builder='chat'"):
        recipe.task_files(args)
