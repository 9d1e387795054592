"""Held-out evaluation: score query sets, compare adapter inits under one inner loop, write the report.

* :func:`score_query` (``scoring``): mean loss per answer token and accuracy (verbalizer ranking
  for classification, exact match for generation).
* :func:`evaluate_held_out` / :func:`evaluate_methods` / :func:`select_inner_lr` (``evaluate``):
  every method adapted on each held-out episode's support for 0..k steps with the project's one
  inner loop, adaptation lr chosen per method on validation tasks only, mean and worst case over seeds,
  paired differences between methods on the same episodes.
* :func:`bootstrap_interval` (``intervals``): stratified (by task) bootstrap intervals.
* :func:`write_report` (``report``): ``eval.json``, ``eval.md`` and PNG plots.
"""

from fmmeta.evaluation.evaluate import (
    IN_CONTEXT,
    Comparison,
    EpisodeRecord,
    EvalMethod,
    EvalResult,
    LrSelection,
    MetricSummary,
    evaluate_held_out,
    evaluate_methods,
    family_of,
    select_inner_lr,
)
from fmmeta.evaluation.intervals import Interval, bootstrap_interval
from fmmeta.evaluation.report import (
    format_markdown,
    plot_adaptation_curves,
    plot_training_curves,
    write_report,
)
from fmmeta.evaluation.scoring import QueryScore, score_query

__all__ = [
    "IN_CONTEXT",
    "Comparison",
    "EpisodeRecord",
    "EvalMethod",
    "Interval",
    "bootstrap_interval",
    "EvalResult",
    "LrSelection",
    "MetricSummary",
    "QueryScore",
    "evaluate_held_out",
    "evaluate_methods",
    "family_of",
    "format_markdown",
    "plot_adaptation_curves",
    "plot_training_curves",
    "score_query",
    "select_inner_lr",
    "write_report",
]
