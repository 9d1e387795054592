"""The outer optimizer: built in exactly one place so every engine updates theta identically.

Every engine (local, DeepSpeed, accelerate) calls :func:`build_outer_optimizer` and applies the
same clipping rule (:func:`clip_grad_norm`), so a run gives the same adapter weights whatever the
backend. The inner loop has its own tiny optimizer (see ``fmmeta.algorithms.inner_loop``); this
module is only about the meta-parameters' update, applied once per meta-step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR

from fmmeta.config import raise_if_invalid

logger = logging.getLogger(__name__)

_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True, kw_only=True)
class OuterOptimConfig:
    """Outer (meta) optimizer settings: AdamW on the adapter, once per meta-step."""

    outer_lr: float = 1e-3
    """Peak learning rate of the outer AdamW (> 0; typical 1e-4 .. 3e-3 for LoRA)."""
    weight_decay: float = 0.0
    """Decoupled AdamW weight decay (>= 0; 0 keeps LoRA's zero init meaningful)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2), each in [0, 1)."""
    eps: float = 1e-8
    """AdamW denominator epsilon (> 0)."""
    grad_clip: float = 1.0
    """Clip the averaged meta-gradient to this global L2 norm (>= 0); 0 turns clipping off."""
    warmup_steps: int = 0
    """Meta-steps of linear warm-up (>= 0); step s < warmup uses lr * (s + 1) / warmup."""
    schedule: str = "constant"
    """"constant" or "cosine" (cosine decays to 0 at total_steps)."""
    total_steps: int | None = None
    """Meta-steps the cosine schedule spans (> warmup_steps); required for "cosine" only."""

    def validate(self) -> list[str]:
        """Range and choice checks, one problem per field."""
        problems: list[str] = []
        if not self.outer_lr > 0:
            problems.append(f"outer_lr={self.outer_lr} is invalid: must be > 0 (e.g. 1e-3)")
        if self.weight_decay < 0:
            problems.append(f"weight_decay={self.weight_decay} is invalid: must be >= 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            problems.append(f"betas={self.betas} is invalid: need two values in [0, 1), e.g. (0.9, 0.999)")
        if not self.eps > 0:
            problems.append(f"eps={self.eps} is invalid: must be > 0 (e.g. 1e-8)")
        if self.grad_clip < 0:
            problems.append(f"grad_clip={self.grad_clip} is invalid: must be >= 0 (0 turns clipping off)")
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps={self.warmup_steps} is invalid: must be >= 0")
        if self.schedule not in _SCHEDULES:
            problems.append(f"schedule={self.schedule!r} is invalid: allowed {list(_SCHEDULES)}")
        if self.schedule == "cosine" and (
            self.total_steps is None or self.total_steps <= self.warmup_steps
        ):
            problems.append(
                f"total_steps={self.total_steps} is invalid for schedule='cosine': set it to the run's "
                f"meta-steps, greater than warmup_steps={self.warmup_steps}"
            )
        return problems


OPTIMIZER_FILE = "outer_optimizer_rank{rank}.pt"
"""Each rank's outer-optimizer state file inside a checkpoint folder (every engine uses it)."""


def optimizer_file(directory: str | Path, rank: int) -> Path:
    """Where ``rank`` writes its outer-optimizer state inside ``directory``."""
    return Path(directory) / OPTIMIZER_FILE.format(rank=rank)


def read_optimizer_state(directory: str | Path, rank: int, device: torch.device | str) -> dict:
    """Loads ``rank``'s outer-optimizer state (tensors only: ``weights_only=True``).

    Raises:
        FileNotFoundError: naming the missing file and what to pass instead.
    """
    file = optimizer_file(directory, rank)
    if not file.is_file():
        raise FileNotFoundError(
            f"load_optimizer: {file} does not exist; pass the directory save_optimizer() wrote"
        )
    return torch.load(file, map_location=device, weights_only=True)


def outer_lr_lambda(cfg: OuterOptimConfig) -> Callable[[int], float]:
    """The LR multiplier as a function of the number of outer steps already taken.

    A plain function (not a callable object) so ``LambdaLR.state_dict()`` holds no Python objects
    and loads with ``torch.load(weights_only=True)``. Warm-up starts at ``1/warmup`` rather than 0,
    so no meta-step is wasted at lr 0.
    """
    warmup = cfg.warmup_steps
    schedule = cfg.schedule
    # Only "cosine" reads total; OuterOptimConfig guarantees it is set there.
    total = cfg.total_steps if cfg.total_steps is not None else warmup + 1

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_outer_optimizer(
    params: Iterable[torch.Tensor], cfg: OuterOptimConfig
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """Builds the outer AdamW and its LR schedule: the one place that does.

    Args:
        params: the adapter parameters (the meta-parameters theta).
        cfg: outer optimizer settings.

    Returns:
        ``(optimizer, scheduler)``; call ``scheduler.step()`` once after each ``optimizer.step()``.

    Example:
        >>> opt, sched = build_outer_optimizer(engine.adapter_parameters(), OuterOptimConfig(outer_lr=3e-3))
    """
    raise_if_invalid(cfg)
    params = list(params)
    if not params:
        raise ValueError(
            "build_outer_optimizer() got no parameters: the model has no trainable adapter tensors; "
            "wrap it with peft.get_peft_model before building the engine"
        )
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.outer_lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        foreach=False,
    )
    scheduler = LambdaLR(optimizer, outer_lr_lambda(cfg))
    return optimizer, scheduler


def check_outer_step(grad_sum: Sequence[torch.Tensor], params: Sequence[torch.Tensor], n_real_tasks: int) -> None:
    """Refuses what every engine's ``outer_step`` would otherwise misuse silently: no real tasks,
    or gradients that are not one per adapter tensor, in ``adapter_parameters()`` order."""
    if n_real_tasks < 1:
        raise ValueError(f"outer_step(n_real_tasks={n_real_tasks}) is invalid: must be >= 1")
    if len(grad_sum) != len(params):
        raise ValueError(
            f"outer_step got {len(grad_sum)} gradients for {len(params)} adapter "
            "parameters: pass one tensor per adapter_parameters() entry, in that order"
        )
    for p, g in zip(params, grad_sum):
        if tuple(g.shape) != tuple(p.shape):
            raise ValueError(
                f"outer_step gradient shape {tuple(g.shape)} does not match adapter parameter "
                f"shape {tuple(p.shape)}: gradients must follow adapter_parameters() order"
            )


def clip_grad_norm(grads: Sequence[torch.Tensor], max_norm: float) -> float:
    """Scales ``grads`` in place so their global L2 norm is at most ``max_norm``.

    Same rule as ``torch.nn.utils.clip_grad_norm_`` (coefficient ``max_norm / (norm + 1e-6)``,
    capped at 1), written on plain tensors so engines that hold gradients outside ``.grad``
    (DeepSpeed's partitioned buffers) apply exactly the same arithmetic.

    Args:
        grads: gradient tensors (modified in place).
        max_norm: maximum global norm; ``<= 0`` means no clipping.

    Returns:
        The global norm before clipping.
    """
    if not grads:
        return 0.0
    total = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.detach().to(torch.promote_types(g.dtype, torch.float32)))
                     for g in grads])
    )
    norm = float(total)
    if max_norm > 0:
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm
