"""Bootstrap intervals against hand computations: degenerate cases, the analytic variance of the
stratified bootstrap, and pairing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fmmeta.evaluation.intervals import bootstrap_interval, bootstrap_means, stratified_resamples


def test_one_episode_per_task_has_no_spread() -> None:
    # every resample must take each task's only episode: the interval is the point itself
    i = bootstrap_interval([0.2, 0.9, 0.4], ["a", "b", "c"])
    assert (i.estimate, i.low, i.high, i.n) == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5), 3)
    assert i.excludes_zero and i.half_width == pytest.approx(0.0)


def test_two_coin_episodes_give_the_binomial_interval() -> None:
    # resample means of {0, 1} with n=2: 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    means = bootstrap_means([0.0, 1.0], ["t", "t"], n_boot=40_000, seed=1)
    freq = {v: float(np.mean(means == v)) for v in (0.0, 0.5, 1.0)}
    assert freq == pytest.approx({0.0: 0.25, 0.5: 0.5, 1.0: 0.25}, abs=0.01)
    i = bootstrap_interval([0.0, 1.0], ["t", "t"])
    assert (i.low, i.high) == (0.0, 1.0) and not i.excludes_zero


def test_spread_matches_the_stratified_formula_not_the_pooled_one() -> None:
    # Var(mean*) = sum_s (n_s / N)^2 * sigma_s^2 / n_s, sigma_s^2 the plug-in variance of stratum s
    rng = np.random.default_rng(0)
    a = rng.binomial(1, 0.2, size=40).astype(float)  # an easy and a hard task: very different means
    b = rng.binomial(1, 0.9, size=60).astype(float)
    values = np.concatenate([a, b])
    strata = ["a"] * 40 + ["b"] * 60
    n = values.size
    by_hand = math.sqrt(sum((x.size / n) ** 2 * x.var() / x.size for x in (a, b)))
    pooled = math.sqrt(values.var() / n)
    means = bootstrap_means(values, strata, n_boot=40_000, seed=2)
    assert float(means.std()) == pytest.approx(by_hand, rel=0.03)
    assert pooled > 1.2 * by_hand  # the check could tell the two apart
    i = bootstrap_interval(values, strata, n_boot=40_000)
    assert i.estimate == pytest.approx(values.mean())
    assert i.low == pytest.approx(values.mean() - 1.96 * by_hand, abs=0.01)
    assert i.high == pytest.approx(values.mean() + 1.96 * by_hand, abs=0.01)


def test_resamples_stay_within_their_task() -> None:
    strata = ["x", "y", "x", "y", "y"]
    idx = stratified_resamples(strata, 500, np.random.default_rng(0))
    assert idx.shape == (500, 5)
    labels = np.asarray(strata)
    assert (labels[idx] == labels[None, :]).all()
    assert set(np.unique(idx[:, 1])) == {1, 3, 4}


def test_paired_difference_is_narrower_than_its_parts() -> None:
    rng = np.random.default_rng(3)
    difficulty = rng.uniform(0, 1, size=80)  # shared by both methods: cancels in the difference
    a = difficulty + 0.05 + rng.normal(0, 0.02, size=80)
    b = difficulty
    strata = [f"t{i % 4}" for i in range(80)]
    d = bootstrap_interval(a - b, strata)
    assert d.excludes_zero and d.low > 0
    assert not bootstrap_interval(a, strata).low > bootstrap_interval(b, strata).high  # unpaired overlap


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no episodes"):
        bootstrap_interval([], [])
    with pytest.raises(ValueError, match="one task per episode"):
        bootstrap_interval([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="confidence=1.5"):
        bootstrap_interval([1.0], ["a"], confidence=1.5)
