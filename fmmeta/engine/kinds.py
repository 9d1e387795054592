"""Engine kinds: each one registered object, resolved once per run and asked, never compared.

``engine.kind`` names one of :data:`ENGINE_KINDS` (or ``"auto"``). Everything that differs between
kinds is written once, on its :class:`EngineKind`: how it builds an engine, whether its ranks are
separate processes, which DeepSpeed config it runs under (none, for the local engine), whether it
packs bf16 weights, and whether the launch implies it. :func:`resolve_engine_kind` turns the
engine section into that object; :class:`~fmmeta.engine.factory.EngineFactory` does it once per
run and hands the object to every later step (the partitioned build, the compile checks, the
engine builds), which ask it instead of comparing its name.

Why: the kind was a string, re-resolved from the config and compared against ``"local"``,
``"deepspeed"`` or ``"accelerate"`` at six call sites in four modules, so another engine (FSDP,
say) meant editing six to eight files. Now it is one :class:`EngineKind` and one
:func:`register_engine_kind` call, from any module; ``engine.kind`` accepts it from then on.

``engine.kind="auto"`` asks the kinds, newest first, whether the launch implies them, so each kind
refines those registered before it: ``local`` (a plain ``python`` process) always applies,
``deepspeed`` (``WORLD_SIZE`` > 1 from any distributed launcher, or an explicit DeepSpeed JSON)
refines it, and ``accelerate`` (``accelerate launch``, which sets ``WORLD_SIZE`` too) refines that.
A kind without an :attr:`EngineKind.implied` test is chosen by name only.

Example:
    >>> register_engine_kind(EngineKind("mine", build=build_mine, distributed=False))  # doctest: +SKIP
    >>> engines = EngineFactory(EngineConfig(kind="mine"), OuterOptimConfig(), precision="fp32")  # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from fmmeta.config import EngineConfig
from fmmeta.engine.distributed import (
    default_backend,
    refuse_bare_multiprocess_launch,
    refuse_missing_accelerator,
)
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.engine.packed import pack_frozen_linears
from fmmeta.engine.protocol import Engine
from fmmeta.errors import UserInputError
from fmmeta.models.precision import precision_dtype

__all__ = [
    "AUTO", "DEFAULT_DS_CONFIG", "ENGINE_KINDS", "DeepSpeedSource", "EngineKind", "EngineRequest",
    "engine_kind", "engine_kind_problems", "register_engine_kind", "resolve_engine_kind",
]

AUTO = "auto"
"""The ``engine.kind`` that is no kind: the one the launch implies (:func:`resolve_engine_kind`)."""

DEFAULT_DS_CONFIG = {
    "zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": "auto", "stage3_max_reuse_distance": "auto",
    },
    "steps_per_print": 10**9,
}
"""ZeRO-3 with every value fmmeta owns filled in by the engine (used when no JSON is given)."""


@dataclass(frozen=True)
class DeepSpeedSource:
    """The DeepSpeed config a kind runs under (unresolved), and how a message names it."""

    config: str | Path | Mapping[str, Any]
    """A JSON path or a dict, with ``"auto"`` for the values fmmeta owns."""
    named: str
    """What asked for it, as a message names it (``engine.deepspeed_config='z3.json'``)."""
    lower_stage: str
    """How a user asks for ZeRO stage 0-2 instead (the fix a ZeRO-3 refusal offers)."""


@dataclass(frozen=True)
class EngineRequest:
    """What a kind's :attr:`EngineKind.build` gets: the engine to make, every choice already taken
    by :func:`fmmeta.engine.build.build_engine` (compiling done, weights to pack or not)."""

    cfg: EngineConfig
    model: nn.Module
    optim_cfg: OuterOptimConfig
    precision: str
    """``"fp32"`` or ``"bf16"``."""
    device: str
    """``"cuda"`` or ``"cpu"``."""
    pack_weights: bool
    """``engine.pack_weights`` was asked for and applies here (:attr:`EngineKind.packs_weights`,
    a CPU, bf16)."""


@dataclass(frozen=True)
class EngineKind:
    """One value ``engine.kind`` takes, and everything the engine layer asks about it.

    Attributes:
        name: what ``engine.kind`` names it by.
        build: makes its engine around the request's peft model.
        distributed: its ranks are separate processes that meet in collectives, even with one
            rank (the factory joins them first; one-process work splitting and compiling, measured
            in one process only, are left out).
        deepspeed: the DeepSpeed config it runs under, read from the engine section and the
            launch; ``None``: it runs without DeepSpeed (no partitioned build, and a
            ``engine.deepspeed_config`` would be ignored, so it is refused).
        packs_weights: it can run on frozen weights packed in oneDNN's bf16 layout
            (``engine.pack_weights``; :mod:`fmmeta.engine.packed`).
        implied: whether the launch (and the engine section) implies it, for
            ``engine.kind="auto"`` (asked newest kind first); ``None``: chosen by name only.
    """

    name: str
    build: Callable[[EngineRequest], Engine]
    distributed: bool
    deepspeed: Callable[[EngineConfig], DeepSpeedSource] | None = None
    packs_weights: bool = False
    implied: Callable[[EngineConfig], bool] | None = None

    def deepspeed_source(self, cfg: EngineConfig) -> DeepSpeedSource | None:
        """The DeepSpeed config it runs under for ``cfg``, or ``None`` without DeepSpeed."""
        return None if self.deepspeed is None else self.deepspeed(cfg)


ENGINE_KINDS: dict[str, EngineKind] = {}
"""Every registered kind by name, in registration order; read live (``engine.kind`` accepts a kind
registered after import)."""


def register_engine_kind(kind: EngineKind) -> EngineKind:
    """Adds ``kind`` to :data:`ENGINE_KINDS` (a name may be registered once; ``"auto"`` is taken)."""
    if kind.name == AUTO or kind.name in ENGINE_KINDS:
        raise ValueError(f"engine kind {kind.name!r} is registered already: pick another name")
    ENGINE_KINDS[kind.name] = kind
    return kind


def _unknown(name: str) -> str:
    """The problem with an ``engine.kind`` no kind is registered under (the section's own key)."""
    names = [AUTO, *ENGINE_KINDS]
    close = difflib.get_close_matches(name, names, n=1)
    return (f"kind={name!r} is invalid: allowed values are " + ", ".join(repr(n) for n in names)
            + " (fmmeta.engine.kinds.register_engine_kind adds one)"
            + (f"; did you mean {close[0]!r}?" if close else ""))


def engine_kind_problems(cfg: EngineConfig) -> list[str]:
    """What the engine section's ``kind`` refuses (one line per problem, each naming the key): an
    unregistered name, or a DeepSpeed JSON for a kind that runs without DeepSpeed."""
    if cfg.kind == AUTO:
        return []
    kind = ENGINE_KINDS.get(cfg.kind)
    if kind is None:
        return [_unknown(cfg.kind)]
    if kind.deepspeed is None and cfg.deepspeed_config is not None:
        return [f"deepspeed_config={cfg.deepspeed_config!r} is set but kind={kind.name!r} runs without DeepSpeed, "
                "so it would be ignored: set kind to 'deepspeed' (or 'auto') to use it, or remove deepspeed_config"]
    return []


def engine_kind(name: str) -> EngineKind:
    """The kind registered as ``name`` (not ``"auto"``: see :func:`resolve_engine_kind`).

    Raises:
        UserInputError: no kind is registered as ``name``; the message lists those that are.
    """
    kind = ENGINE_KINDS.get(name)
    if kind is None:
        raise UserInputError(f"engine.{_unknown(name)}")
    return kind


def resolve_engine_kind(cfg: EngineConfig) -> EngineKind:
    """The kind ``cfg.kind`` names, with ``"auto"`` resolved from the launch environment.

    Raises:
        UserInputError: ``DS_ACCELERATOR`` names an accelerator this machine lacks, or mpirun or
            srun started several copies of the script without ``WORLD_SIZE`` (each would train
            alone, as a local engine included), or no kind is registered as ``cfg.kind``.
    """
    refuse_missing_accelerator()
    if "WORLD_SIZE" not in os.environ:
        refuse_bare_multiprocess_launch()
    if cfg.kind != AUTO:
        return engine_kind(cfg.kind)
    for kind in reversed(ENGINE_KINDS.values()):
        if kind.implied is not None and kind.implied(cfg):
            return kind
    raise UserInputError(f"engine.kind='auto' found no registered kind the launch implies among "
                         f"{list(ENGINE_KINDS)}: name one (engine.kind=...)")


# The built-in kinds. Each imports its engine's module only when asked: importing the registry
# (and the algorithms, which import the engine layer) must not import DeepSpeed or accelerate.


def _build_local(req: EngineRequest) -> Engine:
    from fmmeta.engine.local import LocalEngine

    model = req.model.to(precision_dtype(req.precision))
    if req.pack_weights:
        pack_frozen_linears(model)
    return LocalEngine(model, req.optim_cfg, device=req.device)


_LOWER_STAGE_JSON = "a ZeRO stage 0-2 JSON (engine.deepspeed_config=ds_configs/zero2.json)"


def _deepspeed_json(cfg: EngineConfig) -> DeepSpeedSource:
    """The JSON ``engine.deepspeed_config`` names, or ZeRO-3 with fmmeta's values when none is."""
    if cfg.deepspeed_config:
        return DeepSpeedSource(cfg.deepspeed_config, f"engine.deepspeed_config={cfg.deepspeed_config!r}",
                               _LOWER_STAGE_JSON)
    return DeepSpeedSource(DEFAULT_DS_CONFIG, "the DeepSpeed engine's default (engine.deepspeed_config unset)",
                           _LOWER_STAGE_JSON)


def _build_deepspeed(req: EngineRequest) -> Engine:
    from fmmeta.engine.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(
        req.model, req.optim_cfg, _deepspeed_json(req.cfg).config, precision=req.precision,
        dist_backend=default_backend(), dist_timeout_s=req.cfg.collective_timeout_s,
    )


def _launched_distributed(cfg: EngineConfig) -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or cfg.deepspeed_config is not None


def _accelerate_plugin(cfg: EngineConfig) -> DeepSpeedSource:
    """What ``accelerate launch`` asked for: its DeepSpeed plugin's config, or ZeRO stage 0."""
    from fmmeta.engine.accelerate_engine import deepspeed_config_from_accelerate

    return DeepSpeedSource(deepspeed_config_from_accelerate(), "accelerate launch's DeepSpeed plugin",
                           "an accelerate config file with deepspeed_config.zero_stage 0, 1 or 2")


def _build_accelerate(req: EngineRequest) -> Engine:
    from fmmeta.engine.accelerate_engine import build_accelerate_engine

    return build_accelerate_engine(
        req.model, req.optim_cfg, precision=req.precision, dist_backend=default_backend(),
        dist_timeout_s=req.cfg.collective_timeout_s,
    )


def _launched_by_accelerate(cfg: EngineConfig) -> bool:
    from fmmeta.engine.accelerate_engine import launched_by_accelerate

    return launched_by_accelerate()


register_engine_kind(EngineKind(
    "local", _build_local, distributed=False, packs_weights=True, implied=lambda cfg: True))
register_engine_kind(EngineKind(
    "deepspeed", _build_deepspeed, distributed=True, deepspeed=_deepspeed_json, implied=_launched_distributed))
register_engine_kind(EngineKind(
    "accelerate", _build_accelerate, distributed=True, deepspeed=_accelerate_plugin,
    implied=_launched_by_accelerate))
