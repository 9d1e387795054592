"""What a held-out evaluation found: per-episode records, their summary over seeds, paired
differences between methods, and how the adaptation lrs were chosen (:class:`EvalResult`).

Summaries are the mean over seeds and the worst seed (the lowest seed-mean accuracy, the highest
seed-mean loss), per family (classification / generation, the suite's task families) and overall;
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
from fmmeta.evaluation.intervals import Interval
from fmmeta.evaluation.methods import BASE, IN_CONTEXT, MULTITASK
from fmmeta.evaluation.replicated import Replicated, replicated_interval
from fmmeta.tasks.episode import Episode

CLASSIFICATION = "classification"
MULTIPLE_CHOICE = "multiple_choice"
GENERATION = "generation"
OVERALL = "overall"
KINDS: tuple[str, ...] = (CLASSIFICATION, MULTIPLE_CHOICE, GENERATION)
"""The task kinds, in the order reports list them."""
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
        replicate: the training replicate the scored adapter belongs to (0 with one replicate).
        accuracy_per_token: accuracy with candidates ranked by mean log-probability per token
            (classification, multiple choice); ``None`` for generation.
        chance: a uniform guess's accuracy on the episode (:func:`chance_of`); ``None`` for
            generation.
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
    replicate: int = 0
    accuracy_per_token: float | None = None
    chance: float | None = None

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
        accuracy_interval: mean accuracy over episodes (and replicates) with its 95% interval
            (:func:`~fmmeta.evaluation.replicated.replicated_interval`).
        loss_interval: the same for the query loss.
        n_replicates: training replicates behind it.
    """

    loss_mean: float
    loss_worst: float
    accuracy_mean: float
    accuracy_worst: float
    n_seeds: int
    n_episodes: int
    accuracy_interval: Interval
    loss_interval: Interval
    n_replicates: int = 1


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
        accuracy_replicated, loss_replicated: the same differences with their variance
            components, the replicates favouring each side and the power of the comparison.
    """

    method: str
    baseline: str
    family: str
    method_step: int
    baseline_step: int
    accuracy: Interval
    loss: Interval
    accuracy_replicated: Replicated
    loss_replicated: Replicated


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
        def at_headline(m: str) -> tuple[int, dict[_Key, EpisodeRecord]]:
            step = self.headline_step(m)
            return step, {_key(r): r for r in self.records
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
        # Paired within a replicate: both adapters were trained from its initial adapter and draws.
        accuracy = replicated_interval(*_matrix({k: (r.accuracy - theirs[k].accuracy, r.task)
                                                 for k, r in mine.items()}))
        loss = replicated_interval(*_matrix({k: (r.loss - theirs[k].loss, r.task) for k, r in mine.items()}))
        return Comparison(
            method=method, baseline=baseline, family=family, method_step=m_step, baseline_step=b_step,
            accuracy=accuracy.interval, loss=loss.interval, accuracy_replicated=accuracy, loss_replicated=loss,
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
        cells: dict[tuple[str, str], dict[_Key, tuple[float, str]]] = {}
        for r in self.records:
            if r.chance is not None:
                chance.setdefault(r.task, []).append(r.chance)
                if r.step == headline.get(r.method):
                    cells.setdefault((r.task, r.method), {})[_key(r)] = (r.accuracy, r.task)

        def leaves(task: str, rate: float) -> bool:
            for m in self.methods:
                if (task, m) in cells:
                    i = replicated_interval(*_matrix(cells[(task, m)])).interval
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
            "train_seeds": self.train_seeds,
            "replicate_lrs": self.replicate_lrs,
            "format_shift": self.format_shift,
            "summary": summary,
            "comparisons": [dataclasses.asdict(c) for c in self.comparisons()],
            "against_base": [dataclasses.asdict(c) for c in self.against_base()],
            "records": [dataclasses.asdict(r) for r in self.records],
        }


_Key = tuple[int, tuple[int, str, int]]


def _key(record: EpisodeRecord) -> _Key:
    """``(replicate, episode)``: which adapter scored which episode (seed, task, index)."""
    return record.replicate, (record.seed, record.task, record.episode)


def _matrix(cells: dict[_Key, tuple[float, str]]) -> tuple[np.ndarray, list[str]]:
    """Values keyed by :func:`_key` as a ``[replicates, episodes]`` array (every replicate
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


def summarise(records: Sequence[EpisodeRecord]) -> dict[str, dict[str, dict[int, MetricSummary]]]:
    # (method, family, step) -> seed -> records
    cells: dict[tuple[str, str, int], dict[int, list[EpisodeRecord]]] = {}
    for r in records:
        # in a fixed order (a set's would follow string hashing, which differs per process, and
        # eval.json's keys with it)
        for fam in dict.fromkeys(f for f in (OVERALL, r.kind, r.family) if f):
            cells.setdefault((r.method, fam, r.step), {}).setdefault(r.seed, []).append(r)
    out: dict[str, dict[str, dict[int, MetricSummary]]] = {}
    for (method, fam, step), by_seed in cells.items():
        seed_loss = [sum(r.loss for r in rs) / len(rs) for rs in by_seed.values()]
        seed_acc = [sum(r.accuracy for r in rs) / len(rs) for rs in by_seed.values()]
        every = [r for rs in by_seed.values() for r in rs]
        accuracy, tasks = _matrix({_key(r): (r.accuracy, r.task) for r in every})
        loss, _ = _matrix({_key(r): (r.loss, r.task) for r in every})
        out.setdefault(method, {}).setdefault(fam, {})[step] = MetricSummary(
            loss_mean=sum(seed_loss) / len(seed_loss),
            loss_worst=max(seed_loss),
            accuracy_mean=sum(seed_acc) / len(seed_acc),
            accuracy_worst=min(seed_acc),
            n_seeds=len(by_seed),
            n_episodes=accuracy.shape[1],
            accuracy_interval=replicated_interval(accuracy, tasks).interval,
            loss_interval=replicated_interval(loss, tasks).interval,
            n_replicates=accuracy.shape[0],
        )
    for by_fam in out.values():
        for fam in list(by_fam):
            by_fam[fam] = dict(sorted(by_fam[fam].items()))
    return out

