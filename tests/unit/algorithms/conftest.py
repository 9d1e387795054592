"""Fixtures for the meta-algorithm tests (builders live in ``_tiny``)."""

from __future__ import annotations

import random
from typing import Callable

import pytest
import torch

from fmmeta.tasks.episode import Episode

from ._tiny import build_tiny_peft, make_episode


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def tiny_peft() -> torch.nn.Module:
    return build_tiny_peft()


@pytest.fixture
def episodes() -> list[Episode]:
    rng = random.Random(1234)
    return [make_episode(rng, f"task{i}") for i in range(3)]


@pytest.fixture
def peft_factory() -> Callable[[int], torch.nn.Module]:
    return build_tiny_peft
