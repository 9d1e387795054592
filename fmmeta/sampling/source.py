"""What the sampler consumes (task sources) and what the trainer feeds back (observations).

The sampler never imports the task layer: anything with a ``name``, a ``family`` and a
``sample_episode(rng)`` method is a task. Observations flow the other way: ``meta_step`` makes a
:class:`TaskObservation` per task and a :class:`PassObservation` per pass, and
``fmmeta.algorithms.gather_step`` hands every rank's, as these objects, to every rank's sampler,
so every rank's sampler state stays identical (plans are computed independently on every rank and
must agree). ``to_dict``/:func:`observation_from_dict` exist for checkpoints only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from fmmeta.tasks.episode import Episode


@runtime_checkable
class EpisodeSource(Protocol):
    """A task the sampler can draw episodes from.

    Attributes:
        name: unique task name (shows up in ``Episode.task`` and in logs).
        family: a grouping key (dataset family, language, embedding cluster) used by the
            ``diversity`` strategy to spread a meta-batch.
    """

    name: str
    family: str

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """Draws one episode; every random choice must come from ``rng`` (determinism)."""
        ...


@dataclass(frozen=True, kw_only=True)
class TaskObservation:
    """How well one task did in a meta-step (feeds the loss-driven strategies).

    Attributes:
        task_id: index of the task in the sampler's sources.
        query_loss: mean query loss per answer token after adaptation; ``nan`` if not measured.
        step: the meta-step (``-1`` if unknown).
    """

    task_id: int
    query_loss: float = math.nan
    step: int = -1

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (NaN written as ``None``)."""
        return {"kind": "task", **_plain(asdict(self))}

    def sort_key(self) -> tuple[float, ...]:
        """A total order used to apply observations identically whatever the gather order."""
        return (self.step, self.task_id, _nan_last(self.query_loss))


@dataclass(frozen=True, kw_only=True)
class PassObservation:
    """What one packed pass cost on one rank (feeds the cost model's fit).

    Attributes:
        step: the meta-step.
        rank: the rank that ran it.
        phase: ``"support"`` or ``"query"``.
        index: the pass's index within its phase (passes of one index run in lockstep under ZeRO-3).
        features: the cost model's regressors (``PackedPass.features``).
        seconds: wall seconds of the pass on that rank (mean over its inner-step repeats).
    """

    step: int
    rank: int
    phase: str
    index: int
    features: tuple[float, float, float]
    seconds: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (NaN written as ``None``)."""
        d = _plain(asdict(self))
        d["features"] = list(self.features)
        return {"kind": "pass", **d}

    def sort_key(self) -> tuple[float, ...]:
        """A total order used to apply observations identically whatever the gather order."""
        return (self.step, 0 if self.phase == "support" else 1, self.index, self.rank,
                _nan_last(self.seconds), *self.features)


@dataclass(frozen=True, kw_only=True)
class NoiseObservation:
    """One meta-step's meta-gradient statistics (:class:`~fmmeta.sampling.noise_scale.GradientNoise`'s
    fields), the same on every rank: what ``sampler.meta_batch_size: auto`` chooses B from.

    Attributes:
        step: the meta-step.
        tasks: B, the tasks whose outer gradients were averaged.
        task_sq_mean: the mean over tasks of each task's squared outer-gradient norm.
        mean_sq: the squared norm of the averaged outer gradient.
    """

    step: int
    tasks: int
    task_sq_mean: float
    mean_sq: float

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (NaN written as ``None``)."""
        return {"kind": "noise", **_plain(asdict(self))}

    def sort_key(self) -> tuple[float, ...]:
        """A total order (one per step, so the step alone)."""
        return (self.step,)


Observation = TaskObservation | PassObservation | NoiseObservation
_KINDS: dict[str, type[Observation]] = {"task": TaskObservation, "pass": PassObservation, "noise": NoiseObservation}


def observation_from_dict(d: dict[str, Any]) -> Observation:
    """Inverse of ``to_dict`` of every observation type.

    Raises:
        ValueError: for a dict of another shape (e.g. saved by an fmmeta version before packed
            passes, whose observations had no ``kind``).
    """
    kind = d.get("kind")
    cls = _KINDS.get(kind, TaskObservation)  # type: ignore[arg-type]  # an unknown kind is refused below
    out = {k: (math.nan if v is None else v) for k, v in d.items() if k != "kind"}
    names = {f.name for f in fields(cls)}
    if kind not in _KINDS or not set(out) <= names:
        raise ValueError(
            f"sampler observation {sorted(d)} is not one this fmmeta version writes (kind 'task', 'pass' "
            "or 'noise'): the checkpoint comes from an older version; resume it with that version, or "
            "start again with train.resume=never or a new output_dir"
        )
    if cls is PassObservation:
        out["features"] = tuple(float(x) for x in cast(list, out["features"]))
    return cls(**out)  # type: ignore[arg-type]  # field names checked above


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def _nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else x
