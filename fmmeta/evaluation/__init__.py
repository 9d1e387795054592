"""Held-out evaluation: score query sets, compare adapter inits under one inner loop, write the report.

* :func:`score_query` (``scoring``): mean loss per answer token and accuracy (verbalizer ranking
  for classification, exact match for generation).
* :func:`evaluate_held_out` / :func:`evaluate_methods` / :func:`select_inner_lr` (``held_out``):
  every method adapted on each held-out episode's support for 0..k steps with the project's one
  inner loop, adaptation lr chosen per method on validation tasks only.
* ``adaptation``: a group of episodes adapted and scored together, each through its own fp32
  fast weights (what :func:`evaluate_methods` runs per group).
* ``prefix_tree``: query sets laid out as token tries, each shared prefix encoded once.
* :class:`EvalMethod` (``methods``): what one row of the report is and how it is scored;
  :class:`EvalSettings` (``settings``): what the protocol holds fixed for every row.
* :class:`Metric` (``metrics``): what is measured, one registered object per metric
  (:func:`register_metric`): how an episode computes it, how it aggregates, whether higher is
  better, which episode kinds it applies to; everything below takes every registered metric.
* :class:`EvalResult` (``result``, ``summary``): the records, mean and worst case over seeds,
  paired differences between methods on the same episodes.
* ``lockstep``: the episodes split over ranks, every rank running the same passes.
* :func:`bootstrap_interval` (``intervals``): stratified (by task) bootstrap intervals.
* :func:`write_report` (``report``): ``eval.json``, ``eval.md`` and PNG plots.
* :func:`support_fit` (``support_fit``): support and query scores along one adaptation, to see
  whether an inner-loop setting fits the support set at all.
* :func:`evaluate_run` (``run``): a run's config, task suite and saved adapters evaluated and
  reported (what both recipes call).
"""

from fmmeta.evaluation.adaptation import AdaptPlan
from fmmeta.evaluation.held_out import evaluate_held_out, evaluate_methods, select_inner_lr
from fmmeta.evaluation.intervals import Interval, bootstrap_interval
from fmmeta.evaluation.methods import IN_CONTEXT, EvalMethod
from fmmeta.evaluation.metrics import METRICS, Metric, register_metric
from fmmeta.evaluation.report import (
    format_markdown,
    plot_adaptation_curves,
    plot_training_curves,
    write_report,
)
from fmmeta.evaluation.result import (
    Comparison,
    EpisodeRecord,
    EvalResult,
    LrSelection,
    MetricSummary,
    kind_of,
)
from fmmeta.evaluation.scoring import QueryScore, score_query
from fmmeta.evaluation.settings import EvalSettings
from fmmeta.evaluation.support_fit import FitPoint, support_fit

__all__ = [
    "IN_CONTEXT",
    "METRICS",
    "Metric",
    "register_metric",
    "AdaptPlan",
    "Comparison",
    "EpisodeRecord",
    "EvalMethod",
    "FitPoint",
    "Interval",
    "bootstrap_interval",
    "EvalResult",
    "EvalSettings",
    "LrSelection",
    "MetricSummary",
    "QueryScore",
    "evaluate_held_out",
    "evaluate_methods",
    "kind_of",
    "format_markdown",
    "plot_adaptation_curves",
    "plot_training_curves",
    "score_query",
    "select_inner_lr",
    "support_fit",
    "write_report",
]
