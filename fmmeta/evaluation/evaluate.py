"""Held-out evaluation, honest by construction.

Every method is an adapter state (the tensors of the LoRA parameters): the base model (zero LoRA B,
i.e. the initial adapter), the FOMAML- and Reptile-trained adapters, the multi-task baseline, ...
Each is adapted on every held-out episode's support set with the project's one inner loop
(:func:`fmmeta.algorithms.inner_loop.adapt`) for 0..k steps and scored on the query set after each
step, so "0 steps" is the zero-shot score and the curve shows what adaptation buys. The special
method ``"in_context"`` scores its adapter state (normally the base) with the support set as
in-context demonstrations (:meth:`Episode.in_context_query`) and no adaptation; it has a step-0 score
only.

What keeps it honest:

* the same inner loop, support set and step budget for every method; the adapter is restored
  bit-exactly after each episode, and the caller's parameters after the whole evaluation;
* the adaptation learning rate is chosen per method on meta-*validation* tasks from a small grid
  (:func:`select_inner_lr`; inner-loop SGD on LoRA is fragile, docs/design.md, so one shared lr
  would favour whichever method it happens to suit), never on the held-out tasks;
  :func:`evaluate_held_out` refuses validation and held-out sets that share a task name;
* at least 3 seeds of episode draws, reported as the mean over seeds and the worst seed (the lowest
  seed-mean accuracy, the highest seed-mean loss), per family (classification / generation) and
  overall. Within a seed every episode weighs the same (its own loss is per answer token).

Evaluation runs with the model in eval mode (no dropout, so no random draws) and restores the mode
afterwards.

Several ranks (``ranks=`` an engine) split the episodes: in round ``k`` rank ``r`` takes episode
``k * world_size + r`` (or none), and the scores are gathered and put back in episode order, so the
result is the one a single process computes. Under ZeRO-3 every forward and backward pass
all-gathers parameters, so every rank must run the same sequence of passes or the run hangs: each
phase of an episode (a support step, a query scoring) is padded with zero-weight dummy passes up to
the largest pass count of any rank in that round. The adapter tensors must be resident (the
engine layer keeps them so).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

import torch
from torch import nn

from fmmeta.algorithms.inner_loop import (
    InnerLoopConfig,
    InnerOptimizer,
    adapt,
    check_lrs,
    evaluate_loss,
    restore,
    snapshot,
)
from fmmeta.evaluation.intervals import Interval, bootstrap_interval
from fmmeta.evaluation.scoring import score_passes, score_query
from fmmeta.tasks.episode import Batch, Episode, collate

logger = logging.getLogger(__name__)

IN_CONTEXT = "in_context"
"""Name of the method that uses the support set as demonstrations instead of adapting on it."""
MULTITASK = "multitask"
"""The same-compute baseline every meta-learned method is compared with."""

CLASSIFICATION = "classification"
GENERATION = "generation"
OVERALL = "overall"
FAMILIES: tuple[str, ...] = (CLASSIFICATION, GENERATION, OVERALL)

DEFAULT_LR_GRID: tuple[float, ...] = (0.003, 0.01, 0.03, 0.1)
"""Adaptation learning rates tried per method (a SmolLM2 probe found 0.01-0.1 useful; docs/design.md)."""


class Ranks(Protocol):
    """The part of an engine that splitting evaluation over ranks needs."""

    rank: int
    world_size: int

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        ...


class _OneRank:
    rank = 0
    world_size = 1

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]


_T = TypeVar("_T")


class _Lockstep:
    """Pads each phase of an episode to the same number of passes on every rank."""

    def __init__(self, model: nn.Module, params: Sequence[torch.Tensor], ranks: Ranks) -> None:
        self.model, self.params, self.ranks = model, params, ranks

    def most(self, n: int) -> int:
        """The largest ``n`` over ranks (a collective when there are several)."""
        return n if self.ranks.world_size == 1 else max(self.ranks.all_gather_object(n))

    def support(self, batches: list[Batch | None]) -> list[Batch | None]:
        """``batches`` padded with dummy passes (``None``) to the longest support of the round."""
        return batches + [None] * (self.most(len(batches)) - len(batches))

    def score(self, passes: int, fn: Callable[[], _T] | None) -> _T | None:
        """Runs ``fn`` (forward-only scoring of ``passes`` passes; ``None`` for a rank without an
        episode), then dummy forward passes up to the busiest rank's count.

        The counts are exchanged before any pass runs: a rank still in its forward passes while
        another waits in the exchange would mismatch the collectives.

        Raises:
            RuntimeError: if ``fn`` ran another number of passes than announced.
        """
        target = self.most(passes)
        ran = 0

        def count(*_: Any) -> None:
            nonlocal ran
            ran += 1

        handle = self.model.register_forward_pre_hook(count)
        try:
            result = fn() if fn is not None else None
        finally:
            handle.remove()
        if ran != passes:
            raise RuntimeError(
                f"scoring ran {ran} forward passes but score_passes() announced {passes}: "
                "fmmeta.evaluation.scoring.score_passes must follow score_query"
            )
        if target > ran:
            evaluate_loss(self.model, self.params, [None] * (target - ran))
        return result


def _sharded(ranks: Ranks, items: Sequence[Any], fn: Callable[[Any | None], _T]) -> list[_T]:
    """``[fn(item) for item in items]`` with the items split over ranks, in the original order.

    Every rank calls ``fn`` once per round, with ``None`` when it has no item left, so ranks run the
    same number of rounds.
    """
    world, rank = ranks.world_size, ranks.rank
    mine: dict[int, _T] = {}
    for start in range(0, len(items), world):
        i = start + rank
        result = fn(items[i] if i < len(items) else None)
        if i < len(items):
            mine[i] = result
    if world == 1:
        return [mine[i] for i in range(len(items))]
    merged: dict[int, _T] = {}
    for part in ranks.all_gather_object(mine):
        merged.update(part)
    return [merged[i] for i in range(len(items))]


@dataclass(frozen=True)
class EvalMethod:
    """How one row of the report is scored.

    Attributes:
        state: adapter tensors to load (``None`` = the adapter as it is, e.g. the base model's
            zero-B LoRA).
        demonstrations: score each query with the episode's support prepended as in-context
            demonstrations (MetaICL style), after adaptation if ``adapt``.
        adapt: adapt on the support for 1..max_steps steps and score after each; ``False``
            scores at step 0 only.
        inner_lrs: one adaptation step size per adapter tensor, learned in meta-training
            (``metasgd``, :func:`~fmmeta.algorithms.meta_sgd.load_inner_lrs`); used as they are,
            so no lr is chosen from the grid for this method. ``None``: a single lr.
    """

    state: Sequence[torch.Tensor] | None = None
    demonstrations: bool = False
    adapt: bool = True
    inner_lrs: Sequence[float] | None = None


def as_eval_method(name: str, value: EvalMethod | Sequence[torch.Tensor] | None) -> EvalMethod:
    """``value`` as an :class:`EvalMethod`: a bare state (or ``None``) adapts without
    demonstrations, except under the name ``"in_context"``, which scores with demonstrations and
    no adaptation."""
    if isinstance(value, EvalMethod):
        return value
    if name == IN_CONTEXT:
        return EvalMethod(value, demonstrations=True, adapt=False)
    return EvalMethod(value)


MethodSpec = EvalMethod | Sequence[torch.Tensor] | None
"""What callers pass per method name: an :class:`EvalMethod` or just a state (see
:func:`as_eval_method`)."""


def family_of(episode: Episode) -> str:
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
        family: ``"classification"`` or ``"generation"``.
        domain: the task's family in the suite (e.g. ``"cldr-langid"``), or ``""`` if not given.
        step: adaptation steps taken before scoring (0 = none).
        loss: mean query loss per answer token (nats).
        accuracy: query accuracy in [0, 1].
        n: number of queries.
    """

    method: str
    seed: int
    episode: int
    task: str
    family: str
    step: int
    loss: float
    accuracy: float
    n: int
    domain: str = ""


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
    """The adaptation learning rate chosen per method on meta-validation tasks.

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
        learned_lrs: the per-tensor step sizes of methods that adapt with learned ones.
    """

    records: list[EpisodeRecord]
    methods: list[str]
    max_steps: int
    n_seeds: int
    inner_lrs: dict[str, float]
    inner: InnerLoopConfig
    lr_selection: LrSelection | None = None
    notes: list[str] = field(default_factory=list)
    learned_lrs: dict[str, list[float]] = field(default_factory=dict)
    _summary: dict[str, dict[str, dict[int, MetricSummary]]] | None = field(
        default=None, repr=False, compare=False
    )
    _comparisons: dict[tuple[str, ...], list[Comparison]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def steps_of(self, method: str) -> list[int]:
        """Adaptation steps scored for ``method`` (``[0]`` for methods that do not adapt)."""
        return sorted({r.step for r in self.records if r.method == method})

    def families(self) -> list[str]:
        """Families present in the records (classification, generation, then the suite's task
        families when records name them), then ``"overall"``."""
        present = {r.family for r in self.records}
        domains = sorted({r.domain for r in self.records if r.domain})
        return [f for f in (CLASSIFICATION, GENERATION) if f in present] + domains + [OVERALL]

    def summary(self) -> dict[str, dict[str, dict[int, MetricSummary]]]:
        """``summary()[method][family][step]``: mean, worst case over seeds, and intervals."""
        if self._summary is None:
            self._summary = _summarise(self.records)
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
                          if r.method == m and r.step == step and family in (r.family, r.domain, OVERALL)}

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
            "learned_lrs": self.learned_lrs,
            "summary": summary,
            "comparisons": [dataclasses.asdict(c) for c in self.comparisons()],
            "records": [dataclasses.asdict(r) for r in self.records],
        }


def _summarise(records: Sequence[EpisodeRecord]) -> dict[str, dict[str, dict[int, MetricSummary]]]:
    # (method, family, step) -> seed -> records
    cells: dict[tuple[str, str, int], dict[int, list[EpisodeRecord]]] = {}
    for r in records:
        for fam in {r.family, r.domain, OVERALL} - {""}:
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


def _support_batches(episode: Episode, pad_id: int, micro_batch_size: int) -> list[Batch | None]:
    s = episode.support
    return [collate(s[i : i + micro_batch_size], pad_id) for i in range(0, len(s), micro_batch_size)]


def _check_states(params: Sequence[torch.Tensor], methods: Mapping[str, EvalMethod]) -> None:
    if not methods:
        raise ValueError("methods is empty: pass at least one adapter state, e.g. {'base': None}")
    for name, method in methods.items():
        state = method.state
        if state is None:
            continue
        if len(state) != len(params):
            raise ValueError(
                f"methods[{name!r}] has {len(state)} tensors for {len(params)} adapter parameters: "
                "pass a state saved from the same adapter (same LoRA targets and rank), in order"
            )
        for i, (p, t) in enumerate(zip(params, state)):
            if tuple(p.shape) != tuple(t.shape):
                raise ValueError(
                    f"methods[{name!r}][{i}] has shape {tuple(t.shape)} but adapter parameter {i} has "
                    f"shape {tuple(p.shape)}: the state belongs to a different adapter configuration"
                )


def _load(params: Sequence[torch.Tensor], state: Sequence[torch.Tensor]) -> None:
    restore(params, [t.to(device=p.device, dtype=p.dtype) for p, t in zip(params, state)])


def _score(
    model: nn.Module, episode: Episode | None, pad_id: int, micro_batch_size: int, lockstep: _Lockstep,
    icl_max_length: int | None,
) -> tuple[float, float, int] | None:
    """Scores the query as it is now: plain, or with the support in context when
    ``icl_max_length`` is given (``None`` for a rank without an episode)."""
    ep = episode
    if ep is None:
        s = lockstep.score(0, None)
    else:
        query = ep.query if icl_max_length is None else ep.in_context_query(icl_max_length)
        s = lockstep.score(
            score_passes(query, choices=ep.choices, micro_batch_size=micro_batch_size),
            lambda: score_query(model, query, pad_id, choices=ep.choices, micro_batch_size=micro_batch_size),
        )
    return None if s is None else (s.loss, s.accuracy, s.n)


def _adapt_and_score(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    episode: Episode | None,
    cfg: InnerLoopConfig,
    steps: int,
    pad_id: int,
    micro_batch_size: int,
    lockstep: _Lockstep,
    *,
    icl_max_length: int | None = None,
    score_every_step: bool = True,
    lrs: Sequence[float] | None = None,
) -> list[tuple[int, float, float, int]]:
    """Adapts on the support step by step; returns ``(step, loss, accuracy, n)`` per scored step.

    One :class:`InnerOptimizer` carries the trajectory across the one-step ``adapt`` calls, so
    stepping and scoring in between gives exactly the weights of ``adapt(steps=k)``. ``episode``
    ``None`` runs only the dummy passes that keep this rank in step with the others. With
    ``icl_max_length`` every query is scored with the support prepended as demonstrations;
    ``lrs`` gives every adapter tensor its own step size.
    """
    out: list[tuple[int, float, float, int]] = []
    support = [] if episode is None or steps == 0 else _support_batches(episode, pad_id, micro_batch_size)
    support = lockstep.support(support) if steps else []
    opt = InnerOptimizer(cfg, params, lrs)
    for step in range(steps + 1):
        if step > 0:
            adapt(model, params, support, cfg, steps=1, optimizer=opt)
        if score_every_step or step == steps:
            s = _score(model, episode, pad_id, micro_batch_size, lockstep, icl_max_length)
            if s is not None:
                out.append((step, *s))
    return out


def _prepare_methods(
    params: Sequence[torch.Tensor], methods: Mapping[str, MethodSpec]
) -> dict[str, EvalMethod]:
    specs = {name: as_eval_method(name, value) for name, value in methods.items()}
    _check_states(params, specs)
    for name, spec in specs.items():
        if spec.inner_lrs is not None:
            check_lrs(spec.inner_lrs, len(params))  # one positive, finite lr per adapter tensor
    return specs


def _adapting(specs: Mapping[str, EvalMethod]) -> list[str]:
    return [m for m, spec in specs.items() if spec.adapt]


def _needs_lr(specs: Mapping[str, EvalMethod]) -> list[str]:
    """Methods that adapt with one lr (to choose), not with learned per-tensor ones."""
    return [m for m in _adapting(specs) if specs[m].inner_lrs is None]


def evaluate_methods(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    methods: Mapping[str, MethodSpec],
    episodes_per_seed: Sequence[Sequence[Episode]],
    inner: InnerLoopConfig,
    max_steps: int,
    pad_id: int,
    *,
    inner_lrs: Mapping[str, float] | None = None,
    micro_batch_size: int = 8,
    min_seeds: int = 3,
    lr_selection: LrSelection | None = None,
    progress: bool = False,
    ranks: Ranks | None = None,
    domains: Mapping[str, str] | None = None,
    icl_max_length: int = 1024,
) -> EvalResult:
    """Adapts each method on each held-out episode for 0..``max_steps`` steps and scores the query.

    Every method sees the very same episodes (so differences between methods are paired).

    Args:
        model: the causal LM whose adapter tensors are ``params``.
        params: the adapter tensors (resident, in the engine's order); restored exactly on return.
        methods: method name -> :class:`EvalMethod`, or just the adapter state to load into
            ``params`` (``None`` = ``params`` as they are now, e.g. the base model's zero-B LoRA;
            see :func:`as_eval_method`: the name ``"in_context"`` scores with demonstrations).
        episodes_per_seed: ``episodes_per_seed[s]`` are the held-out episodes of seed ``s``.
        inner: the inner loop shared by all methods (its ``inner_lr`` is the default lr).
        max_steps: largest number of adaptation steps to score (>= 0).
        pad_id: padding token id.
        inner_lrs: adaptation lr per method (from :func:`select_inner_lr`); missing = ``inner.inner_lr``.
        micro_batch_size: sequences per forward pass for support and query.
        min_seeds: fewest episode draws accepted (3 by default; a worst case over fewer says little).
        lr_selection: recorded in the result so the report can show how lrs were chosen.
        progress: show a tqdm bar over (method, episode) pairs (turn on for rank 0 only).
        ranks: split the episodes over the ranks of this engine (every rank must call, with the
            same arguments); the result is the same on every rank and equals one process's.
        domains: task name -> its family in the suite; the report then also has a table per family.
        icl_max_length: longest in-context query (demonstrations + query) in tokens; longer ones
            lose their oldest demonstration tokens.

    Returns:
        All records and their summary.

    Raises:
        ValueError: on too few seeds, an empty seed, a bad ``max_steps`` or a state that does not
            fit ``params``.

    Example:
        >>> sel = select_inner_lr(model, params, methods, val_episodes, inner, steps=3, pad_id=0)
        >>> res = evaluate_methods(model, params, methods, test_episodes_per_seed, inner, 3, 0,
        ...                        inner_lrs=sel.chosen, lr_selection=sel)      # doctest: +SKIP
    """
    if max_steps < 0:
        raise ValueError(f"max_steps={max_steps} is invalid: must be >= 0 (0 = no adaptation)")
    if len(episodes_per_seed) < min_seeds:
        raise ValueError(
            f"episodes_per_seed has {len(episodes_per_seed)} seed(s): at least min_seeds={min_seeds} "
            "episode draws are needed for a mean and a worst case; draw more seeds or lower min_seeds"
        )
    for s, eps in enumerate(episodes_per_seed):
        if len(eps) == 0:
            raise ValueError(f"episodes_per_seed[{s}] is empty: every seed needs >= 1 episode")
    specs = _prepare_methods(params, methods)
    lrs = {m: (inner_lrs or {}).get(m, inner.inner_lr) for m in _needs_lr(specs)}
    domains = domains or {}

    ranks = ranks or _OneRank()
    lockstep = _Lockstep(model, params, ranks)
    theta = snapshot(params)
    was_training = model.training
    model.eval()
    records: list[EpisodeRecord] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(specs) * sum(len(e) for e in episodes_per_seed), desc="eval", unit="ep")
    try:
        for method, spec in specs.items():
            start = theta if spec.state is None else [t.detach() for t in spec.state]
            cfg = dataclasses.replace(inner, inner_lr=lrs.get(method, inner.inner_lr))
            steps = max_steps if spec.adapt else 0
            icl = icl_max_length if spec.demonstrations else None
            logger.info("evaluating %s (lr %s) on %d seeds", method,
                        "learned" if spec.inner_lrs is not None else lrs.get(method), len(episodes_per_seed))

            def one(ep: Episode | None) -> list[tuple[int, float, float, int]]:
                _load(params, start)
                scored = _adapt_and_score(model, params, ep, cfg, steps, pad_id, micro_batch_size,
                                          lockstep, icl_max_length=icl, lrs=spec.inner_lrs)
                if bar is not None:
                    bar.update(ranks.world_size if ep is not None else 0)
                return scored

            for seed, episodes in enumerate(episodes_per_seed):
                for i, (ep, scored) in enumerate(zip(episodes, _sharded(ranks, episodes, one))):
                    records.extend(
                        EpisodeRecord(
                            method=method, seed=seed, episode=i, task=ep.task, family=family_of(ep),
                            domain=domains.get(ep.task, ""), step=step, loss=loss, accuracy=acc, n=n,
                        )
                        for step, loss, acc, n in scored
                    )
    finally:
        if bar is not None:
            bar.close()
        restore(params, theta)
        model.train(was_training)
    return EvalResult(
        records=records,
        methods=list(specs),
        max_steps=max_steps,
        n_seeds=len(episodes_per_seed),
        inner_lrs=lrs,
        inner=inner,
        lr_selection=lr_selection,
        learned_lrs={m: [float(x) for x in spec.inner_lrs] for m, spec in specs.items()
                     if spec.inner_lrs is not None},
    )


def select_inner_lr(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    methods: Mapping[str, MethodSpec],
    validation_episodes: Sequence[Episode],
    inner: InnerLoopConfig,
    *,
    steps: int,
    pad_id: int,
    lr_grid: Sequence[float] = DEFAULT_LR_GRID,
    micro_batch_size: int = 8,
    ranks: Ranks | None = None,
    icl_max_length: int = 1024,
) -> LrSelection:
    """Chooses each method's adaptation lr on meta-validation episodes (never held-out ones).

    For every method that adapts and every lr of the grid, adapts ``steps`` steps on each
    validation episode's support and measures the mean query loss, scored as the method is scored
    (with demonstrations where it uses them); the lr with the lowest loss wins (loss, not accuracy:
    it is smooth on small query sets; ties go to the smaller lr; a diverged, non-finite loss counts
    as ``inf``). Methods that do not adapt (in-context demonstrations) and methods with learned
    per-tensor step sizes get no lr.

    Args:
        model: the causal LM; params: its adapter tensors, restored exactly on return.
        methods: as for :func:`evaluate_methods`.
        validation_episodes: episodes of meta-validation tasks (disjoint from the held-out tasks).
        inner: the shared inner loop; only its lr is varied.
        steps: adaptation steps to choose the lr for (the largest step count reported).
        pad_id: padding token id.
        lr_grid: candidate lrs, each > 0.
        micro_batch_size: sequences per forward pass.
        ranks: split the episodes over the ranks of this engine (as for :func:`evaluate_methods`).
        icl_max_length: as for :func:`evaluate_methods`.

    Raises:
        ValueError: on no validation episodes, an empty grid or a non-positive lr.
    """
    if len(validation_episodes) == 0:
        raise ValueError(
            "validation_episodes is empty: lr selection needs meta-validation episodes "
            "(tasks kept out of both meta-training and the held-out test set)"
        )
    if len(lr_grid) == 0 or any(not lr > 0 for lr in lr_grid):
        raise ValueError(f"lr_grid={list(lr_grid)} is invalid: give one or more lrs, each > 0")
    if steps < 0:
        raise ValueError(f"steps={steps} is invalid: must be >= 0")
    specs = _prepare_methods(params, methods)
    ranks = ranks or _OneRank()
    lockstep = _Lockstep(model, params, ranks)
    theta = snapshot(params)
    was_training = model.training
    model.eval()
    val_loss: dict[str, dict[float, float]] = {}
    chosen: dict[str, float] = {}
    try:
        for method in _needs_lr(specs):
            spec = specs[method]
            start = theta if spec.state is None else [t.detach() for t in spec.state]
            icl = icl_max_length if spec.demonstrations else None
            table: dict[float, float] = {}
            for lr in sorted(lr_grid):
                cfg = dataclasses.replace(inner, inner_lr=lr)

                def final_loss(ep: Episode | None) -> float:
                    _load(params, start)
                    scored = _adapt_and_score(
                        model, params, ep, cfg, steps, pad_id, micro_batch_size, lockstep,
                        icl_max_length=icl, score_every_step=False,
                    )
                    return scored[0][1] if scored else math.nan

                losses = _sharded(ranks, validation_episodes, final_loss)
                mean = sum(losses) / len(losses)
                table[lr] = mean if math.isfinite(mean) else math.inf
            val_loss[method] = table
            chosen[method] = min(table, key=lambda lr: (table[lr], lr))
            logger.info("lr for %s: %s (validation query loss %s)", method, chosen[method], table)
    finally:
        restore(params, theta)
        model.train(was_training)
    return LrSelection(
        chosen=chosen,
        val_loss=val_loss,
        steps=steps,
        tasks=tuple(sorted({ep.task for ep in validation_episodes})),
    )


def evaluate_held_out(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    methods: Mapping[str, MethodSpec],
    validation_episodes: Sequence[Episode],
    test_episodes_per_seed: Sequence[Sequence[Episode]],
    inner: InnerLoopConfig,
    max_steps: int,
    pad_id: int,
    *,
    lr_grid: Sequence[float] = DEFAULT_LR_GRID,
    micro_batch_size: int = 8,
    min_seeds: int = 3,
    progress: bool = False,
    ranks: Ranks | None = None,
    domains: Mapping[str, str] | None = None,
    icl_max_length: int = 1024,
) -> EvalResult:
    """Chooses lrs on validation tasks, then evaluates on held-out tasks: the whole honest protocol.

    The lrs are fixed before any held-out episode is seen, and a task that appears in both sets is
    refused (the held-out numbers would no longer be held out).

    Args:
        model, params, methods, inner, max_steps, pad_id, micro_batch_size, min_seeds, progress,
            ranks, domains, icl_max_length: as for :func:`evaluate_methods`.
        validation_episodes: episodes of meta-validation tasks, for :func:`select_inner_lr`.
        test_episodes_per_seed: held-out episodes, one list per seed of episode draws.
        lr_grid: candidate adaptation lrs; each method's is chosen at ``max_steps`` steps.

    Raises:
        ValueError: if a task name appears in both ``validation_episodes`` and the test episodes,
            and on the errors of :func:`select_inner_lr` and :func:`evaluate_methods`.

    Example:
        >>> res = evaluate_held_out(model, params, {"base": None, "fomaml": phi},
        ...                         val_eps, test_eps_per_seed, InnerLoopConfig(), 3, pad_id=0)
        >>> write_report(res, "out/eval")                                      # doctest: +SKIP
    """
    val_tasks = {ep.task for ep in validation_episodes}
    test_tasks = {ep.task for eps in test_episodes_per_seed for ep in eps}
    shared = sorted(val_tasks & test_tasks)
    if shared:
        raise ValueError(
            f"tasks {shared} are both validation and held-out tasks: the lr would be tuned on the "
            "test set; split the task suite so validation and held-out tasks are disjoint"
        )
    sel = select_inner_lr(
        model, params, methods, validation_episodes, inner,
        steps=max_steps, pad_id=pad_id, lr_grid=lr_grid, micro_batch_size=micro_batch_size,
        ranks=ranks, icl_max_length=icl_max_length,
    )
    return evaluate_methods(
        model, params, methods, test_episodes_per_seed, inner, max_steps, pad_id,
        inner_lrs=sel.chosen, micro_batch_size=micro_batch_size, min_seeds=min_seeds,
        lr_selection=sel, progress=progress, ranks=ranks, domains=domains,
        icl_max_length=icl_max_length,
    )
