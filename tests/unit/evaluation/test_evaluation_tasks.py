"""eval.query: evaluation episodes with more queries per class, everything else as the task's own."""

from __future__ import annotations

import pytest

from fmmeta.errors import UserInputError
from fmmeta.evaluation.run import draw_episodes, evaluation_tasks
from fmmeta.tasks.suites.cldr import build_cldr_suite
from fmmeta.tasks.task import ClassificationTask
from fmmeta.tasks.testing import tiny_tokenizer

SUITE = build_cldr_suite(tiny_tokenizer(), seed=0, max_length=128)


def test_none_keeps_every_task_as_it_is() -> None:
    tasks = evaluation_tasks(SUITE.held_out, None)
    assert [id(t) for t in tasks] == [id(t) for t in SUITE.held_out]


def test_episodes_get_the_query_size_and_keep_their_support_size() -> None:
    own = draw_episodes(SUITE.held_out, 0, 1, 1)
    more = draw_episodes(evaluation_tasks(SUITE.held_out, 6), 0, 1, 1)
    assert [e.task for e in more] == [e.task for e in own]
    for task, a, b in zip(SUITE.held_out, own, more):
        ways = task.ways if isinstance(task, ClassificationTask) else 1
        assert len(a.query) == task.spec.query * ways and len(b.query) == 6 * ways, task.name
        assert len(b.support) == len(a.support) == task.spec.shots * ways, task.name
        assert not {x.prompt_ids for x in b.support} & {x.prompt_ids for x in b.query}, task.name
    # Drawn from the seed alone: every method of an evaluation sees these same episodes.
    again = draw_episodes(evaluation_tasks(SUITE.held_out, 6), 0, 1, 1)
    assert [[x.prompt_ids for x in e.query] for e in again] == [[x.prompt_ids for x in e.query] for e in more]


def test_a_query_size_no_task_can_supply_is_refused_with_the_key() -> None:
    with pytest.raises(UserInputError, match=r"eval.query=500 is too many for task '.+'.*lower eval.query"):
        evaluation_tasks(SUITE.held_out, 500)


def test_a_held_out_family_named_like_its_only_task_keeps_its_table() -> None:
    """``Task.family`` defaults to the task's name, so such families get no table of their own;
    but a family the config holds out by name did vanish from every per-family table."""
    from types import SimpleNamespace

    from fmmeta.evaluation.run import report_families

    tasks = [SimpleNamespace(name="boolq", family="boolq"), SimpleNamespace(name="rte", family="entailment"),
             SimpleNamespace(name="mrpc", family="mrpc")]
    assert report_families(tasks) == {"rte": "entailment"}  # mrpc, boolq: no family of their own
    assert report_families(tasks, ["boolq", "entailment"]) == {"boolq": "boolq", "rte": "entailment"}
    cldr = report_families(SUITE.held_out)
    assert set(cldr.values()) == {t.family for t in SUITE.held_out}  # the built-in suite: unchanged
