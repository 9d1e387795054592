"""Choosing the engine for a run, from the config and from how the process was launched.

``engine.kind="auto"`` picks what the launch implies: ``accelerate launch`` -> the accelerate path,
any other distributed launcher (``deepspeed``, ``torchrun``: ``WORLD_SIZE`` > 1) or an explicit
DeepSpeed config -> DeepSpeed, and a plain ``python`` process -> the local engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fmmeta.config import ConfigError, EngineConfig
from fmmeta.engine.compiled import compile_model, cxx_compiler
from fmmeta.engine.distributed import (
    default_backend,
    refuse_bare_multiprocess_launch,
    refuse_missing_accelerator,
)
from fmmeta.engine.ds_config import load_ds_config, zero_stage
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.engine.packed import pack_frozen_linears
from fmmeta.engine.protocol import Engine
from fmmeta.errors import UserInputError
from fmmeta.models.precision import precision_dtype

logger = logging.getLogger(__name__)

DEFAULT_DS_CONFIG = {
    "zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": "auto", "stage3_max_reuse_distance": "auto",
    },
    "steps_per_print": 10**9,
}
"""ZeRO-3 with every value fmmeta owns filled in by the engine (used when no JSON is given)."""


def resolve_engine_kind(cfg: EngineConfig) -> str:
    """The engine ``cfg.kind`` names, with ``"auto"`` resolved from the launch environment.

    Raises:
        UserInputError: ``DS_ACCELERATOR`` names an accelerator this machine lacks, or mpirun or
            srun started several copies of the script without ``WORLD_SIZE`` (each would train
            alone, as a local engine included).
    """
    refuse_missing_accelerator()
    if "WORLD_SIZE" not in os.environ:
        refuse_bare_multiprocess_launch()
    if cfg.kind != "auto":
        return cfg.kind
    from fmmeta.engine.accelerate_engine import launched_by_accelerate

    if launched_by_accelerate():
        return "accelerate"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or cfg.deepspeed_config is not None:
        return "deepspeed"
    return "local"


def engine_ds_config(cfg: EngineConfig) -> str | Path | Mapping[str, Any]:
    """The DeepSpeed config (unresolved) the DeepSpeed or accelerate engine will use.

    ``accelerate launch`` with its DeepSpeed plugin brings its own; otherwise the JSON named by
    ``engine.deepspeed_config``, or ZeRO-3 with fmmeta's values when none is named.
    """
    if resolve_engine_kind(cfg) == "accelerate":
        from fmmeta.engine.accelerate_engine import deepspeed_config_from_accelerate

        return deepspeed_config_from_accelerate()
    return cfg.deepspeed_config or DEFAULT_DS_CONFIG


AUTO_COMPILE_MIN_PARAMETERS = 100_000_000
"""The smallest model ``engine.compile="auto"`` compiles. Compiling costs about a minute per
process with inductor's cache empty and 12-16 s with it warm, whatever the model's size; what it
saves grows with the model. The default run's 135M model repays it (2-core CPU, training and
evaluation: 0.97x eager on a first run, 1.23x on later ones); the recipe tests' tiny models never
do (7 graphs took 93 s against a 5 s run). Nothing between the two was measured."""

_AUTO_LOGGED: set[str] = set()


def auto_compile(cfg: EngineConfig, model: nn.Module, precision: str) -> tuple[bool, str]:
    """What ``engine.compile="auto"`` means for ``model`` under the engine ``cfg`` resolves to,
    and why: compiled where it was measured to pay, a one-process run on a CPU computing in bf16
    with a model of at least :data:`AUTO_COMPILE_MIN_PARAMETERS` parameters and a C++ compiler
    for inductor; eager elsewhere (a GPU and DeepSpeed's stages are not measured yet; ZeRO-3 is
    slower; in fp32 a default-model meta-step gains 1.15x against bf16's 1.36x, too little to
    repay a first run's compiling)."""
    kind = resolve_engine_kind(cfg)
    if torch.cuda.is_available():
        return False, "compiling is measured to pay on a CPU only, and this run has a GPU"
    if kind != "local":
        return False, f"compiling is measured to pay in one local process only, not the {kind} engine"
    if precision != "bf16":
        return False, f"compiling is measured to pay in bf16 only, and this run computes in {precision}"
    n = sum(p.numel() for p in model.parameters())
    if n < AUTO_COMPILE_MIN_PARAMETERS:
        return False, (f"the model has {n / 1e6:.3g}M parameters, fewer than the "
                       f"{AUTO_COMPILE_MIN_PARAMETERS / 1e6:.0f}M that repay compiling")
    compiler = cxx_compiler()
    if compiler is None:
        return False, "inductor finds no C++ compiler to build CPU kernels with"
    return True, f"one process on a CPU, {n / 1e6:.0f}M parameters, C++ compiler {compiler}"


def should_compile(cfg: EngineConfig, model: nn.Module, precision: str) -> bool:
    """``engine.compile`` resolved for ``model``: ``"auto"`` by :func:`auto_compile`, its
    decision logged once per process."""
    if cfg.compile != "auto":
        return bool(cfg.compile)
    on, why = auto_compile(cfg, model, precision)
    line = f"engine.compile=auto -> {str(on).lower()}: {why}"
    if line not in _AUTO_LOGGED:
        _AUTO_LOGGED.add(line)
        logger.info(line)
    return on


def compile_problems(cfg: EngineConfig) -> list[str]:
    """Why ``engine.compile`` cannot run with the engine ``cfg`` resolves to (``[]`` if it can).

    ZeRO-3 is refused: it gathers each sublayer's weights in module hooks that dynamo must not
    trace (DeepSpeed marks them ``torch.compiler.disable``), so every compiled decoder layer
    breaks into a graph per sublayer, and the hooks' per-module autograd functions recompile
    until dynamo's limit sends them to eager. The numbers stay right (2 ranks, fp32: 1e-7 of
    eager) but a meta-step ran 2.4x slower than eager ZeRO-3 with inductor (tests/distributed/
    test_compiled_zero.py; docs/design.md, "Compiled layers"). ZeRO 0-2 leave the layers alone.
    On a CPU inductor builds its kernels with a C++ compiler, so ``engine.compile=true`` without
    one is refused too ("auto" then stays eager). A launch problem or a missing or unreadable JSON
    is left to the checks that report it."""
    if cfg.compile is not True:
        return []
    if not torch.cuda.is_available() and cxx_compiler() is None:
        return [
            "engine.compile=true needs a C++ compiler on a CPU (inductor builds its kernels with "
            "g++, clang++ or the one CXX names) and none was found: install one (e.g. apt install "
            "g++), or set engine.compile=false (or auto, which stays eager without one)"
        ]
    try:
        kind = resolve_engine_kind(cfg)
        source = engine_ds_config(cfg)
        if isinstance(source, str):
            source = os.path.expanduser(source)
        if kind == "local" or zero_stage(load_ds_config(source)) != 3:
            return []
    except (UserInputError, OSError, ValueError, TypeError, AttributeError):
        return []
    if kind == "accelerate":
        named, other = ("accelerate launch's DeepSpeed plugin",
                        "an accelerate config file with deepspeed_config.zero_stage 0, 1 or 2")
    else:
        named = (f"engine.deepspeed_config={cfg.deepspeed_config!r}" if cfg.deepspeed_config
                 else "the DeepSpeed engine's default (engine.deepspeed_config unset)")
        other = "a ZeRO stage 0-2 JSON (engine.deepspeed_config=ds_configs/zero2.json)"
    return [
        f"engine.compile=true cannot run with ZeRO stage 3, which {named} asks for: ZeRO-3 "
        "gathers every sublayer's weights in hooks torch.compile cannot trace, so each compiled "
        "decoder layer splits into many small graphs and a meta-step ran 2.4x slower than "
        f"eager; set engine.compile=false, or keep engine.compile=true with {other}"
    ]


def build_engine(
    cfg: EngineConfig, model: nn.Module, optim_cfg: OuterOptimConfig, *, precision: str
) -> Engine:
    """Wraps a peft model in the engine ``cfg`` asks for.

    Args:
        cfg: the engine section (kind, DeepSpeed JSON, collective timeout).
        model: the peft-wrapped causal LM; activation checkpointing, if wanted, is already enabled
            on it by :func:`fmmeta.models.build_model_and_tokenizer`.
        optim_cfg: the outer optimizer, built identically by every engine.
        precision: ``"fp32"`` or ``"bf16"``.

    Raises:
        ConfigError: ``engine.compile`` with ZeRO-3 (:func:`compile_problems`).

    Example:
        >>> engine = build_engine(EngineConfig(kind="local"), peft_model, OuterOptimConfig(), precision="fp32")
    """
    kind = resolve_engine_kind(cfg)
    problems = compile_problems(cfg)  # also checked with the config; here for engines built in code
    if problems:
        raise ConfigError(problems)
    if should_compile(cfg, model, precision):  # in place, before any wrapper: every later forward runs them
        compile_model(model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    packs_here = kind == "local" and device == "cpu" and precision == "bf16"
    if cfg.pack_weights and not packs_here:
        logger.warning("engine.pack_weights=true packs bf16 weights for the local engine on a CPU only; "
                       "this run (%s engine, %s, %s) keeps plain matmuls", kind, device, precision)
    if kind == "local":
        from fmmeta.engine.local import LocalEngine

        model = model.to(precision_dtype(precision))
        if cfg.pack_weights and packs_here:
            pack_frozen_linears(model)
        return LocalEngine(model, optim_cfg, device=device)
    backend = default_backend()
    if kind == "accelerate":
        from fmmeta.engine.accelerate_engine import build_accelerate_engine

        return build_accelerate_engine(
            model, optim_cfg, precision=precision, dist_backend=backend,
            dist_timeout_s=cfg.collective_timeout_s,
        )
    from fmmeta.engine.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(
        model, optim_cfg, engine_ds_config(cfg), precision=precision,
        dist_backend=backend, dist_timeout_s=cfg.collective_timeout_s,
    )


