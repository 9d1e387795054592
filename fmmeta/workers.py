"""Side-by-side worker processes for the independent parts of a one-process run on a CPU.

Why: on a CPU a pass of a small model on few-shot rows is mostly per-operation overhead, and a
second intra-op thread buys little (two 1-thread processes on two cores run 1.41x the meta-steps
of one 2-thread process, docs/design.md). A run's methods train independently from the same
initial adapter, and evaluation's episode groups are independent too, so a one-process run splits
them between processes of ``threads`` intra-op threads each (``engine.workers``).

The workers are forked from the run's process when a map starts, so they share the loaded model,
tokenizer and tasks (copy-on-write: nothing is pickled but each item's index and result) and
every function a map runs may be a closure. Fork is what makes this cheap and is also why it is
CPU-only: a CUDA context does not survive a fork. Every item's result equals the one the run's
own process computes, up to the float rounding of another thread count.

Threads: GNU OpenMP's thread pool does not survive a fork either. A worker forked from a process
that has run a parallel region on several threads hangs at its first region on more than one
(measured with torch 2.13: a matmul after ``set_num_threads(2)`` in the child never returned).
So a worker gets more than one thread only where this process gave up its own threads before it
computed anything (:meth:`Workers.for_run`, as the train recipe does when its methods train side
by side); otherwise each worker runs on one thread, which is always safe.

Example:
    >>> with Workers.for_run("auto", methods=5, distributed=False) as workers:  # before any model
    ...     workers.map(lambda m: train_method(m), ["fomaml", "reptile"])       # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterable, Literal, Sequence, TypeVar

import torch

from fmmeta.errors import UserInputError

__all__ = ["Workers", "in_worker", "resolve_workers"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_JOB: tuple[Callable[[Any], Any], Sequence[Any], Any] | None = None
"""The map being run (function, items, stop event): set in the parent just before the fork, so
each worker inherits it."""

_IN_WORKER = False


def in_worker() -> bool:
    """Whether this process is one of a map's workers (progress bars, which several processes
    cannot share on one terminal, stay off there)."""
    return _IN_WORKER


def resolve_workers(setting: int | Literal["auto"], *, jobs: int | None, distributed: bool) -> int:
    """How many workers ``engine.workers`` means for ``jobs`` independent pieces of work
    (``None``: as many as there are threads).

    ``"auto"`` is one per intra-op thread this process may use (``torch.get_num_threads()``, so
    ``OMP_NUM_THREADS=1`` means one process), at most one per job, and one under a distributed
    launch (the ranks split the work there) or where CUDA is in use (a fork loses its context).

    Raises:
        UserInputError: on an explicit number above 1 where workers cannot run.
    """
    if setting != "auto":
        if setting > 1 and distributed:
            raise UserInputError(
                f"engine.workers={setting} applies to one-process runs; under a distributed launch "
                "the ranks split the work: remove engine.workers (or set it to 1)"
            )
        if setting > 1 and torch.cuda.is_available():
            raise UserInputError(
                f"engine.workers={setting} forks CPU worker processes, and a CUDA context does not "
                "survive a fork: on a GPU set engine.workers=1 (or auto)"
            )
        return setting
    if distributed or torch.cuda.is_available():
        return 1
    return max(1, min(torch.get_num_threads(), jobs or torch.get_num_threads()))


class Workers:
    """Runs ``fn`` over items in up to ``n`` forked processes, ``threads`` intra-op threads each.

    With ``n == 1`` (or a single item) everything runs in this process, as if there were no
    workers. A worker's exception is raised here, with the worker's traceback as its cause;
    the remaining items are cancelled.
    """

    def __init__(self, n: int, threads: int = 1) -> None:
        """``threads`` > 1 only if this process has not computed on several threads (see the
        module docstring)."""
        if n < 1 or threads < 1:
            raise ValueError(f"Workers(n={n}, threads={threads}) is invalid: both must be >= 1")
        self.n, self.threads = n, threads
        self._restore_threads: int | None = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        """Gives this process back the threads :meth:`for_run` took from it."""
        if self._restore_threads is not None:
            torch.set_num_threads(self._restore_threads)
            self._restore_threads = None

    @classmethod
    def from_setting(cls, setting: int | Literal["auto"], *, distributed: bool = False) -> Workers:
        """``engine.workers`` resolved (:func:`resolve_workers`: by default one per thread) for work
        that starts after this process has computed: one thread per worker."""
        return cls(resolve_workers(setting, jobs=None, distributed=distributed))

    @classmethod
    def for_run(cls, setting: int | Literal["auto"], *, methods: int, distributed: bool) -> Workers:
        """A run's workers, made before any model is built.

        Several methods train side by side: this process then keeps one thread until the ``with``
        block ends (it loads, forks and reports; its workers compute) and each worker gets an even
        share of the threads. A single method trains here on every thread, and only evaluation is
        shared out, at one thread per worker.

        Example:
            >>> with Workers.for_run("auto", methods=5, distributed=False) as workers:
            ...     adapters = workers.map(train_method, methods)               # doctest: +SKIP
        """
        threads = torch.get_num_threads()
        if methods > 1:
            n = resolve_workers(setting, jobs=methods, distributed=distributed)
            if n > 1:
                workers = cls(n, max(1, threads // n))
                workers._restore_threads = threads  # given back on leaving ``with``
                torch.set_num_threads(1)
                return workers
        return cls.from_setting(setting, distributed=distributed)

    def map(self, fn: Callable[[Any], _T], items: Sequence[Any],
            on_result: Callable[[int], None] | None = None) -> list[_T]:
        """``[fn(item) for item in items]``; items go to whichever worker is free, in order.

        ``on_result(i)`` is called in this process as item ``i``'s result arrives. On the first
        failure no worker starts another item; those already running are waited for (each keeps
        what it wrote), then the failure is raised.
        """
        if self.n == 1 or len(items) <= 1 or _IN_WORKER:
            here = []
            for i, item in enumerate(items):
                here.append(fn(item))
                if on_result is not None:
                    on_result(i)
            return here
        global _JOB
        context = multiprocessing.get_context("fork")
        stop = context.Event()
        _JOB = (fn, items, stop)
        try:
            with ProcessPoolExecutor(min(self.n, len(items)), mp_context=context,
                                     initializer=_start_worker, initargs=(self.threads, os.getpid())) as pool:
                futures = {pool.submit(_run_item, i): i for i in range(len(items))}
                results: dict[int, _T] = {}
                failures = self._wait(futures, results, stop, on_result)
                if failures:
                    for other in failures[1:]:
                        logger.warning("also stopped: %s", other)
                    raise failures[0]
                return [results[i] for i in range(len(items))]
        finally:
            _JOB = None

    @staticmethod
    def _wait(futures: dict[Future[Any], int], results: dict[int, Any], stop: Any,
              on_result: Callable[[int], None] | None) -> list[BaseException]:
        """Collects every item's result into ``results``; returns the failures, most telling
        first. A Ctrl-C reaches the workers too, so after one this waits for what they say; a
        second stops waiting."""
        failures: list[BaseException] = []
        interrupted: BaseException | None = None
        pending = set(futures)
        while pending:
            try:
                for future in as_completed(pending):
                    pending.discard(future)
                    if future.cancelled():
                        continue
                    err = future.exception()
                    if err is None:
                        results[futures[future]] = future.result()
                        if on_result is not None:
                            on_result(futures[future])
                        continue
                    if not failures:
                        _stop_all(stop, futures)
                    failures.append(err)
            except KeyboardInterrupt as err:
                if interrupted is not None:
                    raise
                interrupted = err
                _stop_all(stop, futures)
        return _failures_first(failures, interrupted)


def _die_with_parent(parent: int) -> None:
    """A worker is killed when the process that forked it dies (Linux), even by SIGKILL: an
    orphan would go on writing into the run folder that a resumed run then claims."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


class _Skipped(RuntimeError):
    """An item a worker did not start because another had failed."""


def _failures_first(failures: list[BaseException], interrupted: BaseException | None) -> list[BaseException]:
    """The workers' own failures (each item's message, e.g. a method's interrupted meta-step);
    without any, a Ctrl-C this process got, or else the first item skipped."""
    real = [e for e in failures if not isinstance(e, _Skipped)]
    if real:
        return real
    return [interrupted] if interrupted is not None else failures[:1]


def _stop_all(stop: Any, futures: Iterable[Future[Any]]) -> None:
    """No worker starts another item; those running are waited for (each keeps what it wrote)."""
    stop.set()
    for future in futures:
        future.cancel()
    if any(f.running() for f in futures):
        logger.warning("waiting for the other workers to finish the item each is on")


def _start_worker(threads: int, parent: int) -> None:
    global _IN_WORKER
    _IN_WORKER = True
    _die_with_parent(parent)
    torch.set_num_threads(threads)
    logger.debug("worker %d started with %d thread(s)", os.getpid(), threads)


def _run_item(i: int) -> Any:
    assert _JOB is not None, "a worker runs items of the map it was forked for"
    fn, items, stop = _JOB
    if stop.is_set():
        raise _Skipped(f"item {i} not started: another item failed")
    try:
        return fn(items[i])
    except BaseException:
        stop.set()
        raise
