"""Non-finite meta-gradients, detected on every rank together.

A NaN on one rank poisons the averaged meta-gradient of all of them, and a rank that decides alone
to skip a step would desynchronise DeepSpeed's collectives. :class:`NonFiniteGuard` wraps any
engine: before the outer step every rank contributes a flag to one all-reduce, so all ranks see the
same verdict and apply the same policy: skip the step everywhere, or raise
:class:`NonFiniteError` everywhere (the recipe then stops with its last good checkpoint kept).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Sequence

import torch

from fmmeta.engine.protocol import Engine

logger = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """The meta-gradient was NaN or infinite on some rank and the policy is "stop"."""


class NonFiniteGuard:
    """An :class:`Engine` that refuses non-finite outer updates (composition, not a subclass).

    Args:
        engine: the engine to guard; every other call is passed through to it.
        policy: "skip" the meta-step on all ranks, or "stop" by raising :class:`NonFiniteError`.

    Example:
        >>> engine = NonFiniteGuard(build_engine(...), policy="skip")
    """

    def __init__(self, engine: Engine, policy: Literal["skip", "stop"]) -> None:
        if policy not in ("skip", "stop"):
            raise ValueError(f"policy={policy!r} is invalid: allowed are 'skip' and 'stop'")
        self.inner = engine
        self.policy = policy
        self.skipped_steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def close(self) -> None:
        """Closes the wrapped engine (see ``DeepSpeedEngine.close``)."""
        self.inner.close()

    def outer_step(self, grad_sum: Sequence[torch.Tensor], n_real_tasks: int) -> dict[str, float]:
        """Checks every rank's gradient, then steps, skips, or raises, the same on all ranks."""
        bad = any(not bool(torch.isfinite(g).all()) for g in grad_sum)
        flags = self.inner.all_reduce_sum(
            torch.tensor([float(bad)], dtype=torch.float32, device=self.inner.device)
        )
        n_bad = int(flags.item())
        if n_bad == 0:
            stats = dict(self.inner.outer_step(grad_sum, n_real_tasks))
            stats["skipped"] = 0.0
            return stats
        if self.policy == "stop":
            raise NonFiniteError(
                f"non-finite meta-gradient on {n_bad} of {self.inner.world_size} ranks (this rank: "
                f"{'yes' if bad else 'no'}); stopping with the last good checkpoint kept. Lower "
                "algorithm.inner_lr / optim.outer_lr, set algorithm.inner_clip_norm, or use "
                "train.nonfinite=skip"
            )
        self.skipped_steps += 1
        logger.warning(
            "non-finite meta-gradient on %d rank(s): outer step skipped on all ranks (%d so far)",
            n_bad, self.skipped_steps,
        )
        return {"skipped": 1.0}
