"""The two task types and the builders' options: each built complete, each refusing what is not its own."""

from __future__ import annotations

import numpy as np
import pytest

from fmmeta.sampling.source import EpisodeSource
from fmmeta.tasks import ClassificationTask, EpisodeSpec, GenerationTask, Task, TaskOptions
from fmmeta.tasks.builders import tasks_from_examples
from fmmeta.tasks.collection_config import CollectionSource
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()
SPEC = EpisodeSpec(shots=2, query=2)


def _cls_ids(n_classes: int = 3, per_class: int = 4) -> dict:
    return {
        "prompts": [(5 + c, 6 + i) for c in range(n_classes) for i in range(per_class)],
        "labels": [c for c in range(n_classes) for _ in range(per_class)],
        "class_answers": [(40 + c, 2) for c in range(n_classes)],
    }


def test_a_classification_task_cannot_be_built_without_class_names() -> None:
    with pytest.raises(TypeError, match="class_names"):
        ClassificationTask("c", spec=SPEC, **_cls_ids())  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"class_names=None is invalid: .* one display name per class \(3 classes\)"):
        ClassificationTask("c", spec=SPEC, class_names=None, **_cls_ids())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"class_names=\['a', 'b'\] is invalid"):
        ClassificationTask("c", spec=SPEC, class_names=["a", "b"], **_cls_ids())
    with pytest.raises(ValueError, match=r"class_names has empty or non-str names \[''\]"):
        ClassificationTask("c", spec=SPEC, class_names=["a", "", "c"], **_cls_ids())
    task = ClassificationTask("c", spec=SPEC, class_names=["a", "b", "c"], **_cls_ids())
    assert task.class_names == ("a", "b", "c") and task.ways == 3
    assert task.episode_size == (6, 6)


def test_a_generation_task_has_no_label_fields() -> None:
    task = GenerationTask.from_texts("g", [f"{i}+1=" for i in range(8)], [f" {i + 1}" for i in range(8)], TOK, spec=SPEC)
    for field in ("class_names", "ways", "is_classification"):
        assert not hasattr(task, field), field
    assert all(ex.label is None for ex in task.examples)
    ep = task.sample_episode(np.random.default_rng(0))
    assert ep.ways is None and ep.choices is None
    assert task.episode_size == (2, 2)
    with pytest.raises(ValueError, match="generation task but its spec has ways=2, remap_labels=False"):
        GenerationTask("g", prompts=[(5,)] * 4, answers=[(6,)] * 4, spec=EpisodeSpec(shots=1, query=1, ways=2))


def test_both_types_are_episode_sources_and_tasks() -> None:
    gen = tasks_from_examples("g", [(f"{i}=", f" {i}") for i in range(8)], TOK, TaskOptions(spec=SPEC))
    cls = tasks_from_examples("c", [{"prompt": f"n{i}", "label": i % 2} for i in range(8)], TOK,
                              TaskOptions(spec=SPEC, family="parity"), verbalizer=["even", "odd"])
    assert isinstance(gen, GenerationTask) and isinstance(cls, ClassificationTask)
    for task in (gen, cls):
        assert isinstance(task, Task) and isinstance(task, EpisodeSource)
    assert cls.family == "parity" and gen.family == "g"  # "" means the task's own name
    assert type(cls.with_spec(EpisodeSpec(shots=1, query=3))) is ClassificationTask
    assert type(gen.with_spec(EpisodeSpec(shots=1, query=3))) is GenerationTask


def test_task_options_are_checked_once_with_every_problem() -> None:
    with pytest.raises(ValueError) as err:
        TaskOptions(spec=SPEC, max_length=1, on_too_long="skip", separator=None, family=3)  # type: ignore[arg-type]
    msg = str(err.value)
    assert msg.startswith("TaskOptions: max_length=1 is invalid: it must be an int >= 2")
    assert "on_too_long='skip' is invalid: use 'drop' (skip and count such examples) or 'error'" in msg
    assert "separator=None is invalid: it must be a str" in msg
    assert "family=3 is invalid: it must be a str" in msg
    with pytest.raises(ValueError, match=r"TaskOptions: spec=\{'shots': 2\} is invalid: pass an EpisodeSpec"):
        TaskOptions(spec={"shots": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_length=True is invalid"):
        TaskOptions(spec=SPEC, max_length=True)
    options = TaskOptions(spec=SPEC)
    assert (options.max_length, options.on_too_long, options.separator, options.family) == (256, "drop", "\n\n", "")


def test_a_collection_source_maps_its_keys_onto_the_options() -> None:
    src = CollectionSource(path="x.jsonl", builder="dataset", family="qa", shots=3, query=1,
                           on_too_long="error")
    options = src.task_options(max_length=64)
    assert options == TaskOptions(spec=EpisodeSpec(shots=3, query=1), max_length=64,
                                  on_too_long="error", family="qa")
    with pytest.raises(ValueError, match="shots must be an int >= 1"):
        CollectionSource(path="x.jsonl", builder="dataset", shots=0).task_options(max_length=64)


def test_every_prompt_cut_to_fit_is_counted_and_said(caplog: pytest.LogCaptureFixture) -> None:
    """Prompts longer than max_length lost their opening tokens with no count and no word."""
    long = [tuple(range(5, 5 + 20))] * 4 + [(5, 6)] * 4  # 4 of 8 prompts need cutting
    with caplog.at_level("WARNING", logger="fmmeta.tasks.tokens"):
        gen = GenerationTask.from_ids("g", long, [(7, 2)] * 8, spec=SPEC, max_length=10)
        cls = ClassificationTask.from_ids("c", long, [0, 1] * 4, [(40, 2), (41, 2)], class_names=["a", "b"],
                                          spec=EpisodeSpec(shots=1, query=1), max_length=10)
    assert gen.n_cut == 4 and cls.n_cut == 4
    assert gen.with_spec(EpisodeSpec(shots=1, query=1)).n_cut == 4 and cls.with_spec(cls.spec).n_cut == 4
    assert [len(e.prompt_ids) for e in gen.examples][:5] == [8, 8, 8, 8, 2]
    said = [r.getMessage() for r in caplog.records]
    assert "task 'g': cut 4 of 8 prompts from the left to fit max_length=10" in said[0]
    assert "task 'c': cut 4 of 8 prompts" in said[1] and "raise tasks.max_length" in said[1]
    fits = GenerationTask.from_ids("ok", [(5, 6)] * 8, [(7, 2)] * 8, spec=SPEC, max_length=10)
    assert fits.n_cut == 0
