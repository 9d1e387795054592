"""The one cost model: how long a micro-batch, a task slot and a rank's work take.

A forward+backward pass over a micro-batch of ``n`` sequences padded to length ``L`` costs about

    a + b * (n * L) + c * (n * L**2)

``a`` is the per-pass overhead (kernel launches, ZeRO-3 parameter all-gathers, which do not depend
on the batch), ``b`` the per-token work of the linear layers and ``c`` the attention term. A
packed pass's regressors are ``PackedPass.features``; a dummy pass counts as one token.

The defaults are in *token-equivalents* (``b = 1``): ``a = 64`` says a pass has the fixed overhead
of 64 tokens, ``c = 1/2048`` makes attention match the linear layers at 2048 tokens, about right
for a small Llama with LoRA. :meth:`CostModel.fit` moves the coefficients toward measured step
times (then the unit becomes seconds); only ratios matter to the planner.

The rows-across-ranks placement (:mod:`fmmeta.sampling.rows_plan`) also pays one all-reduce of
the stacked inner gradients per inner step: ``r`` per million floats (:meth:`CostModel.reduce_cost`).
Its price depends on the link and on how long a token takes, so the default, 4 token-equivalents,
is a middle value, not a measurement: gloo between two CPU processes takes 7-15 ms per million
floats (``benchmarks/zero3_step.py``, which prints ``r_measured``: 25-50 next to its hidden-256
model's fp32 passes); a token of SmolLM2-135M takes about 35x that model's FLOPs, which puts ``r``
near 1 there (an estimate from FLOPs, not measured). Set ``sampler.cost_r`` from the benchmark
for your hardware. It is not fitted: the pass times the other coefficients are fitted on do not
contain it.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CostModel:
    """Cost of a pass: ``a + b * padded_tokens + c * sum(padded_len^2)``.

    Attributes:
        a: per-pass overhead (>= 0), in the model's unit (token-equivalents by default).
        b: cost per processed token, padding included (>= 0).
        c: cost per squared sequence length, the attention term (>= 0).
        r: cost of all-reducing a million floats across the ranks (>= 0), in the unit of ``b``
            before any fit (fits rescale it with the other coefficients).
        ridge: pull of the current coefficients on a fit (>= 0; relative to the data, so
            ``0.1`` means a fit needs a clear signal to move a coefficient).
        damping: fraction of the old coefficients kept after a fit, in ``[0, 1)``; damps noise
            in measured times so plans do not jump from step to step.
        n_fits: how many fits updated the model (the first one also rescales the prior to the
            measured unit).
    """

    a: float = 64.0
    b: float = 1.0
    c: float = 1.0 / 2048.0
    r: float = 4.0
    ridge: float = 0.1
    damping: float = 0.5
    n_fits: int = 0

    def __post_init__(self) -> None:
        problems = []
        for key in ("a", "b", "c", "r", "ridge"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                problems.append(f"CostModel.{key}={v!r} is invalid: must be a finite number >= 0")
        if not (0.0 <= self.damping < 1.0):
            problems.append(
                f"CostModel.damping={self.damping!r} is invalid: must be in [0, 1) "
                "(0 = replace coefficients by each fit)"
            )
        if self.a + self.b + self.c <= 0:
            problems.append("CostModel a=b=c=0 is invalid: at least one coefficient must be > 0")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """``(a, b, c)``."""
        return (self.a, self.b, self.c)

    @property
    def dummy_pass_cost(self) -> float:
        """Cost of a dummy pass (one sequence of one token)."""
        return self.a + self.b + self.c

    def reduce_cost(self, n_floats: int) -> float:
        """Cost of one all-reduce of ``n_floats`` floats across the ranks."""
        return self.r * n_floats / 1e6

    def chunk_cost(self, lengths: Sequence[int]) -> float:
        """Cost of one pass over a micro-batch with these sequence lengths (padded to the max)."""
        if not lengths:
            return self.dummy_pass_cost
        n, width = len(lengths), max(lengths)
        return self.a + self.b * n * width + self.c * n * float(width) * width

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Costs of rows ``(passes, padded tokens, sum len^2)``."""
        return np.asarray(features, dtype=np.float64) @ np.array(self.coefficients)

    def fit(self, observations: Sequence[Any]) -> bool:
        """Moves the coefficients toward measured times (non-negative, ridge-regularised, damped).

        Solves ``min ||X theta - y||^2 + ridge * ||S (theta - theta_0)||^2`` subject to
        ``theta >= 0`` (exactly, over the 8 active sets of the 3 coefficients), where ``X`` holds
        each observation's ``features`` and ``y`` its ``seconds``, ``S`` scales the columns so the
        penalty is unit-free, and ``theta_0`` is the current model (rescaled to the measured unit
        on the first fit, so the default shape is the prior). Then blends:
        ``theta = damping * theta_0 + (1 - damping) * theta_fit``.

        Args:
            observations: objects with ``features`` (3 floats) and ``seconds``; those without a
                finite positive time are skipped.

        Returns:
            Whether the coefficients changed.
        """
        rows = [
            (o.features, o.seconds)
            for o in observations
            if math.isfinite(o.seconds) and o.seconds > 0 and any(f > 0 for f in o.features)
        ]
        if not rows:
            return False
        x = np.array([r[0] for r in rows], dtype=np.float64)
        y = np.array([r[1] for r in rows], dtype=np.float64)
        theta0 = np.array(self.coefficients, dtype=np.float64)
        scale = 1.0  # the first fit moves the model into the measurements' unit
        if self.n_fits == 0:
            pred = x @ theta0
            scale = float(y.sum() / pred.sum()) if pred.sum() > 0 else 1.0
            theta0 = theta0 * scale
        col = np.sqrt((x**2).sum(axis=0))
        col[col == 0] = 1.0
        xs = x / col  # unit-norm columns: the problem is in "u = col * theta"
        u0 = theta0 * col
        lam = math.sqrt(self.ridge)
        a_aug = np.vstack([xs, lam * np.eye(3)])
        y_aug = np.concatenate([y, lam * u0])
        u = _nnls_small(a_aug, y_aug)
        theta_fit = u / col
        theta = self.damping * theta0 + (1.0 - self.damping) * theta_fit
        if not np.all(np.isfinite(theta)) or theta.sum() <= 0:
            logger.warning("cost fit gave unusable coefficients %s; keeping %s", theta, self.coefficients)
            return False
        self.r *= scale  # the all-reduce moves to the new unit too
        self.a, self.b, self.c = (float(v) for v in theta)
        self.n_fits += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        """Plain-python state (exact floats survive JSON)."""
        return {"a": self.a, "b": self.b, "c": self.c, "r": self.r, "ridge": self.ridge,
                "damping": self.damping, "n_fits": self.n_fits}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict` output."""
        for key in ("a", "b", "c", "ridge", "damping"):
            setattr(self, key, float(state[key]))
        self.r = float(state.get("r", self.r))  # states saved before the all-reduce term keep the default
        self.n_fits = int(state["n_fits"])


def _nnls_small(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns by trying every active set."""
    n = a.shape[1]
    best, best_res = np.zeros(n), float(y @ y)
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = a[:, cols]
            sol, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(sol < 0):
                continue
            res = y - sub @ sol
            r = float(res @ res)
            if r < best_res - 1e-15 * max(1.0, best_res):
                best = np.zeros(n)
                best[list(cols)] = sol
                best_res = r
    return best
