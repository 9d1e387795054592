"""Meta-SGD over LoRA, first order: FOMAML that also learns one inner step size per adapter tensor.

Inner-loop SGD on LoRA is fragile (on SmolLM2 an lr of 0.3 made every initialisation worse and
0.1 hurt trained ones), and one global lr fits neither LoRA's A and B matrices nor every layer.
Meta-SGD learns the step sizes instead; for LoRA one per adapter tensor (each A and each B of each
targeted module of each layer) is a handful of scalars, kept as log step sizes so they stay > 0.

The first-order gradient. Task ``i`` adapts tensor ``l`` with step size ``a_l`` for ``k`` steps,
each moving it by ``-a_l * d_t,l``, where ``d_t`` is the step's direction: the clipped support
gradient for SGD, ``m_hat / (sqrt(v_hat) + eps)`` for Adam. Both rules are linear in ``a_l``, so

    phi_l - theta_l = -a_l * sum_t d_t,l.

First order, as in FOMAML, means the directions ``d_t`` are held fixed (their dependence on
``a`` through the earlier steps is dropped). Then ``d phi_l / d a_l = (phi_l - theta_l) / a_l``
and, with ``g_q = dL_q / d phi`` the query gradient FOMAML already computes at phi,

    dL_q / d log a_l = a_l * <g_q,l, (phi_l - theta_l) / a_l> = <g_q,l, phi_l - theta_l>.

For ``k = 1`` with SGD the direction is the support gradient at theta, which does not depend on
``a`` at all (nor does its clipping coefficient), so the rule is the exact derivative; for ``k > 1``
it is the derivative along the fixed directions, the same approximation FOMAML makes for theta.

Each task's term is summed on its rank (:meth:`FOMAML.rank_gradient` with ``step_sizes``), the ranks'
sums are added with one all-reduce and divided by the meta-batch's real tasks, like the adapter's
meta-gradient; then the same small Adam step is applied on every rank. The step sizes are not
model parameters, so no engine holds them: every rank keeps an identical copy (:class:`StepSizes`).

The learned step sizes are saved next to the adapter as ``step_sizes.json``
(:func:`save_step_sizes`); :func:`load_step_sizes` reads them back (and the ``inner_lrs.json`` of
adapters saved before) for evaluation's ``adapt(..., step_sizes=...)``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.first_order import FOMAML
from fmmeta.algorithms.inner_loop import check_step_sizes
from fmmeta.algorithms.protocol import RankResult, RankWork
from fmmeta.atomic import replace_text
from fmmeta.engine.protocol import Engine
from fmmeta.sampling.plan import RankPlan

logger = logging.getLogger(__name__)

STEP_SIZES_FILE = "step_sizes.json"
"""Name of the learned step sizes' file inside an adapter folder."""

LEGACY_STEP_SIZES_FILE = "inner_lrs.json"
"""The same file's name in adapters saved before it was renamed (still read)."""

STATE_KEY = "step_sizes"
"""Key of the step sizes' state in a checkpoint's ``state.json``."""


class StepSizes:
    """Log inner step sizes, one per adapter tensor, and the Adam that learns them.

    Replicated on every rank: fed the same all-reduced gradient, every copy makes the same update.
    Built at ``initial`` for every tensor on first use (:meth:`values`), when the adapter's tensor
    count is known, or from a checkpoint (:meth:`load_state_dict`).

    Args:
        initial: the step size every tensor starts from (``algorithm.inner_lr``).
        step_size_lr: Adam's learning rate on the log step sizes (``algorithm.metasgd.step_size_lr``): one
            update moves each step size by at most about this fraction.
        betas: Adam's (beta1, beta2).
        eps: Adam's epsilon.

    Example:
        >>> sizes = StepSizes(initial=0.03, step_size_lr=0.01)
        >>> lrs = sizes.values(n_tensors)  # [0.03, 0.03, ...]
        >>> sizes.step(mean_log_lr_gradient)
    """

    def __init__(self, initial: float, step_size_lr: float, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.initial, self.step_size_lr, self.betas, self.eps = initial, step_size_lr, betas, eps
        self.log_lr: torch.Tensor | None = None
        self._m: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.t = 0

    def _build(self, n: int) -> None:
        self.log_lr = torch.full((n,), math.log(self.initial), dtype=torch.float32)
        self._m = torch.zeros(n, dtype=torch.float32)
        self._v = torch.zeros(n, dtype=torch.float32)
        self.t = 0

    def values(self, n: int) -> list[float]:
        """The current step sizes of ``n`` adapter tensors (builds them at ``initial`` first)."""
        if self.log_lr is None:
            self._build(n)
        assert self.log_lr is not None
        if self.log_lr.numel() != n:
            raise ValueError(
                f"the learned step sizes are for {self.log_lr.numel()} adapter tensors, the adapter "
                f"has {n}: a checkpoint of another LoRA shape? resume with the same lora settings"
            )
        return [float(x) for x in self.log_lr.exp()]

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        """One Adam step on the log step sizes with ``grad`` (the mean over the meta-batch's tasks)."""
        if self.log_lr is None or self._m is None or self._v is None:
            raise RuntimeError("StepSizes.step() before values(): the step sizes were never used")
        grad = grad.to(torch.float32).cpu()
        b1, b2 = self.betas
        self.t += 1
        self._m.mul_(b1).add_(grad, alpha=1.0 - b1)
        self._v.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
        denom = (self._v / (1.0 - b2**self.t)).sqrt_().add_(self.eps)
        self.log_lr.addcdiv_(self._m, denom, value=-self.step_size_lr / (1.0 - b1**self.t))

    def stats(self) -> dict[str, float]:
        """Mean, min and max step size (for the step record); empty before first use."""
        if self.log_lr is None:
            return {}
        lrs = self.log_lr.exp()
        return {"inner_lr_mean": float(lrs.mean()), "inner_lr_min": float(lrs.min()),
                "inner_lr_max": float(lrs.max())}

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state; fp32 values round-trip exactly through JSON's doubles."""
        def values(x: torch.Tensor | None) -> list[float]:
            return [] if x is None else x.tolist()

        return {"log_lr": values(self.log_lr), "adam_m": values(self._m), "adam_v": values(self._v),
                "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned (bitwise)."""
        try:
            log_lr, m, v, t = state["log_lr"], state["adam_m"], state["adam_v"], int(state["t"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"step-size state {str(state)[:200]} is invalid ({err!r}): expected the keys "
                "log_lr, adam_m, adam_v and t, as written by StepSizes.state_dict()"
            ) from err
        if not len(log_lr) == len(m) == len(v):
            raise ValueError(f"step-size state has {len(log_lr)} log lrs, {len(m)} and {len(v)} moments")
        if not log_lr:
            self.log_lr = self._m = self._v = None
            self.t = 0
            return
        self.log_lr = torch.tensor(log_lr, dtype=torch.float32)
        self._m = torch.tensor(m, dtype=torch.float32)
        self._v = torch.tensor(v, dtype=torch.float32)
        self.t = t


class MetaSGD:
    """First-order MAML that also learns per-adapter-tensor inner step sizes (see module docstring).

    The adapter's meta-gradient is FOMAML's; the step sizes are updated by :meth:`outer_update`,
    which ``meta_step`` calls after the engine's outer step.

    Args:
        fomaml: the FOMAML that runs the inner loops and query passes (with this object's lrs).
        cfg: the algorithm settings (``inner_lr`` is the initial step size, ``metasgd.step_size_lr`` the
            step sizes' Adam lr).

    Example:
        >>> algo = build_algorithm("metasgd", AlgorithmConfig(inner_lr=0.03), pad_id=0)
        >>> stats = meta_step(engine, algo, plan)  # stats.outer["inner_lr_mean"], ...
        >>> algo.save_with_adapter(folder, adapter_names)  # step_sizes.json
    """

    support_draws = 1

    def __init__(self, fomaml: FOMAML, cfg: AlgorithmConfig) -> None:
        self.fomaml = fomaml
        self.cfg = cfg
        self.support_repeats = fomaml.support_repeats
        self.step_sizes = StepSizes(cfg.inner_lr, cfg.metasgd.step_size_lr)

    def prepare(self, plan: RankPlan) -> RankWork:
        """Collates a rank's plan (FOMAML's passes)."""
        return self.fomaml.prepare(plan)

    def rank_gradient(self, model: nn.Module, params: Sequence[nn.Parameter], work: RankWork) -> RankResult:
        """FOMAML's meta-gradient at the current step sizes, plus their first-order gradient."""
        return self.fomaml.rank_gradient(model, params, work, step_sizes=self.step_sizes.values(len(params)))

    def state_dict(self) -> dict[str, Any]:
        """The step sizes and their Adam state, under ``step_sizes`` (a checkpoint's
        ``state.json`` has kept them under that key since Meta-SGD landed)."""
        return {STATE_KEY: self.step_sizes.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores the step sizes of a checkpoint's ``state.json`` (bitwise)."""
        if STATE_KEY not in state:
            raise ValueError(
                f"no learned step sizes ({STATE_KEY!r}): not a metasgd checkpoint; use a fresh "
                "output_dir or train.resume=never"
            )
        self.step_sizes.load_state_dict(state[STATE_KEY])

    def save_with_adapter(self, folder: Path, names: Sequence[str]) -> None:
        """The learned step sizes as ``step_sizes.json`` next to the adapter, for evaluation."""
        save_step_sizes(folder, names, self.step_sizes.values(len(names)))

    def outer_update(self, engine: Engine, result: RankResult, n_real_tasks: int, *,
                     skipped: bool) -> dict[str, float]:
        """Sums every rank's step-size gradient, divides by the real tasks and takes one Adam step.

        Every rank calls it and gets the same all-reduced gradient, so every rank's copy takes the
        same step. A meta-step the engine skipped (non-finite meta-gradient) leaves the step
        sizes too; so does a non-finite step-size gradient (seen on every rank alike).
        """
        if result.step_size_grad is None:
            raise ValueError("MetaSGD.outer_update needs a result of MetaSGD.rank_gradient (no step_size_grad)")
        total = engine.all_reduce_sum(result.step_size_grad.to(engine.device)).cpu()
        grad = total / n_real_tasks
        if skipped or not bool(torch.isfinite(grad).all()):
            if not skipped:
                logger.warning("non-finite step-size gradient: the inner step sizes keep their values")
            return {**self.step_sizes.stats(), "step_sizes_skipped": 1.0}
        self.step_sizes.step(grad)
        return {**self.step_sizes.stats(), "step_size_grad_norm": float(grad.norm())}


def save_step_sizes(folder: str | Path, names: Sequence[str], step_sizes: Sequence[float]) -> Path:
    """Writes :data:`STEP_SIZES_FILE` (adapter tensor name -> step size, and the tensors' order)
    into ``folder``.

    Written to a temporary name and renamed, so a crash never leaves a truncated file.
    """
    values = check_step_sizes(step_sizes, len(names))
    if len(set(names)) != len(names):
        raise ValueError("adapter tensor names must be unique to save their step sizes")
    text = json.dumps({"order": list(names), "step_sizes": dict(zip(names, values))}, indent=1)
    return replace_text(Path(folder) / STEP_SIZES_FILE, text)


def load_step_sizes(folder: str | Path, names: Sequence[str] | None = None) -> list[float] | None:
    """The learned step sizes saved with an adapter, in adapter-parameter order, or ``None``.

    Adapters saved before the file was renamed hold :data:`LEGACY_STEP_SIZES_FILE` (key
    ``inner_lrs``); it is read the same way, so old runs evaluate unchanged.

    Args:
        folder: a peft adapter folder (``<run>/<method>/adapter``).
        names: the adapter parameters' names (``named_parameters`` of the trainable tensors) to
            check the file against; ``None`` trusts the file's own order.

    Returns:
        One step size per adapter tensor (pass to ``adapt(..., step_sizes=...)``), or ``None`` when the
        folder has neither file (an adapter of a method with a fixed inner lr).

    Raises:
        ValueError: the file is not valid, or its tensors are not ``names``.
    """
    for file, key in ((STEP_SIZES_FILE, "step_sizes"), (LEGACY_STEP_SIZES_FILE, "inner_lrs")):
        path = Path(folder) / file
        if path.is_file():
            break
    else:
        return None
    try:
        data = json.loads(path.read_text())
        order = [str(n) for n in data["order"]]
        values = check_step_sizes([data[key][n] for n in order], len(order))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path} is not a valid step-size file ({err}): expected {{'order': [names], "
            f"'{key}': {{name: step size > 0}}}}, as written by save_step_sizes; delete it to adapt "
            "with algorithm.inner_lr instead"
        ) from err
    if names is not None and list(names) != order:
        missing = sorted(set(names) - set(order))[:3]
        raise ValueError(
            f"{path} holds step sizes for {len(order)} tensors that do not match the model's "
            f"{len(names)} adapter tensors (missing e.g. {missing}): load the adapter it was "
            "saved with, with the same lora settings"
        )
    return values


__all__ = [
    "LEGACY_STEP_SIZES_FILE", "STATE_KEY", "STEP_SIZES_FILE", "MetaSGD", "StepSizes", "load_step_sizes",
    "save_step_sizes",
]
