"""Synthetic tasks with chosen sequence lengths, for tests and the sampler benchmark.

A :class:`SyntheticTask` holds a fixed pool of pre-built examples (like a tokenized dataset the
task layer caches) and draws episodes from it with the caller's generator. Token ids carry no
meaning; only lengths, shots and ways matter to the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fmmeta.tasks.episode import Episode, Example


@dataclass
class SyntheticTask:
    """An :class:`~fmmeta.sampling.source.EpisodeSource` over examples of given lengths.

    Attributes:
        name: task name.
        family: grouping key.
        lengths: token length of each example in the task's pool (each >= 2).
        shots: support examples per class.
        ways: classes per episode; ``None`` for a generation task (support = ``shots``).
        query_per_class: query examples per class (or in total for generation).
    """

    name: str
    family: str
    lengths: tuple[int, ...]
    shots: int
    ways: int | None = None
    query_per_class: int = 2
    examples: tuple[Example, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if any(n < 2 for n in self.lengths):
            raise ValueError(f"SyntheticTask {self.name}: every length must be >= 2, got {min(self.lengths)}")
        need = (self.ways or 1) * (self.shots + self.query_per_class)
        if len(self.lengths) < need:
            raise ValueError(
                f"SyntheticTask {self.name}: lengths has {len(self.lengths)} examples, an episode needs {need}"
            )
        self.examples = tuple(
            Example(tuple(range(1, n)), (0,), label=(i % self.ways) if self.ways else None)
            for i, n in enumerate(self.lengths)
        )

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        """Draws support and query without overlap."""
        ways = self.ways or 1
        n_s, n_q = ways * self.shots, ways * self.query_per_class
        idx = rng.choice(len(self.examples), n_s + n_q, replace=False).tolist()
        ex = self.examples
        return Episode(
            task=self.name,
            support=tuple(ex[i] for i in idx[:n_s]),
            query=tuple(ex[i] for i in idx[n_s:]),
            shots=self.shots,
            ways=self.ways,
        )


def lognormal_pool(
    n_tasks: int,
    *,
    seed: int,
    median_length: float = 96.0,
    task_sigma: float = 0.6,
    seq_sigma: float = 0.35,
    max_length: int = 1024,
    n_families: int = 8,
    examples_per_task: int = 64,
    shots_choices: tuple[int, ...] = (1, 2, 4, 8),
    ways_choices: tuple[int | None, ...] = (None, 2, 3, 5),
) -> list[SyntheticTask]:
    """A heterogeneous pool: lognormal lengths, mixed shots and ways, several families.

    Each task draws its own median length (lognormal around ``median_length`` with ``task_sigma``)
    and its sequences scatter around it (``seq_sigma``); shots are drawn from ``shots_choices`` and
    ways from ``ways_choices`` (``None`` = a generation task).
    """
    rng = np.random.default_rng(seed)
    tasks = []
    for t in range(n_tasks):
        lengths = _draw_lengths(rng, median_length, task_sigma, seq_sigma, examples_per_task, max_length)
        ways = ways_choices[int(rng.integers(len(ways_choices)))]
        shots = shots_choices[int(rng.integers(len(shots_choices)))]
        tasks.append(_with_family(rng, f"task{t:04d}", lengths, shots, ways, n_families))
    return tasks


def _draw_lengths(rng: np.random.Generator, median: float, task_sigma: float, seq_sigma: float, n: int,
                  max_length: int) -> tuple[int, ...]:
    """A task's ``n`` sequence lengths: its own median lognormal around ``median``
    (``task_sigma``), each sequence lognormal around that (``seq_sigma``), clipped to
    ``[4, max_length]``."""
    med = median * float(np.exp(rng.normal(0.0, task_sigma)))
    lens = np.clip(np.round(med * np.exp(rng.normal(0.0, seq_sigma, n))), 4, max_length)
    return tuple(int(x) for x in lens)


def _with_family(rng: np.random.Generator, name: str, lengths: tuple[int, ...], shots: int, ways: int | None,
                 n_families: int) -> SyntheticTask:
    """The task, in one of ``n_families`` families drawn at random (the last draw for a task)."""
    return SyntheticTask(name=name, family=f"family{int(rng.integers(n_families))}", lengths=lengths,
                         shots=shots, ways=ways)


def bimodal_pool(
    n_tasks: int,
    *,
    seed: int,
    long_fraction: float = 0.125,
    short_length: float = 64.0,
    long_length: float = 640.0,
    task_sigma: float = 0.25,
    seq_sigma: float = 0.3,
    max_length: int = 2048,
    n_families: int = 8,
    examples_per_task: int = 64,
    short_shots: tuple[int, ...] = (1, 2, 4, 8),
    short_ways: tuple[int, ...] = (2, 3, 5),
    long_shots: tuple[int, ...] = (1, 2, 4, 8),
) -> list[SyntheticTask]:
    """A two-mode pool: many short classification tasks and a few long generation tasks.

    This is the mix where one task per pass does worst: a meta-batch's tasks differ in size by an
    order of magnitude, and a single long task can outweigh a rank's fair share.

    ``round(long_fraction * n_tasks)`` tasks (at least one when ``long_fraction > 0``, at random
    positions) are generation tasks (``ways=None``, shots from ``long_shots``) with a median length
    lognormal around ``long_length``; the others are classification tasks (ways from
    ``short_ways``, shots from ``short_shots``) around ``short_length``. Each task's median
    scatters with ``task_sigma`` and its sequences around that median with ``seq_sigma``,
    clipped to ``[4, max_length]``.

    Raises:
        ValueError: for ``n_tasks < 1`` or ``long_fraction`` outside ``[0, 1]``.
    """
    if n_tasks < 1:
        raise ValueError(f"n_tasks={n_tasks} is invalid: must be >= 1")
    if not 0.0 <= long_fraction <= 1.0:
        raise ValueError(f"long_fraction={long_fraction} is invalid: must be in [0, 1]")
    rng = np.random.default_rng(seed)
    n_long = min(n_tasks, max(1, round(long_fraction * n_tasks))) if long_fraction > 0 else 0
    is_long = np.zeros(n_tasks, dtype=bool)
    is_long[rng.choice(n_tasks, n_long, replace=False)] = True
    tasks = []
    for t in range(n_tasks):
        long = bool(is_long[t])
        median = long_length if long else short_length
        lengths = _draw_lengths(rng, median, task_sigma, seq_sigma, examples_per_task, max_length)
        if long:
            shots, ways = long_shots[int(rng.integers(len(long_shots)))], None
        else:
            shots = short_shots[int(rng.integers(len(short_shots)))]
            ways = short_ways[int(rng.integers(len(short_ways)))]
        tasks.append(_with_family(rng, f"{'gen' if long else 'cls'}{t:04d}", lengths, shots, ways, n_families))
    return tasks
