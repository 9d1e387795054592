"""A trial's adapter scored on validation tasks; the chosen adapters scored on held-out ones.

:class:`Scorer` builds the base model, its adapter, the task suite and one engine once per study:
none of them is searched (the model, the adapter's shape and the task split are not searchable
keys), so every trial and the final held-out scoring see the very same tasks and episodes.

Validation scoring is the held-out protocol of :mod:`fmmeta.evaluation` with the validation
tasks in place of the held-out ones: the adaptation lr is chosen on the validation draw the
evaluation chooses it on (draw 0), and the trial is scored on ``seeds`` other draws of the same
validation tasks (draws 1..seeds). The held-out scoring is :func:`evaluate_run`, the very call a
run of the train recipe ends with. Nothing here draws an episode of a held-out task except
:meth:`Scorer.held_out`.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from fmmeta.algorithms import load_step_sizes
from fmmeta.algorithms.build import METHODS
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.engine import EngineFactory
from fmmeta.errors import UserInputError
from fmmeta.evaluation.held_out import evaluate_methods, select_inner_lr
from fmmeta.evaluation.metrics import get_metric
from fmmeta.evaluation.replicated import replicated_interval
from fmmeta.evaluation.result import OVERALL, EvalResult, kind_of
from fmmeta.evaluation.run import (
    Replicate,
    draw_episodes,
    eval_methods,
    eval_settings,
    evaluate_run,
    evaluation_tasks,
    read_adapter_state,
    report_families,
)
from fmmeta.models import adapter_names, add_lora, initial_adapter
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.config import build_task_set
from fmmeta.workers import Workers

__all__ = ["Scorer", "score_of", "standard_error_of"]

logger = logging.getLogger(__name__)


class Scorer:
    """The model, suite and engine a study scores with (one process).

    Args:
        cfg: the study's base train-recipe config (its eval section is the scoring protocol).
        seeds: validation draws each trial is scored over.
        episodes_per_task: validation episodes per task per draw.
        family: the family whose validation episodes score a trial (checked against the suite).
    """

    def __init__(self, cfg: RecipeConfig, *, seeds: int, episodes_per_task: int, family: str) -> None:
        self.cfg = cfg
        self.seeds = seeds
        self.episodes_per_task = episodes_per_task
        # Kept as long as the model: under ZeRO-3 the partitioned base depends on it.
        self.engines = EngineFactory(cfg.engine, cfg.optim, precision=cfg.precision)
        base, self.tokenizer = self.engines.build_base(cfg.model)
        self.suite = build_task_set(cfg.tasks, self.tokenizer)
        if not self.suite.validation:
            raise UserInputError("the task suite has no validation tasks: a study chooses on them; "
                                 "give the suite validation tasks (tasks.validation_fraction > 0)")
        families = {"overall", *(t.family for t in self.suite.validation)}
        kinds = {kind_of(ep) for ep in self._validation_draw(0)}
        if family not in families | kinds:
            raise UserInputError(f"family={family!r} is invalid: the validation tasks have "
                                 f"{sorted(families | kinds)}; choose one of them")
        self.model = add_lora(base, cfg.lora, seed=cfg.train.seed)
        self.engine = self.engines.engine(self.model)
        self.workers = Workers.from_setting(cfg.engine.workers)  # a study is one process

    def held_out_tasks(self) -> list[str]:
        """Names of the held-out tasks (for the report; no episode is drawn)."""
        return [t.name for t in self.suite.held_out]

    def _validation_draw(self, draw: int, per_task: int | None = None) -> list[Any]:
        tasks = evaluation_tasks(self.suite.validation, self.cfg.eval.query)
        return draw_episodes(tasks, self.cfg.tasks.seed, draw,
                             per_task or self.cfg.eval.val_episodes_per_task)

    def _algorithm(self, drawn: Mapping[str, object] | None) -> AlgorithmConfig:
        """The study's algorithm section with what a trial drew that decides how it is scored
        (``drawn``: the trial's searched values): its ``algorithm.inner_format`` and its method's
        own settings (``algorithm.<method>.<key>``: ANIL's ``layers`` say which tensors adapt)."""
        a = self.cfg.algorithm
        for key, value in (drawn or {}).items():
            parts = key.split(".")
            if key == "algorithm.inner_format" and isinstance(value, str):
                a = dataclasses.replace(a, inner_format=value)
            elif len(parts) == 3 and parts[0] == "algorithm":
                own = getattr(a, parts[1])
                a = dataclasses.replace(a, **{parts[1]: dataclasses.replace(own, **{parts[2]: value})})
        return a

    def validation(self, method: str, adapter_dir: Path, drawn: Mapping[str, object] | None = None) -> EvalResult:
        """``method``'s adapter in ``adapter_dir`` scored on validation tasks over ``seeds`` draws,
        its adaptation lr chosen on another draw, as held-out evaluation chooses it, in the rows'
        format it was trained in (``drawn``: the trial's searched values; ``None``: the study's)."""
        cfg = dataclasses.replace(self.cfg, eval=dataclasses.replace(self.cfg.eval, with_demonstrations=()),
                                  algorithm=self._algorithm(drawn))
        names = adapter_names(self.model)
        lrs = load_step_sizes(adapter_dir, names)
        methods = eval_methods(cfg, {method: read_adapter_state(self.model, adapter_dir)}, names,
                               {method: lrs} if lrs is not None else None)
        params = self.engine.adapter_parameters()
        settings = eval_settings(cfg, self.tokenizer.pad_token_id)
        selection = select_inner_lr(self.model, params, methods, self._validation_draw(0), settings,
                                    ranks=self.engine, workers=self.workers)
        draws = [self._validation_draw(1 + s, self.episodes_per_task) for s in range(self.seeds)]
        return evaluate_methods(self.model, params, methods, draws, settings, inner_lrs=selection.chosen,
                                lr_selection=selection, families=report_families(self.suite.validation),
                                ranks=self.engine, workers=self.workers)

    def held_out(self, replicates: Sequence[Mapping[str, Path]], report_dir: Path, notes: Sequence[str],
                 drawn: Mapping[str, Mapping[str, object]] | None = None) -> dict[str, Path]:
        """The chosen adapters, the base model and in-context demonstrations scored once on the
        held-out tasks by the train recipe's own evaluation, each adapter in the rows' format its
        trial trained in (``drawn``: method -> its chosen trial's searched values; missing: the
        study's); the report goes to ``report_dir``.

        ``replicates[r]``: method -> adapter folder of training replicate ``r``, trained with
        ``train.seed + r`` from that seed's initial adapter (replicate 0: the chosen trials)."""
        chosen = drawn or {}
        in_context = [m for m in replicates[0] if METHODS[m].adapts_in_context(self._algorithm(chosen.get(m)))]
        runs = []
        for r, adapters in enumerate(replicates):
            cfg = dataclasses.replace(self.cfg, train=dataclasses.replace(self.cfg.train, seed=self.cfg.train.seed + r))
            runs.append(Replicate(cfg, initial_adapter(self.model, cfg.train.seed), dict(adapters)))
        return evaluate_run(self.cfg, self.engine, self.tokenizer, self.suite, runs,
                            report_dir.parent, report_dir=report_dir, notes=list(notes),
                            in_context=in_context, workers=self.workers)

    def close(self) -> None:
        """Releases the engine."""
        self.engine.close()


def score_of(result: EvalResult, method: str, metric: str, family: str) -> float:
    """A trial's score: the mean over seeds of ``metric`` on ``family``'s validation episodes at
    the method's headline step (the most adaptation steps scored; 0 for MetaICL)."""
    step = result.steps_of(method)[-1]
    cell = result.get(method, step, family)
    if metric not in cell.metrics:
        raise UserInputError(f"metric={metric!r} is not defined on every {family} validation episode (it applies "
                             f"to {sorted(get_metric(metric).kinds)} episodes): choose a family of those kinds "
                             "or another metric")
    return cell.mean(metric)


def standard_error_of(result: EvalResult, method: str, metric: str, family: str) -> float:
    """The standard error of :func:`score_of` over the validation episodes (by task, the trial's
    training held fixed): how far the score would move on another draw of episodes, which is
    what tells two trials' scores apart or not."""
    step = result.steps_of(method)[-1]
    mine = [r for r in result.records if r.method == method and r.step == step
            and family in (r.kind, r.family, OVERALL)]
    values = [[r.metrics[metric] for r in mine]]
    return replicated_interval(values, [r.task for r in mine]).standard_error()
