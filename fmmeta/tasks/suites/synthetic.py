"""A tiny deterministic suite for tests: arithmetic that any tokenizer can spell.

Two families, mirroring the CLDR suite's shape at a fraction of its size: ``add{k}`` generation
tasks (``"7+3="`` -> ``" 10"``) and ``mod{m}`` 3-way classification of a number by its remainder,
with labels remapped per episode, so recipe and algorithm tests exercise both episode kinds in
milliseconds.
"""

from __future__ import annotations

from typing import Any

from fmmeta.tasks.task import (
    ClassificationTask,
    EpisodeSpec,
    GenerationTask,
    OnTooLong,
    Task,
    TaskSet,
    split_tasks,
)

SYNTHETIC_POOL: tuple[str, ...] = ("red", "blue", "green", "gold", "gray", "pink")


def build_synthetic_suite(
    tokenizer: Any,
    *,
    seed: int = 0,
    max_length: int = 32,
    n_generation_tasks: int = 8,
    n_classification_tasks: int = 5,
    n_examples: int = 24,
    shots: int = 2,
    query: int = 2,
    on_too_long: OnTooLong = "drop",
) -> TaskSet:
    """Builds ``add{k}`` and ``mod{m}`` tasks and splits each family 60/20/20 by task.

    Args:
        tokenizer: any Hugging Face tokenizer (e.g. :func:`fmmeta.tasks.testing.tiny_tokenizer`).
        seed: seeds the split of tasks into meta-train / validation / held-out.
        max_length: token budget of one example.
        n_generation_tasks: ``add1 .. addN`` tasks (>= 3 so every split gets one).
        n_classification_tasks: ``mod3 .. mod(N+2)`` tasks; 0 builds none.
        n_examples: examples per task (>= shots + query, and per class for classification).
        shots: support examples (per class for classification).
        query: query examples (per class for classification).
        on_too_long: what to do with an example whose answer cannot fit ``max_length``.

    Returns:
        Disjoint meta-train / validation / held-out task lists.
    """
    if n_generation_tasks < 3:
        raise ValueError(
            f"n_generation_tasks={n_generation_tasks} is too small: use >= 3 so meta-train, "
            "validation and held-out each get a task"
        )
    gen_spec = EpisodeSpec(shots=shots, query=query)
    gen = [
        GenerationTask.from_texts(
            f"add{k}",
            [f"{a}+{k}=" for a in range(n_examples)],
            [f" {a + k}" for a in range(n_examples)],
            tokenizer,
            spec=gen_spec,
            family="arithmetic",
            max_length=max_length,
            on_too_long=on_too_long,
        )
        for k in range(1, n_generation_tasks + 1)
    ]
    cls_spec = EpisodeSpec(
        shots=shots, query=query, ways=3, remap_labels=True, label_pool=SYNTHETIC_POOL
    )
    cls: list[Task] = []
    for m in range(3, 3 + n_classification_tasks):
        values = range(m * (shots + query) + n_examples)
        cls.append(
            ClassificationTask.from_texts(
                f"mod{m}",
                [f"{a} mod {m}?" for a in values],
                [a % m for a in values],
                [f"r{r}" for r in range(m)],
                tokenizer,
                spec=cls_spec,
                family="modulo",
                max_length=max_length,
            )
        )
    parts = [split_tasks(gen, seed=seed, fractions=(0.6, 0.2, 0.2))]
    if len(cls) >= 3:
        parts.append(split_tasks(cls, seed=seed, fractions=(0.6, 0.2, 0.2)))
    elif cls:
        parts.append(TaskSet(meta_train=cls))
    return TaskSet(
        meta_train=[t for p in parts for t in p.meta_train],
        validation=[t for p in parts for t in p.validation],
        held_out=[t for p in parts for t in p.held_out],
    )
