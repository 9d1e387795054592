"""A run's adapter loaded once, adapting many user tasks in groups: :class:`Adapter`, :class:`Adapted`.

The model, the run's adapter and the method's adaptation settings load once; tasks are then
adapted as the evaluation adapts its episodes, in groups whose support rows share passes, each
task through its own slice of stacked fp32 fast weights
(:func:`~fmmeta.evaluation.adaptation.adapting`: the project's one inner loop, not a copy of it).
A hundred small tasks thus cost a few passes per step, not a hundred processes each loading the
model. Each task's adapted weights are kept (fp32) so they can be written as a peft adapter or
used again for new rows.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from fmmeta.adaptation.cross_validation import DEFAULT_METRIC, Comparison, choose, cross_validate, cv_metric
from fmmeta.adaptation.method import RunMethod
from fmmeta.adaptation.predict import generate, rank, subset_route
from fmmeta.adaptation.task_files import TaskFiles, TaskTexts, UserTask, build_task, read_rows
from fmmeta.algorithms.inner_loop import restore, snapshot
from fmmeta.algorithms.passes import answer_tokens_per_task
from fmmeta.algorithms.task_lora import TaskLoRA
from fmmeta.evaluation.adaptation import adapting, by_length, groups_of, support_passes
from fmmeta.evaluation.methods import BASE, IN_CONTEXT, EvalMethod
from fmmeta.models.build import adapter_names

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Adapted:
    """One task adapted: its fp32 fast weights, and the predictions of its query rows.

    Example:
        >>> adapted = fmmeta.adapt("runs/default", "reptile", "support.csv", "query.csv")  # doctest: +SKIP
        >>> adapted.predictions[0]["prediction"], adapted.predict([{"text": "Lyon"}])[0]  # doctest: +SKIP
        >>> adapted.save("my_task_adapter")   # PeftModel.from_pretrained(base, "my_task_adapter")
    """

    task: UserTask
    adapter: Adapter
    fast: list[torch.Tensor]
    predictions: list[dict[str, Any]]
    comparison: Comparison | None = None
    """With ``method="auto"``: every candidate's cross-validated score and the choice."""

    def predict(self, rows: Sequence[Mapping[str, Any]] | str | Path) -> list[dict[str, Any]]:
        """Predictions for new rows (a file or dicts, read as the query was), through this task's
        adapted weights and, for in-context methods, its support as demonstrations."""
        task = self.adapter.build(TaskFiles(self.task.name, self.task.support_rows, _rows(rows),
                                            dataclasses.replace(self.task.format, labels=self.task.labels or None)))
        with self.adapter.active([f.unsqueeze(0) for f in self.fast]) as lora:
            return self.adapter.predict([task], lora)[0]

    def save(self, folder: str | Path) -> Path:
        """Writes the adapted adapter in peft format (``PeftModel.from_pretrained`` loads it), in
        the model's dtype, and ``adapt.json`` (run, method, lr, steps) beside it."""
        return self.adapter.save(self, Path(folder))


def _rows(rows: Sequence[Mapping[str, Any]] | str | Path) -> list[dict[str, Any]]:
    return read_rows(Path(rows) if isinstance(rows, str) else rows, what="predict() rows")


class Adapter:
    """A run's method loaded for adapting user tasks (see the module docstring).

    Args:
        plan: the method as the run's evaluation adapts it (:func:`~fmmeta.adaptation.method.resolve_method`).
        micro_batch_size: support rows and queries per task per pass; ``None`` = ``eval.micro_batch_size``.
        tasks_per_pass: tasks adapted together; ``None`` = ``eval.episodes_per_pass``.
        max_new_tokens: longest greedy continuation of a generation query.
    """

    def __init__(self, plan: RunMethod, *, micro_batch_size: int | None = None, tasks_per_pass: int | None = None,
                 max_new_tokens: int = 64) -> None:
        from fmmeta.algorithms.answer_loss import check_lines
        from fmmeta.models import add_lora, build_model_and_tokenizer

        cfg = plan.cfg
        self.micro_batch_size = micro_batch_size or cfg.eval.micro_batch_size
        self.tasks_per_pass = tasks_per_pass or cfg.eval.episodes_per_pass
        self.max_new_tokens = max_new_tokens
        base, self.tokenizer = build_model_and_tokenizer(cfg.model)
        self.model = add_lora(base, cfg.lora, seed=cfg.train.seed)  # this replicate's initial adapter
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self._use(plan)
        if self.inner.padding_free:
            check_lines(self.model)
        self.lora = TaskLoRA(self.model, self.params)

    def _use(self, plan: RunMethod) -> None:
        """Adapts as ``plan``'s method from now on: its adapter as the start, its lr and steps."""
        self.plan = plan
        self.spec = self._method()
        self.start = [p.detach().clone() for p in self.params] if self.spec.state is None else list(self.spec.state)
        self.inner = plan.cfg.algorithm.inner_loop
        if plan.lr is not None:
            self.inner = dataclasses.replace(self.inner, inner_lr=plan.lr)

    def with_method(self, plan: RunMethod) -> Adapter:
        """An adapter for another method of the same run and replicate, on this one's model (loaded
        once for every candidate ``--method auto`` compares)."""
        if (plan.run, plan.cfg.train.seed) != (self.plan.run, self.plan.cfg.train.seed):
            raise ValueError(f"{plan.method} of {plan.run} (seed {plan.cfg.train.seed}) is not of this adapter's run "
                             f"{self.plan.run} (seed {self.plan.cfg.train.seed}): its initial adapter differs")
        other = copy.copy(self)
        other._use(plan)
        return other

    def _method(self) -> EvalMethod:
        """The method as the evaluation's report row scores it (:func:`eval_methods`)."""
        from fmmeta.algorithms.meta_sgd import load_step_sizes
        from fmmeta.evaluation.run import eval_methods, read_adapter_state

        plan, cfg = self.plan, self.plan.cfg
        states: dict[str, list[torch.Tensor] | None] = {BASE: None}
        learned: dict[str, list[float]] = {}
        names = adapter_names(self.model)
        if plan.adapter is not None:
            states[plan.method] = read_adapter_state(self.model, plan.adapter)
            sizes = load_step_sizes(plan.adapter, names)
            if sizes is not None:
                learned[plan.method] = sizes
        # in_context is a row only where eval.in_context is on; with_demonstrations rows are not ours
        eval_cfg = dataclasses.replace(cfg.eval, in_context=plan.method == IN_CONTEXT, with_demonstrations=())
        return eval_methods(dataclasses.replace(cfg, eval=eval_cfg), states, names, learned)[plan.method]

    @property
    def steps(self) -> int:
        """Adaptation steps each task takes."""
        return self.plan.steps if self.spec.adapt else 0

    def _icl(self, on: bool) -> int | None:
        return self.plan.cfg.algorithm.icl_max_length if on else None

    def build(self, files: TaskFiles | TaskTexts) -> UserTask:
        """A task's rows tokenized with the run's tokenizer and token budget."""
        return build_task(files, self.tokenizer, max_length=self.plan.cfg.tasks.max_length)

    @contextlib.contextmanager
    def active(self, fast: Sequence[torch.Tensor]) -> Iterator[TaskLoRA]:
        """The model in eval mode (no dropout) with ``fast`` (``[T, *shape]``) routed per task."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self.lora.active(fast):
                yield self.lora
        finally:
            self.lora.rows = None
            self.model.train(was_training)

    def predict(self, tasks: Sequence[UserTask], lora: TaskLoRA) -> list[list[dict[str, Any]]]:
        """Predictions of every task's queries, task ``g`` through fast weights ``g``."""
        icl = self._icl(self.spec.demonstrations)
        queries = [t.episode.query if icl is None else t.episode.in_context_query(icl) for t in tasks]

        def route(rows: torch.Tensor) -> None:
            lora.rows = rows

        out: list[list[dict[str, Any]]] = [[] for _ in tasks]
        kinds = {True: [g for g, t in enumerate(tasks) if t.is_classification],
                 False: [g for g, t in enumerate(tasks) if not t.is_classification]}
        for ranked, group in kinds.items():
            if not group or not any(queries[g] for g in group):
                continue
            sub = subset_route(route, group)
            qs, known = [queries[g] for g in group], [tasks[g].query_known for g in group]
            if ranked:
                rows = rank(self.model, sub, qs, [tasks[g].episode.choices or () for g in group],
                            [tasks[g].candidate_words() for g in group], known, self.micro_batch_size)
            else:
                rows = generate(self.model, sub, qs, known, self.tokenizer,
                                micro_batch_size=self.micro_batch_size, max_new_tokens=self.max_new_tokens)
            for g, r in zip(group, rows):
                out[g] = [{"task": tasks[g].name, "row": i, **row} for i, row in enumerate(r)]
        return out

    def compare(self, plans: Mapping[str, RunMethod], tasks: Sequence[TaskTexts], k: int,
                skipped: Mapping[str, str], clock: Callable[[], float], metric: str = DEFAULT_METRIC) -> Comparison:
        """Cross-validates every plan's method on ``tasks`` on this model (loaded once): the
        folds of all tasks adapt together for each candidate
        (:func:`~fmmeta.adaptation.cross_validation.cross_validate`).

        Args:
            plans: the candidates as the run's evaluation adapts them, simplest first
                (:func:`~fmmeta.adaptation.method.candidate_methods`).
            tasks: the user's tasks, read and checked; k: folds per task.
            skipped: candidates left out, with why; clock: seconds.
            metric: the registered metric the choice reads
                (:func:`~fmmeta.adaptation.cross_validation.choose`).

        Raises:
            UserInputError: ``metric`` does not score these tasks (checked before any fold adapts).
        """
        cv_metric(metric, tasks)
        def adapt_with(name: str, fold_tasks: list[TaskTexts]) -> list[list[dict[str, Any]]]:
            candidate = self.with_method(plans[name])
            return [a.predictions for a in candidate.adapt([candidate.build(t) for t in fold_tasks])]

        scores = cross_validate(adapt_with, list(plans), tasks, k, clock)
        chosen, why = choose(scores, list(plans), metric)
        return Comparison(k, scores, chosen, why, dict(skipped))

    def adapt(self, tasks: Sequence[UserTask], on_group: Callable[[int], None] | None = None) -> list[Adapted]:
        """Adapts the tasks in groups of ``tasks_per_pass`` (similar lengths together, as the
        evaluation groups episodes) and predicts their queries; results in the tasks' order."""
        done: dict[int, Adapted] = {}
        order = by_length([t.episode for t in tasks])
        for group in groups_of(order, self.tasks_per_pass):
            for g, adapted in zip(group, self._adapt_group([tasks[i] for i in group])):
                done[g] = adapted
            if on_group is not None:
                on_group(len(group))
        return [done[i] for i in range(len(tasks))]

    def _adapt_group(self, tasks: list[UserTask]) -> list[Adapted]:
        """One group: its support passes, ``steps`` steps of every task, then its predictions."""
        episodes = [t.episode for t in tasks]
        support = (support_passes(episodes, int(self.tokenizer.pad_token_id), self.micro_batch_size,
                                  self._icl(self.spec.in_context_support), padding_free=self.inner.padding_free)
                   if self.steps else [])
        n_answer = answer_tokens_per_task(support, len(tasks))
        was_training = self.model.training
        self.model.eval()  # no dropout, as the evaluation adapts
        try:
            with adapting(self.model, self.lora, self.params, self.start, support, n_answer, self.inner,
                          self.spec.step_sizes, adapted=self.spec.adapted) as step:
                for _ in range(self.steps):
                    step()
                predictions = self.predict(tasks, self.lora)
                fast = [[f[g].detach().clone() for f in step.fast] for g in range(len(tasks))]
        finally:
            self.lora.rows = None
            self.model.train(was_training)
        return [Adapted(t, self, f, p) for t, f, p in zip(tasks, fast, predictions)]

    def save(self, adapted: Adapted, folder: Path) -> Path:
        """Writes ``adapted``'s weights as a peft adapter folder (see :meth:`Adapted.save`)."""
        saved = snapshot(self.params)
        try:
            with torch.no_grad():
                for p, f in zip(self.params, adapted.fast):
                    p.copy_(f.to(p.dtype))
            save: Any = self.model.save_pretrained  # a peft model (add_lora)
            save(str(folder), safe_serialization=True)
        finally:
            restore(self.params, saved)
        plan = self.plan
        about = {"run": str(plan.run), "method": plan.method, "seed": plan.cfg.train.seed, "lr": plan.lr,
                 "steps": self.steps, "lr_source": plan.lr_source, "task": adapted.task.name}
        (folder / "adapt.json").write_text(json.dumps(about, indent=1) + "\n", encoding="utf-8")
        return folder


__all__ = ["Adapted", "Adapter"]
