"""Cost model: the formula, the pass accounting and the fit on measured times."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.plan import DUMMY_PASS, PackedPass
from fmmeta.sampling.planner import pass_cost
from fmmeta.sampling.source import PassObservation


def test_chunk_cost_pads_to_the_longest_sequence() -> None:
    cm = CostModel(a=10.0, b=2.0, c=0.5)
    # 3 sequences padded to 8: 10 + 2 * 24 + 0.5 * 3 * 64
    assert cm.chunk_cost([8, 3, 5]) == pytest.approx(10 + 48 + 96)
    assert cm.chunk_cost([]) == pytest.approx(10 + 2 + 0.5)  # dummy pass: one token


def test_pass_features_pad_rows_to_the_pass_width() -> None:
    p = PackedPass(slots=(0, 0, 1), examples=(2, 0, 1), width=6, n_tokens=12)
    assert p.features == (1.0, 18.0, 108.0)  # 1 pass, 3 rows x 6, 3 x 6^2
    assert p.n_padded_tokens == 18 and p.n_rows == 3
    cm = CostModel(a=1.0, b=2.0, c=3.0)
    assert pass_cost(p, cm) == pytest.approx(cm.chunk_cost([6, 4, 2]))
    assert DUMMY_PASS.features == (1.0, 1.0, 1.0) and DUMMY_PASS.is_dummy
    assert pass_cost(DUMMY_PASS, cm) == pytest.approx(cm.dummy_pass_cost)


def _observations(true: tuple[float, float, float], n: int, seed: int, noise: float = 0.0) -> list[PassObservation]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        passes = int(rng.integers(2, 20))
        tokens = int(rng.integers(100, 5000))
        attn = float(tokens * rng.integers(16, 512))
        sec = true[0] * passes + true[1] * tokens + true[2] * attn
        sec *= 1.0 + noise * rng.standard_normal()
        out.append(PassObservation(step=0, rank=0, phase="support", index=i,
                                   features=(float(passes), float(tokens), attn), seconds=sec))
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
    obs = [PassObservation(step=0, rank=0, phase="query", index=k, seconds=1.0 + 0.001 * k,
                           features=(1.0, 100.0 + k, 1e4 - 50 * k)) for k in range(20)]
    assert cm.fit(obs)
    assert min(cm.coefficients) >= 0.0
    before = cm.coefficients
    assert not cm.fit([PassObservation(step=0, rank=0, phase="query", index=0, seconds=math.nan,
                                       features=(3.0, 0.0, 0.0))])
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
