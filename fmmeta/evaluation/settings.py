"""What the held-out protocol holds fixed for every method: :class:`EvalSettings`.

Choosing lrs on validation tasks and scoring held-out episodes must adapt and score every method
the same way, so the settings they share travel as one object instead of a dozen loose arguments
that each caller (the recipe, the study, ``fmmeta evaluate``, the benchmarks) would have to keep
in step by hand. What differs per method (its adapter state, demonstrations, learned step sizes,
the tensors it adapts) is its :class:`~fmmeta.evaluation.methods.EvalMethod`; what differs per
process (ranks, worker processes, a progress bar) stays an argument of the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fmmeta.algorithms.config import DEFAULT_LR_GRID, InnerLoopConfig

__all__ = ["EvalSettings"]


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """How every method is adapted and scored in one evaluation.

    Attributes:
        inner: the inner loop shared by all methods (its ``inner_lr`` is the lr of a method no lr
            was chosen for).
        max_steps: largest number of adaptation steps scored (>= 0): the headline step, and the
            steps lrs are chosen for.
        pad_id: the tokenizer's padding id.
        lr_grid: candidate adaptation lrs tried on validation tasks, each > 0.
        micro_batch_size: support rows, and queries (with their candidates, as one row), of one
            episode per forward pass.
        min_seeds: fewest episode draws accepted (a worst case over fewer says little).
        icl_max_length: longest in-context row (demonstrations + example) in tokens; longer ones
            lose their oldest demonstration tokens.
        score_steps: the adaptation steps scored, each in 0..``max_steps`` (``max_steps`` always
            is); ``None`` scores every step. Scoring a query costs about as much as an adaptation
            step, so a long adaptation scored at a few steps costs about half as much.
        episodes_per_pass: episodes adapted and scored together, each through its own fp32 fast
            weights; every score equals the one-episode-at-a-time score up to float rounding.

    Example:
        >>> settings = EvalSettings(inner=InnerLoopConfig(), max_steps=6, pad_id=tok.pad_token_id)
    """

    inner: InnerLoopConfig
    max_steps: int
    pad_id: int
    lr_grid: Sequence[float] = DEFAULT_LR_GRID
    micro_batch_size: int = 8
    min_seeds: int = 3
    icl_max_length: int = 1024
    score_steps: Sequence[int] | None = None
    episodes_per_pass: int = 16

    def check(self) -> None:
        """Refuses a step budget, steps to score or an lr grid no evaluation can use.

        Raises:
            ValueError: naming the setting, its value and what is allowed.
        """
        if self.max_steps < 0:
            raise ValueError(f"max_steps={self.max_steps} is invalid: must be >= 0 (0 = no adaptation)")
        if self.score_steps is not None and any(not 0 <= s <= self.max_steps for s in self.score_steps):
            raise ValueError(f"score_steps={list(self.score_steps)} is invalid: each step must be in "
                             f"0..max_steps={self.max_steps}")
        if len(self.lr_grid) == 0 or any(not lr > 0 for lr in self.lr_grid):
            raise ValueError(f"lr_grid={list(self.lr_grid)} is invalid: give one or more lrs, each > 0")
