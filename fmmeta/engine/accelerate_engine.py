"""The accelerate path: the same engine when a run is started with ``accelerate launch``.

``accelerate launch`` starts the processes through torchrun (``LOCAL_RANK``, ``RANK``,
``WORLD_SIZE`` in the environment) and, with its DeepSpeed plugin, passes the ZeRO settings of the
accelerate config file (``recipes/accelerate_zero*.yaml``) in ``ACCELERATE_DEEPSPEED_*`` variables.
We read those settings through accelerate's own ``DeepSpeedPlugin`` and build the ordinary
:class:`~fmmeta.engine.deepspeed_engine.DeepSpeedEngine` from them, rather than letting
``Accelerator.prepare`` wrap the model: its forward would route inner-loop passes through
DeepSpeed's ``engine.backward`` machinery, which the meta-learning inner loop must avoid
(docs/design.md, "No `no_sync` under ZeRO-2/3"), and a second engine implementation would be a second place for results to drift.

Without the DeepSpeed plugin (plain multi-process accelerate), the run uses ZeRO stage 0: plain
data parallelism, where the meta-gradient is all-reduced once per meta-step, exactly as DDP would.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from torch import nn

from fmmeta.engine.deepspeed_engine import DeepSpeedEngine
from fmmeta.engine.distributed import default_backend, init_distributed
from fmmeta.engine.optim import OuterOptimConfig

logger = logging.getLogger(__name__)


def launched_by_accelerate() -> bool:
    """Whether this process was started by ``accelerate launch``."""
    return any(k.startswith("ACCELERATE_") for k in os.environ)


def deepspeed_config_from_accelerate() -> dict[str, Any]:
    """The DeepSpeed config ``accelerate launch`` asked for, as a plain dict.

    With the DeepSpeed plugin it is the plugin's config (accelerate writes ``"auto"`` for the values
    fmmeta owns; :func:`~fmmeta.engine.ds_config.resolve_ds_config` fills them and reports any
    explicit conflict, e.g. ``mixed_precision: bf16`` in the accelerate file against an fp32
    recipe). Without it, ZeRO stage 0 (plain data parallelism).
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return {"zero_optimization": {"stage": 0}}
    from accelerate.utils import DeepSpeedPlugin

    cfg = dict(DeepSpeedPlugin().deepspeed_config)
    steps = cfg.get("steps_per_print")
    if isinstance(steps, float) and math.isinf(steps):
        cfg["steps_per_print"] = 2**31 - 1  # DeepSpeed wants an int; accelerate writes inf
    mixed = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if mixed in ("bf16", "fp16", "no"):
        cfg.setdefault("bf16", {"enabled": mixed == "bf16"})
        cfg.setdefault("fp16", {"enabled": mixed == "fp16"})
    return cfg


def build_accelerate_engine(
    model: nn.Module,
    optim_cfg: OuterOptimConfig,
    *,
    precision: str = "fp32",
    dist_backend: str | None = None,
    dist_timeout_s: float = 300.0,
) -> DeepSpeedEngine:
    """Builds the engine for a process started by ``accelerate launch``.

    Args:
        model: a peft-wrapped causal LM.
        optim_cfg: outer optimizer settings.
        precision: ``"fp32"`` or ``"bf16"``; must agree with the accelerate file's
            ``mixed_precision`` (``no`` or ``bf16``), else the config error lists the mismatch.
        dist_backend: ``"gloo"`` or ``"nccl"`` (``None``: nccl on CUDA, else gloo).
        dist_timeout_s: collective timeout.

    Example:
        >>> # accelerate launch --config_file recipes/accelerate_zero3.yaml recipes/train.py
        >>> engine = build_accelerate_engine(peft_model, OuterOptimConfig(outer_lr=3e-3))
    """

    backend = dist_backend or default_backend()
    init_distributed(backend, dist_timeout_s)
    ds_config = deepspeed_config_from_accelerate()
    logger.info("accelerate launch: DeepSpeed config from accelerate: %s", ds_config)
    return DeepSpeedEngine(
        model, optim_cfg, ds_config, precision=precision,
        dist_backend=backend, dist_timeout_s=dist_timeout_s,
    )
