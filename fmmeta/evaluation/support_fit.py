"""Does the inner loop fit the support set? Support and query scores along an adaptation.

A few-shot method can only beat a baseline through adaptation if its inner loop learns the
support set in the steps it is given: when the support accuracy after ``k`` steps is still at
chance, the query cannot be better, and every method's query accuracy sits at chance whatever
meta-training did. :func:`support_fit` measures exactly that, with the project's one inner loop
(:func:`fmmeta.evaluation.adaptation.adapting`: fp32 fast weights, as in evaluation), on episodes the caller chooses (validation
ones when the result chooses settings): the support and query loss and accuracy after each scored
step, averaged over episodes, for one start (an adapter state) and one inner-loop setting.
``scripts/support_fit.py`` runs it over a grid of settings from a recipe config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.inner_loop import restore, snapshot
from fmmeta.algorithms.passes import answer_tokens_per_task
from fmmeta.algorithms.task_lora import TaskLoRA
from fmmeta.evaluation.adaptation import adapting, support_passes
from fmmeta.evaluation.scoring import score_query
from fmmeta.tasks.episode import Episode


@dataclass(frozen=True)
class FitPoint:
    """Mean scores over the episodes after ``step`` adaptation steps.

    Attributes:
        step: adaptation steps taken on the support set.
        support_loss, support_accuracy: the support set scored at the adapted weights (what the
            inner loop optimises: how well it fits).
        query_loss, query_accuracy: the query set scored at the same weights (what generalises).
    """

    step: int
    support_loss: float
    support_accuracy: float
    query_loss: float
    query_accuracy: float


def support_fit(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    episodes: Sequence[Episode],
    inner: InnerLoopConfig,
    steps: int,
    pad_id: int,
    *,
    score_steps: Sequence[int] | None = None,
    micro_batch_size: int = 8,
) -> list[FitPoint]:
    """Adapts ``params`` on each episode's support for ``steps`` steps from their current values
    and scores support and query after each step of ``score_steps`` (``None``: every step
    0..``steps``; ``steps`` always). ``params`` and the model's mode are restored on return.

    Example:
        >>> curve = support_fit(model, params, validation_episodes, InnerLoopConfig(inner_lr=0.1), 6,
        ...                     tokenizer.pad_token_id, score_steps=[0, 2])  # doctest: +SKIP
        >>> curve[-1].support_accuracy, curve[-1].query_accuracy            # doctest: +SKIP
    """
    if not episodes:
        raise ValueError("support_fit() got no episodes: pass one or more (validation) episodes")
    if steps < 0:
        raise ValueError(f"steps={steps} is invalid: must be >= 0")
    wanted = sorted({*(range(steps + 1) if score_steps is None else score_steps), steps})
    if wanted[0] < 0 or wanted[-1] > steps:
        raise ValueError(f"score_steps={list(score_steps or [])} is invalid: each must be in 0..{steps}")
    sums = {s: torch.zeros(4, dtype=torch.float64) for s in wanted}
    theta = snapshot(params)
    lora = TaskLoRA(model, params)
    was_training = model.training
    model.eval()
    try:
        for ep in episodes:
            support = support_passes([ep], pad_id, micro_batch_size, padding_free=inner.padding_free)
            n_answer = answer_tokens_per_task(support, 1)
            with adapting(model, lora, params, theta, support, n_answer, inner) as adapt_step:
                for step in range(steps + 1):
                    if step:
                        adapt_step()
                    if step in sums:
                        s = score_query(model, ep.support, pad_id, choices=ep.choices,
                                        micro_batch_size=micro_batch_size)
                        q = score_query(model, ep, pad_id, micro_batch_size=micro_batch_size)
                        sums[step] += torch.tensor([s.loss, s.accuracy, q.loss, q.accuracy],
                                                   dtype=torch.float64)
    finally:
        restore(params, theta)
        model.train(was_training)
    n = len(episodes)
    return [FitPoint(step, *(float(v) / n for v in sums[step])) for step in wanted]
