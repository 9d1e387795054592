"""Replicated intervals: the t quantile against tables, the stratified mean squares against their
expectations, coverage on synthetic crossed designs (against the episode-only bootstrap), the
planning figures, and the R = 1 path that must stay the bootstrap.

``pytest tests/unit/evaluation/test_replicated.py -s -k coverage`` prints the measured coverages.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fmmeta.evaluation.intervals import Interval, bootstrap_interval
from fmmeta.evaluation.replicated import Replicated, _mean_squares, replicated_interval, t_quantile

# A run like the real ones: retraining moves a paired difference by ~0.06 (sa = 0.04, two reruns
# differ by sa * sqrt(2) = 0.057), while one run's episode interval is about +-0.045.
TASKS, PER_TASK = 20, 3
SA, SB, SC = 0.04, 0.15, 0.09
RUNS = 8000  # simulated runs per coverage: its standard error is 0.0024 at 95%


def _simulate(
    runs: int, replicates: int, sa: float, sb: float, sc: float, seed: int
) -> tuple[np.ndarray, list[str], float]:
    """``runs`` crossed designs ``[R, N]``: fixed task effects, random replicate, episode and cell effects."""
    rng = np.random.default_rng(seed)
    strata = [f"task{t}" for t in range(TASKS) for _ in range(PER_TASK)]
    task_effect = np.repeat(rng.uniform(-0.1, 0.2, size=TASKS), PER_TASK)  # fixed: same in every run
    n = task_effect.size
    y = (
        task_effect
        + rng.normal(0, sa, size=(runs, replicates, 1))
        + rng.normal(0, sb, size=(runs, 1, n))
        + rng.normal(0, sc, size=(runs, replicates, n))
    )
    return y, strata, float(task_effect.mean())


def _covers(i: Interval, truth: float) -> bool:
    return i.low <= truth <= i.high


def _replicated_coverage(runs: int, replicates: int, sa: float, sb: float, sc: float, seed: int) -> float:
    y, strata, truth = _simulate(runs, replicates, sa, sb, sc, seed)
    return float(np.mean([_covers(replicated_interval(v, strata).interval, truth) for v in y]))


# --- the t quantile ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [(0.975, 2, 4.3027), (0.975, 10, 2.2281), (0.8, 2, 1.0607), (0.995, 1, 63.6567), (0.95, 30, 1.6973),
     (0.9, 5, 1.4759), (0.975, 120, 1.9799), (0.975, 1e6, 1.9600)],
)
def test_t_quantile_matches_the_tables(p: float, df: float, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, abs=5e-5)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=5e-5)


def test_t_quantile_closed_forms_and_fractional_df() -> None:
    for p in (0.6, 0.8, 0.975, 0.9999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert t_quantile(0.5, 7.3) == 0.0
    # Satterthwaite df are fractional: strictly between the neighbouring integers' quantiles
    assert t_quantile(0.975, 3) > t_quantile(0.975, 3.5) > t_quantile(0.975, 4)
    for bad_p, bad_df in ((0.0, 3.0), (1.0, 3.0), (0.9, 0.0), (0.9, -1.0)):
        with pytest.raises(ValueError, match="invalid"):
            t_quantile(bad_p, bad_df)


# --- the mean squares -------------------------------------------------------------------------


def test_stratified_mean_squares_have_their_expectations() -> None:
    # unequal tasks, fixed task effects, and a replicate-by-task interaction d (a seed that is
    # good on one task, bad on another): E MS_E = sc2 + R sb2 and E MS_I = sc2 must ignore d,
    # E MS_R = sc2 + N (sa2 + sd2 * sum_s w_s^2) must count it (it shrinks with replicates only)
    rng = np.random.default_rng(11)
    sizes = [2, 3, 5, 4, 6]
    strata = [f"t{s}" for s, k in enumerate(sizes) for _ in range(k)]
    task = np.repeat(np.arange(len(sizes)), sizes)
    r, n, runs = 4, len(strata), 20_000
    sa, sb, sc, sd = 0.3, 0.5, 0.4, 0.6
    y = (
        np.repeat(rng.normal(0, 2, size=len(sizes)), sizes)
        + rng.normal(0, sa, size=(runs, r, 1))
        + rng.normal(0, sb, size=(runs, 1, n))
        + rng.normal(0, sc, size=(runs, r, n))
        + rng.normal(0, sd, size=(runs, r, len(sizes)))[..., task]
    )
    ms_r, ms_e, ms_i = _mean_squares(y, strata)
    weights = np.asarray(sizes) / n
    assert ms_r.mean() == pytest.approx(sc**2 + n * (sa**2 + sd**2 * (weights**2).sum()), rel=0.03)
    assert ms_e.mean() == pytest.approx(sc**2 + r * sb**2, rel=0.03)
    assert ms_i.mean() == pytest.approx(sc**2, rel=0.01)
    # the unstratified residual y - m_r - ebar_e + m would have absorbed d: the check tells them apart
    pooled = y - y.mean(-1, keepdims=True) - y.mean(-2, keepdims=True) + y.mean((-2, -1), keepdims=True)
    assert ((pooled**2).sum((-2, -1)) / ((r - 1) * (n - 1))).mean() > 1.5 * sc**2
    # and the variance of the grand mean is what the interval estimates
    total_var = sa**2 / r + sd**2 * (weights**2).sum() / r + sb**2 / n + sc**2 / (r * n)
    assert y.mean((-2, -1)).var() == pytest.approx(total_var, rel=0.04)
    assert ((ms_r + ms_e - ms_i) / (r * n)).mean() == pytest.approx(total_var, rel=0.03)


def test_components_are_recovered_on_a_large_design() -> None:
    rng = np.random.default_rng(5)
    r, tasks, per = 40, 100, 4
    sa, sb, sc = 0.05, 0.15, 0.09
    strata = [f"t{t}" for t in range(tasks) for _ in range(per)]
    y = (
        np.repeat(rng.uniform(0, 1, size=tasks), per)
        + rng.normal(0, sa, size=(r, 1))
        + rng.normal(0, sb, size=(1, tasks * per))
        + rng.normal(0, sc, size=(r, tasks * per))
    )
    got = replicated_interval(y, strata)
    assert (got.replicates, got.episodes, got.interval.n) == (40, 400, 400)
    # relative standard errors: sa2 ~ sqrt(2/39) = 23%, sb2 ~ 9%, sc2 ~ 1.3%
    assert got.between_replicates == pytest.approx(sa**2, rel=0.5)
    assert got.between_episodes == pytest.approx(sb**2, rel=0.25)
    assert got.residual == pytest.approx(sc**2, rel=0.05)
    # training and episodes weigh alike in V here: Satterthwaite's df lies between theirs and their sum
    assert r - 1 < got.df < (r - 1) + (tasks * per - tasks)
    assert got.standard_error() == pytest.approx(got.interval.half_width / t_quantile(0.975, got.df))


# --- coverage ---------------------------------------------------------------------------------


def test_coverage_counts_training_variance_where_the_episode_bootstrap_does_not() -> None:
    # 3 replicates, 20 tasks x 3 episodes: training variance (sa2 = 0.0016) about 3x one run's
    # episode variance ((sb2 + sc2) / N = 0.0005)
    replicated = _replicated_coverage(RUNS, 3, SA, SB, SC, seed=0)
    # the old interval: today's stratified bootstrap of one run (replicate 0's row), which holds
    # the adapter fixed; fewer runs and resamples, as it is far from 95% and slow
    old, old_without_training = (
        float(np.mean([_covers(bootstrap_interval(v[0], strata, n_boot=500, seed=k), truth) for k, v in enumerate(y)]))
        for y, strata, truth in (_simulate(300, 1, sa, SB, SC, seed=1) for sa in (SA, 0.0))
    )
    print(f"\ncoverage of 95% intervals, R=3, sa={SA} sb={SB} sc={SC}: replicated {replicated:.3f}, "
          f"episode-only bootstrap of one run {old:.3f} (with sa=0: {old_without_training:.3f})")
    assert 0.93 <= replicated <= 0.97
    assert old < 0.85
    # the bootstrap falls short a little by itself (3 episodes per task: its within-task variance is
    # the plug-in one, 2/3 of the unbiased); training variance is what takes it far below
    assert old_without_training > old + 0.15


@pytest.mark.parametrize(
    ("label", "replicates", "sa", "sb", "sc"),
    [
        ("no training variance (df near N-S)", 3, 0.0, SB, SC),
        ("no episode variance (df near R-1)", 3, SA, 0.0, SC),
        ("five replicates", 5, SA, SB, SC),
    ],
)
def test_coverage_near_nominal(label: str, replicates: int, sa: float, sb: float, sc: float) -> None:
    coverage = _replicated_coverage(RUNS, replicates, sa, sb, sc, seed=2)
    print(f"\ncoverage of 95% intervals, {label}, R={replicates}, sa={sa} sb={sb} sc={sc}: {coverage:.3f}")
    assert 0.93 <= coverage <= 0.97


# --- the floor and the degenerate designs -----------------------------------------------------


def test_no_training_signal_leaves_the_episode_mean_square_alone() -> None:
    # every replicate has the same mean: MS_R = 0 < MS_I, so sa2 = 0 and V = MS_E / (R N), df = N - S
    rng = np.random.default_rng(3)
    strata = ["a"] * 4 + ["b"] * 5 + ["c"] * 3
    y = rng.normal(size=(3, 12)) + 3 * rng.normal(size=12)  # episode effects: MS_E > MS_I
    y -= y.mean(axis=1, keepdims=True)
    got = replicated_interval(y, strata)
    _, ms_e, _ = _mean_squares(y, strata)
    assert got.between_replicates == 0.0 and got.df == 12 - 3
    half = t_quantile(0.975, 9) * math.sqrt(float(ms_e) / (3 * 12))
    assert got.interval.half_width == pytest.approx(half)


def test_one_episode_per_task_counts_all_of_ms_r_as_training() -> None:
    # N = S: stratification removes all episode variance (as in the bootstrap); the interval is the
    # t interval of the replicate means, R - 1 degrees of freedom
    y = np.array([[0.1, 0.4, 0.2], [0.3, 0.5, 0.1], [0.0, 0.6, 0.3]])
    got = replicated_interval(y, ["a", "b", "c"])
    row_means = y.mean(axis=1)
    assert got.df == 2 and got.between_episodes == 0.0 and got.residual == 0.0
    assert got.interval.estimate == pytest.approx(y.mean())
    assert got.interval.half_width == pytest.approx(t_quantile(0.975, 2) * row_means.std(ddof=1) / math.sqrt(3))


def test_constant_values_give_a_point() -> None:
    got = replicated_interval(np.full((3, 6), 0.25), ["a", "a", "b", "b", "c", "c"])
    assert (got.interval.low, got.interval.high) == (pytest.approx(0.25), pytest.approx(0.25))
    assert got.standard_error() == 0.0


# --- one replicate ----------------------------------------------------------------------------


def test_one_replicate_is_exactly_the_bootstrap() -> None:
    rng = np.random.default_rng(4)
    strata = ["x"] * 5 + ["y"] * 7
    row = rng.normal(0.1, 0.2, size=12)
    for confidence, seed in ((0.95, 0), (0.9, 7)):
        got = replicated_interval([row], strata, confidence=confidence, seed=seed)
        assert got.interval == bootstrap_interval(row, strata, confidence=confidence, seed=seed)
    assert got.between_replicates is None and got.df == math.inf and got.residual == 0.0
    within = (((row[:5] - row[:5].mean()) ** 2).sum() + ((row[5:] - row[5:].mean()) ** 2).sum()) / (12 - 2)
    assert got.between_episodes == pytest.approx(within)
    # unknown training variance counts as 0: the planning figures see the episodes only
    assert got.standard_error() == pytest.approx(math.sqrt(within / 12))
    assert got.resolvable() == pytest.approx((1.959964 + 0.841621) * math.sqrt(within / 12), rel=1e-6)


# --- planning figures -------------------------------------------------------------------------


def _design(sa2: float | None = 0.0016, sb2: float = 0.0225, sc2: float = 0.0081, r: int = 3, n: int = 200,
            df: float = 4.5) -> Replicated:
    return Replicated(Interval(0.0, -0.1, 0.1, n), r, n, sa2, sb2, sc2, df, (2, 1))


def test_standard_error_at_other_designs() -> None:
    d = _design()
    assert d.standard_error() == pytest.approx(math.sqrt(0.0016 / 3 + 0.0225 / 200 + 0.0081 / 600))
    assert d.standard_error(10, 200) == pytest.approx(math.sqrt(0.0016 / 10 + 0.0225 / 200 + 0.0081 / 2000))
    with pytest.raises(ValueError, match="at least 1"):
        d.standard_error(0)


def test_resolvable_is_the_formula() -> None:
    d = _design()
    expected = (t_quantile(0.975, 4.5) + t_quantile(0.8, 4.5)) * d.standard_error()
    assert d.resolvable() == pytest.approx(expected)
    assert d.resolvable(power=0.9, confidence=0.99) == pytest.approx(
        (t_quantile(0.995, 4.5) + t_quantile(0.9, 4.5)) * d.standard_error())
    with pytest.raises(ValueError, match="power"):
        d.resolvable(power=1.0)


def test_replicates_and_episodes_to_resolve_are_the_smallest_designs() -> None:
    target = 0.05 / (1.959964 + 0.841621)  # normal quantiles: SE <= effect / 2.80
    d = _design()
    r = d.replicates_to_resolve()
    assert r is not None and r > 1
    assert d.standard_error(r) <= target < d.standard_error(r - 1)
    low_training = _design(sa2=0.0002)
    n = low_training.episodes_to_resolve()
    assert n is not None and n > 1
    assert low_training.standard_error(episodes=n) <= target < low_training.standard_error(episodes=n - 1)
    # a design that already resolves needs 1
    assert _design(sa2=0.0, sb2=0.0, sc2=1e-6).replicates_to_resolve() == 1
    # unreachable: the episode part alone (sb2 / N) exceeds the target, or the training part (sa2 / R)
    assert _design(sb2=0.07).replicates_to_resolve() is None
    assert d.episodes_to_resolve() is None
    # the limit
    assert d.replicates_to_resolve(limit=r) == r and d.replicates_to_resolve(limit=r - 1) is None
    assert d.replicates_to_resolve(effect=0.1) < r  # type: ignore[operator]


# --- favour and validation --------------------------------------------------------------------


def test_favour_counts_replicate_means_on_each_side() -> None:
    y = [[0.2, 0.0], [-0.1, -0.1], [0.05, 0.0], [0.1, -0.1]]  # means 0.1, -0.1, 0.025, 0.0
    assert replicated_interval(y, ["a", "b"]).favour == (2, 1)


@pytest.mark.parametrize(
    ("values", "strata", "message"),
    [
        ([0.1, 0.2], ["a", "b"], r"\[replicates, episodes\]"),
        (np.zeros((2, 2, 2)), ["a", "b"], r"\[replicates, episodes\]"),
        (np.zeros((0, 3)), ["a", "b", "c"], "at least 1 replicate"),
        (np.zeros((2, 0)), [], "at least 1 replicate"),
        (np.zeros((2, 3)), ["a", "b"], "one task per episode"),
        ([[0.1, float("nan")]], ["a", "b"], "non-finite"),
    ],
)
def test_bad_shapes_raise(values: object, strata: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replicated_interval(values, strata)


def test_bad_confidence_raises() -> None:
    with pytest.raises(ValueError, match=r"confidence=1.5 is invalid"):
        replicated_interval([[0.1, 0.2]], ["a", "b"], confidence=1.5)
