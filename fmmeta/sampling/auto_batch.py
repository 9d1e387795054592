"""``sampler.meta_batch_size: auto``: tasks per meta-step chosen from the measured gradient noise.

A run measures the meta-gradient's noise scale B_noise at every meta-step
(:mod:`fmmeta.sampling.noise_scale`): below it a step is mostly noise, far above it more tasks
per step buy little for their linear cost. ``auto`` runs a short warm-up at ``auto_batch_min``
tasks per step, then takes B = B_noise rounded, within ``[auto_batch_min, auto_batch_max]`` (and
the pool's size), and looks again every ``auto_batch_every`` steps as the adapter moves.

Memory does not bound B the way it bounds a batch in ordinary training: the planner packs a
meta-batch's tasks into passes of a fixed token budget (``tokens_per_pass``), so activation memory
stays what it is at any B; what grows with B is one fast-weight copy of the adapter per task
(priced in the choice's log line). ``auto_batch_max`` is the user's bound on it and on a step's time.

The sizer lives in the sampler and sees the statistics as the sampler sees everything else: through
``observe``, one step late (:mod:`fmmeta.sampling.prefetch`), with its state in the sampler's
checkpoint, so a choice is the same on every rank and a resumed run makes the same ones.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fmmeta.sampling.noise_scale import GradientNoise, NoiseScale
from fmmeta.sampling.source import NoiseObservation

logger = logging.getLogger(__name__)

AUTO = "auto"


class AutoBatch:
    """The current tasks per meta-step of an ``auto`` run, and how it was chosen.

    Args:
        low: the warm-up's B and the least it chooses (>= 2: the noise needs two tasks).
        high: the most it chooses (the user's bound, already capped at the pool's size).
        warmup: meta-steps at ``low`` before the first choice.
        every: meta-steps between later choices (0: choose once).
        multiple: B is a multiple of this (the world size where ranks must hold equal counts).
        mib_per_task: memory of one task's fast weights (MiB), for the choice's log line.
        label: what the log line names (the method: methods may train side by side).

    Example:
        >>> sizer = AutoBatch(low=4, high=16, warmup=2, every=0)
        >>> for step in range(2):  # tr(Sigma) 10, |G|^2 1: B_noise 10
        ...     sizer.observe(NoiseObservation(step=step, tasks=4, task_sq_mean=11.0, mean_sq=3.5))
        >>> sizer.size
        10
    """

    def __init__(self, *, low: int, high: int, warmup: int, every: int, multiple: int = 1,
                 mib_per_task: float = 0.0, label: str = "") -> None:
        self.low, self.high, self.warmup, self.every, self.multiple = low, high, warmup, every, multiple
        self.mib_per_task, self.label = mib_per_task, label
        self.size = self._bounded(low)
        self.due: int | None = warmup - 1
        """The step whose statistics the next choice follows (``None``: no more choices). A step
        without statistics (rows across ranks split each task's gradient) moves it to the next one."""
        self.scale = NoiseScale()
        self.choices: list[dict[str, Any]] = []
        """One entry per choice: the step it followed, B_noise then, and the B it took."""

    def _bounded(self, b: int) -> int:
        b = min(max(b, self.low), self.high)
        return max(self.multiple, b // self.multiple * self.multiple)

    def choose(self, b_noise: float) -> int:
        """B for a measured B_noise: rounded, within the bounds (the current B while there is none)."""
        return self._bounded(round(b_noise)) if math.isfinite(b_noise) else self.size

    def observe(self, noise: NoiseObservation) -> None:
        """Takes one step's statistics; at the end of a period, chooses B for the steps ahead."""
        b_noise = self.scale.observe(GradientNoise(noise.tasks, noise.task_sq_mean, noise.mean_sq))
        if self.due is None or noise.step < self.due:
            return
        self.due = noise.step + self.every if self.every > 0 else None
        before, self.size = self.size, self.choose(b_noise)
        self.choices.append({"step": noise.step, "b_noise": None if math.isnan(b_noise) else b_noise, "size": self.size})
        logger.info(
            "%smeta_batch_size auto: B_noise %s after meta-step %d -> %d tasks per meta-step from meta-step %d "
            "(was %d; bounds %d-%d; their fast weights %.1f MiB)",
            f"{self.label}: " if self.label else "",
            f"{b_noise:.1f}" if math.isfinite(b_noise) else "not measured yet (B kept)", noise.step, self.size,
            noise.step + 2, before, self.low, self.high, self.size * self.mib_per_task,
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the current B, its choices and the noise averages."""
        return {"size": self.size, "due": self.due, "choices": list(self.choices), "scale": self.scale.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`: later choices are those of a run that never stopped."""
        self.size = int(state["size"])
        self.due = state["due"]
        self.choices = list(state["choices"])
        self.scale.load_state_dict(state["scale"])


__all__ = ["AUTO", "AutoBatch"]
