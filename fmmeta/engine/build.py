"""Building a run's engine from the engine section and its resolved kind, and the checks on the way.

What a kind is, and how ``engine.kind="auto"`` picks one from the launch, is
:mod:`fmmeta.engine.kinds`; here is what every kind shares: refusing ``engine.compile`` where it
cannot pay (ZeRO-3), compiling the layers where it does, choosing whether to pack bf16 weights,
then the kind's own build. Each function takes the kind the run resolved once
(:class:`~fmmeta.engine.factory.EngineFactory` passes it); an engine built in code without one
resolves it from the section.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from fmmeta.config import ConfigError, EngineConfig
from fmmeta.engine.compiled import compile_model, cxx_compiler
from fmmeta.engine.ds_config import load_ds_config, zero_stage
from fmmeta.engine.kinds import EngineKind, EngineRequest, resolve_engine_kind
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.engine.protocol import Engine
from fmmeta.errors import UserInputError

logger = logging.getLogger(__name__)


AUTO_COMPILE_MIN_PARAMETERS = 100_000_000
"""The smallest model ``engine.compile="auto"`` compiles. Compiling costs about a minute per
process with inductor's cache empty and 12-16 s with it warm, whatever the model's size; what it
saves grows with the model. The default run's 135M model repays it (2-core CPU, training and
evaluation: 0.97x eager on a first run, 1.23x on later ones); the recipe tests' tiny models never
do (7 graphs took 93 s against a 5 s run). Nothing between the two was measured."""

_AUTO_LOGGED: set[str] = set()


def auto_compile(cfg: EngineConfig, model: nn.Module, precision: str,
                 kind: EngineKind | None = None) -> tuple[bool, str]:
    """What ``engine.compile="auto"`` means for ``model`` under ``kind`` (``None``: the kind
    ``cfg`` resolves to), and why: compiled where it was measured to pay, a one-process run on a
    CPU computing in bf16 with a model of at least :data:`AUTO_COMPILE_MIN_PARAMETERS` parameters
    and a C++ compiler for inductor; eager elsewhere (a GPU and DeepSpeed's stages are not
    measured yet; ZeRO-3 is slower; in fp32 a default-model meta-step gains 1.15x against bf16's
    1.36x, too little to repay a first run's compiling)."""
    kind = kind or resolve_engine_kind(cfg)
    if torch.cuda.is_available():
        return False, "compiling is measured to pay on a CPU only, and this run has a GPU"
    if kind.distributed:
        return False, f"compiling is measured to pay in one local process only, not the {kind.name} engine"
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


def should_compile(cfg: EngineConfig, model: nn.Module, precision: str,
                   kind: EngineKind | None = None) -> bool:
    """``engine.compile`` resolved for ``model`` under ``kind``: ``"auto"`` by
    :func:`auto_compile`, its decision logged once per process."""
    if cfg.compile != "auto":
        return bool(cfg.compile)
    on, why = auto_compile(cfg, model, precision, kind)
    line = f"engine.compile=auto -> {str(on).lower()}: {why}"
    if line not in _AUTO_LOGGED:
        _AUTO_LOGGED.add(line)
        logger.info(line)
    return on


def compile_problems(cfg: EngineConfig, kind: EngineKind | None = None) -> list[str]:
    """Why ``engine.compile`` cannot run with ``kind`` (``None``: the kind ``cfg`` resolves to;
    ``[]`` if it can).

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
        ds = (kind or resolve_engine_kind(cfg)).deepspeed_source(cfg)
        if ds is None:
            return []
        source = os.path.expanduser(ds.config) if isinstance(ds.config, str) else ds.config
        if zero_stage(load_ds_config(source)) != 3:
            return []
    except (UserInputError, OSError, ValueError, TypeError, AttributeError):
        return []
    return [
        f"engine.compile=true cannot run with ZeRO stage 3, which {ds.named} asks for: ZeRO-3 "
        "gathers every sublayer's weights in hooks torch.compile cannot trace, so each compiled "
        "decoder layer splits into many small graphs and a meta-step ran 2.4x slower than "
        f"eager; set engine.compile=false, or keep engine.compile=true with {ds.lower_stage}"
    ]


def build_engine(
    cfg: EngineConfig, model: nn.Module, optim_cfg: OuterOptimConfig, *, precision: str,
    kind: EngineKind | None = None,
) -> Engine:
    """Wraps a peft model in the engine of ``kind`` (``None``: the kind ``cfg`` resolves to).

    Args:
        cfg: the engine section (kind, DeepSpeed JSON, collective timeout).
        model: the peft-wrapped causal LM; activation checkpointing, if wanted, is already enabled
            on it by :func:`fmmeta.models.build_model_and_tokenizer`.
        optim_cfg: the outer optimizer, built identically by every engine.
        precision: ``"fp32"`` or ``"bf16"``.
        kind: the run's resolved kind (:class:`~fmmeta.engine.factory.EngineFactory` passes it).

    Raises:
        ConfigError: ``engine.compile`` with ZeRO-3 (:func:`compile_problems`).

    Example:
        >>> engine = build_engine(EngineConfig(kind="local"), peft_model, OuterOptimConfig(), precision="fp32")
    """
    kind = kind or resolve_engine_kind(cfg)
    problems = compile_problems(cfg, kind)  # also checked with the config; here for engines built in code
    if problems:
        raise ConfigError(problems)
    if should_compile(cfg, model, precision, kind):  # in place, before any wrapper: every later forward runs them
        compile_model(model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    packs_here = kind.packs_weights and device == "cpu" and precision == "bf16"
    if cfg.pack_weights and not packs_here:
        logger.warning("engine.pack_weights=true packs bf16 weights for the local engine on a CPU only; "
                       "this run (%s engine, %s, %s) keeps plain matmuls", kind.name, device, precision)
    return kind.build(EngineRequest(cfg, model, optim_cfg, precision=precision, device=device,
                                    pack_weights=cfg.pack_weights and packs_here))
