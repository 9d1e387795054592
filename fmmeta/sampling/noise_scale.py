"""The meta-gradient's noise at each meta-step, and the tasks per step past which more stop paying.

A meta-step averages B tasks' outer gradients g_1..g_B into G_B. More tasks give a more precise
G_B but cost linearly more; the gradient noise scale of McCandlish et al. (2018, "An Empirical
Model of Large-Batch Training"), ``B_noise = tr(Sigma) / |G|^2``, is the batch size around which
that stops paying: below it a step is mostly noise, far above it extra tasks buy little.

fmmeta adapts every task of a meta-batch through its own stacked fast weights, so each task's
outer gradient exists before the tasks are summed: its squared norm costs one reduction per
tensor. From the mean of the tasks' squared norms ``S`` and the squared norm of their mean
``|G_B|^2`` (what the outer step clips), the unbiased estimates are::

    E[S] = |G|^2 + tr(Sigma)          E[|G_B|^2] = |G|^2 + tr(Sigma) / B
    tr(Sigma) ~ B (S - |G_B|^2) / (B - 1)      |G|^2 ~ (B |G_B|^2 - S) / (B - 1)

Both are noisy step to step (|G|^2 can come out negative), so, as in the paper, the ratio is
taken of their exponential moving averages (:class:`NoiseScale`), never of one step's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

NOISE_KEYS: tuple[str, ...] = ("grad_task_sq", "grad_noise_trace", "grad_signal_sq")
"""The step's fields in ``metrics.jsonl`` (:meth:`GradientNoise.as_record`); ``noise_scale`` is
the run's B_noise so far (:class:`NoiseScale`)."""


@dataclass(frozen=True)
class GradientNoise:
    """One meta-step's meta-gradient statistics.

    Attributes:
        tasks: B, the tasks whose gradients were averaged.
        task_sq_mean: S, the mean over tasks of each task's squared outer-gradient norm.
        mean_sq: |G_B|^2, the squared norm of the averaged outer gradient (before clipping).
    """

    tasks: int
    task_sq_mean: float
    mean_sq: float

    @property
    def trace(self) -> float:
        """tr(Sigma): the variance of one task's outer gradient, summed over coordinates
        (``nan`` with one task: nothing to compare it with)."""
        if self.tasks < 2:
            return math.nan
        return self.tasks * (self.task_sq_mean - self.mean_sq) / (self.tasks - 1)

    @property
    def signal(self) -> float:
        """|G|^2: the squared norm of the expected outer gradient (unbiased, may be negative)."""
        if self.tasks < 2:
            return math.nan
        return (self.tasks * self.mean_sq - self.task_sq_mean) / (self.tasks - 1)

    def as_record(self) -> dict[str, float]:
        """The ``metrics.jsonl`` fields of the step (:data:`NOISE_KEYS`)."""
        return dict(zip(NOISE_KEYS, (self.task_sq_mean, self.trace, self.signal), strict=True))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> GradientNoise | None:
        """The statistics of a ``metrics.jsonl`` step (``None`` where the method records none)."""
        if "grad_task_sq" not in record:
            return None
        number = lambda key: math.nan if record.get(key) is None else float(record[key])  # noqa: E731 (JSON null: NaN)
        return cls(int(record["tasks"]), number("grad_task_sq"), number("grad_norm") ** 2)


class NoiseScale:
    """B_noise over a run: the ratio of the moving averages of tr(Sigma) and |G|^2.

    Args:
        decay: weight of the past in each average (0.9: about the last ten steps).

    Example:
        >>> scale = NoiseScale()
        >>> scale.observe(GradientNoise(tasks=4, task_sq_mean=5.0, mean_sq=2.0))  # tr 4, |G|^2 1
        4.0
    """

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay={decay} is invalid: must be in [0, 1)")
        self.decay = decay
        self._trace = self._signal = 0.0
        self._weight = 0.0

    @classmethod
    def replayed(cls, records: Iterable[Mapping[str, Any]]) -> NoiseScale:
        """The average of a run's ``metrics.jsonl`` records so far (one method's, in order): what a
        resumed run goes on from, so its records are those of a run that never stopped."""
        scale = cls()
        for record in records:
            noise = GradientNoise.from_record(record)
            if noise is not None:
                scale.observe(noise)
        return scale

    def observe(self, noise: GradientNoise) -> float:
        """Takes one step's statistics; returns B_noise so far (``nan`` until there is signal)."""
        trace, signal = noise.trace, noise.signal
        if math.isfinite(trace) and math.isfinite(signal):
            self._trace = self.decay * self._trace + (1 - self.decay) * trace
            self._signal = self.decay * self._signal + (1 - self.decay) * signal
            self._weight = self.decay * self._weight + (1 - self.decay)
        return self.value

    def state_dict(self) -> dict[str, float]:
        """The averages so far, JSON-able (floats round-trip exactly)."""
        return {"trace": self._trace, "signal": self._signal, "weight": self._weight, "decay": self.decay}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Restores :meth:`state_dict`: observing goes on as if never stopped."""
        self.decay = float(state["decay"])
        self._trace, self._signal, self._weight = float(state["trace"]), float(state["signal"]), float(state["weight"])

    @property
    def value(self) -> float:
        """B_noise: the averaged tr(Sigma) over the averaged |G|^2 (the bias corrections of the
        two averages cancel in the ratio); ``nan`` before any step or while |G|^2 <= 0."""
        if self._weight == 0.0 or self._signal <= 0.0:
            return math.nan
        return self._trace / self._signal


__all__ = ["NOISE_KEYS", "GradientNoise", "NoiseScale"]
