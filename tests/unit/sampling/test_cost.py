"""Cost model: the formula, the slot accounting and the fit on measured times."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fmmeta.sampling.cost import CostModel, slot_features
from fmmeta.sampling.plan import TaskSlot
from fmmeta.sampling.source import TaskObservation
from fmmeta.tasks.episode import Episode

from .conftest import make_example


def test_chunk_cost_pads_to_the_longest_sequence() -> None:
    cm = CostModel(a=10.0, b=2.0, c=0.5)
    # 3 sequences padded to 8: 10 + 2 * 24 + 0.5 * 3 * 64
    assert cm.chunk_cost([8, 3, 5]) == pytest.approx(10 + 48 + 96)
    assert cm.chunk_cost([]) == pytest.approx(10 + 2 + 0.5)  # dummy pass: one token


def test_slot_cost_counts_inner_steps_and_dummy_chunks() -> None:
    ep = Episode("t", tuple(make_example(n) for n in (4, 6, 2)), tuple(make_example(n) for n in (5,)), shots=3)
    slot = TaskSlot(ep, 1.0, ((1, 0), (2,)), ((0,), ()), task_id=0)
    passes, padded, attn, real = slot_features(slot, inner_steps=3)
    assert passes == 3 * 2 + 2
    assert padded == 3 * (2 * 6 + 2) + 5 + 1
    assert attn == 3 * (2 * 36 + 4) + 25 + 1
    assert real == 3 * 12 + 5
    cm = CostModel(a=1.0, b=2.0, c=3.0)
    expected = 3 * (cm.chunk_cost([6, 4]) + cm.chunk_cost([2])) + cm.chunk_cost([5]) + cm.chunk_cost([])
    assert cm.slot_cost(slot, inner_steps=3) == pytest.approx(expected)


def _observations(true: tuple[float, float, float], n: int, seed: int, noise: float = 0.0) -> list[TaskObservation]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        passes = int(rng.integers(2, 20))
        tokens = int(rng.integers(100, 5000))
        attn = float(tokens * rng.integers(16, 512))
        sec = true[0] * passes + true[1] * tokens + true[2] * attn
        sec *= 1.0 + noise * rng.standard_normal()
        out.append(TaskObservation(task_id=i, seconds=sec, n_passes=passes, n_padded_tokens=tokens, attention_tokens=attn))
    return out


def test_fit_recovers_true_coefficients() -> None:
    true = (0.02, 1e-4, 3e-7)
    cm = CostModel(damping=0.0, ridge=1e-6)
    assert cm.fit(_observations(true, 64, seed=0))
    np.testing.assert_allclose(cm.coefficients, true, rtol=1e-3)


def test_fit_is_damped_and_converges() -> None:
    true = (0.02, 1e-4, 3e-7)
    cm = CostModel(damping=0.5, ridge=0.01)
    cm.fit(_observations(true, 32, seed=1))
    first = np.array(cm.coefficients)
    assert not np.allclose(first, true, rtol=0.05)  # one damped step does not jump all the way
    for s in range(2, 30):
        cm.fit(_observations(true, 32, seed=s, noise=0.02))
    np.testing.assert_allclose(cm.coefficients, true, rtol=0.1)


def test_fit_never_goes_negative_and_ignores_unmeasured() -> None:
    cm = CostModel(damping=0.0, ridge=1e-6)
    # Time falls with attention tokens: an unconstrained fit would give c < 0.
    obs = [TaskObservation(task_id=0, seconds=1.0 + 0.001 * k, n_passes=1, n_padded_tokens=100 + k, attention_tokens=1e4 - 50 * k) for k in range(20)]
    assert cm.fit(obs)
    assert min(cm.coefficients) >= 0.0
    before = cm.coefficients
    assert not cm.fit([TaskObservation(task_id=0, seconds=math.nan, n_passes=3)])
    assert cm.coefficients == before


def test_state_dict_round_trips_through_json() -> None:
    cm = CostModel()
    cm.fit(_observations((0.02, 1e-4, 3e-7), 16, seed=3))
    other = CostModel()
    other.load_state_dict(json.loads(json.dumps(cm.state_dict())))
    assert other.coefficients == cm.coefficients and other.n_fits == 1


def test_invalid_coefficients_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"CostModel.b=-1.0"):
        CostModel(b=-1.0)
    with pytest.raises(ValueError, match="damping"):
        CostModel(damping=1.0)
