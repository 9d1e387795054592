"""Every rank's meta-step, gathered once: what the sampler learns and what a metrics line shows.

After a meta-step every rank's sampler must see every rank's observations (plans are computed
independently on each rank and must agree), and rank 0 writes one metrics line over all ranks.
:func:`gather_step` does both with one ``all_gather_object`` of this rank's
:class:`~fmmeta.algorithms.meta_step.StepStats`: the observations travel as the objects
``meta_step`` made, and every total is a sum of what each rank's ``meta_step`` counted (nothing is
recounted). Turning observations into dicts is the checkpoint's business only
(``Prefetcher.state_dict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fmmeta.algorithms.meta_step import StepStats, peak_memory_kind
from fmmeta.engine.protocol import Engine
from fmmeta.sampling.noise_scale import NOISE_KEYS
from fmmeta.sampling.source import Observation

__all__ = ["GatheredStep", "gather_step"]


@dataclass(frozen=True)
class GatheredStep:
    """One meta-step over all ranks, identical on every rank.

    Attributes:
        ranks: every rank's :class:`StepStats`, in rank order.
        peak_memory_kind: what ``peak_memory_mb`` measures on these ranks (see
            :func:`~fmmeta.algorithms.meta_step.peak_memory_kind`).
    """

    ranks: tuple[StepStats, ...]
    peak_memory_kind: str

    @property
    def step(self) -> int:
        """The meta-step (the same on every rank)."""
        return self.ranks[0].step

    @property
    def observations(self) -> tuple[Observation, ...]:
        """Every rank's task and pass observations, in rank order (for ``sampler.observe``)."""
        return tuple(o for s in self.ranks for o in s.observations)

    @property
    def n_real_tasks(self) -> int:
        """Real tasks over all ranks."""
        return sum(s.n_real_tasks for s in self.ranks)

    @property
    def n_tokens(self) -> int:
        """Real tokens over all ranks (dummies excluded)."""
        return sum(s.n_tokens for s in self.ranks)

    @property
    def n_padded_tokens(self) -> int:
        """Tokens processed over all ranks, padding and dummy passes included."""
        return sum(s.n_padded_tokens for s in self.ranks)

    @property
    def seconds(self) -> float:
        """The slowest rank's wall time: the meta-step takes as long as it."""
        return max(s.seconds for s in self.ranks)

    @property
    def outer(self) -> dict[str, float]:
        """What the outer step returned (identical on every rank; rank 0's)."""
        return self.ranks[0].outer

    def mean(self, name: str) -> float:
        """The mean over all real tasks of a per-rank mean (``outer_loss``, ``query_loss_*``),
        each rank weighted by its tasks; ranks where it is ``nan`` are left out."""
        pairs = [(getattr(s, name), s.n_real_tasks) for s in self.ranks]
        pairs = [(v, k) for v, k in pairs if not math.isnan(v)]
        weight = sum(k for _, k in pairs)
        return sum(v * k for v, k in pairs) / weight if weight else math.nan

    def record(self) -> dict[str, Any]:
        """The step's ``metrics.jsonl`` fields: totals, means, the outer step's stats, and the
        per-rank telemetry as lists in rank order (``rank_*``)."""
        tokens, seconds = self.n_tokens, self.seconds
        return {
            "step": self.step,
            "outer_loss": self.mean("outer_loss"),
            "query_loss_before": self.mean("query_loss_before"),
            "query_loss_after": self.mean("query_loss_after"),
            "tasks": self.n_real_tasks,
            "tokens": tokens,
            "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
            "padding_efficiency": tokens / self.n_padded_tokens if self.n_padded_tokens else math.nan,
            "step_s": seconds,
            "data_wait_s": self.ranks[0].data_wait_seconds,
            "grad_norm": self.outer.get("grad_norm", math.nan),
            "lr": self.outer.get("lr", math.nan),
            "skipped": self.outer.get("skipped", 0.0),
            # metasgd: its learned inner step sizes after this step (identical on every rank); the
            # meta-gradient's noise where the method has per-task gradients
            **{k: v for k, v in self.outer.items() if k.startswith("inner_lr_") or k in NOISE_KEYS},
            "rank_compute_s": [s.compute_seconds for s in self.ranks],
            "rank_collective_s": [s.collective_seconds for s in self.ranks],
            "rank_data_wait_s": [s.data_wait_seconds for s in self.ranks],
            "rank_tokens": [s.n_tokens for s in self.ranks],
            "rank_peak_memory_mb": [s.peak_memory_mb for s in self.ranks],
            "peak_memory": self.peak_memory_kind,
        }


def gather_step(engine: Engine, stats: StepStats) -> GatheredStep:
    """Gathers every rank's ``stats`` with one ``all_gather_object``; every rank must call it.

    Args:
        engine: the engine ``stats`` came from (its collectives and device).
        stats: this rank's :func:`~fmmeta.algorithms.meta_step.meta_step` result.

    Returns:
        The same :class:`GatheredStep` on every rank.

    Raises:
        RuntimeError: if the ranks were not at the same meta-step (they must run in lockstep).

    Example:
        >>> gathered = gather_step(engine, meta_step(engine, algorithm, plan))
        >>> sampler.observe(gathered.observations)
    """
    ranks = tuple(engine.all_gather_object(stats))
    if [s.rank for s in ranks] != list(range(engine.world_size)) or {s.step for s in ranks} != {stats.step}:
        raise RuntimeError(
            f"gathered meta-steps {[(s.rank, s.step) for s in ranks]} (rank, step) are not every "
            f"rank at step {stats.step}: every rank must call gather_step once per meta-step"
        )
    return GatheredStep(ranks, peak_memory_kind(engine.device))
