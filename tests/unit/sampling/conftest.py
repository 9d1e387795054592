"""Fake task sources with hand-chosen sequence lengths."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from fmmeta.tasks.episode import Episode, Example


def make_example(n_tokens: int, label: int | None = None) -> Example:
    """An example of exactly ``n_tokens`` tokens (prompt + one answer token)."""
    return Example(tuple(range(1, n_tokens)), (0,), label)


@dataclass
class FixedSource:
    """Always the same lengths; the rng only permutes them (so episodes still vary)."""

    name: str
    support_lengths: tuple[int, ...]
    query_lengths: tuple[int, ...]
    family: str = "d0"
    shots: int = 1
    ways: int | None = None

    def sample_episode(self, rng: np.random.Generator) -> Episode:
        s = [self.support_lengths[i] for i in rng.permutation(len(self.support_lengths))]
        q = [self.query_lengths[i] for i in rng.permutation(len(self.query_lengths))]
        return Episode(
            task=self.name,
            support=tuple(make_example(n) for n in s),
            query=tuple(make_example(n) for n in q),
            shots=self.shots,
            ways=self.ways,
        )


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
