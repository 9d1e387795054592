"""Background preparation of the next meta-batch, with exact checkpoints.

While the trainer runs step ``t``, a worker thread samples, assembles and (through ``prepare``,
e.g. collation into tensors) prepares step ``t + 1``. The trainer calls :meth:`Prefetcher.get`
for each step and :meth:`Prefetcher.observe` with the gathered observations.

Ordering, made deterministic on purpose: the plan of step ``t + 1`` is sampled as soon as plan
``t`` is handed out, so it sees the observations up to step ``t - 1`` (one step of lag), and
:meth:`observe` waits until that sampling is done before changing the sampler's state. Timing
therefore never changes a plan, and with ``background=False`` the same sequence is produced
serially (useful as a reference and for debugging).

Checkpoints: the sampler's live state is ahead of the plan being prepared, so it is not what a
resumed run needs. :meth:`Prefetcher.state_dict` returns the sampler state as it was *before*
sampling the next (prefetched, not yet handed out) plan, plus the observations received since;
a resumed prefetcher re-samples that plan from the snapshot, then re-applies those observations,
reproducing the uninterrupted run exactly.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fmmeta.sampling.plan import MetaBatchPlan
from fmmeta.sampling.sampler import CostAwareSampler
from fmmeta.sampling.source import Observation, observation_from_dict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prefetched:
    """One step's data.

    Attributes:
        step: the meta-step.
        plan: the plan of that step.
        prepared: what ``prepare(plan)`` returned (``None`` without ``prepare``).
        wait_seconds: how long :meth:`Prefetcher.get` blocked for it.
    """

    step: int
    plan: MetaBatchPlan
    prepared: Any
    wait_seconds: float


@dataclass
class _Job:
    step: int
    sampled: threading.Event = field(default_factory=threading.Event)
    snapshot: dict[str, Any] | None = None
    pending: list[Observation] = field(default_factory=list)
    future: Future | None = None


class Prefetcher:
    """Prepares the next meta-batch in a background thread while the current one trains.

    Args:
        sampler: the sampler (the prefetcher becomes its only user: do not call it directly).
        prepare: optional ``prepare(plan)`` run in the background (e.g. collate this rank's
            micro-batches); its result comes back in :attr:`Prefetched.prepared`.
        start_step: first step :meth:`get` returns (a loaded state overrides it).
        stop_step: if set, no step at or beyond it is prefetched.
        background: ``False`` runs the same work inline (same plans, no overlap).

    Example:
        >>> with Prefetcher(sampler, prepare=lambda p: collate_rank(p, rank)) as pf:
        ...     for _ in range(steps):
        ...         item = pf.get()
        ...         observations = train(item.plan, item.prepared)
        ...         pf.observe(gather(observations))
        ...         log(data_wait_fraction=pf.wait_fraction)
    """

    def __init__(
        self,
        sampler: CostAwareSampler,
        *,
        prepare: Callable[[MetaBatchPlan], Any] | None = None,
        start_step: int = 0,
        stop_step: int | None = None,
        background: bool = True,
    ) -> None:
        self._sampler = sampler
        self._prepare = prepare
        self._next_step = start_step
        self._stop_step = stop_step
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fmmeta-prefetch") if background else None
        self._job: _Job | None = None
        self._resume_pending: list[Observation] = []
        self._started = False
        self._wait_total = 0.0
        self._t_first: float | None = None
        self._t_last: float | None = None
        self.last_wait_seconds = 0.0

    # -- the work -----------------------------------------------------------------------------

    def _work(self, job: _Job) -> tuple[MetaBatchPlan, Any]:
        try:
            with self._lock:
                job.snapshot = self._sampler.state_dict()
                plan = self._sampler.sample(job.step)
                if self._resume_pending:
                    job.pending.extend(self._resume_pending)
                    self._sampler.observe(self._resume_pending)
                    self._resume_pending = []
        finally:
            job.sampled.set()
        prepared = self._prepare(plan) if self._prepare is not None else None
        return plan, prepared

    def _submit(self, step: int) -> _Job | None:
        if self._stop_step is not None and step >= self._stop_step:
            return None
        job = _Job(step)
        if self._executor is not None:
            job.future = self._executor.submit(self._work, job)
        else:
            fut: Future = Future()
            try:
                fut.set_result(self._work(job))
            except BaseException as exc:  # surfaced by get(), like the threaded path
                fut.set_exception(exc)
            job.future = fut
        return job

    # -- public API ---------------------------------------------------------------------------

    def get(self) -> Prefetched:
        """The next step's plan and prepared data; blocks only if it is not ready yet.

        Raises:
            StopIteration: past ``stop_step``.
            Exception: whatever sampling or ``prepare`` raised.
        """
        t0 = time.perf_counter()
        if self._t_first is None:
            self._t_first = t0
        if not self._started:
            self._started = True
            self._job = self._submit(self._next_step)
        job = self._job
        if job is None:
            raise StopIteration(f"no step at or beyond stop_step={self._stop_step}")
        assert job.future is not None
        plan, prepared = job.future.result()
        self._next_step = job.step + 1
        self._job = self._submit(self._next_step)
        t1 = time.perf_counter()
        self.last_wait_seconds = t1 - t0
        self._wait_total += t1 - t0
        self._t_last = t1
        return Prefetched(job.step, plan, prepared, t1 - t0)

    def observe(self, observations: Sequence[Observation]) -> None:
        """Feeds gathered observations to the sampler (after the in-flight plan was sampled)."""
        job = self._job
        if job is not None:
            job.sampled.wait()
        with self._lock:
            self._sampler.observe(observations)
            if job is not None:
                job.pending.extend(observations)

    @property
    def wait_fraction(self) -> float:
        """Fraction of wall time since the first :meth:`get` spent blocked in :meth:`get`."""
        if self._t_first is None or self._t_last is None or self._t_last <= self._t_first:
            return 0.0
        return self._wait_total / (self._t_last - self._t_first)

    def metrics(self) -> dict[str, float]:
        """``data_wait_s`` (last get) and ``data_wait_fraction`` (cumulative), for metrics.jsonl."""
        return {"data_wait_s": self.last_wait_seconds, "data_wait_fraction": self.wait_fraction}

    def state_dict(self) -> dict[str, Any]:
        """Exact resume state: next step, sampler state before that step's plan, later observations."""
        job = self._job
        if job is not None:
            job.sampled.wait()
            with self._lock:
                if job.snapshot is None:
                    raise RuntimeError(f"sampling step {job.step} failed; call get() to see the error")
                return {
                    "next_step": job.step,
                    "sampler": job.snapshot,
                    "pending": [o.to_dict() for o in job.pending],
                }
        with self._lock:
            return {
                "next_step": self._next_step,
                "sampler": self._sampler.state_dict(),
                "pending": [o.to_dict() for o in self._resume_pending],
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` output; call before the first :meth:`get`.

        Raises:
            RuntimeError: if :meth:`get` was already called.
        """
        if self._started:
            raise RuntimeError("Prefetcher.load_state_dict() must be called before the first get()")
        with self._lock:
            self._sampler.load_state_dict(state["sampler"])
            self._next_step = int(state["next_step"])
            self._resume_pending = [observation_from_dict(o) for o in state["pending"]]

    def close(self) -> None:
        """Waits for the in-flight job and stops the worker thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
