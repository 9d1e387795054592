"""Which tasks a meta-step trains on. Strategies pick task ids; the planner places them.

Every strategy is a small object with ``select(n, rng, pool, step) -> task ids``. It draws only
from the generator it is given and reads only the :class:`PoolView` (task families, difficulty
measures, loss estimates the sampler keeps), so a plan is a pure function of seed, step and
sampler state. Within a meta-batch tasks are drawn without replacement where the pool allows.

* ``uniform`` (default): every task equally likely; a strong baseline in task-sampling studies.
* ``curriculum``: easiest tasks first; the admitted pool (the easiest fraction by a difficulty
  measure) widens with the step from ``pacing_start`` to all tasks at ``pacing_steps``.
* ``diversity``: spreads a meta-batch over task families as evenly as the pool allows.
* ``hard``: samples by recent query loss (softmax with a temperature), mixed with a uniform
  floor so no task starves; unobserved tasks count as the hardest seen (explored first).
* ``uniform_difficulty``: Arnold et al. (NeurIPS 2021): bins tasks by difficulty into equal-width
  bins, picks a non-empty bin uniformly, then a task in it; rare hard (or easy) tasks get a bin's
  share instead of their head count's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Protocol

import numpy as np

DifficultyMeasure = Literal["shots", "lengths", "loss"]
StrategyName = Literal["uniform", "curriculum", "diversity", "hard", "uniform_difficulty"]
STRATEGIES: tuple[str, ...] = ("uniform", "curriculum", "diversity", "hard", "uniform_difficulty")


@dataclass
class PoolView:
    """What strategies may read about the task pool.

    Attributes:
        n_tasks: pool size.
        families: ``[n_tasks]`` integer family code of each task.
        loss: ``[n_tasks]`` recent query-loss estimate (``nan`` where never observed).
        difficulty_fn: returns ``[n_tasks]`` difficulty for a measure (higher = harder); the
            sampler computes shot and length measures lazily from one probe episode per task.
        tie_break: ``[n_tasks]`` a fixed random permutation that orders equally difficult tasks,
            so ties do not favour low task ids.
    """

    n_tasks: int
    families: np.ndarray
    loss: np.ndarray
    difficulty_fn: Callable[[str], np.ndarray]
    tie_break: np.ndarray

    def difficulty(self, measure: str) -> np.ndarray:
        """Difficulty per task; for ``"loss"`` unobserved tasks take the median observed loss."""
        if measure == "loss":
            loss = self.loss.copy()
            seen = ~np.isnan(loss)
            loss[~seen] = float(np.median(loss[seen])) if seen.any() else 0.0
            return loss
        return self.difficulty_fn(measure)


class Strategy(Protocol):
    """Picks the task ids of one meta-batch."""

    name: str

    def select(self, n: int, rng: np.random.Generator, pool: PoolView, step: int) -> np.ndarray:
        """Returns ``n`` task ids (distinct when the candidate set has at least ``n`` tasks)."""
        ...


def _choose(rng: np.random.Generator, candidates: np.ndarray, n: int, p: np.ndarray | None = None) -> np.ndarray:
    """``n`` draws from ``candidates``; without replacement when there are enough."""
    replace = candidates.size < n
    if p is not None and not replace:
        replace = int(np.count_nonzero(p)) < n
    return rng.choice(candidates, size=n, replace=replace, p=p)


@dataclass
class Uniform:
    """Every task equally likely."""

    name: str = "uniform"

    def select(self, n: int, rng: np.random.Generator, pool: PoolView, step: int) -> np.ndarray:
        return _choose(rng, np.arange(pool.n_tasks), n)


@dataclass
class Curriculum:
    """Easiest first, admitting harder tasks as training goes on.

    Attributes:
        measure: ``shots`` (ways / shots: fewer examples per class is harder), ``lengths`` (longer
            sequences are harder) or ``loss`` (higher recent query loss is harder).
        pacing_start: fraction of the pool admitted at step 0, in ``(0, 1]``.
        pacing_steps: step at which the whole pool is admitted (>= 1).
        pacing: ``linear`` or ``root`` (widens fast early, like competence-based curricula).
    """

    measure: str = "shots"
    pacing_start: float = 0.2
    pacing_steps: int = 1000
    pacing: str = "linear"
    name: str = "curriculum"

    def admitted_fraction(self, step: int) -> float:
        """Fraction of the pool (easiest first) that may be sampled at ``step``."""
        t = min(1.0, max(0.0, step / self.pacing_steps))
        if self.pacing == "root":
            t = math.sqrt(t)
        return min(1.0, self.pacing_start + (1.0 - self.pacing_start) * t)

    def admitted(self, pool: PoolView, step: int) -> np.ndarray:
        """Task ids admitted at ``step`` (easiest ``ceil(fraction * n_tasks)``)."""
        diff = pool.difficulty(self.measure)
        order = np.lexsort((pool.tie_break, diff))
        k = max(1, math.ceil(self.admitted_fraction(step) * pool.n_tasks - 1e-9))
        return np.sort(order[:k])

    def select(self, n: int, rng: np.random.Generator, pool: PoolView, step: int) -> np.ndarray:
        return _choose(rng, self.admitted(pool, step), n)


@dataclass
class Diversity:
    """Spreads the meta-batch over families: each family gets ``n // D`` or one more task."""

    name: str = "diversity"

    def select(self, n: int, rng: np.random.Generator, pool: PoolView, step: int) -> np.ndarray:
        codes = np.unique(pool.families)
        members = [np.flatnonzero(pool.families == c) for c in codes]
        quota = np.zeros(len(codes), dtype=np.int64)
        left = n
        # Fill quotas round by round in a random family order; a family that has run out of
        # distinct tasks stops taking a share while others still have some.
        while left > 0:
            open_ = [d for d in rng.permutation(len(codes)) if quota[d] < members[d].size]
            if not open_:
                open_ = list(rng.permutation(len(codes)))  # pool smaller than n: allow repeats
            for d in open_[:left]:
                quota[d] += 1
            left -= min(left, len(open_))
        picks = [_choose(rng, members[d], int(q)) for d, q in enumerate(quota) if q]
        out = np.concatenate(picks)
        return out[rng.permutation(out.size)]


@dataclass
class Hard:
    """Samples by recent query loss with a uniform floor.

    Attributes:
        floor: probability mass spread uniformly over all tasks, in ``(0, 1]``; every task has
            at least ``floor / n_tasks`` so none starves.
        temperature: softmax temperature on the loss (> 0; lower = greedier).
    """

    floor: float = 0.1
    temperature: float = 1.0
    name: str = "hard"

    def probabilities(self, pool: PoolView) -> np.ndarray:
        """Per-task selection probability of one draw."""
        loss = pool.loss.copy()
        seen = ~np.isnan(loss)
        if not seen.any():
            return np.full(pool.n_tasks, 1.0 / pool.n_tasks)
        loss[~seen] = float(loss[seen].max())
        z = (loss - loss.max()) / self.temperature
        w = np.exp(z)
        p = (1.0 - self.floor) * w / w.sum() + self.floor / pool.n_tasks
        return p / p.sum()

    def select(self, n: int, rng: np.random.Generator, pool: PoolView, step: int) -> np.ndarray:
        return _choose(rng, np.arange(pool.n_tasks), n, self.probabilities(pool))


@dataclass
class UniformDifficulty:
    """Uniform over difficulty bins, then uniform within the bin (Arnold et al., 2021).

    Attributes:
        measure: difficulty measure (see :class:`Curriculum`).
        bins: number of equal-width difficulty bins (>= 1).
    """

    measure: str = "shots"
    bins: int = 4
    name: str = "uniform_difficulty"

    def bin_of(self, pool: PoolView) -> np.ndarray:
        """Bin index of every task."""
        diff = pool.difficulty(self.measure)
        lo, hi = float(diff.min()), float(diff.max())
        if hi <= lo:
            return np.zeros(pool.n_tasks, dtype=np.int64)
        return np.minimum(((diff - lo) / (hi - lo) * self.bins).astype(np.int64), self.bins - 1)

    def select(self, n: int, rng: np.random.Generator, pool: PoolView, step: int) -> np.ndarray:
        bins = self.bin_of(pool)
        members = [np.flatnonzero(bins == b) for b in np.unique(bins)]
        size = np.array([m.size for m in members])
        taken = np.zeros(len(members), dtype=np.int64)
        # Each draw picks a bin uniformly among those with a task not yet taken, so a lone task
        # in its bin is drawn at most once per meta-batch while the pool has n distinct tasks.
        for _ in range(n):
            open_ = np.flatnonzero(taken < size)
            if open_.size == 0:
                open_ = np.arange(len(members))  # pool smaller than n: repeats are unavoidable
            taken[rng.choice(open_)] += 1
        out = np.concatenate([_choose(rng, m, int(t)) for m, t in zip(members, taken) if t])
        return out[rng.permutation(out.size)]
