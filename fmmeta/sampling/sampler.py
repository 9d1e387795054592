"""The cost-aware meta-batch sampler: which tasks, on which rank, in which micro-batches.

Every rank builds its own sampler with the same seed and calls :meth:`CostAwareSampler.sample`
with the same step; the plan is a pure function of ``(seed, step, state)``, so every rank gets the
same plan without any communication (compare ``plan.digest()`` across ranks to check).

Randomness is counter-based: the draws of step ``t`` come from generators seeded with
``(seed, stream, t, i)``. Nothing advances between steps, so sampling the next plan early (the
prefetcher does) or twice changes nothing, and resuming needs only the state that observations
change: loss estimates, cost coefficients and the last step.

State that changes comes only from :meth:`CostAwareSampler.observe`. The trainer must gather the
observations of *all* ranks (e.g. ``all_gather_object``) and pass the same list on every rank;
the sampler applies them in a canonical order, so the gather order does not matter either.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fmmeta.config import raise_if_invalid
from fmmeta.errors import UserInputError
from fmmeta.sampling.auto_batch import AUTO, AutoBatch
from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.plan import MetaBatchPlan, bucketed
from fmmeta.sampling.rows_plan import fast_weight_megabytes, plan_placed
from fmmeta.sampling.sampler_config import SamplerConfig
from fmmeta.sampling.source import (
    EpisodeSource,
    NoiseObservation,
    Observation,
    PassObservation,
    TaskObservation,
)
from fmmeta.sampling.strategies import PoolView
from fmmeta.tasks.episode import Episode

logger = logging.getLogger(__name__)

_STREAM_STRATEGY, _STREAM_EPISODE, _STREAM_PLAN, _STREAM_PROBE, _STREAM_SUPPORT = 0, 1, 2, 3, 4
_STATE_VERSION = 1


@dataclass
class _Probe:
    """Shot and length statistics of one probe episode per task (deterministic from the seed)."""

    shots_difficulty: np.ndarray
    mean_length: np.ndarray


class PoolTooSmallError(UserInputError, ValueError):
    """``sampler.meta_batch_size`` exceeds the meta-training pool: the user's config and task
    suite, so a :class:`~fmmeta.errors.UserInputError` (a recipe exits 2 with the message); also a
    ``ValueError``, as the sampler's other argument checks are."""


def check_pool_size(config: SamplerConfig, n_tasks: int) -> None:
    """Refuses a meta-batch larger than the pool of ``n_tasks`` meta-training tasks.

    Drawing with replacement would put one task into a meta-batch twice, weighting it double
    without anyone having asked for it. The sampler checks it; the train recipe calls it too as
    soon as the suite is built, so the refusal comes before anything is written or trained.

    Raises:
        PoolTooSmallError: naming both numbers and the fix.
    """
    key = "auto_batch_min" if config.meta_batch_size == AUTO else "meta_batch_size"
    if config.first_batch_size > n_tasks:
        raise PoolTooSmallError(
            f"sampler.{key}={config.first_batch_size} is larger than the "
            f"meta-training pool ({n_tasks} tasks), so a meta-batch would hold a task "
            f"twice: set sampler.{key} to at most {n_tasks}, or add tasks"
        )


def _check_arguments(sources: Sequence[EpisodeSource], config: SamplerConfig, *, world_size: int,
                     seed: int, support_draws: int) -> None:
    """Refuses a sampler that could not plan honest meta-batches, each problem with its fix."""
    raise_if_invalid(config)
    if not sources:
        raise ValueError("CostAwareSampler got no sources: pass at least one task")
    check_pool_size(config, len(sources))
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"world_size={world_size!r} is invalid: must be an integer >= 1")
    if not (isinstance(seed, int) and seed >= 0):
        raise ValueError(f"seed={seed!r} is invalid: must be an integer >= 0")
    if config.on_uneven == "error" and config.meta_batch_size != AUTO and config.meta_batch_size % world_size:
        raise ValueError(
            f"sampler.meta_batch_size={config.meta_batch_size} does not divide by "
            f"world_size={world_size} and sampler.on_uneven='error'; use a multiple of "
            f"{world_size} or on_uneven='pad'"
        )
    if not (isinstance(support_draws, int) and support_draws >= 1):
        raise ValueError(f"support_draws={support_draws!r} is invalid: must be an integer >= 1")
    empty = [s.name for s in sources if hasattr(s, "__len__") and len(s) == 0]  # type: ignore[arg-type]
    if empty:
        raise ValueError(
            f"task(s) {empty[:5]} have no examples: a task in a meta-batch counts as one "
            "slot of the meta-gradient's mean, so an empty one would dilute it; leave them out"
        )
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"task names must be unique; duplicated: {dup[:5]}")


class CostAwareSampler:
    """Samples task meta-batches and plans them over ranks (see the module docstring).

    Args:
        sources: the task pool; ``task_id`` in plans and observations indexes this list.
        config: sampling and planning settings.
        world_size: data-parallel ranks (>= 1).
        seed: the run's seed (>= 0); equal on every rank.
        support_draws: support sets per episode (>= 1): the first is the episode's own, the others
            are the support sets of fresh episodes of the same task (from a stream of their own, so
            the first draw is the same whatever this is). The multi-task baseline spends the
            compute of ``inner_steps`` support passes on them instead of repeating one set.
        support_repeats: how often each support pass runs (weights the support cost in the plan);
            the algorithm's ``support_repeats`` (its inner steps for FOMAML and Reptile).
        fast_weight_numel: floats of one task's fast weights (the adapter's size; 0 for methods
            that adapt nothing): prices the rows placement's all-reduce per inner step.
        lockstep: whether the engine's ranks meet at every pass (ZeRO-3); prices the placements.
        name: whose meta-batches it plans (the method), named in its messages.

    Example:
        >>> sampler = CostAwareSampler(tasks, SamplerConfig(meta_batch_size=8), world_size=2, seed=0)
        >>> plan = sampler.sample(step)
        >>> slots = plan.for_rank(rank)
        >>> # ... train; gather observations from all ranks, then on every rank:
        >>> sampler.observe(all_observations)
    """

    def __init__(
        self,
        sources: Sequence[EpisodeSource],
        config: SamplerConfig,
        *,
        world_size: int,
        seed: int,
        support_draws: int = 1,
        support_repeats: int = 1,
        fast_weight_numel: int = 0,
        lockstep: bool = True,
        name: str = "",
    ) -> None:
        _check_arguments(sources, config, world_size=world_size, seed=seed, support_draws=support_draws)
        self.sources = list(sources)
        self.config = config
        self.world_size = world_size
        self.seed = seed
        self.support_draws = support_draws
        self.support_repeats = support_repeats
        self.fast_weight_numel = fast_weight_numel
        self.lockstep = lockstep
        self.strategy = config.build_strategy()
        self.auto_batch = None if config.meta_batch_size != AUTO else AutoBatch(
            low=config.auto_batch_min, high=min(config.auto_batch_max, len(sources)),
            warmup=config.auto_batch_warmup, every=config.auto_batch_every,
            multiple=world_size if config.on_uneven == "error" else 1,
            mib_per_task=fast_weight_megabytes(1, fast_weight_numel), label=name)
        """Chooses the tasks per meta-step of ``meta_batch_size: auto`` (``None`` otherwise)."""
        self.cost_model = CostModel(a=config.cost_a, b=config.cost_b, c=config.cost_c, r=config.cost_r,
                                    damping=config.cost_damping)
        n = len(self.sources)
        family_names = sorted({s.family for s in self.sources})
        code = {d: i for i, d in enumerate(family_names)}
        self._families = np.array([code[s.family] for s in self.sources], dtype=np.int64)
        self._tie_break = self._rng(_STREAM_PROBE, 0, 1 << 30).permutation(n)
        self._loss = np.full(n, np.nan)
        self._n_observed = np.zeros(n, dtype=np.int64)
        self._last_step = -1
        self._probe: _Probe | None = None
        self.ignored_observations = 0
        """Non-finite losses and pass times ignored by :meth:`observe` so far (this process)."""

    # -- randomness ---------------------------------------------------------------------------

    def _rng(self, stream: int, step: int, *index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, stream, step, *(index or (0,))])

    # -- pool view ----------------------------------------------------------------------------

    def _difficulty(self, measure: str) -> np.ndarray:
        if self._probe is None:
            shots_d, lengths = [], []
            for i, src in enumerate(self.sources):
                ep = src.sample_episode(self._rng(_STREAM_PROBE, 1, i))
                shots_d.append((ep.ways or 1) / max(ep.shots, 1))
                lens = ep.support_lengths + ep.query_lengths
                lengths.append(sum(lens) / max(len(lens), 1))
            self._probe = _Probe(np.array(shots_d), np.array(lengths))
        if measure == "shots":
            return self._probe.shots_difficulty
        if measure == "lengths":
            return self._probe.mean_length
        raise ValueError(f"difficulty measure {measure!r} is invalid: allowed shots, lengths, loss")

    def pool_view(self) -> PoolView:
        """What the strategy sees (copies, so a strategy cannot change sampler state)."""
        return PoolView(
            n_tasks=len(self.sources),
            families=self._families,
            loss=self._loss.copy(),
            difficulty_fn=self._difficulty,
            tie_break=self._tie_break,
        )

    # -- sampling -----------------------------------------------------------------------------

    def select(self, step: int) -> np.ndarray:
        """Task ids of step ``step``'s meta-batch (the strategy's choice, before planning)."""
        return self.strategy.select(self.batch_size, self._rng(_STREAM_STRATEGY, step), self.pool_view(), step)

    @property
    def batch_size(self) -> int:
        """Tasks in the next meta-batch: the config's, or ``auto``'s current choice."""
        return self.config.first_batch_size if self.auto_batch is None else self.auto_batch.size

    def sample(self, step: int) -> MetaBatchPlan:
        """Chooses, assembles and plans the meta-batch of ``step``; equal on every rank.

        Raises:
            ValueError: for a negative step.
        """
        if not (isinstance(step, int) and step >= 0):
            raise ValueError(f"step={step!r} is invalid: must be an integer >= 0")
        ids = self.select(step).tolist()
        episodes = [self._episode(t, step, i) for i, t in enumerate(ids)]
        for ep in episodes:
            if not ep.query:
                raise ValueError(
                    f"task {ep.task!r} gave an episode with no query examples: it would count as "
                    "a full task of the meta-batch with nothing to learn from; give it examples "
                    "or leave it out of the pool"
                )
        plan = plan_placed(
            episodes,
            ids,
            step=step,
            world_size=self.world_size,
            micro_batch_size=self.config.micro_batch_size,
            tokens_per_pass=self.config.tokens_per_pass or None,
            support_repeats=self.support_repeats,
            cost_model=self.cost_model,
            rng=self._rng(_STREAM_PLAN, step),
            on_uneven=self.config.on_uneven,  # type: ignore[arg-type]
            tol=self.config.balance_tol,
            placement=self.config.placement,  # type: ignore[arg-type]
            fast_weight_numel=self.fast_weight_numel, length_buckets=self.config.length_buckets,
            lockstep=self.lockstep,
        )
        self._last_step = max(self._last_step, step)
        return bucketed(plan, self.config.length_buckets)

    def _episode(self, task: int, step: int, i: int) -> Episode:
        """The ``i``-th episode of ``step`` (task ``task``), with ``support_draws`` support sets."""
        source = self.sources[task]
        episode = source.sample_episode(self._rng(_STREAM_EPISODE, step, i))
        if self.support_draws == 1:
            return episode
        extra = tuple(
            ex
            for d in range(1, self.support_draws)
            for ex in source.sample_episode(self._rng(_STREAM_SUPPORT, step, i, d)).support
        )
        return dataclasses.replace(episode, support=episode.support + extra)

    # -- feedback -----------------------------------------------------------------------------

    def observe(self, observations: Sequence[Observation]) -> None:
        """Updates loss estimates, the cost model and ``auto``'s B from one meta-step's observations.

        Pass the observations of *all* ranks (gathered), identically on every rank; they are
        applied in a canonical order, so gather order does not matter.

        The cost model is fitted on the *critical* pass of each pass index only (the rank whose
        pass the model prices highest). Under ZeRO-3 the other ranks wait for that one inside
        every pass, so their times measure waiting, not their own work; where ranks run
        independently the critical pass is as good a sample as any.

        Raises:
            ValueError: for a task id outside the pool.
        """
        tasks = sorted((o for o in observations if isinstance(o, TaskObservation)),
                       key=TaskObservation.sort_key)
        passes = sorted((o for o in observations if isinstance(o, PassObservation)),
                        key=PassObservation.sort_key)
        alpha = self.config.loss_ema
        n = len(self.sources)
        # An infinite loss or time (a diverged task, a clock glitch) would poison the running
        # estimates for good: one inf loss turns every later "hard" probability into NaN.
        bad = [o for o in tasks if math.isinf(o.query_loss)]
        bad_passes = [o for o in passes if not math.isfinite(o.seconds)]
        if bad or bad_passes:
            self.ignored_observations += len(bad) + len(bad_passes)
            logger.warning(
                "sampler ignored %d non-finite task loss(es) and %d non-finite pass time(s) "
                "(%d ignored so far); first task: %s",
                len(bad), len(bad_passes), self.ignored_observations,
                self.sources[bad[0].task_id].name if bad and 0 <= bad[0].task_id < n else "-",
            )
            passes = [o for o in passes if math.isfinite(o.seconds)]
        for o in tasks:
            if not (0 <= o.task_id < n):
                raise ValueError(f"observation task_id={o.task_id} is invalid: must be in [0, {n})")
            if not math.isfinite(o.query_loss):
                continue
            old = self._loss[o.task_id]
            self._loss[o.task_id] = o.query_loss if math.isnan(old) else (1 - alpha) * old + alpha * o.query_loss
            self._n_observed[o.task_id] += 1
        if self.config.fit_cost and passes:
            self.cost_model.fit(critical_passes(passes, self.cost_model))
        if self.auto_batch is not None:
            for noise in sorted((o for o in observations if isinstance(o, NoiseObservation)),
                                key=NoiseObservation.sort_key):
                self.auto_batch.observe(noise)

    @property
    def loss_estimates(self) -> np.ndarray:
        """Per-task running query loss (``nan`` = never observed); a copy."""
        return self._loss.copy()

    # -- checkpointing ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain-python, JSON-able state (no pickle needed); floats round-trip exactly."""
        return {
            "version": _STATE_VERSION,
            "seed": self.seed,
            "world_size": self.world_size,
            "task_names": [s.name for s in self.sources],
            "config": {f.name: _plain(getattr(self.config, f.name)) for f in fields(self.config)},
            "last_step": self._last_step,
            "loss": [None if math.isnan(v) else float(v) for v in self._loss.tolist()],
            "n_observed": [int(v) for v in self._n_observed.tolist()],
            "cost_model": self.cost_model.state_dict(),
            **({"auto_batch": self.auto_batch.state_dict()} if self.auto_batch is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` output; afterwards plans continue exactly.

        Raises:
            ValueError: if the state belongs to another task pool or seed.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"sampler state version={state.get('version')!r} is not supported (expected {_STATE_VERSION})")
        names = [s.name for s in self.sources]
        if state["task_names"] != names:
            raise ValueError(
                "sampler state was saved for another task pool "
                f"({len(state['task_names'])} tasks vs {len(names)} now); build the sampler with the same sources"
            )
        if state["seed"] != self.seed:
            raise ValueError(f"sampler state has seed={state['seed']} but this sampler has seed={self.seed}; use the same seed")
        if state["world_size"] != self.world_size:
            logger.warning("resuming with world_size=%d (saved with %d): plans will differ", self.world_size, state["world_size"])
        now = {f.name: getattr(self.config, f.name) for f in fields(self.config)}
        changed = [f"{k}={state['config'][k]!r} -> {v!r}" for k, v in now.items()
                   if k in state.get("config", {}) and _plain(state["config"][k]) != _plain(v)]
        if changed:
            logger.warning(
                "sampler state was saved with another configuration (%s): its loss estimates "
                "and cost model are kept, but plans will differ from the saved run's",
                ", ".join(changed),
            )
        self._last_step = int(state["last_step"])
        self._loss = np.array([math.nan if v is None else float(v) for v in state["loss"]], dtype=np.float64)
        self._n_observed = np.array(state["n_observed"], dtype=np.int64)
        self.cost_model.load_state_dict(state["cost_model"])
        if self.auto_batch is not None and "auto_batch" in state:  # absent: saved with a fixed B
            self.auto_batch.load_state_dict(state["auto_batch"])


def _plain(value: Any) -> Any:
    """Tuples as lists: a state read back from JSON holds lists."""
    return list(value) if isinstance(value, tuple) else value


def critical_passes(passes: Sequence[PassObservation], cost_model: CostModel) -> list[PassObservation]:
    """Per (step, phase, index), the observation whose pass ``cost_model`` prices highest.

    Ties go to the lowest rank, so every rank picks the same ones.
    """
    best: dict[tuple[int, str, int], tuple[float, int, PassObservation]] = {}
    for o in passes:
        key = (o.step, o.phase, o.index)
        cost = float(np.dot(o.features, cost_model.coefficients))
        if key not in best or (cost, -o.rank) > best[key][:2]:
            best[key] = (cost, -o.rank, o)
    return [best[k][2] for k in sorted(best)]


__all__ = ["CostAwareSampler", "PoolTooSmallError", "SamplerConfig", "check_pool_size", "critical_passes"]
