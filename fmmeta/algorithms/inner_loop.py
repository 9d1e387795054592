"""The one inner loop: adapt adapters on support sets, used by training and by evaluation.

A loop runs over passes (:mod:`fmmeta.algorithms.passes`). The weights it differentiates are
either

* stacked fast weights ``[T, *shape]`` of ``T`` tasks, routed per row by
  :class:`~fmmeta.algorithms.task_lora.TaskLoRA` (training: many tasks per pass), or
* the adapter parameters themselves with one task (evaluation: :func:`adapt` updates them in
  place, the caller snapshots and restores theta).

Each row's answer-loss sum (:mod:`fmmeta.algorithms.answer_loss`) is weighted by its task's scale
(``1 / the task's answer tokens``), so each task's gradient is its own mean loss's gradient
whatever the split into passes or the other tasks sharing them. Its settings are
:class:`~fmmeta.algorithms.config.InnerLoopConfig`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.passes import PackedBatch, Pass, answer_tokens, inverse_tokens, per_token, run_passes
from fmmeta.algorithms.task_lora import TaskLoRA
from fmmeta.config import raise_if_invalid
from fmmeta.engine.optim import clip_grad_norm
from fmmeta.tasks.episode import Batch

__all__ = [
    "Adaptation", "InnerOptimizer", "adapt", "adapt_tasks", "check_step_sizes", "clip_per_task",
    "evaluate_loss", "only_adapting", "restore", "snapshot",
]

# --------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------


def snapshot(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of ``params`` (theta), to restore after a task's adaptation."""
    return [p.detach().clone() for p in params]


def restore(params: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    """Copies ``saved`` back into ``params`` in place (bit-exact)."""
    if len(params) != len(saved):
        raise ValueError(
            f"restore() got {len(saved)} saved tensors for {len(params)} parameters: pass the "
            "list returned by snapshot() of the same parameters"
        )
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)



# --------------------------------------------------------------------------------------------
# Clipping and the update rule
# --------------------------------------------------------------------------------------------


def _at_least_fp32(g: torch.Tensor) -> torch.Tensor:
    return g.detach().to(torch.promote_types(g.dtype, torch.float32))


def clip_per_task(grads: Sequence[torch.Tensor], max_norm: float, *, stacked: bool) -> None:
    """Clips each task's gradient to global L2 norm ``max_norm`` in place (``<= 0``: off).

    Same coefficient as :func:`~fmmeta.engine.optim.clip_grad_norm` (``max_norm / (norm +
    1e-6)``, capped at 1), computed per task over the leading dimension of stacked gradients.
    """
    if max_norm <= 0 or not grads:
        return
    if not stacked:
        clip_grad_norm(grads, max_norm)
        return
    sq = cast(torch.Tensor, sum(_at_least_fp32(g).flatten(1).pow(2).sum(dim=1) for g in grads))
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))


def check_step_sizes(step_sizes: Sequence[float], n_params: int) -> list[float]:
    """Per-tensor step sizes as floats, refused unless there is one finite, positive lr per tensor."""
    values = [float(lr) for lr in step_sizes]
    if len(values) != n_params:
        raise ValueError(
            f"got {len(values)} step sizes for {n_params} adapter tensors: pass one step size per "
            "adapter tensor, in the order of the adapter parameters (e.g. load_step_sizes(folder))"
        )
    bad = [(i, lr) for i, lr in enumerate(values) if not (math.isfinite(lr) and lr > 0)]
    if bad:
        raise ValueError(f"step sizes must be finite and > 0; got (index, lr) {bad[:5]}")
    return values


class InnerOptimizer:
    """The inner update rule (SGD or Adam) on plain tensors, updated in place under ``no_grad``.

    Every operation is elementwise, so the same rule serves stacked ``[T, ...]`` fast weights (each
    task its own moments) and single adapters. Adam keeps its moments here, fresh per task; create
    one per adaptation or pass the same one to successive calls to continue a trajectory.

    Args:
        cfg: the inner-loop settings.
        params: the tensors it will update (shapes for Adam's moments).
        step_sizes: one step size per tensor of ``params`` (Meta-SGD's learned step sizes, see
            :mod:`fmmeta.algorithms.meta_sgd`); ``None`` uses ``cfg.inner_lr`` for every tensor.
            Both rules are linear in the step size, which is what makes the first-order gradient
            of the query loss with respect to it exact (see that module).
        task_lrs: one step size per task of stacked ``[T, ...]`` params instead (several lrs
            of a grid tried side by side in one pass); not together with ``step_sizes``.
    """

    def __init__(self, cfg: InnerLoopConfig, params: Sequence[torch.Tensor],
                 step_sizes: Sequence[float] | None = None, task_lrs: Sequence[float] | None = None) -> None:
        raise_if_invalid(cfg)  # every adaptation builds one: the check no caller can skip
        if step_sizes is not None and task_lrs is not None:
            raise ValueError("pass step_sizes (per tensor) or task_lrs (per task), not both")
        self.cfg = cfg
        self.step_sizes = check_step_sizes(step_sizes, len(params)) if step_sizes is not None else [cfg.inner_lr] * len(params)
        self._task_lrs: torch.Tensor | None = None
        if task_lrs is not None:
            check_step_sizes(task_lrs, len(task_lrs))
            if any(p.shape[0] != len(task_lrs) for p in params):
                raise ValueError(f"task_lrs has {len(task_lrs)} lrs; the stacked params have "
                                 f"{sorted({p.shape[0] for p in params})} tasks")
            self._task_lrs = torch.tensor(list(task_lrs), dtype=torch.float32)
            self.step_sizes = [1.0] * len(params)
        self.t = 0
        self._m: list[torch.Tensor] | None = None
        self._v: list[torch.Tensor] | None = None
        if cfg.inner_optimizer == "adam":
            self._m = [torch.zeros_like(p) for p in params]
            self._v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
        """Applies one update ``params[i] <- params[i] - step_sizes[i] * direction(grads[i])`` (each
        task's slice times its own lr with ``task_lrs``)."""
        self.t += 1
        if self._m is None or self._v is None:
            for p, g, lr in zip(params, grads, self.step_sizes, strict=True):
                p.add_(self._per_task(g.to(p.dtype)), alpha=-lr)
            return
        b1, b2 = self.cfg.adam_betas
        c1 = 1.0 - b1**self.t
        c2 = 1.0 - b2**self.t
        for p, g, m, v, lr in zip(params, grads, self._m, self._v, self.step_sizes, strict=True):
            g = g.to(m.dtype)
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            denom = (v / c2).sqrt_().add_(self.cfg.adam_eps)
            p.addcdiv_(self._per_task(m), denom, value=-lr / c1)

    def _per_task(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` with each task's slice scaled by its lr (as it is without ``task_lrs``)."""
        if self._task_lrs is None:
            return t
        return t * self._task_lrs.to(t.device).view(-1, *[1] * (t.dim() - 1))


@contextlib.contextmanager
def only_adapting(weights: Sequence[torch.Tensor], adapted: Sequence[int] | None) -> Iterator[list[torch.Tensor]]:
    """The weights an inner loop adapts: all of ``weights``, or those at the indices ``adapted``
    (ANIL adapts only its top layers' adapter tensors).

    Inside the block the other weights stop requiring grad, so a pass records no graph below the
    lowest adapted tensor and its backward stops there: that is where an inner step of fewer
    layers saves time and activation memory. They require grad again afterwards (a query pass
    differentiates every tensor). With ``adapted=None`` it hands back every weight, untouched.
    """
    if adapted is None:
        yield list(weights)
        return
    keep = sorted(set(adapted))
    if not keep or keep[0] < 0 or keep[-1] >= len(weights):
        raise ValueError(f"adapted={list(adapted)} is invalid: give one or more indices into the "
                         f"{len(weights)} adapter tensors")
    frozen = [w for i, w in enumerate(weights) if i not in set(keep) and w.requires_grad]
    for w in frozen:
        w.requires_grad_(False)
    try:
        yield [weights[i] for i in keep]
    finally:
        for w in frozen:
            w.requires_grad_(True)


@dataclass
class Adaptation:
    """What an inner loop did.

    Attributes:
        losses: per step, ``[T]`` support loss per answer token before that step's update
            (``nan`` for a task without support tokens).
        seconds: per step, the wall seconds of each support pass.
    """

    losses: list[torch.Tensor]
    seconds: list[list[float]]


def adapt_tasks(
    model: nn.Module,
    weights: Sequence[torch.Tensor],
    support: Sequence[Pass],
    n_answer: torch.Tensor,
    cfg: InnerLoopConfig,
    *,
    lora: TaskLoRA | None = None,
    steps: int | None = None,
    optimizer: InnerOptimizer | None = None,
    step_sizes: Sequence[float] | None = None,
    reduce: Callable[[Sequence[torch.Tensor]], None] | None = None,
) -> Adaptation:
    """Adapts every task's weights in place on its support rows: theta -> phi. The one inner loop.

    Each step runs every support pass, giving each task the gradient of its own ``sum answer
    loss / its support answer tokens``, clips each task's gradient to ``cfg.inner_clip_norm``
    and applies one inner-optimizer update to all tasks at once. A task without support tokens
    gets a zero gradient and keeps its weights (SGD and Adam both leave it unchanged).

    Args:
        model: the causal LM.
        weights: stacked ``[T, ...]`` fast weights (with ``lora`` active) or the adapter itself.
        support: the support passes; ``None`` entries are dummy passes.
        n_answer: ``[T]`` support answer tokens of each task.
        cfg: inner-loop settings.
        lora: the active :class:`TaskLoRA` for stacked weights; ``None`` for a single adapter.
        steps: number of inner steps (default ``cfg.inner_steps``).
        optimizer: continue with this inner optimizer's state (default: a fresh one).
        step_sizes: one step size per weight tensor for a fresh optimizer (default ``cfg.inner_lr`` for
            all); an ``optimizer`` passed in brings its own.
        reduce: makes each step's partial gradients and loss sums whole, in place, before
            clipping and the update. With rows dealt across ranks it sums them over the ranks, so
            every rank clips by the whole task's norm and applies the same update (``n_answer``
            must then count the whole tasks' tokens; every rank calls it once per step); when
            evaluation's lr choice adapts one episode at several lrs, it copies the one gradient
            computed for the episode to each of its copies.
    """
    n_steps = cfg.inner_steps if steps is None else steps
    if n_steps < 0:
        raise ValueError(f"adapt(steps={n_steps}) is invalid: steps must be >= 0")
    if optimizer is not None and step_sizes is not None:
        raise ValueError("pass step_sizes or optimizer, not both: an InnerOptimizer carries its own")
    opt = optimizer if optimizer is not None else InnerOptimizer(cfg, weights, step_sizes)
    n = n_answer.to(torch.float64)
    scale = inverse_tokens(n)
    out = Adaptation([], [])
    for _ in range(n_steps):
        res = run_passes(model, weights, support, scale, lora=lora)
        if reduce is not None:
            assert res.grads is not None
            reduce([*res.grads, res.task_sums])
        out.losses.append(per_token(res.task_sums, n))
        out.seconds.append(res.seconds)
        if not bool((n > 0).any()):
            continue  # dummy passes only: they ran for lockstep, weights untouched
        assert res.grads is not None
        clip_per_task(res.grads, cfg.inner_clip_norm or 0.0, stacked=lora is not None)
        opt.step(weights, res.grads)
        del res  # free this step's gradient before the next step allocates its own
    return out


def adapt(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    support_batches: Sequence[Batch | None],
    cfg: InnerLoopConfig,
    *,
    steps: int | None = None,
    optimizer: InnerOptimizer | None = None,
    step_sizes: Sequence[float] | None = None,
) -> list[float]:
    """Adapts one task's adapter ``params`` in place on its support set (evaluation's entry point).

    :func:`adapt_tasks` with one task and the model's own LoRA forward. The caller owns theta:
    take a :func:`snapshot` before and :func:`restore` after. ``step_sizes`` gives every adapter tensor
    its own step size (Meta-SGD's learned ones: ``load_step_sizes(adapter_folder)``); ``None`` uses
    ``cfg.inner_lr`` for all.

    Returns:
        The support loss per answer token before each step's update (``nan`` for a dummy set).

    Example:
        >>> theta = snapshot(params)
        >>> losses = adapt(model, params, support, InnerLoopConfig(inner_steps=3, inner_lr=0.03))
        >>> ...  # evaluate phi on the query set
        >>> restore(params, theta)
    """
    passes = [None if b is None else PackedBatch.one_task(b) for b in support_batches]
    n_answer = torch.tensor([float(answer_tokens(support_batches))], dtype=torch.float64)
    result = adapt_tasks(model, params, passes, n_answer, cfg, steps=steps, optimizer=optimizer, step_sizes=step_sizes)
    return [float(x[0]) for x in result.losses]


@torch.no_grad()
def evaluate_loss(model: nn.Module, params: Sequence[torch.Tensor], batches: Sequence[Batch | None]) -> float:
    """Mean loss per answer token over ``batches`` (forward only; ``nan`` if all are dummies).

    ``params`` only tells the device; dummies still run a forward so ranks stay in lockstep.
    """
    passes = [None if b is None else PackedBatch.one_task(b) for b in batches]
    res = run_passes(model, params, passes, torch.ones(1), grad=False)
    n = answer_tokens(batches)
    return float(res.task_sums[0]) / n if n else math.nan
