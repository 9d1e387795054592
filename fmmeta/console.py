"""What a training run prints for a person: a banner per method and one line per meta-step.

Why apart from the recipe: these lines are a format (docs/outputs.md describes them, tests read
them, people grep logs for them), not a step of the run's story; the recipe says when to print,
this module says what. It logs under the recipe's logger name ("fmmeta.train"), so a run's log
reads as one voice.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

from torch import nn

from fmmeta.engine import Engine
from fmmeta.models import count_parameters, model_id
from fmmeta.recipe_config import RecipeConfig
from fmmeta.sampling import fast_weight_megabytes

__all__ = ["banner", "step_line"]

logger = logging.getLogger("fmmeta.train")


def banner(cfg: RecipeConfig, method: str, engine: Engine, model: nn.Module, fast_weight_numel: int) -> None:
    """The facts a person checks first: what runs where, and how much of it."""
    trainable, total = count_parameters(model)
    per_rank = cfg.sampler.first_batch_size / engine.world_size
    budget = cfg.sampler.tokens_per_pass or f"{cfg.sampler.micro_batch_size} x longest sequence"
    logger.info(
        "== %s | model %s (%s) | params trainable %s / total %s (%.3f%%) | world size %d | %s"
        " | tasks per meta-step %s (~%.1f per rank, packed into passes of %s tokens, %s)"
        " | inner steps %d | meta-steps %d",
        method, model_id(cfg.model), cfg.model.dtype, f"{trainable:,}", f"{total:,}", 100 * trainable / total,
        engine.world_size, engine.sharding, cfg.sampler.batch_description(),
        per_rank, budget, "padding-free" if cfg.algorithm.padding_free else "padded",
        cfg.algorithm.inner_steps, cfg.train.meta_steps,
    )
    if engine.world_size > 1:
        n = cfg.sampler.largest_batch_size
        logger.info(
            "placement %s | rows across ranks would hold %d fast-weight copies on every rank (%.1f MiB)"
            " and all-reduce %.1f MiB per inner step", cfg.sampler.placement, n if fast_weight_numel else 0,
            fast_weight_megabytes(n, fast_weight_numel, adam=cfg.algorithm.inner_optimizer == "adam"),
            n * fast_weight_numel * 4 / 2**20,
        )


def step_line(method: str, record: Mapping[str, Any], meta_steps: int) -> str:
    """The console line of one meta-step; ``meta-step k (k+1/N)`` numbers steps as checkpoints
    (``step_0000000k``, written after meta-step k) and messages do."""
    return (
        f"{method} meta-step {record['step']} ({record['step'] + 1}/{meta_steps})"
        f" | outer {record['outer_loss']:.3f}"
        f" | query {record['query_loss_before']:.3f} -> {record['query_loss_after']:.3f}"
        f" | {record['tokens']} tok, {record['tokens_per_s']:.0f} tok/s"
        f" | pad eff {record['padding_efficiency']:.3f}"
        + (" | rows across ranks" if record.get("placement") == "rows" else "")
        + f" | data wait {record['data_wait_fraction']:.1%}"
        f" | lr {record['lr']:.3g} | grad norm {record['grad_norm']:.3g}"
        + (f" | inner lr {record['inner_lr_mean']:.4g}" if "inner_lr_mean" in record else "")
        + (f" | B_noise {record['noise_scale']:.3g}" if math.isfinite(record.get("noise_scale", math.nan)) else "")
        + (" | SKIPPED (non-finite)" if record["skipped"] else "")
    )
