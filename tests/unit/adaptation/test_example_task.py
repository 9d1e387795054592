"""The shipped example task of ``fmmeta adapt`` (the README's one command) reads as written."""

from __future__ import annotations

from pathlib import Path

from fmmeta.adaptation.task_files import TaskFormat, build_task, read_task
from fmmeta.adaptation.task_list import task_list
from fmmeta.cli import COMMANDS
from fmmeta.tasks.testing import tiny_tokenizer

EXAMPLE = Path(__file__).resolve().parents[3] / "recipes" / "data" / "adapt_example" / "tasks.yaml"


def test_the_example_task_reads_with_its_labels_and_template() -> None:
    [files] = task_list(EXAMPLE, TaskFormat())
    texts = read_task(files)
    assert texts.labels == ("animal", "plant") and len(texts.support) == 8
    assert texts.prompts[0][0] == "Word: salmon\nKind:"
    task = build_task(texts, tiny_tokenizer(), max_length=48)
    assert all(task.query_known) and len(task.episode.query) == 8  # accuracy is reported
    assert [ex.label for ex in task.episode.support][:2] == [0, 1]


def test_fmmeta_adapt_is_a_command() -> None:
    assert COMMANDS["adapt"][0] == "fmmeta.recipes.adapt"
