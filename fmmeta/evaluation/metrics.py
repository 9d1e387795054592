"""What an evaluation measures: every metric is one registered :class:`Metric`.

A metric says how an episode computes it from its scored query set
(:class:`~fmmeta.evaluation.scoring.QueryScore`, which holds the set's loss and accuracies and,
per query, whether it was answered correctly and its gold answer's log-probability), how the
episodes of one seed aggregate into the seed's value (the mean unless told), whether higher is
better (which seed is the worst, the sign of a paired difference that favours a method, a study's
direction) and which kinds of episode it applies to. Records carry metrics by name
(``EpisodeRecord.metrics``), and the summary, the comparisons and their intervals, the report's
tables, the tracker's rows and a study's objective take every registered metric alike: a metric
registered from any module (:func:`register_metric`, read live) shows up in all of them.

Registered here: ``accuracy`` (the headline: verbalizer ranking or exact match), ``loss`` (mean
negative log-likelihood per answer token) and ``accuracy_per_token`` (multiple choice, options
ranked by mean log-probability per token).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Sequence

from fmmeta.evaluation.scoring import QueryScore

CLASSIFICATION = "classification"
MULTIPLE_CHOICE = "multiple_choice"
GENERATION = "generation"
KINDS: tuple[str, ...] = (CLASSIFICATION, MULTIPLE_CHOICE, GENERATION)
"""The episode kinds, in the order reports list them."""

HEADLINE = "accuracy"
"""The metric the report's headline ("What holds"), its chance check and its plot read."""


def mean(values: Sequence[float]) -> float:
    """The plain mean, summed in order (the seed-mean every summary has always used)."""
    return sum(values) / len(values)


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One metric of held-out evaluation.

    Attributes:
        name: the key records, summaries, reports and ``study.metric`` know it by.
        compute: the episode's value from its scored query set (``None``: not defined there).
        higher_is_better: whether a higher value is better (accuracy) or worse (loss).
        kinds: the episode kinds it applies to (:data:`KINDS`); other episodes do not carry it.
        aggregate: a seed's value from its episodes' values (default :func:`mean`).
        description: what it measures, in words (the report's tables say it).
    """

    name: str
    compute: Callable[[QueryScore], float | None]
    higher_is_better: bool
    kinds: frozenset[str] = frozenset(KINDS)
    aggregate: Callable[[Sequence[float]], float] = mean
    description: str = ""

    def worst(self, values: Sequence[float]) -> float:
        """The worst of ``values`` (the lowest when higher is better, else the highest)."""
        return min(values) if self.higher_is_better else max(values)

    @property
    def direction(self) -> str:
        """``"maximize"`` or ``"minimize"`` (Optuna's words)."""
        return "maximize" if self.higher_is_better else "minimize"

    def favours(self, difference: float) -> bool:
        """Whether a difference ``method - baseline`` favours the method."""
        return difference > 0 if self.higher_is_better else difference < 0


METRICS: dict[str, Metric] = {}
"""The registered metrics by name, in registration order (read live: register before use)."""


def register_metric(metric: Metric) -> Metric:
    """Registers ``metric`` under its name and returns it.

    Raises:
        ValueError: a metric of that name is registered, or it names an unknown kind.
    """
    if metric.name in METRICS:
        raise ValueError(f"a metric named {metric.name!r} is registered already")
    unknown = sorted(set(metric.kinds) - set(KINDS))
    if unknown or not metric.kinds:
        raise ValueError(f"metric {metric.name!r} names kinds {sorted(metric.kinds)}: choose among {list(KINDS)}")
    METRICS[metric.name] = metric
    return metric


def get_metric(name: str) -> Metric:
    """The registered metric ``name``.

    Raises:
        KeyError: none is registered under that name (the message lists those that are).
    """
    try:
        return METRICS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(METRICS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"no metric named {name!r}{hint}: registered metrics are {list(METRICS)}") from None


def metrics_of(score: QueryScore, kind: str) -> dict[str, float]:
    """Every registered metric that applies to an episode of ``kind``, from its scored query set."""
    out: dict[str, float] = {}
    for m in METRICS.values():
        if kind in m.kinds:
            value = m.compute(score)
            if value is not None:
                out[m.name] = value
    return out


register_metric(Metric(
    name="accuracy", compute=lambda s: s.accuracy, higher_is_better=True,
    description="verbalizer ranking (classification, multiple choice), exact match (generation)"))
register_metric(Metric(
    name="loss", compute=lambda s: s.loss, higher_is_better=False,
    description="mean negative log-likelihood per gold answer token (nats)"))
register_metric(Metric(
    name="accuracy_per_token", compute=lambda s: s.accuracy_per_token, higher_is_better=True,
    kinds=frozenset({MULTIPLE_CHOICE}),
    description="options ranked by mean log-probability per token (lm-eval-harness's length-normalised variant)"))

__all__ = ["CLASSIFICATION", "GENERATION", "HEADLINE", "KINDS", "METRICS", "MULTIPLE_CHOICE", "Metric",
           "get_metric", "mean", "metrics_of", "register_metric"]
