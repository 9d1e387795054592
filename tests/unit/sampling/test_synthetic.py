"""Synthetic pools for the sampler benchmark: the bimodal pool has the two modes it promises."""

from __future__ import annotations

import numpy as np
import pytest

from fmmeta.sampling.synthetic import bimodal_pool


def test_bimodal_pool_has_many_short_classification_and_few_long_generation_tasks() -> None:
    pool = bimodal_pool(200, seed=3)
    long = [t for t in pool if t.ways is None]
    short = [t for t in pool if t.ways is not None]
    assert len(long) == 25 and len(short) == 175  # round(0.125 * 200)
    long_med = [np.median(t.lengths) for t in long]
    short_med = [np.median(t.lengths) for t in short]
    assert min(long_med) > max(short_med) and np.mean(long_med) > 5 * np.mean(short_med)
    assert all(4 <= n <= 2048 for t in pool for n in t.lengths)
    ep = long[0].sample_episode(np.random.default_rng(0))
    assert len(ep.support) == long[0].shots and ep.ways is None
    # a pure function of its arguments
    assert [t.lengths for t in bimodal_pool(200, seed=3)] == [t.lengths for t in pool]
    assert [t.lengths for t in bimodal_pool(200, seed=4)] != [t.lengths for t in pool]


def test_bimodal_pool_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="long_fraction=1.5"):
        bimodal_pool(10, seed=0, long_fraction=1.5)
    with pytest.raises(ValueError, match="n_tasks=0"):
        bimodal_pool(0, seed=0)
    assert all(t.ways is not None for t in bimodal_pool(10, seed=0, long_fraction=0.0))
