"""Intervals that count training variance: a method trained R times, every replicate on the same episodes.

:func:`~fmmeta.evaluation.intervals.bootstrap_interval` resamples episodes with the trained
adapter held fixed, so it answers "how much would the score move on other episodes of these
tasks", not "how much would it move if the method were trained again". When retraining moves a
score as much as the episodes do, such an interval under-covers badly. Here each method is
trained ``R`` times under different training seeds and every replicate is scored on the very
same episodes: a crossed design ``values[r, e]``. A paired difference (method minus baseline,
same replicate index, same episode) is such a matrix too.

A bootstrap over replicates cannot help with ``R = 3``: resampling three values has 2/3 of the
sample's variance, and a percentile interval has no way to widen for the 2 degrees of freedom
behind it. So for ``R >= 2`` the variance of the grand mean is estimated from a two-way
analysis of variance with crossed random effects,

    ``y[r, e] = mu_task(e) + a_r + b_e + c_re``  (training ``sa2``, episode ``sb2``, residual ``sc2``),

with the task effects fixed (stratified, as in the bootstrap), and the interval is a Student-t
interval with Satterthwaite degrees of freedom. For ``R = 1`` nothing is known about training
variance and the interval is exactly the stratified bootstrap's, so single-run reports do not
change (and still hold the adapter fixed).

The Student-t quantile is computed here (scipy is not a dependency): Newton's method on the t
tail, written with the regularized incomplete beta function, from a Cornish-Fisher start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable, Sequence

import numpy as np

from fmmeta.evaluation.intervals import CONFIDENCE, Interval, bootstrap_interval

_NORMAL = NormalDist()


# --- The Student-t quantile -------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), for ``x < (a+1)/(a+b+2)``."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            delta = c * d
            h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _beta_regularized(a: float, b: float, x: float, y: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function; ``y = 1 - x``, given apart so that
    neither loses digits to the subtraction."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, y) / b


def _t_tail(t: float, df: float) -> float:
    """``P(T > t)`` for ``t >= 0``: half of ``I_{df/(df+t^2)}(df/2, 1/2)``."""
    return 0.5 * _beta_regularized(df / 2.0, 0.5, df / (df + t * t), t * t / (df + t * t))


def _t_density(t: float, df: float) -> float:
    log_norm = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1.0) / 2.0 * math.log1p(t * t / df))


def _cornish_fisher(z: float, df: float) -> float:
    """Abramowitz & Stegun 26.7.5: the t quantile as the normal one plus terms in ``1/df``."""
    z2 = z * z
    g1 = z * (z2 + 1) / 4
    g2 = z * ((5 * z2 + 16) * z2 + 3) / 96
    g3 = z * (((3 * z2 + 19) * z2 + 17) * z2 - 15) / 384
    g4 = z * ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) / 92160
    return z + (g1 + (g2 + (g3 + g4 / df) / df) / df) / df


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` (possibly fractional, or ``inf``) degrees of freedom.

    Satterthwaite's degrees of freedom are fractional, so tables and closed forms do not do.
    Beyond 10^4 degrees of freedom the Cornish-Fisher series alone is exact to double precision;
    below, Newton's method on the tail (convex for ``t > 0``, so the iterates from below rise to the
    root without overshooting) polishes it, inside a bracket that falls back on bisection.

    Args:
        p: the probability, in (0, 1).
        df: degrees of freedom, > 0; ``math.inf`` gives the normal quantile.

    Example:
        >>> round(t_quantile(0.975, 10), 4)
        2.2281
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} is invalid: a quantile's probability must be in (0, 1), e.g. 0.975")
    if not df > 0.0:
        raise ValueError(f"df={df} is invalid: degrees of freedom must be > 0 (math.inf for the normal)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    z = _NORMAL.inv_cdf(p)
    if math.isinf(df):
        return z
    if df > 1e4:
        return _cornish_fisher(z, df)
    tail = 1.0 - p
    lo, hi = 0.0, max(z, 1.0)
    while _t_tail(hi, df) > tail:  # widen until the root is bracketed
        lo, hi = hi, hi * 2.0
    t = min(max(_cornish_fisher(z, df), lo), hi) if df >= 3 else lo
    for _ in range(200):
        excess = _t_tail(t, df) - tail
        if excess > 0:
            lo = t
        else:
            hi = t
        step = excess / _t_density(t, df)
        nxt = t + step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2.0
        if abs(nxt - t) <= 1e-13 * max(1.0, abs(t)) or hi - lo <= 1e-13 * max(1.0, hi):
            return nxt
        t = nxt
    return t


def _planning_multiplier(power: float, confidence: float) -> float:
    """``z_{(1+confidence)/2} + z_power``: 1.96 + 0.84 = 2.80 for 95% and 80% power."""
    _check_probability("power", power, "0.8")
    _check_probability("confidence", confidence, "0.95")
    return _NORMAL.inv_cdf((1 + confidence) / 2) + _NORMAL.inv_cdf(power)


def _check_probability(name: str, value: float, example: str) -> None:
    if not 0 < value < 1:
        raise ValueError(f"{name}={value} is invalid: must be in (0, 1), e.g. {example}")


# --- The variance components ------------------------------------------------------------------


@dataclass(frozen=True)
class Replicated:
    """A mean over replicates and episodes, its interval, and the variance behind it, split by source.

    The three components say what more effort would buy: training variance shrinks only with more
    replicates, episode variance only with more episodes, the residual with either.

    Attributes:
        interval: the grand mean and its interval (``n``: episodes).
        replicates: training replicates ``R``.
        episodes: episodes ``N`` (each scored for every replicate).
        between_replicates: ``sa2``, variance of a replicate's effect on the score (training
            variance); ``None`` with one replicate, where it cannot be known.
        between_episodes: ``sb2``, variance of an episode's effect within its task.
        residual: ``sc2``, the replicate-by-episode interaction (and per-cell noise).
        df: degrees of freedom of the interval's t quantile (``inf`` for one replicate, whose
            interval is the bootstrap's).
        favour: how many replicate means are > 0 and < 0; for a paired difference, the
            replicates favouring the method and the ones favouring the baseline.
    """

    interval: Interval
    replicates: int
    episodes: int
    between_replicates: float | None
    between_episodes: float
    residual: float
    df: float
    favour: tuple[int, int]

    def standard_error(self, replicates: int | None = None, episodes: int | None = None) -> float:
        """The standard error of the grand mean at another design: ``sqrt(sa2/R + sb2/N + sc2/(R N))``.

        The episodes are assumed spread over the same tasks in the same proportions (the episode
        variance is within tasks). With one replicate the training variance is unknown and taken
        as 0, so the figure is a lower bound on what retraining would show.

        Args:
            replicates: ``R``, default this design's.
            episodes: ``N``, default this design's.
        """
        r = self.replicates if replicates is None else replicates
        n = self.episodes if episodes is None else episodes
        if r < 1 or n < 1:
            raise ValueError(f"replicates={r}, episodes={n} is invalid: a design needs at least 1 of each")
        sa2 = self.between_replicates or 0.0
        return math.sqrt(sa2 / r + self.between_episodes / n + self.residual / (r * n))

    def resolvable(self, power: float = 0.8, confidence: float = 0.95) -> float:
        """The smallest true difference this design detects with ``power`` in a two-sided test.

        ``(t_{(1+confidence)/2, df} + t_{power, df}) * SE``: the difference must sit that far from
        0 for its interval to exclude 0 with probability ``power``. It uses this interval's own
        degrees of freedom (normal quantiles for one replicate), so with three replicates and
        mostly training variance it is far larger than ``2.8 * SE``.
        """
        _check_probability("power", power, "0.8")
        _check_probability("confidence", confidence, "0.95")
        multiplier = t_quantile((1 + confidence) / 2, self.df) + t_quantile(power, self.df)
        return multiplier * self.standard_error()

    def replicates_to_resolve(
        self, effect: float = 0.05, power: float = 0.8, confidence: float = 0.95, limit: int = 1000
    ) -> int | None:
        """The fewest replicates, at this design's episodes, whose standard error resolves ``effect``.

        A planning figure, so it uses normal quantiles (``SE <= effect / 2.80`` for 80% power at
        95%), not the t of a design not yet run; the t with few replicates asks for more.

        Returns:
            ``R'`` in ``[1, limit]``, or ``None`` when even ``limit`` replicates cannot (the episode
            variance ``sb2/N`` alone is then too large: more episodes are needed instead).
        """
        target = self._target_variance(effect, power, confidence)
        sa2 = self.between_replicates or 0.0
        room = target - self.between_episodes / self.episodes
        if room <= 0:
            return None
        per_replicate = sa2 + self.residual / self.episodes
        r = max(1, math.ceil(per_replicate / room))
        return self._smallest(lambda k: self.standard_error(k, self.episodes) ** 2 <= target, r, limit)

    def episodes_to_resolve(
        self, effect: float = 0.05, power: float = 0.8, confidence: float = 0.95, limit: int = 100_000
    ) -> int | None:
        """The fewest episodes, at this design's replicates, whose standard error resolves ``effect``.

        Normal quantiles, as in :meth:`replicates_to_resolve`; the episodes are assumed spread
        over the same tasks in the same proportions.

        Returns:
            ``N'`` in ``[1, limit]``, or ``None`` when even ``limit`` episodes cannot (the training
            variance ``sa2/R`` alone is then too large: more replicates are needed instead).
        """
        target = self._target_variance(effect, power, confidence)
        sa2 = self.between_replicates or 0.0
        room = target - sa2 / self.replicates
        if room <= 0:
            return None
        per_episode = self.between_episodes + self.residual / self.replicates
        n = max(1, math.ceil(per_episode / room))
        return self._smallest(lambda k: self.standard_error(self.replicates, k) ** 2 <= target, n, limit)

    @staticmethod
    def _target_variance(effect: float, power: float, confidence: float) -> float:
        if not effect > 0:
            raise ValueError(f"effect={effect} is invalid: the difference to resolve must be > 0, e.g. 0.05")
        return (effect / _planning_multiplier(power, confidence)) ** 2

    @staticmethod
    def _smallest(meets: Callable[[int], bool], guess: int, limit: int) -> int | None:
        """The smallest ``k >= 1`` near ``guess`` that ``meets`` (monotone), or None past ``limit``.

        The closed-form ``guess`` can be off by one in floating point; this settles it exactly.
        """
        if limit < 1:
            raise ValueError(f"limit={limit} is invalid: must be >= 1")
        k = guess
        while k <= limit and not meets(k):
            k += 1
        if k > limit:
            return None
        while k > 1 and meets(k - 1):
            k -= 1
        return k


def _mean_squares(values: np.ndarray, strata: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``MS_R``, ``MS_E``, ``MS_I`` of ``values[..., R, N]`` (any leading batch axes), tasks as fixed strata.

    * ``MS_R = N sum_r (m_r - m)^2 / (R-1)``, expectation ``sc2 + N sa2``. A replicate-by-task
      interaction (a seed good on one task, bad on another) lands here too, which is right: it
      shrinks with replicates only.
    * ``MS_E = R sum_e (ebar_e - ebar_task(e))^2 / (N-S)``, expectation ``sc2 + R sb2``: episodes
      are compared only within their task, the task means being fixed effects.
    * ``MS_I``: the two-way interaction residual within each task's ``R x n_s`` block,
      ``y - ybar_{r,task} - ebar_e + ybar_{.,task}``, with ``(R-1)(N-S)`` degrees of freedom,
      expectation ``sc2``. Centering per task (not ``y - m_r - ebar_e + m``) keeps a
      replicate-by-task interaction out of it.

    ``MS_R`` is ``nan`` for ``R = 1``, ``MS_E`` and ``MS_I`` are ``nan`` when ``N = S``.
    """
    y = np.asarray(values, dtype=np.float64)
    r, n = y.shape[-2:]
    _, task = np.unique(np.asarray(strata), return_inverse=True)
    task = task.reshape(-1)
    counts = np.bincount(task).astype(np.float64)
    onehot = np.zeros((n, counts.size))
    onehot[np.arange(n), task] = 1.0
    replicate_means = y.mean(axis=-1)
    grand = replicate_means.mean(axis=-1)
    episode_means = y.mean(axis=-2)
    task_replicate_means = (y @ onehot) / counts  # [..., R, S]
    task_means = task_replicate_means.mean(axis=-2)  # [..., S]
    with np.errstate(divide="ignore", invalid="ignore"):
        ms_r = n * ((replicate_means - grand[..., None]) ** 2).sum(axis=-1) / (r - 1)
        ms_e = r * ((episode_means - task_means[..., task]) ** 2).sum(axis=-1) / (n - counts.size)
        resid = y - task_replicate_means[..., task] - episode_means[..., None, :] + task_means[..., None, task]
        ms_i = (resid**2).sum(axis=(-2, -1)) / ((r - 1) * (n - counts.size))
    return ms_r, ms_e, ms_i


def _checked(values: object, strata: Sequence[str], confidence: float) -> np.ndarray:
    _check_probability("confidence", confidence, "0.95")
    y = np.asarray(values, dtype=np.float64)
    if y.ndim != 2:
        raise ValueError(
            f"values has shape {y.shape}: pass a [replicates, episodes] matrix, one row per training "
            "replicate (a single run is [scores])"
        )
    r, n = y.shape
    if r < 1 or n < 1:
        raise ValueError(f"values has shape {y.shape}: need at least 1 replicate and 1 episode")
    if len(strata) != n:
        raise ValueError(f"got {n} episodes per replicate but {len(strata)} strata: give one task per episode")
    if not np.isfinite(y).all():
        raise ValueError(f"values has {int((~np.isfinite(y)).sum())} non-finite entries: score every cell")
    return y


def replicated_interval(
    values: object, strata: Sequence[str], *, confidence: float = CONFIDENCE, seed: int = 0
) -> Replicated:
    """The grand mean of ``values[r, e]`` with an interval that counts training variance.

    ``R >= 2``: ``m ± t_{(1+confidence)/2, df} sqrt(V)``, with ``V = sa2/R + sb2/N + sc2/(R N)``
    built from the components of :func:`_mean_squares`, each training and episode component
    floored at 0 (so ``V = (max(MS_R, MS_I) + max(MS_E, MS_I) - MS_I) / (R N)``). The floor keeps
    ``V`` at least ``max(MS_R, MS_E) / (R N)``, whose expectation is already below the true
    variance, and makes :meth:`Replicated.standard_error` at this design equal the interval's.
    ``df`` is Satterthwaite's for the mean squares that remain (``R-1`` when only training and
    residual do, ``N-S`` when only episodes and residual do).

    With one episode per task (``N = S``) the stratification leaves no episode variance (as in
    the bootstrap, whose resamples then all equal the data): the episode component is 0 and the
    residual cannot be told from training, so all of ``MS_R`` counts as training (``V =
    MS_R / (R N)``, ``df = R-1``).

    ``R = 1``: exactly :func:`bootstrap_interval` of the one row (the adapter held fixed, as in
    every single-run report); ``between_replicates`` is None, and the within-task variance of the
    row counts as episode variance (residual 0: with one replicate the two are inseparable, and
    calling it episode variance, which more replicates do not shrink, is the cautious choice).

    Args:
        values: ``[R, N]``: replicate ``r``'s score (or paired difference) on episode ``e``; every
            row must hold the same episodes in the same order.
        strata: the task of each of the ``N`` episodes.
        confidence: coverage of the interval, in (0, 1).
        seed: seeds the bootstrap for ``R = 1`` (unused otherwise: the t interval is exact).

    Example:
        >>> r = replicated_interval([[0.1, 0.3, 0.2, 0.4], [0.0, 0.2, 0.2, 0.3]], ["a", "a", "b", "b"])
        >>> (round(r.interval.estimate, 4), r.replicates, r.episodes, r.favour)
        (0.2125, 2, 4, (2, 0))
    """
    y = _checked(values, strata, confidence)
    r, n = y.shape
    means = y.mean(axis=1)
    favour = (int((means > 0).sum()), int((means < 0).sum()))
    ms_r, ms_e, ms_i = (float(v) for v in _mean_squares(y, strata))
    n_tasks = len(set(strata))
    if r == 1:
        episode_var = ms_e if n > n_tasks else 0.0
        boot = bootstrap_interval(y[0], strata, confidence=confidence, seed=seed)
        return Replicated(boot, 1, n, None, episode_var, 0.0, math.inf, favour)
    df_r, df_e = r - 1, n - n_tasks
    if df_e == 0:
        sa2, sb2, sc2 = ms_r / n, 0.0, 0.0
        variance, df = ms_r / (r * n), float(df_r)
    else:
        sa2, sb2, sc2 = max(0.0, (ms_r - ms_i) / n), max(0.0, (ms_e - ms_i) / r), ms_i
        variance = sa2 / r + sb2 / n + sc2 / (r * n)
        # the mean squares V keeps, with their signs: -MS_I only where both components stay
        kept_r, kept_e = float(ms_r >= ms_i), float(ms_e >= ms_i)
        terms = ((kept_r * ms_r, df_r), (kept_e * ms_e, df_e), ((1 - kept_r - kept_e) * ms_i, df_r * df_e))
        denominator = sum(ms * ms / d for ms, d in terms)
        numerator = sum(ms for ms, _ in terms) ** 2
        df = numerator / denominator if denominator > 0 else math.inf
    half = t_quantile((1 + confidence) / 2, df) * math.sqrt(variance)
    m = float(y.mean())
    return Replicated(Interval(m, m - half, m + half, n), r, n, sa2, sb2, sc2, df, favour)
