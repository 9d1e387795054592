"""Tasks in the in-context format (``algorithm.inner_format=in_context``): the same draws as the
task's plain episodes, formatted; which methods adapt that way; the key's check."""

from __future__ import annotations

import numpy as np
import pytest

from fmmeta.algorithms.build import METHODS
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.config import ConfigError, raise_if_invalid
from fmmeta.tasks import ClassificationTask, EpisodeSpec
from fmmeta.tasks.in_context import InContextTask
from fmmeta.tasks.testing import tiny_tokenizer


def _task() -> ClassificationTask:
    prompts = [f"Text: {w} {w}\nLabel:" for w in ["one", "two", "three", "four", "five", "six"] * 4]
    labels = [i % 2 for i in range(len(prompts))]
    return ClassificationTask.from_texts("t", prompts, labels, ["yes", "no"], tiny_tokenizer(),
                                         spec=EpisodeSpec(shots=2, query=2, ways=2), family="fam")


def test_an_in_context_task_draws_the_plain_episode_formatted() -> None:
    task = _task()
    wrapped = InContextTask(task, max_length=4096)
    assert (wrapped.name, wrapped.family, len(wrapped)) == (task.name, task.family, len(task))
    plain = task.sample_episode(np.random.default_rng(7))
    shown = wrapped.sample_episode(np.random.default_rng(7))
    assert shown == plain.in_context(4096)
    assert [x.answer_ids for x in shown.support] == [x.answer_ids for x in plain.support]
    # each support row ends with its own prompt and holds the others' prompts, not its own twice
    for i, (row, ex) in enumerate(zip(shown.support, plain.support)):
        assert row.prompt_ids[-len(ex.prompt_ids):] == ex.prompt_ids
        assert len(row.prompt_ids) == len(ex.prompt_ids) + sum(
            o.n_tokens + len(plain.separator_ids) for j, o in enumerate(plain.support) if j != i)


def test_only_the_adapting_methods_adapt_in_context() -> None:
    cfg = AlgorithmConfig(inner_format="in_context")
    assert [m for m in ("fomaml", "metasgd", "reptile", "multitask", "metaicl")
            if METHODS[m].adapts_in_context(cfg)] == ["fomaml", "metasgd", "reptile"]
    assert not METHODS["fomaml"].adapts_in_context(AlgorithmConfig())


def test_an_unknown_inner_format_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"inner_format='icl' is invalid: allowed \['plain', 'in_context'\]"):
        raise_if_invalid(AlgorithmConfig(inner_format="icl"))
