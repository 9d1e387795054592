"""Deterministic stand-ins for a trainer's feedback."""

from __future__ import annotations

from fmmeta.sampling.plan import MetaBatchPlan
from fmmeta.sampling.source import TaskObservation

TRUE_COST = (0.003, 2e-5, 4e-8)  # "measured" seconds = a * passes + b * tokens + c * len^2


def fake_observations(plan: MetaBatchPlan, inner_steps: int) -> list[TaskObservation]:
    """One observation per slot of every rank, as a trainer would gather them."""
    out = []
    for slots in plan.ranks:
        for slot in slots:
            o = TaskObservation.from_slot(slot, inner_steps=inner_steps, step=plan.step)
            seconds = TRUE_COST[0] * o.n_passes + TRUE_COST[1] * o.n_padded_tokens + TRUE_COST[2] * o.attention_tokens
            loss = float("nan") if slot.is_dummy else 1.0 + (slot.task_id * 7919 + plan.step * 31) % 97 / 25.0
            out.append(TaskObservation.from_slot(slot, inner_steps=inner_steps, query_loss=loss, seconds=seconds, step=plan.step))
    return out
