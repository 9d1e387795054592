"""Per-episode records and what is computed from them for every registered metric
(:mod:`fmmeta.evaluation.metrics`): the summary of a (method, family, step) cell over seeds and a
paired difference between two methods, each with its interval
(:func:`~fmmeta.evaluation.replicated.replicated_interval`).

A cell summarises the registered metrics that every one of its records carries (a metric of one
kind, such as ``accuracy_per_token``, is summarised on that kind's families, not overall); a
comparison differences the metrics that every record of both sides carries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from fmmeta.evaluation.intervals import Interval
from fmmeta.evaluation.metrics import METRICS, get_metric
from fmmeta.evaluation.replicated import Replicated, replicated_interval

OVERALL = "overall"

_FIELDS = ("method", "seed", "episode", "task", "kind", "step", "n", "family", "replicate", "chance")
"""The keys of a record's ``eval.json`` form that are not metrics."""


@dataclass(frozen=True, kw_only=True)
class EpisodeRecord:
    """One method's score on one held-out episode after ``step`` adaptation steps.

    Attributes:
        method: method name.
        seed: index of the episode draw (seed) the episode belongs to.
        episode: index of the episode within its seed.
        task: the episode's task name.
        kind: ``"classification"``, ``"multiple_choice"`` or ``"generation"``.
        family: the task's family in the suite (e.g. ``"cldr-langid"``), or ``""`` if not given.
        step: adaptation steps taken before scoring (0 = none).
        metrics: metric name -> the episode's value, for every registered metric that applies to
            the episode's kind (:func:`~fmmeta.evaluation.metrics.metrics_of`), e.g. ``loss``
            (mean query loss per answer token, nats) and ``accuracy`` (in [0, 1]).
        n: number of queries.
        replicate: the training replicate the scored adapter belongs to (0 with one replicate).
        chance: a uniform guess's accuracy on the episode; ``None`` for generation.
    """

    method: str
    seed: int
    episode: int
    task: str
    kind: str
    step: int
    metrics: dict[str, float]
    n: int
    family: str = ""
    replicate: int = 0
    chance: float | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> EpisodeRecord:
        """A record from its ``eval.json`` form (:meth:`to_dict`), any layout.

        A record's metrics are its keys beside the fixed fields (a ``null`` one, as generation's
        ``accuracy_per_token`` was written, is left out). ``eval.json`` files written before the
        kind was renamed (``docs/research/`` keeps some) call the kind ``"family"`` and the suite
        family ``"domain"``; a record without ``"kind"`` is one of those.
        """
        raw = dict(raw)
        if "kind" not in raw:  # old layout: "family" was the kind, "domain" the suite family
            raw["kind"] = raw.pop("family")
            raw["family"] = raw.pop("domain", "")
        fixed = {k: raw.pop(k) for k in _FIELDS if k in raw}
        nested = raw.pop("metrics", None) or {}
        metrics = {k: float(v) for k, v in {**raw, **nested}.items() if v is not None}
        return cls(**fixed, metrics=metrics)

    def to_dict(self) -> dict[str, Any]:
        """The ``eval.json`` form: the fixed fields with every metric as a key of its own."""
        out = {k: getattr(self, k) for k in _FIELDS}
        return {**out, **self.metrics}


@dataclass(frozen=True)
class MetricCell:
    """One metric of a summary cell: the mean over seeds of the seed values (each the metric's
    aggregate over the seed's episodes), the worst seed value, and the mean over episodes (and
    replicates) with its 95% interval."""

    mean: float
    worst: float
    interval: Interval


@dataclass(frozen=True, kw_only=True)
class MetricSummary:
    """Aggregate of one (method, family, step) cell over seeds.

    Attributes:
        metrics: metric name -> its :class:`MetricCell`, for every registered metric all the
            cell's records carry.
        n_seeds: seeds that had episodes of this family.
        n_episodes: episodes aggregated over all those seeds.
        n_replicates: training replicates behind it.
    """

    metrics: dict[str, MetricCell]
    n_seeds: int
    n_episodes: int
    n_replicates: int = 1

    def cell(self, metric: str) -> MetricCell:
        """The cell's ``metric``, with an error that lists the metrics it has."""
        try:
            return self.metrics[metric]
        except KeyError:
            raise KeyError(f"this summary has no metric {metric!r}: it has {list(self.metrics)}") from None

    def mean(self, metric: str) -> float:
        """Mean over seeds of the seed values of ``metric``."""
        return self.cell(metric).mean

    def worst(self, metric: str) -> float:
        """The worst seed value of ``metric`` (lowest when higher is better, else highest)."""
        return self.cell(metric).worst

    def interval(self, metric: str) -> Interval:
        """The mean over episodes of ``metric`` with its 95% interval."""
        return self.cell(metric).interval

    def to_dict(self) -> dict[str, Any]:
        """The ``eval.json`` form: ``<metric>_mean``, ``<metric>_worst``, ``<metric>_interval``
        per metric, then the counts."""
        out: dict[str, Any] = {}
        for name, c in self.metrics.items():
            out.update({f"{name}_mean": c.mean, f"{name}_worst": c.worst,
                        f"{name}_interval": dataclasses.asdict(c.interval)})
        return {**out, "n_seeds": self.n_seeds, "n_episodes": self.n_episodes, "n_replicates": self.n_replicates}


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A paired difference ``method - baseline`` over the episodes both were scored on.

    Each method is taken at its headline step: the most adaptation steps it was scored at (step 0
    for methods that do not adapt, such as in-context demonstrations).

    Attributes:
        method, baseline: the two methods.
        family: the family the episodes belong to (or ``"overall"``).
        method_step, baseline_step: the steps compared.
        metrics: metric name -> the difference with its interval, its variance components, the
            replicates favouring each side and the power of the comparison. A difference favours
            the method when it is above 0 for a metric where higher is better, below 0 otherwise.
    """

    method: str
    baseline: str
    family: str
    method_step: int
    baseline_step: int
    metrics: dict[str, Replicated] = field(default_factory=dict)

    def interval(self, metric: str) -> Interval:
        """The difference in ``metric`` with its 95% interval."""
        return self.replicated(metric).interval

    def replicated(self, metric: str) -> Replicated:
        """The difference in ``metric`` with its variance components."""
        try:
            return self.metrics[metric]
        except KeyError:
            raise KeyError(f"this comparison has no metric {metric!r}: it has {list(self.metrics)}") from None

    def to_dict(self) -> dict[str, Any]:
        """The ``eval.json`` form: per metric, ``<metric>`` (the interval) and
        ``<metric>_replicated``."""
        out: dict[str, Any] = {"method": self.method, "baseline": self.baseline, "family": self.family,
                               "method_step": self.method_step, "baseline_step": self.baseline_step}
        for name, rep in self.metrics.items():
            out.update({name: dataclasses.asdict(rep.interval), f"{name}_replicated": dataclasses.asdict(rep)})
        return out


Key = tuple[int, tuple[int, str, int]]


def key_of(record: EpisodeRecord) -> Key:
    """``(replicate, episode)``: which adapter scored which episode (seed, task, index)."""
    return record.replicate, (record.seed, record.task, record.episode)


def matrix(cells: Mapping[Key, tuple[float, str]]) -> tuple[np.ndarray, list[str]]:
    """Values keyed by :func:`key_of` as a ``[replicates, episodes]`` array (every replicate
    scored on the same episodes, in one order) and each episode's task.

    Raises:
        ValueError: if the replicates were not all scored on the same episodes.
    """
    replicates = sorted({r for r, _ in cells})
    episodes = sorted({e for _, e in cells})
    if len(cells) != len(replicates) * len(episodes):
        raise ValueError(
            f"the {len(replicates)} training replicates were scored on different episodes: intervals "
            "over replicates need every replicate on the same episodes (evaluate them in one call)"
        )
    values = np.array([[cells[(r, e)][0] for e in episodes] for r in replicates], dtype=np.float64)
    return values, [task for _, task, _ in episodes]


def carried(records: Sequence[EpisodeRecord]) -> list[str]:
    """The registered metrics every one of ``records`` carries, in registration order."""
    return [name for name in METRICS if all(name in r.metrics for r in records)]


def paired(mine: Mapping[Key, EpisodeRecord], theirs: Mapping[Key, EpisodeRecord]) -> dict[str, Replicated]:
    """Per metric both sides carry, the difference ``mine - theirs`` over the same episodes, paired
    within a replicate (both adapters were trained from its initial adapter and draws)."""
    names = carried([*mine.values(), *theirs.values()])
    return {name: replicated_interval(*matrix({k: (r.metrics[name] - theirs[k].metrics[name], r.task)
                                               for k, r in mine.items()}))
            for name in names}


def summarise(records: Sequence[EpisodeRecord]) -> dict[str, dict[str, dict[int, MetricSummary]]]:
    """``[method][family][step]``: every cell's :class:`MetricSummary` (see the module docstring)."""
    # (method, family, step) -> seed -> records
    cells: dict[tuple[str, str, int], dict[int, list[EpisodeRecord]]] = {}
    for r in records:
        # in a fixed order (a set's would follow string hashing, which differs per process, and
        # eval.json's keys with it)
        for fam in dict.fromkeys(f for f in (OVERALL, r.kind, r.family) if f):
            cells.setdefault((r.method, fam, r.step), {}).setdefault(r.seed, []).append(r)
    out: dict[str, dict[str, dict[int, MetricSummary]]] = {}
    for (method, fam, step), by_seed in cells.items():
        every = [r for rs in by_seed.values() for r in rs]
        metrics: dict[str, MetricCell] = {}
        shape = (0, 0)
        for name in carried(every):
            metric = get_metric(name)
            seed_values = [metric.aggregate([r.metrics[name] for r in rs]) for rs in by_seed.values()]
            values, tasks = matrix({key_of(r): (r.metrics[name], r.task) for r in every})
            shape = values.shape
            metrics[name] = MetricCell(mean=sum(seed_values) / len(seed_values), worst=metric.worst(seed_values),
                                       interval=replicated_interval(values, tasks).interval)
        if not metrics:  # no metric all records carry: still count the cell's episodes
            shape = matrix({key_of(r): (0.0, r.task) for r in every})[0].shape
        out.setdefault(method, {}).setdefault(fam, {})[step] = MetricSummary(
            metrics=metrics, n_seeds=len(by_seed), n_episodes=shape[1], n_replicates=shape[0])
    for by_fam in out.values():
        for fam in list(by_fam):
            by_fam[fam] = dict(sorted(by_fam[fam].items()))
    return out
