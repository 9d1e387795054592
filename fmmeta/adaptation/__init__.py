"""From a meta-trained adapter to a user's new task: ``fmmeta adapt`` and :func:`adapt`.

A finished run's method adapts to a task the run never saw, from a handful of labelled support
rows, exactly as the run's held-out evaluation adapted its episodes (same inner loop, lr chosen on
validation, learned step sizes, demonstrations), then predicts the query rows and can write the
adapted adapter in peft format. :mod:`.method` reads the run, :mod:`.task_files` the user's rows,
:mod:`.session` adapts (many tasks in groups), :mod:`.predict` ranks or decodes, and
:mod:`.cross_validation` chooses among the run's methods on the user's own rows (``auto``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from fmmeta.adaptation.cross_validation import DEFAULT_FOLDS, DEFAULT_METRIC, fold_count
from fmmeta.adaptation.cross_validation import cv_metric as checked_metric
from fmmeta.adaptation.method import AUTO, RunMethod, candidate_methods, resolve_method
from fmmeta.adaptation.session import Adapted, Adapter
from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, UserTask, build_task, read_task
from fmmeta.errors import UserInputError

Rows = Sequence[Mapping[str, Any]] | str | Path


def _data(rows: Rows | None) -> Path | Sequence[Mapping[str, Any]] | None:
    return Path(rows) if isinstance(rows, str) else rows


def adapt(run: str | Path, method: str, support: Rows, query: Rows | None = None, *, replicate: int = 0,
          steps: int | None = None, lr: float | None = None, name: str = "task",
          max_new_tokens: int = 64, adapter: str | Path | None = None, folds: int = DEFAULT_FOLDS,
          cv_metric: str = DEFAULT_METRIC, **format_keys: Any) -> Adapted:
    """Adapts a run's ``method`` to one new task, as the run's evaluation adapts, and predicts its query.

    Args:
        run: a finished run folder (its ``config.yaml`` names the model it was trained on).
        method: a method the run trained, ``base`` / ``in_context`` (its initial adapter), or
            ``auto``: the candidate that does best in cross-validation on the support rows
            (:mod:`~fmmeta.adaptation.cross_validation`; its scores in ``.comparison``).
        support: labelled rows (a file any task builder reads, or a list of dicts).
        query: rows to predict (labels optional: where given, accuracy and loss are reported,
            never used to adapt); ``None``: predict later with :meth:`Adapted.predict`.
        replicate: which training replicate's adapter (runs of ``train.replicates`` > 1).
        steps, lr: override the evaluation's steps and its lr chosen on validation.
        adapter: a peft adapter folder to adapt the way ``method`` adapts, instead of the
            method's own (e.g. one :meth:`Adapted.save` wrote); it must fit the run's model and LoRA.
        name: the task's name in predictions.
        max_new_tokens: longest greedy answer of a generation task.
        folds: cross-validation folds of ``auto``.
        cv_metric: the registered metric (:mod:`fmmeta.evaluation.metrics`) ``auto`` chooses by;
            it must apply to the task's kind.
        format_keys: how the rows are read (:class:`~fmmeta.adaptation.task_format.TaskFormat`):
            ``builder``, ``template``, ``answer_template``, ``labels``, and any key of that
            builder's own section (``text_column``; chat's ``messages_column``, ...); a key the
            builder does not take is refused, naming the keys it does.

    Returns:
        The adapted task: ``.predictions`` of the query, ``.predict(rows)``, ``.save(folder)``.

    Raises:
        UserInputError: a bad run, method, override or rows (before the model loads, where the
            run alone decides).

    Example:
        >>> import fmmeta
        >>> adapted = fmmeta.adapt("runs/default", "reptile", "support.csv", "query.csv",
        ...                        template="Country: {text}\\nContinent:")  # doctest: +SKIP
        >>> adapted.predictions[0]["prediction"]; adapted.save("my_adapter")  # doctest: +SKIP
    """
    files = TaskFiles(name, _data(support), _data(query), TaskFormat().replace(**format_keys))  # type: ignore[arg-type]
    if method != AUTO:
        if cv_metric != DEFAULT_METRIC:
            raise UserInputError(f"cv_metric={cv_metric!r} with method={method!r}: the metric chooses a method "
                                 f"by cross-validation, for method={AUTO!r} only")
        plan = resolve_method(Path(run), method, replicate=replicate, steps=steps, lr=lr,
                              adapter=None if adapter is None else Path(adapter))
        loaded = Adapter(plan, max_new_tokens=max_new_tokens)
        return loaded.adapt([loaded.build(files)])[0]
    if steps is not None or lr is not None or adapter is not None:
        raise UserInputError(f"method={AUTO!r} compares the run's methods as its evaluation adapts them: drop steps, "
                             "lr and adapter, or name the method they apply to")
    plans, skipped = candidate_methods(Path(run), replicate)
    texts = read_task(files)
    k = fold_count([texts], folds)
    checked_metric(cv_metric, [texts])  # before the model loads
    loaded = Adapter(next(iter(plans.values())), max_new_tokens=max_new_tokens)
    comparison = loaded.compare(plans, [texts], k, skipped, time.monotonic, cv_metric)
    loaded = loaded.with_method(plans[comparison.chosen])
    return dataclasses.replace(loaded.adapt([loaded.build(texts)])[0], comparison=comparison)


__all__ = ["Adapted", "Adapter", "RunMethod", "TaskFiles", "TaskFormat", "UserTask", "adapt", "build_task",
           "resolve_method"]
