"""What a run's ``sampler`` section says: how many tasks per meta-step, chosen how, packed how.

Its keys are validated here, one problem per key; :class:`~fmmeta.sampling.sampler.CostAwareSampler`
is what acts on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from fmmeta.sampling.auto_batch import AUTO
from fmmeta.sampling.plan import ascending_widths
from fmmeta.sampling.rows_plan import PLACEMENTS
from fmmeta.sampling.strategies import STRATEGIES, Curriculum, Diversity, Hard, Strategy, Uniform, UniformDifficulty


@dataclass(kw_only=True)
class SamplerConfig:
    """How meta-batches are chosen and planned.

    The inner-step count that weights a task's support cost is not a field: it is the
    algorithm's, passed to :class:`CostAwareSampler` by whoever builds both.
    """

    meta_batch_size: int | Literal["auto"] = 8
    """Tasks per outer step, over all ranks (>= 1, at most the meta-training pool's size), or
    "auto": chosen from the meta-gradient's measured noise scale (the auto_batch_* keys)."""
    auto_batch_min: int = 4
    """auto: tasks per step of the warm-up, and the fewest it chooses (>= 2)."""
    auto_batch_max: int = 16
    """auto: the most tasks per step it chooses (>= auto_batch_min; capped at the pool's size)."""
    auto_batch_warmup: int = 5
    """auto: meta-steps at auto_batch_min before the first choice (>= 1)."""
    auto_batch_every: int = 10
    """auto: meta-steps between later choices (>= 0; 0 chooses once)."""
    micro_batch_size: int = 4
    """With tokens_per_pass = 0, a pass holds at most this many of the meta-batch's longest
    sequences (>= 1)."""
    tokens_per_pass: int = 0
    """Padded tokens per forward/backward pass, over all the tasks it packs (>= 0; 0 =
    micro_batch_size x the meta-batch's longest sequence). Peak activation memory follows it."""
    strategy: str = "uniform"
    """Task selection: uniform | curriculum | diversity | hard | uniform_difficulty."""
    placement: str = "auto"
    """How a meta-batch is placed on ranks: "tasks" (each task on one rank), "rows" (every rank
    holds every task and runs a share of each task's rows; the inner steps all-reduce the tasks'
    gradients) or "auto" (whichever the cost model prices lower, per meta-step). One rank always
    plans "tasks"."""
    on_uneven: str = "pad"
    """When meta_batch_size does not divide by world size: "pad" (ranks hold different task
    counts; packing keeps their pass counts equal) or "error"."""
    difficulty: str = "shots"
    """Difficulty measure for curriculum and uniform_difficulty: shots | lengths | loss."""
    pacing_start: float = 0.2
    """Curriculum: fraction of the pool admitted at step 0, in (0, 1]."""
    pacing_steps: int = 1000
    """Curriculum: step at which the whole pool is admitted (>= 1)."""
    pacing: str = "linear"
    """Curriculum: linear | root growth of the admitted fraction."""
    hard_floor: float = 0.1
    """Hard: uniform probability mass so no task starves, in (0, 1]."""
    hard_temperature: float = 1.0
    """Hard: softmax temperature on the query loss (> 0)."""
    difficulty_bins: int = 4
    """Uniform_difficulty: equal-width difficulty bins (>= 1)."""
    loss_ema: float = 0.5
    """Weight of a new loss observation in a task's running estimate, in (0, 1]."""
    fit_cost: bool = False
    """Fit the cost model to measured pass times after each observe. Plans then follow the
    hardware but depend on timing: two runs (or a run and its resume) pack passes differently and
    agree only to float rounding, not bitwise."""
    cost_a: float = 64.0
    """Initial per-pass cost (token-equivalents, >= 0)."""
    cost_b: float = 1.0
    """Initial per-token cost (>= 0)."""
    cost_c: float = 1.0 / 2048.0
    """Initial per-squared-length cost (attention, >= 0)."""
    cost_r: float = 4.0
    """Initial cost of all-reducing a million floats across ranks (token-equivalents, >= 0):
    what the rows placement pays per inner step for T x adapter floats."""
    cost_damping: float = 0.5
    """Fraction of old cost coefficients kept per fit, in [0, 1)."""
    balance_tol: float = 1e-3
    """Stop improving rank balance within this fraction of the lower bound (>= 0)."""
    length_buckets: tuple[int, ...] = ()
    """Ascending widths (>= 1) each training pass is padded up to, for static-shape graphs; [] = its own width."""

    def validate(self) -> list[str]:
        """Range and choice checks, one problem per field."""
        problems: list[str] = []

        def need(ok: bool, key: str, allowed: str, fix: str = "") -> None:
            if not ok:
                problems.append(
                    f"{key}={getattr(self, key)!r} is invalid: {allowed}" + (f"; {fix}" if fix else "")
                )

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        b = self.meta_batch_size
        need(b == AUTO or (is_int(b) and int(b) >= 1),
             "meta_batch_size", "must be an integer >= 1 or auto")
        for key in ("micro_batch_size", "pacing_steps", "difficulty_bins", "auto_batch_warmup"):
            need(is_int(getattr(self, key)) and getattr(self, key) >= 1, key, "must be an integer >= 1")
        need(is_int(self.auto_batch_min) and self.auto_batch_min >= 2, "auto_batch_min",
             "must be an integer >= 2", "the noise is measured from the spread of two or more tasks")
        need(is_int(self.auto_batch_max) and self.auto_batch_max >= self.auto_batch_min, "auto_batch_max",
             f"must be an integer >= auto_batch_min ({self.auto_batch_min})")
        need(is_int(self.auto_batch_every) and self.auto_batch_every >= 0, "auto_batch_every",
             "must be an integer >= 0", "0 chooses once, after the warm-up")
        need(is_int(self.tokens_per_pass) and self.tokens_per_pass >= 0, "tokens_per_pass",
             "must be an integer >= 0", "0 derives it from micro_batch_size")
        need(self.strategy in STRATEGIES, "strategy", f"allowed: {', '.join(STRATEGIES)}")
        need(self.on_uneven in ("pad", "error"), "on_uneven", "allowed: pad, error")
        need(self.placement in PLACEMENTS, "placement", f"allowed: {', '.join(PLACEMENTS)}")
        need(self.difficulty in ("shots", "lengths", "loss"), "difficulty", "allowed: shots, lengths, loss")
        need(self.pacing in ("linear", "root"), "pacing", "allowed: linear, root")
        need(0.0 < self.pacing_start <= 1.0, "pacing_start", "must be in (0, 1]")
        need(0.0 < self.hard_floor <= 1.0, "hard_floor", "must be in (0, 1]", "a floor of 0 lets tasks starve")
        need(self.hard_temperature > 0, "hard_temperature", "must be > 0")
        need(0.0 < self.loss_ema <= 1.0, "loss_ema", "must be in (0, 1]")
        for key in ("cost_a", "cost_b", "cost_c", "cost_r"):
            v = getattr(self, key)
            need(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, key, "must be a finite number >= 0")
        need(0.0 <= self.cost_damping < 1.0, "cost_damping", "must be in [0, 1)")
        need(self.balance_tol >= 0, "balance_tol", "must be >= 0")
        need(ascending_widths(self.length_buckets), "length_buckets", "need ascending distinct integer widths >= 1",
             "e.g. [64, 128, 256, 512], or [] for none")
        return problems

    def build_strategy(self) -> Strategy:
        """The strategy object this config names."""
        if self.strategy == "curriculum":
            return Curriculum(self.difficulty, self.pacing_start, self.pacing_steps, self.pacing)
        if self.strategy == "diversity":
            return Diversity()
        if self.strategy == "hard":
            return Hard(self.hard_floor, self.hard_temperature)
        if self.strategy == "uniform_difficulty":
            return UniformDifficulty(self.difficulty, self.difficulty_bins)
        return Uniform()

    def batch_description(self) -> str:
        """Tasks per meta-step in words, for the banner and the report."""
        if self.meta_batch_size != AUTO:
            return str(self.meta_batch_size)
        again = f", again every {self.auto_batch_every}" if self.auto_batch_every else ""
        return (f"auto ({self.auto_batch_min} for {self.auto_batch_warmup} steps, then B_noise within "
                f"{self.auto_batch_min}-{self.auto_batch_max}{again})")

    @property
    def first_batch_size(self) -> int:
        """Tasks in the first meta-step: the fixed number, or auto's warm-up."""
        return self.auto_batch_min if self.meta_batch_size == AUTO else int(self.meta_batch_size)

    @property
    def largest_batch_size(self) -> int:
        """The most tasks a meta-step can hold: the fixed number, or auto's upper bound (what
        memory that grows with the tasks per step must be sized for)."""
        return self.auto_batch_max if self.meta_batch_size == AUTO else int(self.meta_batch_size)


__all__ = ["SamplerConfig"]
