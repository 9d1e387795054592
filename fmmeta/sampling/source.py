"""What the sampler consumes (task sources) and what the trainer feeds back (observations).

The sampler never imports the task layer: anything with a ``name``, a ``domain`` and a
``sample_episode(rng)`` method is a task. Observations flow the other way: after a meta-step the
trainer gathers one :class:`TaskObservation` per task slot from *all* ranks and hands the same list
to every rank's sampler, so every rank's sampler state stays identical (plans are computed
independently on every rank and must agree).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fmmeta.sampling.plan import TaskSlot
from fmmeta.tasks.episode import Episode


@runtime_checkable
class EpisodeSource(Protocol):
    """A task the sampler can draw episodes from.

    Attributes:
        name: unique task name (shows up in ``Episode.task`` and in logs).
        domain: a grouping key (dataset family, language, embedding cluster) used by the
            ``diversity`` strategy to spread a meta-batch.
    """

    name: str
    domain: str

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """Draws one episode; every random choice must come from ``rng`` (determinism)."""
        ...


@dataclass(frozen=True, kw_only=True)
class TaskObservation:
    """What one task slot cost and how well it did, reported back to the sampler.

    Attributes:
        task_id: the slot's ``task_id`` (index into the sampler's sources); ``-1`` for a dummy slot
            (its timing still helps fit the cost model's per-pass overhead).
        query_loss: mean query loss per answer token after adaptation; ``nan`` if not measured.
        seconds: wall-clock seconds the slot's passes took on its rank; ``nan`` if not measured.
        n_passes: forward+backward passes the slot ran (cost model feature ``a``).
        n_padded_tokens: tokens processed including padding, summed over passes (feature ``b``).
        attention_tokens: sum over passes and sequences of padded length squared (feature ``c``).
        n_tokens: real (non-pad) tokens processed, for logging.
        step: the meta-step the slot belonged to (``-1`` if unknown).
    """

    task_id: int
    query_loss: float = math.nan
    seconds: float = math.nan
    n_passes: int = 0
    n_padded_tokens: int = 0
    attention_tokens: float = 0.0
    n_tokens: int = 0
    step: int = -1

    @property
    def features(self) -> tuple[float, float, float]:
        """The cost model's regressors ``(passes, padded tokens, sum of len^2)``."""
        return (float(self.n_passes), float(self.n_padded_tokens), float(self.attention_tokens))

    @classmethod
    def from_slot(
        cls,
        slot: TaskSlot,
        *,
        inner_steps: int,
        query_loss: float = math.nan,
        seconds: float = math.nan,
        step: int = -1,
    ) -> "TaskObservation":
        """Builds an observation whose cost features are the ones the plan scheduled.

        Use this in the trainer: it counts exactly the passes and padded shapes the cost model
        predicted, so a fit compares like with like.

        Args:
            slot: the slot that ran.
            inner_steps: inner steps per task (support chunks run once per inner step).
            query_loss: measured query loss (``nan`` if not measured).
            seconds: measured wall time of the slot's passes.
            step: the meta-step.
        """
        from fmmeta.sampling.cost import slot_features

        passes, padded, attn, real = slot_features(slot, inner_steps=inner_steps)
        return cls(
            task_id=slot.task_id,
            query_loss=float(query_loss),
            seconds=float(seconds),
            n_passes=int(passes),
            n_padded_tokens=int(padded),
            attention_tokens=float(attn),
            n_tokens=int(real),
            step=step,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (NaN written as ``None``)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskObservation":
        """Inverse of :meth:`to_dict`."""
        out = dict(d)
        for key in ("query_loss", "seconds"):
            if out.get(key) is None:
                out[key] = math.nan
        return cls(**out)

    def sort_key(self) -> tuple[float, ...]:
        """A total order used to apply observations identically whatever the gather order."""
        def f(x: float) -> float:
            return math.inf if math.isnan(x) else x

        return (
            self.step, self.task_id, f(self.query_loss), f(self.seconds), self.n_passes,
            self.n_padded_tokens, self.attention_tokens, self.n_tokens,
        )
