"""The meta-batch plan: which task runs on which rank, in which micro-batches.

This is the contract between the sampler (which builds plans) and the meta-algorithms (which run
them). Under DeepSpeed ZeRO-3 every forward and backward pass all-gathers parameters, so every rank
must run the same number of passes in lockstep. A plan guarantees it by construction: every rank
holds the same number of :class:`TaskSlot`, and every slot of a plan has the same number of
support chunks and of query chunks. A slot without real work (``episode is None``) or a chunk
without examples (``()``) is a *dummy pass*: the algorithm runs one forward and backward on a
one-token sequence with zero weight, so the collectives stay matched and the result is unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from fmmeta.tasks.episode import Episode


@dataclass(frozen=True)
class TaskSlot:
    """One task's work on one rank within a meta-step.

    Attributes:
        episode: the episode to adapt on and score; ``None`` for a zero-weight dummy task.
        weight: 1.0 for a real task, 0.0 for a dummy; the meta-gradient is the weighted mean.
        support_chunks: micro-batches of the support set for one inner step, as indices into
            ``episode.support``; every inner step runs all of them, accumulating one gradient.
            ``()`` marks a dummy pass.
        query_chunks: micro-batches of the query set, as indices into ``episode.query``.
        cost: the cost model's estimate for this slot (arbitrary units, comparable within a plan).
        task_id: index of the task in the sampler's pool (-1 for a dummy).
    """

    episode: Episode | None
    weight: float
    support_chunks: tuple[tuple[int, ...], ...]
    query_chunks: tuple[tuple[int, ...], ...]
    cost: float = 0.0
    task_id: int = -1

    @property
    def is_dummy(self) -> bool:
        """Whether this slot only keeps the collectives in lockstep."""
        return self.episode is None or self.weight == 0.0


@dataclass(frozen=True)
class MetaBatchPlan:
    """All ranks' work for one meta-step.

    Attributes:
        step: the meta-step this plan is for.
        ranks: ``ranks[r]`` is the ordered tuple of slots rank ``r`` runs; all of equal length.
        n_real_tasks: number of non-dummy slots over all ranks (the meta-gradient's divisor).
    """

    step: int
    ranks: tuple[tuple[TaskSlot, ...], ...]
    n_real_tasks: int

    def for_rank(self, rank: int) -> tuple[TaskSlot, ...]:
        """The slots ``rank`` runs, in order."""
        return self.ranks[rank]

    def digest(self) -> str:
        """SHA-256 of the plan's structure; equal on every rank when samplers agree."""
        h = hashlib.sha256(f"step={self.step};n={self.n_real_tasks}".encode())
        for r, slots in enumerate(self.ranks):
            for s in slots:
                ep = s.episode
                ids = (
                    ""
                    if ep is None
                    else f"{ep.task}|{[e.prompt_ids + e.answer_ids for e in ep.support]}|"
                    f"{[e.prompt_ids + e.answer_ids for e in ep.query]}"
                )
                h.update(
                    f"r{r}:{s.task_id}:{s.weight}:{s.support_chunks}:{s.query_chunks}:{ids};".encode()
                )
        return h.hexdigest()
