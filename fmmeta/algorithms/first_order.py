"""First-order meta-algorithms over adapter parameters: FOMAML and Reptile.

Each turns one rank's packed work (:class:`RankWork`: its tasks and passes) into the sum of its
tasks' meta-gradients and leaves the adapter exactly at theta. Both run the one inner loop
(:mod:`fmmeta.algorithms.inner_loop`) on every task of the rank in the same passes (each row
through its own task's fast weights, :mod:`fmmeta.algorithms.task_lora`) and differ only in what
they return:

========== ============================ ======================================================
algorithm  meta-gradient per task       passes (S, Q = the rank's support and query passes)
========== ============================ ======================================================
FOMAML     query-loss gradient at phi   k*S (fwd+bwd) + Q (fwd+bwd)
Reptile    theta - phi                  k*S (fwd+bwd) + Q (fwd only, or fwd+bwd when the query
                                        step is folded in)
========== ============================ ======================================================

``k`` is ``inner_steps``. Measuring the query loss before adaptation (``measure_query_before``)
adds Q forward-only passes; every rank must use the same setting, because under ZeRO-3 every
forward is a collective. Meta-SGD (:mod:`fmmeta.algorithms.meta_sgd`) is FOMAML run with learned
step sizes; the baselines they must beat are in :mod:`fmmeta.algorithms.baselines`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.inner_loop import InnerOptimizer, adapt_tasks, only_adapting
from fmmeta.algorithms.passes import inverse_tokens, per_token, run_passes
from fmmeta.algorithms.protocol import RankResult, RankWork, Stateless, make_whole, prepare_rank, task_sq_norms
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters
from fmmeta.sampling.plan import RankPlan

__all__ = ["FOMAML", "Reptile", "mean_seconds"]


def mean_seconds(per_step: list[list[float]]) -> list[float]:
    """Each support pass's wall seconds, averaged over the inner steps that ran it."""
    if not per_step:
        return []
    return [sum(col) / len(col) for col in zip(*per_step)]


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
    make_whole(work.share, [res.task_sums])
    return per_token(res.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])


class FOMAML(Stateless):
    """First-order MAML: the meta-gradient is the query-loss gradient at the adapted weights phi.

    Example:
        >>> algo = FOMAML(AlgorithmConfig(inner_steps=4, inner_lr=0.1), pad_id=0)
        >>> result = algo.rank_gradient(engine.model, engine.adapter_parameters(), work)
    """

    support_draws = 1

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.inner = cfg.inner_loop
        self.pad_id = pad_id
        self.support_repeats = cfg.inner_steps
        self._lora = _LoraCache()

    def prepare(self, plan: RankPlan) -> RankWork:
        """Collates a rank's plan into its support and query passes (:func:`prepare_rank`)."""
        return prepare_rank(plan, self.pad_id, pad_to_multiple_of=self.cfg.pad_to_multiple_of,
                            padding_free=self.cfg.padding_free)

    def adapted_tensors(self, model: nn.Module, params: Sequence[nn.Parameter]) -> list[int] | None:
        """The adapter tensors the inner loop adapts, as indices into ``params``; ``None``: all
        of them (ANIL adapts only its top layers'). The query
        gradient is taken for every tensor either way."""
        return None

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork, *,
                      step_sizes: Sequence[float] | None = None) -> RankResult:
        """Adapts every task on its support rows, then takes the query gradients at phi.

        With ``step_sizes`` (one inner step size per adapter tensor: Meta-SGD) the result also carries
        ``step_size_grad``, the first-order gradient of the query losses with respect to the log
        step sizes: ``sum over tasks of <g_q(phi), phi - theta>`` per tensor (derivation in
        :mod:`fmmeta.algorithms.meta_sgd`); it needs nothing but tensors this method already has.
        """
        lora = self._lora.get(model, params)
        fast = stack_adapters(params, max(work.n_tasks, 1))
        with lora.active(fast):
            before = _query_before(self.cfg, model, fast, lora, work)
            with only_adapting(fast, self.adapted_tensors(model, params)) as adapted:
                adaptation = adapt_tasks(model, adapted, work.support, work.support_answers, self.inner,
                                         lora=lora, step_sizes=step_sizes, reduce=work.reduce)
            res = run_passes(model, fast, work.query, inverse_tokens(work.query_answers), lora=lora)
        assert res.grads is not None
        # The query gradients (and the step-size terms, linear in them) stay partial with rows
        # across ranks: the outer step's all-reduce adds the ranks. Only the losses are made whole.
        make_whole(work.share, [res.task_sums])
        n = work.n_tasks
        step_size_grad = None
        if step_sizes is not None:
            with torch.no_grad():
                step_size_grad = torch.stack([
                    (g[:n].float() * (f[:n].float() - p.detach().float().unsqueeze(0))).sum()
                    for g, f, p in zip(res.grads, fast, params, strict=True)
                ])
        grads = [g[:n].sum(dim=0) for g in res.grads]
        after = per_token(res.task_sums[:n], work.query_answers[:n])
        # With rows across ranks a task's query gradient is split over the ranks: no norm of its own.
        sq = task_sq_norms(res.grads, n) if work.share is None else None
        return RankResult(grads=grads, query_loss_before=before, query_loss_after=after,
                          support_seconds=mean_seconds(adaptation.seconds), query_seconds=res.seconds,
                          support_repeats=self.inner.inner_steps,
                          query_repeats=1 + self.cfg.measure_query_before, step_size_grad=step_size_grad,
                          task_grad_sq=sq)


class Reptile(Stateless):
    """Reptile: the meta-gradient is theta - phi after the inner steps.

    An outer SGD step with learning rate ``lr`` then moves theta by ``lr * mean(phi - theta)``.
    With ``algorithm.reptile.query_step`` one more inner step on the query set is folded into phi.
    """

    support_draws = 1

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.inner = cfg.inner_loop
        self.pad_id = pad_id
        self.support_repeats = cfg.inner_steps
        self._lora = _LoraCache()

    def prepare(self, plan: RankPlan) -> RankWork:
        """Collates a rank's plan into its support and query passes (:func:`prepare_rank`)."""
        return prepare_rank(plan, self.pad_id, pad_to_multiple_of=self.cfg.pad_to_multiple_of,
                            padding_free=self.cfg.padding_free)

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """Adapts every task on its support (and optionally query) rows and returns sum(theta - phi)."""
        lora = self._lora.get(model, params)
        fast = stack_adapters(params, max(work.n_tasks, 1))
        with lora.active(fast):
            before = _query_before(self.cfg, model, fast, lora, work)
            opt = InnerOptimizer(self.inner, fast)
            adaptation = adapt_tasks(model, fast, work.support, work.support_answers, self.inner,
                                     lora=lora, optimizer=opt, reduce=work.reduce)
            if self.cfg.reptile.query_step:
                # The loss reported is measured before the query step's update, i.e. at phi.
                step = adapt_tasks(model, fast, work.query, work.query_answers, self.inner,
                                   lora=lora, steps=1, optimizer=opt, reduce=work.reduce)
                after, q_seconds = step.losses[0][: work.n_tasks], step.seconds[0]
            else:
                res = run_passes(model, fast, work.query, torch.ones(len(fast[0])), lora=lora, grad=False)
                make_whole(work.share, [res.task_sums])
                after = per_token(res.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])
                q_seconds = None
        with torch.no_grad():
            # Difference first, then sum: theta - phi is small next to theta, and n * theta - sum(phi)
            # would lose its digits to cancellation.
            per_task = [p.detach().unsqueeze(0) - f[: work.n_tasks] for p, f in zip(params, fast)]
            grads = [d.sum(dim=0) for d in per_task]
            sq = task_sq_norms(per_task, work.n_tasks)
            if work.share is not None and not work.share.lead:
                grads = [torch.zeros_like(g) for g in grads]  # every rank holds the same phi: count it once
                sq = torch.zeros_like(sq)
        return RankResult(grads=grads, query_loss_before=before, query_loss_after=after,
                          support_seconds=mean_seconds(adaptation.seconds), query_seconds=q_seconds,
                          support_repeats=self.inner.inner_steps,
                          query_repeats=1 + self.cfg.measure_query_before, task_grad_sq=sq)
