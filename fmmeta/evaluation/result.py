"""What a held-out evaluation found: per-episode records, their summary over seeds, paired
differences between methods, and how the adaptation lrs were chosen (:class:`EvalResult`).

Summaries are the mean over seeds and the worst seed (the lowest seed-mean accuracy, the highest
seed-mean loss), per family (classification / generation, the suite's task families) and overall;
within a seed every episode weighs the same (its own loss is per answer token). Intervals are
stratified bootstraps (:mod:`fmmeta.evaluation.intervals`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.evaluation.intervals import Interval, bootstrap_interval
from fmmeta.evaluation.methods import IN_CONTEXT, MULTITASK
from fmmeta.tasks.episode import Episode

CLASSIFICATION = "classification"
GENERATION = "generation"
OVERALL = "overall"
FAMILIES: tuple[str, ...] = (CLASSIFICATION, GENERATION, OVERALL)

def kind_of(episode: Episode) -> str:
    """``"classification"`` when the episode has answer ``choices``, else ``"generation"``."""
    return CLASSIFICATION if episode.choices is not None else GENERATION


@dataclass(frozen=True, kw_only=True)
class EpisodeRecord:
    """One method's score on one held-out episode after ``step`` adaptation steps.

    Attributes:
        method: method name.
        seed: index of the episode draw (seed) the episode belongs to.
        episode: index of the episode within its seed.
        task: the episode's task name.
        kind: ``"classification"`` or ``"generation"``.
        family: the task's family in the suite (e.g. ``"cldr-langid"``), or ``""`` if not given.
        step: adaptation steps taken before scoring (0 = none).
        loss: mean query loss per answer token (nats).
        accuracy: query accuracy in [0, 1].
        n: number of queries.
    """

    method: str
    seed: int
    episode: int
    task: str
    kind: str
    step: int
    loss: float
    accuracy: float
    n: int
    family: str = ""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EpisodeRecord:
        """A record from its ``eval.json`` form (:meth:`EvalResult.to_dict`), either layout.

        ``eval.json`` files written before the rename (``docs/research/`` keeps some) call the
        kind ``"family"`` and the suite family ``"domain"``; a record without ``"kind"`` is one
        of those and is mapped onto today's fields.
        """
        if "kind" not in raw:  # old layout: "family" was the kind, "domain" the suite family
            raw = dict(raw)
            raw["kind"] = raw.pop("family")
            raw["family"] = raw.pop("domain", "")
        return cls(**raw)


@dataclass(frozen=True, kw_only=True)
class MetricSummary:
    """Aggregate of one (method, family, step) cell over seeds.

    Attributes:
        loss_mean: mean over seeds of the seed-mean query loss.
        loss_worst: highest seed-mean query loss (worst case).
        accuracy_mean: mean over seeds of the seed-mean accuracy.
        accuracy_worst: lowest seed-mean accuracy (worst case, as MetaICL reports).
        n_seeds: seeds that had episodes of this family.
        n_episodes: episodes aggregated over all those seeds.
        accuracy_interval: mean accuracy over episodes with its 95% bootstrap interval
            (stratified by task, :mod:`fmmeta.evaluation.intervals`).
        loss_interval: the same for the query loss.
    """

    loss_mean: float
    loss_worst: float
    accuracy_mean: float
    accuracy_worst: float
    n_seeds: int
    n_episodes: int
    accuracy_interval: Interval
    loss_interval: Interval


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A paired difference ``method - baseline`` over the episodes both were scored on.

    Each method is taken at its headline step: the most adaptation steps it was scored at (step 0
    for methods that do not adapt, such as in-context demonstrations).

    Attributes:
        method, baseline: the two methods.
        family: the family the episodes belong to (or ``"overall"``).
        method_step, baseline_step: the steps compared.
        accuracy: difference in accuracy (positive: ``method`` is better) with its interval.
        loss: difference in query loss (negative: ``method`` is better) with its interval.
    """

    method: str
    baseline: str
    family: str
    method_step: int
    baseline_step: int
    accuracy: Interval
    loss: Interval


@dataclass(frozen=True, kw_only=True)
class LrSelection:
    """The adaptation learning rate chosen per method on validation tasks.

    Attributes:
        chosen: method -> the lr with the lowest mean validation query loss after ``steps`` steps.
        val_loss: method -> lr -> that mean validation query loss (``inf`` if it diverged).
        steps: adaptation steps the choice was made at.
        tasks: names of the validation tasks used (for the report and for leak checks).
    """

    chosen: dict[str, float]
    val_loss: dict[str, dict[float, float]]
    steps: int
    tasks: tuple[str, ...]


@dataclass
class EvalResult:
    """Every score of a held-out evaluation plus the settings that produced it.

    Attributes:
        records: one entry per (method, seed, episode, step).
        methods: method names in the order given.
        max_steps: largest number of adaptation steps scored.
        n_seeds: number of episode draws.
        inner_lrs: adaptation lr used per method (absent for methods that do not adapt and for
            methods with learned per-tensor step sizes).
        inner: the inner-loop settings shared by all methods (lr aside).
        lr_selection: how ``inner_lrs`` were chosen, when they were.
        notes: how the compared adapters were trained (budget rules), for the report.
        step_sizes: the per-tensor step sizes of methods that adapt with learned ones.
    """

    records: list[EpisodeRecord]
    methods: list[str]
    max_steps: int
    n_seeds: int
    inner_lrs: dict[str, float]
    inner: InnerLoopConfig
    lr_selection: LrSelection | None = None
    notes: list[str] = field(default_factory=list)
    step_sizes: dict[str, list[float]] = field(default_factory=dict)
    _summary: dict[str, dict[str, dict[int, MetricSummary]]] | None = field(
        default=None, repr=False, compare=False
    )
    _comparisons: dict[tuple[str, ...], list[Comparison]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def steps_of(self, method: str) -> list[int]:
        """Adaptation steps scored for ``method`` (``[0]`` for methods that do not adapt)."""
        return sorted({r.step for r in self.records if r.method == method})

    def scored_steps(self) -> list[int]:
        """Adaptation steps scored for any method (all of 0..max_steps unless fewer were asked)."""
        return sorted({r.step for r in self.records})

    def families(self) -> list[str]:
        """Families present in the records (classification, generation, then the suite's task
        families when records name them), then ``"overall"``."""
        present = {r.kind for r in self.records}
        families = sorted({r.family for r in self.records if r.family})
        return [f for f in (CLASSIFICATION, GENERATION) if f in present] + families + [OVERALL]

    def summary(self) -> dict[str, dict[str, dict[int, MetricSummary]]]:
        """``summary()[method][family][step]``: mean, worst case over seeds, and intervals."""
        if self._summary is None:
            self._summary = summarise(self.records)
        return self._summary

    def compare(self, method: str, baseline: str, family: str = OVERALL) -> Comparison | None:
        """The paired difference ``method - baseline`` at their headline steps on ``family``'s
        episodes; ``None`` when either has no episode there.

        Raises:
            ValueError: if the two were not scored on the same episodes (no pairing possible).
        """
        def at_headline(m: str) -> tuple[int, dict[tuple[int, int], EpisodeRecord]]:
            steps = self.steps_of(m)
            step = steps[-1] if steps else 0
            return step, {(r.seed, r.episode): r for r in self.records
                          if r.method == m and r.step == step and family in (r.kind, r.family, OVERALL)}

        m_step, mine = at_headline(method)
        b_step, theirs = at_headline(baseline)
        if not mine or not theirs:
            return None
        if mine.keys() != theirs.keys():
            raise ValueError(
                f"{method} and {baseline} were scored on different {family} episodes: a paired "
                "difference needs both on the same episodes (evaluate them in one call)"
            )
        keys = sorted(mine)
        strata = [mine[k].task for k in keys]
        return Comparison(
            method=method, baseline=baseline, family=family, method_step=m_step, baseline_step=b_step,
            accuracy=bootstrap_interval([mine[k].accuracy - theirs[k].accuracy for k in keys], strata),
            loss=bootstrap_interval([mine[k].loss - theirs[k].loss for k in keys], strata),
        )

    def comparisons(self, baselines: Sequence[str] = (MULTITASK, IN_CONTEXT)) -> list[Comparison]:
        """Every method against each of ``baselines`` that was evaluated, on every family.

        Computed once per set of baselines (each is a bootstrap): the report and ``eval.json``
        both show them."""
        key = tuple(baselines)
        if key in self._comparisons:
            return self._comparisons[key]
        out: list[Comparison] = []
        for baseline in (b for b in baselines if b in self.methods):
            for method in (m for m in self.methods if m != baseline):
                for fam in self.families():
                    c = self.compare(method, baseline, fam)
                    if c is not None:
                        out.append(c)
        self._comparisons[key] = out
        return out

    def get(self, method: str, step: int, family: str = OVERALL) -> MetricSummary:
        """One cell of :meth:`summary`, with an error that lists what exists."""
        s = self.summary()
        try:
            return s[method][family][step]
        except KeyError:
            raise KeyError(
                f"no result for method={method!r}, family={family!r}, step={step}: methods "
                f"{sorted(s)}, families {self.families()}, steps 0..{self.max_steps} "
                f"(in_context has step 0 only)"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``eval.json`` holds)."""
        summary = {
            m: {
                fam: {str(step): dataclasses.asdict(cell) for step, cell in by_step.items()}
                for fam, by_step in by_fam.items()
            }
            for m, by_fam in self.summary().items()
        }
        sel = None
        if self.lr_selection is not None:
            sel = {
                "chosen": self.lr_selection.chosen,
                "val_loss": {
                    m: {repr(lr): v for lr, v in table.items()}
                    for m, table in self.lr_selection.val_loss.items()
                },
                "steps": self.lr_selection.steps,
                "tasks": list(self.lr_selection.tasks),
            }
        return {
            "methods": self.methods,
            "max_steps": self.max_steps,
            "n_seeds": self.n_seeds,
            "inner_lrs": self.inner_lrs,
            "inner": dataclasses.asdict(self.inner),
            "lr_selection": sel,
            "notes": self.notes,
            "step_sizes": self.step_sizes,
            "summary": summary,
            "comparisons": [dataclasses.asdict(c) for c in self.comparisons()],
            "records": [dataclasses.asdict(r) for r in self.records],
        }


def summarise(records: Sequence[EpisodeRecord]) -> dict[str, dict[str, dict[int, MetricSummary]]]:
    # (method, family, step) -> seed -> records
    cells: dict[tuple[str, str, int], dict[int, list[EpisodeRecord]]] = {}
    for r in records:
        for fam in {r.kind, r.family, OVERALL} - {""}:
            cells.setdefault((r.method, fam, r.step), {}).setdefault(r.seed, []).append(r)
    out: dict[str, dict[str, dict[int, MetricSummary]]] = {}
    for (method, fam, step), by_seed in cells.items():
        seed_loss = [sum(r.loss for r in rs) / len(rs) for rs in by_seed.values()]
        seed_acc = [sum(r.accuracy for r in rs) / len(rs) for rs in by_seed.values()]
        every = [r for rs in by_seed.values() for r in rs]
        strata = [r.task for r in every]
        out.setdefault(method, {}).setdefault(fam, {})[step] = MetricSummary(
            loss_mean=sum(seed_loss) / len(seed_loss),
            loss_worst=max(seed_loss),
            accuracy_mean=sum(seed_acc) / len(seed_acc),
            accuracy_worst=min(seed_acc),
            n_seeds=len(by_seed),
            n_episodes=len(every),
            accuracy_interval=bootstrap_interval([r.accuracy for r in every], strata),
            loss_interval=bootstrap_interval([r.loss for r in every], strata),
        )
    for by_fam in out.values():
        for fam in list(by_fam):
            by_fam[fam] = dict(sorted(by_fam[fam].items()))
    return out

