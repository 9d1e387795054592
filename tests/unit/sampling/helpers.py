"""Deterministic stand-ins for a trainer's feedback."""

from __future__ import annotations

from fmmeta.sampling.plan import MetaBatchPlan
from fmmeta.sampling.source import Observation, PassObservation, TaskObservation

TRUE_COST = (0.003, 2e-5, 4e-8)  # "measured" seconds = a * passes + b * tokens + c * len^2


def fake_observations(plan: MetaBatchPlan, support_repeats: int) -> list[Observation]:
    """What every rank of a trainer would gather: one observation per task and one per pass
    (``meta_step``'s rule for which rank reports a task)."""
    out: list[Observation] = []
    world = len(plan.ranks)
    for r, rank in enumerate(plan.ranks):
        # With rows across ranks every rank holds every task; task i is reported by rank i % world.
        for i, slot in enumerate(rank.slots):
            if rank.shared and i % world != r:
                continue
            loss = 1.0 + (slot.task_id * 7919 + plan.step * 31) % 97 / 25.0
            out.append(TaskObservation(task_id=slot.task_id, query_loss=loss, step=plan.step))
        for phase, passes in (("support", rank.support), ("query", rank.query)):
            for i, p in enumerate(passes):
                seconds = sum(t * f for t, f in zip(TRUE_COST, p.features))
                out.append(PassObservation(step=plan.step, rank=r, phase=phase, index=i,
                                           features=p.features, seconds=seconds))
    return out
