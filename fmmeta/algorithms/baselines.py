"""The baselines a meta-learner must beat at equal compute: multi-task training and MetaICL.

========== ============================================== ==========================================
algorithm  gradient per task                              passes (S, Q = the rank's support and
                                                          query passes)
========== ============================================== ==========================================
MultiTask  pooled support+query loss gradient at theta    k*S + Q (fwd+bwd) with ``match_passes``
                                                          (S over k distinct support sets), else
                                                          S + Q
MetaICL    query-answer loss gradient at theta with the   Q' (fwd+bwd): the query passes, each row
           support as in-context demonstrations           with its demonstrations prepended
========== ============================================== ==========================================

How the multi-task baseline's compute is matched to FOMAML's (``k`` is ``inner_steps``): with
``algorithm.multitask.match_passes`` (default) the sampler gives each of its episodes ``k``
distinct support sets (``support_draws``: the first is the one FOMAML would see, the others come from fresh
episodes of the same task), and it runs every support pass once, then every query pass once, all
at theta. So it processes as many support rows as FOMAML's ``k`` inner steps, but spends them on
new examples instead of the same gradient ``k`` times; each task's sum is divided by its pooled
answer-token count (support + query). (With ``k = 0`` the support is never visited, as in FOMAML,
and the gradient is the query gradient.) It needs no fast weights: all tasks share theta, so it
runs the model's own LoRA forward. CrossFit found such a baseline often as good as first-order
MAML or Reptile, which is why the recipe trains it beside them.

MetaICL (Min et al., 2022) trains theta to use demonstrations: each query row gets its episode's
support prepended (:meth:`~fmmeta.tasks.episode.Episode.in_context_query`, cut from the left to
``icl_max_length`` tokens) and the loss covers the query answers only. It keeps the plan's query
passes (same rows, so every rank runs the same pass count under ZeRO-3) and runs no support pass;
its rows are longer, so a pass costs more than the plan's cost model predicts, and with
``sampler.length_buckets`` they take the bucket that holds them (past the last one, their own
width), which the plan's widths do not say.

``support_draws`` and ``support_repeats`` on each algorithm tell the sampler the shape of its
work: how many support sets an episode carries, and how often each support pass runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.passes import (
    PackedBatch,
    Pass,
    answer_tokens_per_task,
    collate_pass,
    inverse_tokens,
    per_token,
    run_passes,
)
from fmmeta.algorithms.protocol import (
    RankResult,
    RankWork,
    Stateless,
    answer_tokens_of_sets,
    make_whole,
    prepare_rank,
)
from fmmeta.sampling.plan import RankPlan

__all__ = ["MetaICL", "MultiTask"]


class MultiTask(Stateless):
    """Multi-task baseline: plain training on the episode's pooled examples, gradient at theta.

    No adaptation, so the query loss before and after are both the query loss at theta (measured
    inside the training passes, at no extra cost). See the module docstring for compute matching.
    """

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        self.cfg = cfg
        self.pad_id = pad_id
        k = cfg.inner_steps
        self.support_draws = max(k, 1) if cfg.multitask.match_passes else 1
        self.support_repeats = min(k, 1) if cfg.multitask.match_passes else 1

    def prepare(self, plan: RankPlan) -> RankWork:
        """Collates a rank's plan into its support and query passes (:func:`prepare_rank`)."""
        return prepare_rank(plan, self.pad_id, pad_to_multiple_of=self.cfg.pad_to_multiple_of,
                            padding_free=self.cfg.padding_free)

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """Returns the sum over tasks of each task's pooled support+query loss gradient at theta."""
        support_passes = list(work.support) if self.support_repeats else []
        scale = inverse_tokens((work.support_answers if support_passes else 0) + work.query_answers)
        support = run_passes(model, params, support_passes, scale)
        query = run_passes(model, params, work.query, scale)
        assert support.grads is not None and query.grads is not None
        grads = [a.add_(b) for a, b in zip(support.grads, query.grads)]
        make_whole(work.share, [query.task_sums])  # the gradient stays partial: the outer step adds it
        q_loss = per_token(query.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])
        before = q_loss if self.cfg.measure_query_before else torch.full_like(q_loss, math.nan)
        return RankResult(grads=grads, query_loss_before=before, query_loss_after=q_loss,
                          support_seconds=support.seconds, query_seconds=query.seconds,
                          support_repeats=self.support_repeats, query_repeats=1)


class MetaICL(Stateless):
    """MetaICL baseline: train theta to answer queries with the support set as demonstrations.

    No adaptation: the query loss before and after are the in-context query loss at theta. The
    query passes' times reach the cost model with the shape of these longer rows, which is what
    they took.

    Example:
        >>> algo = MetaICL(AlgorithmConfig(), pad_id=tok.pad_token_id)
        >>> result = algo.rank_gradient(engine.model, engine.adapter_parameters(), algo.prepare(plan))
    """

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
            batch = collate_pass(rows, self.pad_id, self.cfg.pad_to_multiple_of,
                                 padding_free=self.cfg.padding_free, buckets=plan.length_buckets)
            query.append(PackedBatch(batch, torch.tensor(p.slots, dtype=torch.long)))
        n = max(len(plan.slots), 1)
        answers = answer_tokens_of_sets(in_context) if plan.shared else answer_tokens_per_task(query, n)
        return RankWork(len(plan.slots), [], query, torch.zeros(n, dtype=torch.float64), answers)

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """Returns the sum over tasks of each task's in-context query-loss gradient at theta."""
        query = run_passes(model, params, work.query, inverse_tokens(work.query_answers))
        assert query.grads is not None
        make_whole(work.share, [query.task_sums])
        q_loss = per_token(query.task_sums[: work.n_tasks], work.query_answers[: work.n_tasks])
        before = q_loss if self.cfg.measure_query_before else torch.full_like(q_loss, math.nan)
        return RankResult(grads=query.grads, query_loss_before=before, query_loss_after=q_loss,
                          support_seconds=[], query_seconds=query.seconds, support_repeats=0,
                          query_repeats=1)
