"""The meta-algorithms' settings: one inner-loop config, one set of defaults.

:class:`InnerLoopConfig` is what the one inner loop (:mod:`fmmeta.algorithms.inner_loop`) reads,
in training and in evaluation alike. :class:`AlgorithmConfig` is the recipe's ``algorithm``
section: the inner-loop fields plus the few that only meta-training reads, and one section per
method that has settings of its own (``algorithm.<method>.<key>``: :class:`MetaSGDConfig`,
:class:`ReptileConfig`, :class:`MultiTaskConfig`, :class:`ANILConfig`), read only by that method.
It extends :class:`InnerLoopConfig` instead of repeating its fields, so each inner-loop field has
one default and one doc, and every one of them (``adam_betas`` and ``adam_eps`` included) can be
set from YAML as ``algorithm.<field>``.

The defaults are the inner loop the default run uses: measured on SmolLM2 (at 3 steps of lr 0.03 clipped to
norm 1.0, FOMAML's adaptation lowered the query loss by 0.33 nats and it trained almost like
multi-task; 4 steps at lr 0.1 lower it by 1.74; docs/research/adaptation_sweep.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

from fmmeta.tasks.in_context import INNER_FORMATS

__all__ = ["ANILConfig", "DEFAULT_LR_GRID", "INNER_OPTIMIZERS", "AlgorithmConfig", "InnerLoopConfig", "MetaSGDConfig",
           "MultiTaskConfig", "ReptileConfig"]

INNER_OPTIMIZERS = ("sgd", "adam")
"""The inner update rules :class:`~fmmeta.algorithms.inner_loop.InnerOptimizer` implements."""

DEFAULT_LR_GRID: tuple[float, ...] = (0.1, 0.3)
"""Adaptation learning rates evaluation tries per method on validation tasks (each > 0).

At 6 adaptation steps validation chose 0.1 and 0.3 came second; 1.0 oscillated
(docs/research/adaptation_sweep.md). The one default: ``eval.lr_grid`` and the evaluation functions'
``lr_grid`` both start from it."""


@dataclass(frozen=True, kw_only=True)
class InnerLoopConfig:
    """Settings of the inner (per-task) adaptation, identical on every rank.

    Example:
        >>> InnerLoopConfig(inner_steps=6, inner_lr=0.3).validate()
        []
    """

    inner_steps: int = 4
    """Optimizer steps on the support set per task (>= 0; 0 = no adaptation)."""
    inner_lr: float = 0.1
    """Inner learning rate (> 0). SGD on LoRA is fragile (on SmolLM2 lr 0.3 made every init worse
    after 3 steps): choose it on validation tasks."""
    inner_optimizer: str = "sgd"
    """"sgd" (plain, stateless) or "adam" (fresh moments for every task)."""
    inner_clip_norm: float | None = 1.0
    """Clip each inner step's gradient to this global L2 norm (> 0); null = off."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """(beta1, beta2) of the inner Adam, each in [0, 1); unused for SGD."""
    adam_eps: float = 1e-8
    """Epsilon of the inner Adam (> 0); unused for SGD."""
    padding_free: bool = False
    """Pack each pass's examples several to a row, positions restarting per example, instead of
    padding every row to the longest (fmmeta.tasks.lines): training's passes and evaluation's
    adaptation passes. Losses equal the padded pass's to float rounding; needs a model whose
    attention honours restarting ``position_ids`` without a mask (transformers' Llama family and
    others built on ``create_causal_mask``; checked before the first pass)."""

    def validate(self) -> list[str]:
        """Range and choice checks, one problem per field."""
        problems: list[str] = []
        if self.inner_steps < 0:
            problems.append(f"inner_steps={self.inner_steps} is invalid: must be >= 0")
        if not self.inner_lr > 0:
            problems.append(f"inner_lr={self.inner_lr} is invalid: must be > 0 (e.g. 0.1)")
        if self.inner_optimizer not in INNER_OPTIMIZERS:
            problems.append(
                f"inner_optimizer={self.inner_optimizer!r} is invalid: allowed {list(INNER_OPTIMIZERS)}"
            )
        if self.inner_clip_norm is not None and not self.inner_clip_norm > 0:
            problems.append(
                f"inner_clip_norm={self.inner_clip_norm} is invalid: must be > 0, or null to turn "
                "clipping off"
            )
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            problems.append(f"adam_betas={list(self.adam_betas)} is invalid: need two values in [0, 1)")
        if not self.adam_eps > 0:
            problems.append(f"adam_eps={self.adam_eps} is invalid: must be > 0 (e.g. 1e-8)")
        return problems


# --------------------------------------------------------------------------------------------
# Each method's own settings: ``algorithm.<method>.<key>``, read only by that method
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MetaSGDConfig:
    """Meta-SGD's settings (:mod:`fmmeta.algorithms.meta_sgd`)."""

    step_size_lr: float = 0.01
    """Adam learning rate of the log inner step sizes (> 0); one meta-step changes each step size
    by at most about this fraction (0.01: 1%)."""

    def validate(self) -> list[str]:
        """The step sizes' lr must be a positive number."""
        if not (math.isfinite(self.step_size_lr) and self.step_size_lr > 0):
            return [f"step_size_lr={self.step_size_lr} is invalid: must be > 0 (Adam lr of metasgd's "
                    "log inner step sizes, e.g. 0.01)"]
        return []


@dataclass(frozen=True, kw_only=True)
class ReptileConfig:
    """Reptile's settings (:class:`~fmmeta.algorithms.first_order.Reptile`)."""

    query_step: bool = False
    """After the support steps take one more inner step on the query set, so theta - phi
    includes it; the query loss after adaptation then comes free with its forward."""


@dataclass(frozen=True, kw_only=True)
class MultiTaskConfig:
    """The multi-task baseline's settings (:class:`~fmmeta.algorithms.baselines.MultiTask`)."""

    match_passes: bool = True
    """Run FOMAML's pass count (support passes inner_steps times each, query once) so the
    baseline spends the same compute (see fmmeta.algorithms.baselines)."""


@dataclass(frozen=True, kw_only=True)
class ANILConfig:
    """ANIL's settings (:mod:`fmmeta.algorithms.anil`)."""

    layers: int = 2
    """The inner loop adapts the adapter tensors of this many top decoder layers (>= 1; all of
    them on a model with this many or fewer); the outer step updates every adapter tensor."""

    def validate(self) -> list[str]:
        """At least one layer adapts."""
        if self.layers < 1:
            return [f"layers={self.layers} is invalid: must be >= 1 (the top decoder layers the "
                    "inner loop adapts; ANIL's paper adapts only the head)"]
        return []


@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig(InnerLoopConfig):
    """The recipe's ``algorithm`` section: the inner loop plus what only meta-training reads.

    Which algorithm runs is not a field: the recipe trains every method it lists (``methods``),
    each built by :func:`~fmmeta.algorithms.build.build_algorithm` from its name and this config.

    Example:
        >>> AlgorithmConfig(inner_steps=5, adam_betas=(0.8, 0.99)).inner_loop.adam_betas
        (0.8, 0.99)
    """

    pad_to_multiple_of: int | None = None
    """Pad each micro-batch's length to a multiple of this (>= 1); null = exact lengths."""
    measure_query_before: bool = False
    """Also measure the query loss at theta (one extra forward pass per query pass). Equal on
    every rank (under ZeRO-3 every forward is a collective)."""
    icl_max_length: int = 1024
    """MetaICL (training and in-context scoring) and the in-context inner loop: longest sequence
    of demonstrations + example in tokens (>= 2); longer ones lose their oldest demonstration
    tokens."""
    inner_format: str = "plain"
    """Rows the adapting methods (fomaml, metasgd, reptile, anil) adapt and are scored on: "plain", or
    "in_context" (MAML-en-LLM style: each support row has the other support examples as
    demonstrations, each query row all of them; evaluation adapts and scores those methods the
    same way). Multi-task trains on plain rows and MetaICL on in-context queries either way."""
    metasgd: MetaSGDConfig = field(default_factory=lambda: MetaSGDConfig())
    """Meta-SGD's own settings (``algorithm.metasgd.<key>``)."""
    reptile: ReptileConfig = field(default_factory=lambda: ReptileConfig())
    """Reptile's own settings (``algorithm.reptile.<key>``)."""
    multitask: MultiTaskConfig = field(default_factory=lambda: MultiTaskConfig())
    """The multi-task baseline's own settings (``algorithm.multitask.<key>``)."""
    anil: ANILConfig = field(default_factory=lambda: ANILConfig())
    """ANIL's own settings (``algorithm.anil.<key>``)."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "reptile_query_step": "algorithm.reptile.query_step",
        "multitask_match_passes": "algorithm.multitask.match_passes",
        "step_size_lr": "algorithm.metasgd.step_size_lr",
    }
    """Keys that became a method's own (the loader refuses them, naming where they went)."""

    def validate(self) -> list[str]:
        """The inner loop's checks, then this section's own."""
        problems = InnerLoopConfig.validate(self)
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            problems.append(
                f"pad_to_multiple_of={self.pad_to_multiple_of} is invalid: must be >= 1, or null"
            )
        if not self.icl_max_length >= 2:
            problems.append(
                f"icl_max_length={self.icl_max_length} is invalid: must be >= 2 (tokens of "
                "demonstrations + query; MetaICL used 1024)"
            )
        if self.inner_format not in INNER_FORMATS:
            problems.append(f"inner_format={self.inner_format!r} is invalid: allowed {list(INNER_FORMATS)}")
        return problems

    @property
    def inner_loop(self) -> InnerLoopConfig:
        """The inner-loop part alone (what evaluation records and adapts with)."""
        return InnerLoopConfig(**{f.name: getattr(self, f.name) for f in fields(InnerLoopConfig)})
