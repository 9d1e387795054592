"""The one object a recipe asks the engine layer for: :class:`EngineFactory`.

Why an object, and not the free functions it calls: a recipe needs the engine layer before any
engine exists. The ranks must meet before anyone builds anything; under ZeRO-3 the base must be
built already partitioned (so no rank ever holds it whole), and the object that makes this so must
stay alive as long as the model; every method must start from the same seeded adapter, written into
ZeRO-3's own partitions so that a re-gather does not bring back the last method's values. Done by
hand, each recipe (and the study) called these ZeRO internals in the right order, and another engine
(FSDP, say) would have had to be wired into each of them. Here the order lives once: a recipe makes
one factory from its config, and asks it to join the ranks, build the base, and make engines, each
starting from a given adapter. The factory resolves ``engine.kind`` once, to a registered
:class:`~fmmeta.engine.kinds.EngineKind`, and every step asks that object; a new engine is one
registered kind (:mod:`fmmeta.engine.kinds`), and no recipe changes.

Example:
    >>> engines = EngineFactory(cfg.engine, cfg.optim, precision=cfg.precision)  # doctest: +SKIP
    >>> rank = engines.join(flat_config(cfg))                                    # doctest: +SKIP
    >>> base, tokenizer = engines.build_base(cfg.model)                          # doctest: +SKIP
    >>> model = add_lora(base, cfg.lora, seed=0)                                 # doctest: +SKIP
    >>> engine = engines.engine(model, initial_adapter(model, 0))                # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fmmeta.config import EngineConfig, ModelConfig
from fmmeta.engine.build import build_engine
from fmmeta.engine.distributed import check_same_on_every_rank, default_backend, init_distributed
from fmmeta.engine.kinds import EngineKind, resolve_engine_kind
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.engine.partition import PartitionedBuild, partitioned_build
from fmmeta.engine.protocol import Engine
from fmmeta.engine.zero import scatter_adapter
from fmmeta.models import build_model_and_tokenizer

__all__ = ["EngineFactory"]


class EngineFactory:
    """Joins the ranks, builds the base the engine's way and makes engines, for one run.

    Args:
        cfg: the engine section (``engine.kind`` is resolved here, once, to :attr:`kind`).
        optim_cfg: the outer optimizer every engine builds.
        precision: ``"fp32"`` or ``"bf16"``.

    Raises:
        UserInputError: the launch contradicts the config (see
            :func:`fmmeta.engine.kinds.resolve_engine_kind`), or names no registered kind.
    """

    def __init__(self, cfg: EngineConfig, optim_cfg: OuterOptimConfig, *, precision: str) -> None:
        self.cfg = cfg
        self.optim_cfg = optim_cfg
        self.precision = precision
        self.kind: EngineKind = resolve_engine_kind(cfg)
        # Under ZeRO-3: what keeps transformers' ZeRO-3 integration on; it must outlive the model.
        self._partitioned: PartitionedBuild | None = None

    @property
    def distributed(self) -> bool:
        """Whether the run's ranks are separate processes that meet in collectives (the kind says
        so: every built-in kind but the local engine, even with one rank)."""
        return self.kind.distributed

    def join(self, config: dict[str, Any] | None = None) -> int:
        """Joins the other ranks (when :attr:`distributed`) and returns this rank.

        ``config``: the run's flat config; every rank must have been given the same one, checked
        here before any rank builds anything (a rank that read another file would train another
        run and hang a collective later).
        """
        if not self.distributed:
            return 0
        rank, _, _ = init_distributed(default_backend(), self.cfg.collective_timeout_s)
        if config is not None:
            check_same_on_every_rank(config, "the config")
        return rank

    def build_base(self, model_cfg: ModelConfig) -> tuple[nn.Module, Any]:
        """The base model and its tokenizer, built as the engine wants it: under ZeRO-3
        partitioned as it is built or loaded, so no rank holds it whole; otherwise whole.

        Call it on every rank, once per run.

        Raises:
            DSConfigError: the DeepSpeed config conflicts with the recipe (the check every engine
                makes later, now before any weight is loaded).
        """
        self._partitioned = partitioned_build(self.cfg, self.optim_cfg, precision=self.precision, kind=self.kind)
        return build_model_and_tokenizer(model_cfg, partitioned=self._partitioned)

    def reset_adapter(self, model: nn.Module, initial: Sequence[torch.Tensor]) -> None:
        """Writes ``initial`` (full tensors, in the order of the model's trainable parameters)
        into the adapter, ZeRO-3's partitions included. Every rank, with the same values, while
        no engine wraps the model."""
        scatter_adapter([p for p in model.parameters() if p.requires_grad], initial)

    def engine(self, model: nn.Module, initial: Sequence[torch.Tensor] | None = None) -> Engine:
        """A new engine around ``model``, its adapter first reset to ``initial`` when given.

        Several engines wrap the same model one after the other (one per method, one for the
        evaluation), each starting from the run's seeded adapter without a copy of the base; close
        the previous one first (under ZeRO-3 it removes its hooks).
        """
        if initial is not None:
            self.reset_adapter(model, initial)
        return build_engine(self.cfg, model, self.optim_cfg, precision=self.precision, kind=self.kind)
