"""The recipe's ``tasks`` section: which tasks a run meta-trains on, and how they are tokenized.

Three ways to name the tasks, all from YAML: a built-in suite (``suite: cldr``), a Python suite
builder by import string (``suite: my_pkg.tasks:build``), or a collection of data sources
(``collection: [...]`` plus ``split:``), read by the builders of :mod:`fmmeta.tasks.builders`.
:func:`build_task_set` is the one call the recipes make.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fmmeta.errors import UserInputError
from fmmeta.tasks.collection_config import CollectionSource, CollectionSplit
from fmmeta.tasks.task import TaskSet

COLLECTION = "collection"
"""``tasks.suite`` value that builds ``tasks.collection`` (the default when it lists sources)."""


@dataclass(kw_only=True)
class TasksConfig:
    """Which tasks to build (a suite or a collection of sources) and how examples are tokenized."""

    suite: str | None = None
    """"cldr" (built-in CLDR suite), "synthetic" (tiny arithmetic), "package.module:function"
    (your builder) or "collection"; null = "collection" if collection lists sources, else "cldr"."""
    max_length: int = 48
    """Token budget of one example (>= 8); longer prompts are cut from the left, never the answer."""
    options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the suite builder (e.g. {n_held_out_languages: 5}); not for collections."""
    collection: list[CollectionSource] = field(default_factory=list)
    """Data sources, each a list item with path, builder (or preset), columns, templates, episode shape."""
    split: CollectionSplit = field(default_factory=CollectionSplit)
    """Which collection tasks are validation and held-out (names, families, files, shares)."""
    cache_dir: str | None = None
    """Folder for the collection's caches (tokenized/ and datasets/ inside); null = the datasets cache."""
    seed: int = 0
    """Seed of the task split, of max_examples draws and of evaluation's episodes (>= 0): what every
    training replicate shares, apart from the training seed (train.seed)."""

    def resolved_suite(self) -> str:
        """The suite this section builds, with ``suite: null`` resolved."""
        if self.suite is not None:
            return self.suite
        return COLLECTION if self.collection else "cldr"

    def validate(self) -> list[str]:
        """Range checks, the suite name, and the whole collection against its data: every problem
        is found here, before any model is loaded."""
        from fmmeta.tasks.collection import collection_problems
        from fmmeta.tasks.suites import option_problems, resolve_suite

        problems: list[str] = []
        if not self.seed >= 0:
            problems.append(f"seed={self.seed} is invalid: must be >= 0 (numpy's seed sequence)")
        if not self.max_length >= 8:
            problems.append(f"max_length={self.max_length} is invalid: must be >= 8 tokens")
        suite = self.resolved_suite()
        if suite != COLLECTION:
            try:
                resolve_suite(suite)
                problems.extend(option_problems(suite, self.options))
            except ValueError as err:
                problems.append(_suite_problem(suite, err))
            if self.collection:
                problems.append(
                    f"suite={suite!r} and collection ({len(self.collection)} sources) are both "
                    "set: remove suite (or set it to 'collection') to train on the collection"
                )
            if self.split != CollectionSplit():
                problems.append(
                    f"split is set but suite={suite!r} builds its own split: split applies to "
                    "tasks.collection only; remove it"
                )
            return problems
        if not self.collection:
            problems.append(
                "suite='collection' but collection is empty: list at least one source "
                "(path + builder or preset)"
            )
        if self.options:
            problems.append(
                f"options={self.options!r} is set but a collection takes no suite options: "
                "put the settings on each source"
            )
        # The check reads with the build's seed and budget, so the build can take the rows it read.
        problems.extend(collection_problems(self.collection, self.split, seed=max(self.seed, 0),
                                            cache_dir=self.cache_dir, max_length=self.max_length))
        return problems


def _suite_problem(suite: str, err: ValueError) -> str:
    if ":" in suite:
        return f"suite={suite!r} is invalid: {err}"
    import difflib

    from fmmeta.tasks.suites import available_suites

    names = available_suites()
    close = difflib.get_close_matches(suite, names, n=1)
    return (
        f"suite={suite!r} is invalid: choose one of {names}"
        + (f"; did you mean {close[0]!r}?" if close else "")
        + " Or list sources under tasks.collection, or name your own builder as "
        "'package.module:function'"
    )


def build_task_set(cfg: TasksConfig, tokenizer: Any, *, seed: int | None = None) -> TaskSet:
    """Builds the task set ``cfg`` names: a suite, an imported builder or a collection.

    Args:
        cfg: the (validated) tasks section.
        tokenizer: the model's tokenizer.
        seed: the seed of splits, ``max_examples`` draws and suite shuffles; ``None`` =
            ``cfg.seed`` (``tasks.seed``), which every training replicate of a run shares.

    Example:
        >>> cfg = load_config(RecipeConfig, "recipes/configs/own_tasks.yaml", [])  # doctest: +SKIP
        >>> suite = build_task_set(cfg.tasks, tokenizer)  # doctest: +SKIP
    """
    seed = cfg.seed if seed is None else seed
    suite = cfg.resolved_suite()
    try:
        if suite == COLLECTION:
            from fmmeta.tasks.collection import build_collection

            return build_collection(
                cfg.collection, cfg.split, tokenizer, seed=seed, max_length=cfg.max_length,
                cache_dir=cfg.cache_dir,
            )  # fmt: skip
        from fmmeta.tasks.suites import build_suite

        return build_suite(suite, tokenizer, seed=seed, max_length=cfg.max_length, **cfg.options)
    except ValueError as err:  # the builders' refusals of the data, each naming task and fix
        # Only here is it known that the budget came from tasks.max_length: say so, since the
        # builder's message cannot name the key the user has to change.
        fix = (f" Raise tasks.max_length (now {cfg.max_length} tokens per example) so the examples "
               "fit, or shorten them." if "too long for max_length" in str(err) else "")
        raise UserInputError(f"tasks (suite {suite!r}) could not be built: {str(err).rstrip('.')}.{fix}") from err


__all__ = ["COLLECTION", "CollectionSource", "CollectionSplit", "TasksConfig", "build_task_set"]
