"""First-order meta-algorithms over adapter parameters: FOMAML and Reptile, and the two baselines
they must beat: multi-task training and MetaICL.

(Meta-SGD, FOMAML with learned inner step sizes, lives in :mod:`fmmeta.algorithms.meta_sgd` and
is built here too.)

Each turns one rank's packed work (:class:`RankWork`: its tasks and passes) into the sum of its
tasks' meta-gradients and leaves the adapter exactly at theta. They share the one inner loop
(:mod:`fmmeta.algorithms.inner_loop`), run every task of the rank in the same passes (each row
through its own task's fast weights, :mod:`fmmeta.algorithms.task_lora`) and differ only in what
they return:

========== ============================================== ==========================================
algorithm  meta-gradient per task                         passes (S, Q = the rank's support and
                                                          query passes)
========== ============================================== ==========================================
FOMAML     query-loss gradient at phi                     k*S (fwd+bwd) + Q (fwd+bwd)
Reptile    theta - phi                                    k*S (fwd+bwd) + Q (fwd only, or fwd+bwd
                                                          when the query step is folded in)
MultiTask  pooled support+query loss gradient at theta    k*S + Q (fwd+bwd) when ``multitask_match_
                                                          passes`` (S over k distinct support
                                                          sets), else S + Q
MetaICL    query-answer loss gradient at theta with the   Q' (fwd+bwd): the query passes, each row
           support as in-context demonstrations           with its demonstrations prepended
========== ============================================== ==========================================

``k`` is ``inner_steps``. Measuring the query loss before adaptation (``measure_query_before``)
adds Q forward-only passes to FOMAML and Reptile; every rank must use the same setting, because
under ZeRO-3 every forward is a collective.

How the multi-task baseline's compute is matched to FOMAML's: with ``multitask_match_passes``
(default) the sampler gives each of its episodes ``k`` distinct support sets (``support_draws``:
the first is the one FOMAML would see, the others come from fresh episodes of the same task), and
it runs every support pass once, then every query pass once, all at theta. So it processes as many
support rows as FOMAML's ``k`` inner steps, but spends them on new examples instead of the same
gradient ``k`` times; each task's sum is divided by its pooled answer-token count (support +
query). (With ``k = 0`` the support is never visited, as in FOMAML, and the gradient is the query
gradient.) It needs no fast weights: all tasks share theta, so it runs the model's own LoRA forward.

MetaICL (Min et al., 2022) trains theta to use demonstrations: each query row gets its episode's
support prepended (:meth:`~fmmeta.tasks.episode.Episode.in_context_query`, cut from the left to
``icl_max_length`` tokens) and the loss covers the query answers only. It keeps the plan's query
passes (same rows, so every rank runs the same pass count under ZeRO-3) and runs no support pass;
its rows are longer, so a pass costs more than the plan's cost model predicts.

``support_draws`` and ``support_repeats`` on each algorithm tell the sampler the shape of its
work: how many support sets an episode carries, and how often each support pass runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fmmeta.algorithms.inner_loop import InnerLoopConfig, InnerOptimizer, adapt_tasks
from fmmeta.algorithms.meta_sgd import MetaSGD
from fmmeta.algorithms.passes import PackedBatch, Pass, answer_tokens_per_task, run_passes
from fmmeta.algorithms.protocol import MetaAlgorithm, RankResult, RankWork, prepare_rank
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters
from fmmeta.config import raise_if_invalid
from fmmeta.sampling.plan import RankPlan
from fmmeta.tasks.episode import collate

logger = logging.getLogger(__name__)

ALGORITHMS = ("fomaml", "metasgd", "reptile", "multitask", "metaicl")

BUDGET_RULES: dict[str, str] = {
    "fomaml": "{k} inner steps over the support set, then the query gradient at the adapted weights.",
    "metasgd": "{k} inner steps over the support set at its learned per-tensor step sizes, then the "
    "query gradient at the adapted weights (the step sizes' gradient reuses those tensors).",
    "reptile": "{k} inner steps over the support set; theta - phi is the meta-gradient.",
    "multitask": "the same support rows as {k} inner steps, spent on {k} distinct support sets "
    "(not one set {k} times), plus the query, all at theta.",
    "metaicl": "the query rows with the support prepended as demonstrations (longer rows, no "
    "support passes).",
}
"""The compute each method spends per episode, as the evaluation report states it (``{k}``:
inner steps)."""


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """The meta-algorithms' per-task settings (identical on every rank).

    Which algorithm runs is not a field: the recipe trains every method it lists (``methods``),
    each built by :func:`build_algorithm` from its name and this one config.
    """

    inner_steps: int = 3
    """Inner optimizer steps on the support set per task (>= 0)."""
    inner_lr: float = 0.03
    """Inner learning rate (> 0)."""
    inner_optimizer: str = "sgd"
    """Inner optimizer: "sgd" or "adam" (fresh moments per task)."""
    inner_clip_norm: float | None = None
    """Per-inner-step global gradient-norm clip (> 0); null = off."""
    pad_to_multiple_of: int | None = None
    """Pad each micro-batch's length to a multiple of this (>= 1); null = exact lengths."""
    measure_query_before: bool = False
    """Also measure the query loss at theta (one extra forward pass per query pass). Equal on
    every rank (under ZeRO-3 every forward is a collective)."""
    reptile_query_step: bool = False
    """Reptile only: after the support steps take one more inner step on the query set, so
    theta - phi includes it; the query loss after adaptation then comes free with its forward."""
    multitask_match_passes: bool = True
    """MultiTask only: run FOMAML's pass count (support passes inner_steps times each, query once)
    so the baseline spends the same compute; see the module docstring."""
    icl_max_length: int = 1024
    """MetaICL (training and in-context scoring): longest sequence of demonstrations + query in
    tokens (>= 2); longer ones lose their oldest demonstration tokens."""
    step_size_lr: float = 0.01
    """metasgd only: Adam learning rate of the log inner step sizes (> 0); one meta-step changes
    each step size by at most about this fraction (0.01: 1%)."""

    def validate(self) -> list[str]:
        """Range and choice checks, including the inner-loop fields."""
        problems: list[str] = []
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            problems.append(
                f"pad_to_multiple_of={self.pad_to_multiple_of} is invalid: must be >= 1, or null"
            )
        if not self.icl_max_length >= 2:
            problems.append(
                f"icl_max_length={self.icl_max_length} is invalid: must be >= 2 (tokens of "
                "demonstrations + query; MetaICL used 1024)"
            )
        if not (math.isfinite(self.step_size_lr) and self.step_size_lr > 0):
            problems.append(
                f"step_size_lr={self.step_size_lr} is invalid: must be > 0 (Adam lr of metasgd's "
                "log inner step sizes, e.g. 0.01)"
            )
        return problems + self.inner_loop.validate()

    @property
    def inner_loop(self) -> InnerLoopConfig:
        """The inner-loop part of this config."""
        return InnerLoopConfig(
            inner_steps=self.inner_steps,
            inner_lr=self.inner_lr,
            inner_optimizer=self.inner_optimizer,
            inner_clip_norm=self.inner_clip_norm,
        )


def _per_token(sums: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return torch.where(n > 0, sums / n.clamp(min=1.0), torch.full_like(sums, math.nan))


def _inverse(n: torch.Tensor) -> torch.Tensor:
    return torch.where(n > 0, 1.0 / n.clamp(min=1.0), torch.zeros_like(n))


def _mean_seconds(per_step: list[list[float]]) -> list[float]:
    if not per_step:
        return []
    return [sum(col) / len(col) for col in zip(*per_step)]


def _prepare(self: FOMAML | Reptile | MultiTask, plan: RankPlan) -> RankWork:
    """Collates a rank's plan (see :func:`prepare_rank`); the ``prepare`` of every algorithm."""
    return prepare_rank(plan, self.pad_id, pad_to_multiple_of=self.cfg.pad_to_multiple_of)


class _LoraCache:
    """The model's :class:`TaskLoRA`, built once per model (it walks every module)."""

    def __init__(self) -> None:
        self._entry: tuple[int, TaskLoRA] | None = None

    def get(self, model: nn.Module, params: Sequence[torch.Tensor]) -> TaskLoRA:
        if self._entry is None or self._entry[0] != id(model):
            self._entry = (id(model), TaskLoRA(model, params))
        return self._entry[1]


def _query_before(cfg: AlgorithmConfig, model: nn.Module, fast: Sequence[torch.Tensor],
                  lora: TaskLoRA, work: RankWork) -> torch.Tensor:
    """Query loss per task at theta (forward only), or ``nan`` when not measured."""
    if not cfg.measure_query_before:
        return torch.full((work.n_tasks,), math.nan, dtype=torch.float64)
    res = run_passes(model, fast, work.query, torch.ones(len(fast[0])), lora=lora, grad=False)
    return _per_token(res.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])


class FOMAML:
    """First-order MAML: the meta-gradient is the query-loss gradient at the adapted weights phi.

    Example:
        >>> algo = FOMAML(AlgorithmConfig(inner_steps=3, inner_lr=0.03), pad_id=0)
        >>> result = algo.rank_gradient(engine.model, engine.adapter_parameters(), work)
    """

    name = "fomaml"
    support_draws = 1

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.inner = cfg.inner_loop
        self.pad_id = pad_id
        self.support_repeats = cfg.inner_steps
        self._lora = _LoraCache()

    prepare = _prepare

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork, *,
                      lrs: Sequence[float] | None = None) -> RankResult:
        """Adapts every task on its support rows, then takes the query gradients at phi.

        With ``lrs`` (one inner step size per adapter tensor: Meta-SGD) the result also carries
        ``step_size_grad``, the first-order gradient of the query losses with respect to the log
        step sizes: ``sum over tasks of <g_q(phi), phi - theta>`` per tensor (derivation in
        :mod:`fmmeta.algorithms.meta_sgd`); it needs nothing but tensors this method already has.
        """
        lora = self._lora.get(model, params)
        fast = stack_adapters(params, max(work.n_tasks, 1))
        with lora.active(fast):
            before = _query_before(self.cfg, model, fast, lora, work)
            adaptation = adapt_tasks(model, fast, work.support, work.support_answers, self.inner,
                                     lora=lora, lrs=lrs)
            res = run_passes(model, fast, work.query, _inverse(work.query_answers), lora=lora)
        assert res.grads is not None
        n = work.n_tasks
        step_size_grad = None
        if lrs is not None:
            with torch.no_grad():
                step_size_grad = torch.stack([
                    (g[:n].float() * (f[:n].float() - p.detach().float().unsqueeze(0))).sum()
                    for g, f, p in zip(res.grads, fast, params, strict=True)
                ])
        grads = [g[:n].sum(dim=0) for g in res.grads]
        after = _per_token(res.task_sums[:n], work.query_answers[:n])
        return RankResult(grads, before, after,
                          _mean_seconds(adaptation.seconds), res.seconds, self.inner.inner_steps,
                          1 + self.cfg.measure_query_before, step_size_grad)


class Reptile:
    """Reptile: the meta-gradient is theta - phi after the inner steps.

    An outer SGD step with learning rate ``lr`` then moves theta by ``lr * mean(phi - theta)``.
    With ``reptile_query_step`` one more inner step on the query set is folded into phi.
    """

    name = "reptile"
    support_draws = 1

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.inner = cfg.inner_loop
        self.pad_id = pad_id
        self.support_repeats = cfg.inner_steps
        self._lora = _LoraCache()

    prepare = _prepare

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """Adapts every task on its support (and optionally query) rows and returns sum(theta - phi)."""
        lora = self._lora.get(model, params)
        fast = stack_adapters(params, max(work.n_tasks, 1))
        with lora.active(fast):
            before = _query_before(self.cfg, model, fast, lora, work)
            opt = InnerOptimizer(self.inner, fast)
            adaptation = adapt_tasks(model, fast, work.support, work.support_answers, self.inner,
                                     lora=lora, optimizer=opt)
            if self.cfg.reptile_query_step:
                # The loss reported is measured before the query step's update, i.e. at phi.
                step = adapt_tasks(model, fast, work.query, work.query_answers, self.inner,
                                   lora=lora, steps=1, optimizer=opt)
                after, q_seconds = step.losses[0][: work.n_tasks], step.seconds[0]
            else:
                res = run_passes(model, fast, work.query, torch.ones(len(fast[0])), lora=lora, grad=False)
                after = _per_token(res.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])
                q_seconds = None
        with torch.no_grad():
            # Difference first, then sum: theta - phi is small next to theta, and n * theta - sum(phi)
            # would lose its digits to cancellation.
            grads = [(p.detach().unsqueeze(0) - f[: work.n_tasks]).sum(dim=0) for p, f in zip(params, fast)]
        return RankResult(grads, before, after, _mean_seconds(adaptation.seconds), q_seconds,
                          self.inner.inner_steps, 1 + self.cfg.measure_query_before)


class MultiTask:
    """Multi-task baseline: plain training on the episode's pooled examples, gradient at theta.

    No adaptation, so the query loss before and after are both the query loss at theta (measured
    inside the training passes, at no extra cost). See the module docstring for compute matching.
    """

    name = "multitask"

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.inner = cfg.inner_loop
        self.pad_id = pad_id
        k = cfg.inner_steps
        self.support_draws = max(k, 1) if cfg.multitask_match_passes else 1
        self.support_repeats = min(k, 1) if cfg.multitask_match_passes else 1

    prepare = _prepare

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """Returns the sum over tasks of each task's pooled support+query loss gradient at theta."""
        support_passes = list(work.support) if self.support_repeats else []
        scale = _inverse((work.support_answers if support_passes else 0) + work.query_answers)
        support = run_passes(model, params, support_passes, scale)
        query = run_passes(model, params, work.query, scale)
        assert support.grads is not None and query.grads is not None
        grads = [a.add_(b) for a, b in zip(support.grads, query.grads)]
        q_loss = _per_token(query.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])
        before = q_loss if self.cfg.measure_query_before else torch.full_like(q_loss, math.nan)
        return RankResult(grads, before, q_loss, support.seconds, query.seconds,
                          self.support_repeats, 1)


class MetaICL:
    """MetaICL baseline: train theta to answer queries with the support set as demonstrations.

    No adaptation: the query loss before and after are the in-context query loss at theta. The
    query passes' times are not reported to the cost model, whose features describe the plan's
    plain rows, not these longer ones.

    Example:
        >>> algo = MetaICL(AlgorithmConfig(), pad_id=tok.pad_token_id)
        >>> result = algo.rank_gradient(engine.model, engine.adapter_parameters(), algo.prepare(plan))
    """

    name = "metaicl"
    support_draws = 1
    support_repeats = 0

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.pad_id = pad_id

    def prepare(self, plan: RankPlan) -> RankWork:
        """The plan's query passes with each row's demonstrations prepended; no support passes."""
        in_context = [s.episode.in_context_query(self.cfg.icl_max_length) for s in plan.slots]
        query: list[Pass] = []
        for p in plan.query:
            if p.is_dummy:
                query.append(None)
                continue
            rows = [in_context[s][e] for s, e in zip(p.slots, p.examples)]
            batch = collate(rows, self.pad_id, self.cfg.pad_to_multiple_of)
            query.append(PackedBatch(batch, torch.tensor(p.slots, dtype=torch.long)))
        n = max(len(plan.slots), 1)
        return RankWork(len(plan.slots), [], query, torch.zeros(n, dtype=torch.float64),
                        answer_tokens_per_task(query, n))

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """Returns the sum over tasks of each task's in-context query-loss gradient at theta."""
        query = run_passes(model, params, work.query, _inverse(work.query_answers))
        assert query.grads is not None
        q_loss = _per_token(query.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])
        before = q_loss if self.cfg.measure_query_before else torch.full_like(q_loss, math.nan)
        return RankResult(query.grads, before, q_loss, [], None, 0, 1)


def build_algorithm(name: str, cfg: AlgorithmConfig, pad_id: int) -> MetaAlgorithm:
    """Builds the meta-algorithm ``name`` (one of :data:`ALGORITHMS`).

    Args:
        name: which algorithm; one of :data:`ALGORITHMS`.
        cfg: algorithm settings (identical on every rank).
        pad_id: the tokenizer's padding id, used when collating passes.

    Raises:
        ValueError: for an unknown name; ConfigError for an invalid ``cfg``.

    Example:
        >>> algo = build_algorithm("reptile", AlgorithmConfig(inner_steps=5), pad_id=tok.pad_token_id)
    """
    classes: dict[str, type[FOMAML | Reptile | MultiTask | MetaICL]] = {
        "fomaml": FOMAML, "reptile": Reptile, "multitask": MultiTask, "metaicl": MetaICL,
    }
    if name not in (*classes, "metasgd"):
        raise ValueError(f"algorithm {name!r} is unknown: choose one of {list(ALGORITHMS)}")
    raise_if_invalid(cfg)
    if name == "metasgd":  # FOMAML plus learned step sizes: composed, not subclassed
        return MetaSGD(FOMAML(cfg, pad_id), cfg)
    return classes[name](cfg, pad_id)
