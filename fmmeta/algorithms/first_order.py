"""First-order meta-algorithms over adapter parameters: FOMAML, Reptile and the multi-task baseline.

Each class turns one :class:`~fmmeta.sampling.plan.TaskSlot` into that task's meta-gradient
(:class:`~fmmeta.algorithms.protocol.TaskResult`) and leaves the adapter exactly at theta. They share
the one inner loop (:mod:`fmmeta.algorithms.inner_loop`) and differ only in what they return:

========== ============================================== ==========================================
algorithm  meta-gradient                                  forward passes per task (s, q = chunks)
========== ============================================== ==========================================
FOMAML     query-loss gradient at phi                     k*s (fwd+bwd) + q (fwd+bwd)
Reptile    theta - phi                                    k*s (fwd+bwd) + q (fwd only, or fwd+bwd
                                                          when the query step is folded in)
MultiTask  pooled support+query loss gradient at theta    k*s + q (fwd+bwd) when ``multitask_match_
                                                          passes``, else s + q
========== ============================================== ==========================================

``k`` is ``inner_steps``. Measuring the query loss before adaptation (``measure_query_before``)
adds q forward-only passes to FOMAML and Reptile; every rank must use the same setting, because
under ZeRO-3 every forward is a collective.

How the multi-task baseline's compute is matched to FOMAML's: with ``multitask_match_passes``
(default) it runs exactly FOMAML's passes on exactly FOMAML's sequences -- every support chunk
``k`` times, then every query chunk once -- all at theta. Each of the ``k`` support repetitions is
weighted ``1/k`` and the sum is divided by the pooled answer-token count (support + query), so the
gradient is the plain pooled mean gradient, independent of ``k``; only the spent compute matches.
(With ``k = 0`` the support is never visited, as in FOMAML, and the gradient is the query
gradient: multi-task and FOMAML coincide.) With ``multitask_match_passes=False`` it runs each
chunk once (s + q passes, same gradient), and a recipe matches compute by other means.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from fmmeta.algorithms.inner_loop import (
    InnerLoopConfig,
    InnerOptimizer,
    adapt,
    answer_tokens,
    evaluate_loss,
    loss_and_grad,
    restore,
    slot_batches,
    snapshot,
    token_counts,
)
from fmmeta.algorithms.protocol import MetaAlgorithm, TaskResult
from fmmeta.config import ConfigError
from fmmeta.sampling.plan import TaskSlot
from fmmeta.tasks.episode import Batch

logger = logging.getLogger(__name__)

ALGORITHMS = ("fomaml", "reptile", "multitask")


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """Which meta-algorithm to run and its per-task settings (identical on every rank).

    Attributes:
        name: "fomaml", "reptile" or "multitask".
        inner_steps: inner optimizer steps on the support set per task (>= 0).
        inner_lr: inner learning rate (> 0).
        inner_optimizer: "sgd" or "adam" (fresh moments per task).
        inner_clip_norm: per-inner-step global gradient-norm clip; ``None`` = off.
        pad_to_multiple_of: pad each micro-batch's length to a multiple of this (``None`` = exact).
        measure_query_before: also measure the query loss at theta (q extra forward passes per
            task). Must be the same on every rank (ZeRO-3 lockstep).
        reptile_query_step: Reptile only: after the support steps take one more inner step on the
            query set, so theta - phi includes it; the query loss after adaptation then comes free
            with that step's forward.
        multitask_match_passes: MultiTask only: run FOMAML's pass count (support chunks
            ``inner_steps`` times each, query once) so the baseline spends the same compute; see
            the module docstring.
    """

    name: str = "fomaml"
    inner_steps: int = 3
    inner_lr: float = 0.03
    inner_optimizer: str = "sgd"
    inner_clip_norm: float | None = None
    pad_to_multiple_of: int | None = None
    measure_query_before: bool = False
    reptile_query_step: bool = False
    multitask_match_passes: bool = True

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.name not in ALGORITHMS:
            problems.append(f"name={self.name!r} is invalid: allowed {list(ALGORITHMS)}")
        for key in ("pad_to_multiple_of",):
            value = getattr(self, key)
            if value is not None and value < 1:
                problems.append(f"{key}={value} is invalid: must be >= 1, or None")
        try:
            _ = self.inner_loop  # validates the inner-loop fields (raises ValueError naming them)
        except ValueError as err:
            # Reported as this section's own fields, so the recipe names "algorithm.inner_steps".
            problems.extend(str(err).removeprefix("InnerLoopConfig: ").split("; "))
        if problems:
            raise ConfigError(problems)

    @property
    def inner_loop(self) -> InnerLoopConfig:
        """The inner-loop part of this config."""
        return InnerLoopConfig(
            inner_steps=self.inner_steps,
            inner_lr=self.inner_lr,
            inner_optimizer=self.inner_optimizer,
            inner_clip_norm=self.inner_clip_norm,
        )


def _sum_real(values: Sequence[float]) -> float:
    return sum(v for v in values if not math.isnan(v))


def _mean_loss(sums: Sequence[float], batches: Sequence[Batch | None]) -> float:
    n = answer_tokens(batches)
    return _sum_real(sums) / n if n else math.nan


def _slot_batches(
    cfg: AlgorithmConfig, pad_id: int, slot: TaskSlot
) -> tuple[list[Batch | None], list[Batch | None]]:
    return slot_batches(slot, pad_id, pad_to_multiple_of=cfg.pad_to_multiple_of)


def _query_before(
    cfg: AlgorithmConfig,
    model: nn.Module,
    params: Sequence[torch.Tensor],
    query: Sequence[Batch | None],
) -> tuple[float, int]:
    """Query loss at theta and the forward passes it cost (none when not measured)."""
    if not cfg.measure_query_before:
        return math.nan, 0
    return evaluate_loss(model, params, query), len(query)


class FOMAML:
    """First-order MAML: the meta-gradient is the query-loss gradient at the adapted weights phi.

    Example:
        >>> algo = FOMAML(AlgorithmConfig(name="fomaml", inner_steps=3, inner_lr=0.03), pad_id=0)
        >>> result = algo.task_gradient(engine.model, engine.adapter_parameters(), slot)
    """

    name = "fomaml"

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.inner = cfg.inner_loop
        self.pad_id = pad_id

    def task_gradient(
        self, model: nn.Module, params: Sequence[nn.Parameter], slot: TaskSlot
    ) -> TaskResult:
        """Adapts on the support set, takes the query gradient at phi, restores theta."""
        support, query = _slot_batches(self.cfg, self.pad_id, slot)
        theta = snapshot(params)
        try:
            before, passes = _query_before(self.cfg, model, params, query)
            adapt(model, params, support, self.inner)
            grads, sums = loss_and_grad(model, params, query)
        finally:
            restore(params, theta)
        passes += self.inner.inner_steps * len(support) + len(query)
        return _result(grads, before, _mean_loss(sums, query), passes, support, query,
                       self.inner.inner_steps, self.cfg.measure_query_before)


class Reptile:
    """Reptile: the meta-gradient is theta - phi after the inner steps.

    An outer SGD step with learning rate ``lr`` then moves theta by ``lr * mean(phi - theta)``.
    With ``reptile_query_step`` one more inner step on the query set is folded into phi.
    """

    name = "reptile"

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.inner = cfg.inner_loop
        self.pad_id = pad_id

    def task_gradient(
        self, model: nn.Module, params: Sequence[nn.Parameter], slot: TaskSlot
    ) -> TaskResult:
        """Adapts on the support (and optionally query) set and returns theta - phi, restoring theta."""
        support, query = _slot_batches(self.cfg, self.pad_id, slot)
        theta = snapshot(params)
        try:
            before, passes = _query_before(self.cfg, model, params, query)
            opt = InnerOptimizer(self.inner, params)
            adapt(model, params, support, self.inner, optimizer=opt)
            if self.cfg.reptile_query_step:
                # The loss reported is measured before the query step's update, i.e. at phi.
                after = adapt(model, params, query, self.inner, steps=1, optimizer=opt)[0]
            else:
                after = evaluate_loss(model, params, query)
            with torch.no_grad():
                grads = [t - p.detach() for t, p in zip(theta, params)]
        finally:
            restore(params, theta)
        passes += self.inner.inner_steps * len(support) + len(query)
        return _result(grads, before, after, passes, support, query,
                       self.inner.inner_steps, self.cfg.measure_query_before)


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

    def task_gradient(
        self, model: nn.Module, params: Sequence[nn.Parameter], slot: TaskSlot
    ) -> TaskResult:
        """Returns the gradient of the pooled support+query loss at theta (params untouched)."""
        support, query = _slot_batches(self.cfg, self.pad_id, slot)
        k = self.inner.inner_steps
        repeats = k if self.cfg.multitask_match_passes else 1
        batches = list(support) * repeats + list(query)
        scales = [1.0 / repeats] * (len(support) * repeats) + [1.0] * len(query)
        normaliser = (answer_tokens(support) if repeats else 0) + answer_tokens(query)
        theta = snapshot(params)
        try:
            grads, sums = loss_and_grad(model, params, batches, scales=scales, normaliser=normaliser)
        finally:
            restore(params, theta)  # nothing should change; cheap insurance for the contract
        q_loss = _mean_loss(sums[len(batches) - len(query) :], query)
        before = q_loss if self.cfg.measure_query_before else math.nan
        return _result(grads, before, q_loss, len(batches), support, query, repeats, False)


def _result(
    grads: list[torch.Tensor],
    before: float,
    after: float,
    passes: int,
    support: Sequence[Batch | None],
    query: Sequence[Batch | None],
    support_repeats: int,
    query_twice: bool,
) -> TaskResult:
    s_real, s_pad = token_counts(support)
    q_real, q_pad = token_counts(query)
    q_times = 2 if query_twice else 1
    return TaskResult(
        grads=grads,
        query_loss_before=before,
        query_loss_after=after,
        n_passes=passes,
        n_tokens=support_repeats * s_real + q_times * q_real,
        n_padded_tokens=support_repeats * s_pad + q_times * q_pad,
    )


def build_algorithm(cfg: AlgorithmConfig, pad_id: int) -> MetaAlgorithm:
    """Builds the meta-algorithm named by ``cfg.name``.

    Args:
        cfg: algorithm settings (identical on every rank).
        pad_id: the tokenizer's padding id, used when collating micro-batches.

    Example:
        >>> algo = build_algorithm(AlgorithmConfig(name="reptile", inner_steps=5), pad_id=tok.pad_token_id)
    """
    classes: dict[str, type[FOMAML] | type[Reptile] | type[MultiTask]] = {
        "fomaml": FOMAML, "reptile": Reptile, "multitask": MultiTask,
    }
    return classes[cfg.name](cfg, pad_id)  # name validated by AlgorithmConfig
