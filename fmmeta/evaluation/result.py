"""What a held-out evaluation found: per-episode records, their summary over seeds, paired
differences between methods, and how the adaptation lrs were chosen (:class:`EvalResult`).

Every metric is one registered object (:mod:`fmmeta.evaluation.metrics`); records carry them by
name and the summary, the comparisons and their intervals take every registered metric alike
(:mod:`fmmeta.evaluation.summary`). Summaries are the mean over seeds and the worst seed (the
lowest seed value of a metric where higher is better, such as accuracy, the highest of one where
lower is, such as loss), per family (classification / generation, the suite's task families) and overall;
within a seed every episode weighs the same (its own loss is per answer token). With one training
replicate, intervals are stratified bootstraps over episodes (:mod:`fmmeta.evaluation.intervals`),
which hold the trained adapters fixed; with several (``train.replicates``), every replicate is
scored on the same episodes and intervals count training variance too
(:mod:`fmmeta.evaluation.replicated`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.evaluation.methods import BASE, IN_CONTEXT, MULTITASK
from fmmeta.evaluation.metrics import CLASSIFICATION, GENERATION, HEADLINE, KINDS, MULTIPLE_CHOICE
from fmmeta.evaluation.replicated import replicated_interval
from fmmeta.evaluation.summary import (
    OVERALL,
    Comparison,
    EpisodeRecord,
    Key,
    MetricCell,
    MetricSummary,
    key_of,
    matrix,
    paired,
    summarise,
)
from fmmeta.tasks.episode import Episode

FAMILIES: tuple[str, ...] = (*KINDS, OVERALL)


def kind_of(episode: Episode) -> str:
    """``"classification"`` when the episode has answer ``choices``, ``"multiple_choice"`` when
    its questions bring their own options, else ``"generation"``."""
    if episode.choices is not None:
        return CLASSIFICATION
    return MULTIPLE_CHOICE if episode.query[0].options is not None else GENERATION


def chance_of(episode: Episode) -> float | None:
    """The accuracy of a uniform guess among an episode's candidates (its ways, or the mean over
    its questions of one over their options); ``None`` for generation, which has no candidates."""
    if episode.choices is not None:
        return 1.0 / len(episode.choices)
    if episode.query[0].options is None:
        return None
    return float(np.mean([1.0 / len(ex.options or ()) for ex in episode.query]))


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
        step_sizes: the per-tensor step sizes of methods that adapt with learned ones (replicate
            0's when there are several).
        train_seeds: the training seed of each replicate (record ``replicate`` r has
            ``train_seeds[r]``); empty when the evaluation does not know it (one replicate).
        replicate_lrs: the adaptation lrs of each replicate, each chosen on validation for its
            own adapters, when there are several (``inner_lrs`` is replicate 0's).
        format_shift: held-out families of a format no meta-training task has, scored apart
            against the base model (:meth:`against_base`).
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
    train_seeds: list[int] = field(default_factory=list)
    replicate_lrs: list[dict[str, float]] = field(default_factory=list)
    format_shift: list[str] = field(default_factory=list)
    _summary: dict[str, dict[str, dict[int, MetricSummary]]] | None = field(
        default=None, repr=False, compare=False
    )
    _comparisons: dict[tuple[str, ...], list[Comparison]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def n_replicates(self) -> int:
        """Training replicates scored (1 unless ``train.replicates`` trained several)."""
        return 1 + max((r.replicate for r in self.records), default=0)

    def steps_of(self, method: str) -> list[int]:
        """Adaptation steps scored for ``method`` (``[0]`` for methods that do not adapt)."""
        return sorted({r.step for r in self.records if r.method == method})

    def headline_step(self, method: str) -> int:
        """The most adaptation steps ``method`` was scored at (0 for methods that do not adapt)."""
        steps = self.steps_of(method)
        return steps[-1] if steps else 0

    def scored_steps(self) -> list[int]:
        """Adaptation steps scored for any method (all of 0..max_steps unless fewer were asked)."""
        return sorted({r.step for r in self.records})

    def families(self) -> list[str]:
        """Families present in the records (classification, generation, then the suite's task
        families when records name them), then ``"overall"``."""
        present = {r.kind for r in self.records}
        families = sorted({r.family for r in self.records if r.family})
        return [f for f in KINDS if f in present] + families + [OVERALL]

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
        def at_headline(m: str) -> tuple[int, dict[Key, EpisodeRecord]]:
            step = self.headline_step(m)
            return step, {key_of(r): r for r in self.records
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
        return Comparison(method=method, baseline=baseline, family=family, method_step=m_step,
                          baseline_step=b_step, metrics=paired(mine, theirs))

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

    def against_base(self) -> list[Comparison]:
        """Every method against the base model on each :attr:`format_shift` family: whether
        meta-training helps or hurts on a task of a format it never saw."""
        out = []
        for family in self.format_shift:
            for method in self.methods:
                c = None if method == BASE else self.compare(method, BASE, family)
                if c is not None:
                    out.append(c)
        return out

    def at_chance(self) -> dict[str, float]:
        """Tasks where no method's accuracy leaves chance: ``task -> chance rate`` for every task
        with candidates on which, for every method at its headline step, the 95% accuracy interval
        over the task's episodes (and replicates) holds the chance rate. On such a task the model
        tells no candidate apart, so differences between methods there are noise the report keeps
        out of its headline."""
        chance: dict[str, list[float]] = {}
        headline = {m: self.headline_step(m) for m in self.methods}
        cells: dict[tuple[str, str], dict[Key, tuple[float, str]]] = {}
        for r in self.records:
            if r.chance is not None:
                chance.setdefault(r.task, []).append(r.chance)
                if r.step == headline.get(r.method):
                    cells.setdefault((r.task, r.method), {})[key_of(r)] = (r.metrics[HEADLINE], r.task)

        def leaves(task: str, rate: float) -> bool:
            for m in self.methods:
                if (task, m) in cells:
                    i = replicated_interval(*matrix(cells[(task, m)])).interval
                    if i.low > rate or i.high < rate:
                        return True
            return False

        rates = {task: float(np.mean(values)) for task, values in chance.items()}
        return {task: rate for task, rate in rates.items() if not leaves(task, rate)}

    def without_tasks(self, tasks: Sequence[str]) -> EvalResult:
        """The same result with ``tasks``' records left out (summaries computed anew)."""
        left_out = set(tasks)
        keep = [r for r in self.records if r.task not in left_out]
        return dataclasses.replace(self, records=keep, _summary=None, _comparisons={})

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

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EvalResult:
        """The result an ``eval.json`` holds (:meth:`to_dict`), to report it again: its summary,
        intervals and comparisons are computed anew from the records (a ``null`` validation loss,
        strict JSON's non-finite, reads back as ``inf``)."""
        sel = raw.get("lr_selection")
        selection = None if sel is None else LrSelection(
            chosen={m: float(v) for m, v in sel["chosen"].items()},
            val_loss={m: {float(lr): (float("inf") if v is None else float(v)) for lr, v in table.items()}
                      for m, table in sel["val_loss"].items()},
            steps=int(sel["steps"]), tasks=tuple(sel["tasks"]),
        )
        inner: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw["inner"].items()}
        return cls(
            records=[EpisodeRecord.from_dict(r) for r in raw["records"]], methods=list(raw["methods"]),
            max_steps=int(raw["max_steps"]), n_seeds=int(raw["n_seeds"]), inner_lrs=dict(raw["inner_lrs"]),
            inner=InnerLoopConfig(**inner),
            lr_selection=selection, notes=list(raw.get("notes", [])), step_sizes=dict(raw.get("step_sizes", {})),
            train_seeds=list(raw.get("train_seeds", [])), replicate_lrs=list(raw.get("replicate_lrs", [])),
            format_shift=list(raw.get("format_shift", [])),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``eval.json`` holds)."""
        summary = {
            m: {
                fam: {str(step): cell.to_dict() for step, cell in by_step.items()}
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
            "train_seeds": self.train_seeds,
            "replicate_lrs": self.replicate_lrs,
            "format_shift": self.format_shift,
            "summary": summary,
            "comparisons": [c.to_dict() for c in self.comparisons()],
            "against_base": [c.to_dict() for c in self.against_base()],
            "records": [r.to_dict() for r in self.records],
        }


def merge_replicates(results: Sequence[EvalResult], train_seeds: Sequence[int]) -> EvalResult:
    """One result of several training replicates, each evaluated on the same episodes: record
    ``replicate`` r comes from ``results[r]`` (trained with ``train_seeds[r]``)."""
    if len(results) != len(train_seeds) or not results:
        raise ValueError(f"got {len(results)} results for {len(train_seeds)} training seeds: give one per replicate")
    if len(results) == 1:
        return dataclasses.replace(results[0], train_seeds=list(train_seeds))
    first = results[0]
    return dataclasses.replace(
        first,
        records=[dataclasses.replace(rec, replicate=r) for r, res in enumerate(results) for rec in res.records],
        train_seeds=list(train_seeds),
        replicate_lrs=[dict(res.inner_lrs) for res in results],
        _summary=None, _comparisons={},
    )


__all__ = ["CLASSIFICATION", "FAMILIES", "GENERATION", "KINDS", "MULTIPLE_CHOICE", "OVERALL", "Comparison",
           "EpisodeRecord", "EvalResult", "LrSelection", "MetricCell", "MetricSummary", "chance_of", "kind_of",
           "merge_replicates", "summarise"]
