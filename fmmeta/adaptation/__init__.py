"""From a meta-trained adapter to a user's new task: ``fmmeta adapt`` and :func:`adapt`.

A finished run's method adapts to a task the run never saw, from a handful of labelled support
rows, exactly as the run's held-out evaluation adapted its episodes (same inner loop, lr chosen on
validation, learned step sizes, demonstrations), then predicts the query rows and can write the
adapted adapter in peft format. :mod:`.method` reads the run, :mod:`.task_files` the user's rows,
:mod:`.session` adapts (many tasks in groups) and :mod:`.predict` ranks or decodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from fmmeta.adaptation.method import RunMethod, resolve_method
from fmmeta.adaptation.session import Adapted, Adapter
from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, UserTask, build_task

Rows = Sequence[Mapping[str, Any]] | str | Path


def _data(rows: Rows | None) -> Path | Sequence[Mapping[str, Any]] | None:
    return Path(rows) if isinstance(rows, str) else rows


def adapt(run: str | Path, method: str, support: Rows, query: Rows | None = None, *, replicate: int = 0,
          steps: int | None = None, lr: float | None = None, name: str = "task",
          max_new_tokens: int = 64, adapter: str | Path | None = None, **format_keys: Any) -> Adapted:
    """Adapts a run's ``method`` to one new task, as the run's evaluation adapts, and predicts its query.

    Args:
        run: a finished run folder (its ``config.yaml`` names the model it was trained on).
        method: a method the run trained, or ``base`` / ``in_context`` (its initial adapter).
        support: labelled rows (a file any task builder reads, or a list of dicts).
        query: rows to predict (labels optional: where given, accuracy and loss are reported,
            never used to adapt); ``None``: predict later with :meth:`Adapted.predict`.
        replicate: which training replicate's adapter (runs of ``train.replicates`` > 1).
        steps, lr: override the evaluation's steps and its lr chosen on validation.
        adapter: a peft adapter folder to adapt the way ``method`` adapts, instead of the
            method's own (e.g. one :meth:`Adapted.save` wrote); it must fit the run's model and LoRA.
        name: the task's name in predictions.
        max_new_tokens: longest greedy answer of a generation task.
        format_keys: the task source keys of :class:`~fmmeta.adaptation.task_files.TaskFormat`
            (``builder``, ``template``, ``text_column``, ``label_column``, ``labels``, ...).

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
    plan = resolve_method(Path(run), method, replicate=replicate, steps=steps, lr=lr,
                          adapter=None if adapter is None else Path(adapter))
    files = TaskFiles(name, _data(support), _data(query), TaskFormat().replace(**format_keys))  # type: ignore[arg-type]
    loaded = Adapter(plan, max_new_tokens=max_new_tokens)
    return loaded.adapt([loaded.build(files)])[0]


__all__ = ["Adapted", "Adapter", "RunMethod", "TaskFiles", "TaskFormat", "UserTask", "adapt", "build_task",
           "resolve_method"]
