"""The recipe's configuration: every section of a run in one typed tree.

The sections live with the layer that owns them (sampler, algorithm, outer optimizer, tasks,
model, ...); this module only assembles them and adds the section no layer owns (evaluation), plus
the checks that span sections. ``recipes/train.py`` and ``recipes/evaluate.py`` load it with
:func:`fmmeta.config.load_config`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Literal

from fmmeta.algorithms.build import METHODS
from fmmeta.algorithms.config import DEFAULT_LR_GRID, AlgorithmConfig
from fmmeta.config import EngineConfig, LoraConfig, ModelConfig, TrainConfig
from fmmeta.engine.build import compile_problems
from fmmeta.engine.ds_config import DSConfigError, owned_values, resolve_ds_config
from fmmeta.engine.kinds import ENGINE_KINDS
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.models.precision import auto_dtype, engine_precision
from fmmeta.path_names import folder_room_problem
from fmmeta.sampling.sampler import SamplerConfig
from fmmeta.tasks.config import TasksConfig

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class EvalConfig:
    """Held-out evaluation after meta-training (see fmmeta.evaluation)."""

    enabled: bool = True
    """Evaluate on held-out tasks at the end of the run."""
    seeds: int = 3
    """Independent seeds of episode draws on held-out tasks (>= 1; mean and worst case reported)."""
    episodes_per_task: int = 1
    """Episodes per held-out task per seed (>= 1)."""
    val_episodes_per_task: int = 1
    """Episodes per validation task used to choose each method's adaptation lr (>= 1)."""
    max_steps: int = 3
    """Adaptation steps: 0..max_steps (>= 0); max_steps is each adapting method's headline step."""
    score_steps: tuple[int, ...] = ()
    """Steps at which the query is scored, each in 0..max_steps (max_steps always is); empty =
    every step. Scoring costs about an adaptation step, so [0, max_steps] halves a long one's cost."""
    lr_grid: tuple[float, ...] = DEFAULT_LR_GRID
    """Adaptation learning rates tried on validation tasks, one chosen per method (each > 0)."""
    micro_batch_size: int = 8
    """Support rows, and queries (each with all its candidates, as one row), of one episode per
    forward pass during evaluation (>= 1)."""
    episodes_per_pass: int = 16
    """Episodes adapted and scored together (>= 1; across seeds), each through its own fp32 fast weights, so a
    pass holds all their rows: scores as one episode at a time up to float rounding, and on
    few-shot episodes several times faster (bigger passes cost less per token)."""
    query: int | None = None
    """Query examples per class (per episode for generation tasks) in every evaluation episode,
    validation and held-out (>= 1); None keeps each task's own. Queries cost forward passes only,
    not adaptation steps; more of them narrow the intervals of in-context rows, less those of
    adapted rows, whose spread is likely mostly between support draws (docs/research/step_size_sweep.md)."""
    in_context: bool = True
    """Also score the base model with the support set as in-context demonstrations."""
    with_demonstrations: tuple[str, ...] = ()
    """Methods (trained ones, or ``base``) also scored with the support set as in-context
    demonstrations after each adaptation step, as rows named ``<method>+demos``."""

    def validate(self) -> list[str]:
        """Range checks."""
        problems: list[str] = []
        for key in ("seeds", "episodes_per_task", "val_episodes_per_task", "micro_batch_size",
                    "episodes_per_pass"):
            if not getattr(self, key) >= 1:
                problems.append(f"{key}={getattr(self, key)} is invalid: must be >= 1")
        if not self.max_steps >= 0:
            problems.append(f"max_steps={self.max_steps} is invalid: must be >= 0")
        if self.query is not None and not self.query >= 1:
            problems.append(
                f"query={self.query} is invalid: must be >= 1 (query examples per class), or null "
                "to keep each task's own"
            )
        bad = [s for s in self.score_steps if not 0 <= s <= self.max_steps]
        if bad:
            problems.append(
                f"score_steps={list(self.score_steps)} is invalid: {bad} outside 0..max_steps="
                f"{self.max_steps}; list steps in that range, or [] to score every step"
            )
        if not self.lr_grid or any(not lr > 0 for lr in self.lr_grid):
            problems.append(f"lr_grid={list(self.lr_grid)} is invalid: give one or more lrs > 0")
        return problems


def replicate_folder(r: int) -> str:
    """The folder of training replicate ``r`` inside a run of several (``replicate_<r>``)."""
    return f"replicate_{r}"


@dataclass(kw_only=True)
class RecipeConfig:
    """Everything one run of ``recipes/train.py`` needs; YAML files hold only what differs."""

    output_dir: str = "runs/default"
    """Folder the run writes everything into (config, metrics, adapters, checkpoints, report)."""
    methods: tuple[str, ...] = ("fomaml", "metasgd", "reptile", "multitask", "metaicl")
    """Adapters to meta-train (side by side on a CPU, engine.workers), each from the same initial
    adapter and the same episode draws: meta-learners and the baselines they must beat."""
    # bf16 compute where the hardware has it: 1.8-2.2x faster passes on an AVX512-BF16 CPU, and
    # held-out scores that match fp32's (docs/benchmarks.md, "precision"; docs/design.md, "Precision").
    model: ModelConfig = field(default_factory=lambda: ModelConfig(dtype="auto"))
    """Which base model to load and how."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """The LoRA adapter that meta-training learns."""
    tasks: TasksConfig = field(default_factory=TasksConfig)
    """Which tasks to meta-train on (a suite or a collection of sources)."""
    # The embedded default run (no arguments) departs from the layers' own defaults only where a
    # 2-core CPU must finish meta-training and evaluation in reasonable time, and where
    # measurement on SmolLM2 found what works (outer lr 3e-3 from the calibration in
    # docs/design.md; the inner loop from docs/research/adaptation_sweep.md). "diversity" puts both task
    # families in every meta-batch: the language-id family has 3 of the 33 meta-training tasks
    # and would be rare under uniform. Passes of up to 32 rows: CLDR rows are ~12 tokens, and a
    # pass of a few hundred tokens is mostly per-operation overhead on a CPU ("CPU pass overhead"
    # in docs/benchmarks.md); the sums are the same whatever the passes hold.
    sampler: SamplerConfig = field(
        default_factory=lambda: SamplerConfig(
            meta_batch_size=4, micro_batch_size=32, strategy="diversity"
        )
    )
    """How meta-batches are chosen and planned over ranks."""
    # The inner loop is the section's own default (fmmeta.algorithms.config says why); the run
    # also logs the query loss before adaptation, the number a reader compares "after" with, and
    # packs its passes padding-free: FOMAML's meta-steps faster on SmolLM2 (fp32, 2-core CPU),
    # MetaICL's within noise ("Padding-free passes" in docs/benchmarks.md).
    algorithm: AlgorithmConfig = field(
        default_factory=lambda: AlgorithmConfig(measure_query_before=True, padding_free=True)
    )
    """The inner loop every method in methods shares."""
    optim: OuterOptimConfig = field(default_factory=lambda: OuterOptimConfig(outer_lr=3e-3))
    """The outer (meta) optimizer."""
    # Compiled decoder layers where they pay (engine.compile's docstring): the default run on the
    # 2-core CPU took 283.7 s with inductor's cache warm against 349.8 s eager, and 358.9 s on
    # a first run that compiled everything (docs/benchmarks.md, "Compiled layers").
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(compile="auto"))
    """Which training backend runs the outer update."""
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(meta_steps=20, checkpoint_every=5)
    )
    """The meta-training loop: length, logging, checkpoints, failure policy."""
    # Seven rows (base, in-context and five trained methods) on 60 held-out episodes. Remapped
    # labels are learned from the support set only, and after 2 adaptation steps an adapter
    # labels just 40% of its own support set (chance 33%); 6 steps at lr 0.1 fit 58%, chosen on
    # validation languages (docs/research/adaptation_sweep.md). Scoring only steps 0 and max_steps saves
    # 5 of 7 scoring passes; (0,) stays valid whatever eval.max_steps a user sets.
    eval: EvalConfig = field(
        default_factory=lambda: EvalConfig(max_steps=6, score_steps=(0,))
    )
    """Held-out evaluation after meta-training."""

    def validate(self) -> list[str]:
        """Cross-section checks; each section checks itself."""
        problems: list[str] = []
        bad = [m for m in self.methods if m not in METHODS]  # read now: a method registered after import counts
        if not self.methods or bad:
            problems.append(
                f"methods={list(self.methods)} is invalid: choose one or more of "
                f"{', '.join(METHODS)}"
            )
        for m in self.methods:
            problems.extend(METHODS[m].problems(self.algorithm) if m in METHODS else [])
        if len(set(self.methods)) != len(self.methods):
            problems.append(f"methods={list(self.methods)} is invalid: a method is listed twice")
        unknown = [m for m in self.eval.with_demonstrations if m not in ("base", *self.methods)]
        if unknown:
            problems.append(
                f"eval.with_demonstrations={list(self.eval.with_demonstrations)} is invalid: "
                f"{unknown} not among base and the run's methods {list(self.methods)}"
            )
        budget = self.sampler.tokens_per_pass
        if 0 < budget < self.tasks.max_length:
            problems.append(
                f"sampler.tokens_per_pass={budget} is below one sequence (tasks.max_length="
                f"{self.tasks.max_length}): a pass always holds at least one row, so it would not "
                f"bound anything; use >= {self.tasks.max_length}, or 0 for micro_batch_size x the "
                "longest sequence"
            )
        problems.extend(self._bucket_problems())
        problems.extend(self._launch_problems())
        return problems

    def _bucket_problems(self) -> list[str]:
        """A ``sampler.length_buckets`` width no pass can reach: every pass past the one below it
        would be padded up to it (a width of 10**9 asked for a tensor no machine holds, and died
        as a raw allocation error in the first pass)."""
        buckets = self.sampler.length_buckets
        longest = max(self.tasks.max_length, self.algorithm.icl_max_length)
        widest = (max(self.sampler.tokens_per_pass, self.sampler.micro_batch_size * longest)
                  if self.algorithm.padding_free else longest)
        if not buckets or not isinstance(buckets[-1], int) or buckets[-1] <= widest:
            return []
        return [f"sampler.length_buckets={list(buckets)} is invalid: its widest bucket {buckets[-1]} is wider "
                f"than any pass can be ({widest} tokens: " + ("sampler.tokens_per_pass, or micro_batch_size x the "
                "longest row, with algorithm.padding_free" if self.algorithm.padding_free else
                "the longest row, max of tasks.max_length and algorithm.icl_max_length") + "), so it would only "
                f"pad; use widths <= {widest}"]

    def on_this_machine(self) -> RecipeConfig:
        """This config with ``model.dtype="auto"`` replaced by the dtype this machine computes
        in (logged with the reason), so that the run folder records the choice and a resume on
        other hardware is checked against it."""
        if self.model.dtype != "auto":
            return self
        name, why = auto_dtype()
        dtype: Literal["float32", "bfloat16"] = "bfloat16" if name == "bfloat16" else "float32"
        logger.info("model.dtype=auto -> %s: %s", dtype, why)
        return dataclasses.replace(self, model=dataclasses.replace(self.model, dtype=dtype))

    def replicate_configs(self) -> list[RecipeConfig]:
        """Each training replicate as a one-replicate run: replicate ``r`` trains with
        ``train.seed + r`` into ``<output_dir>/replicate_<r>`` (docs/outputs.md); with
        ``train.replicates=1`` the run is its own one replicate, in ``output_dir`` itself.

        So replicate ``r`` of a run is, file for file, the run of ``train.replicates=1`` and
        ``train.seed`` + r: the same code trains both, and the task split and evaluation episodes
        (``tasks.seed``) are shared.
        """
        if self.train.replicates == 1:
            return [self]
        return [
            dataclasses.replace(
                self, output_dir=os.path.join(self.output_dir, replicate_folder(r)),
                train=dataclasses.replace(self.train, seed=self.train.seed + r, replicates=1),
            )
            for r in range(self.train.replicates)
        ]

    @property
    def precision(self) -> str:
        """The engine's precision for ``model.dtype``: ``"bf16"`` or ``"fp32"``."""
        return engine_precision(self.model.dtype)

    def _launch_problems(self) -> list[str]:
        """Checks that need the launch (world size) or the DeepSpeed JSON, done before any rank
        builds a model: the sampler and the engine would otherwise refuse them only after minutes
        of model loading and task tokenization."""
        problems: list[str] = []
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if self.sampler.on_uneven == "error" and self.sampler.meta_batch_size != "auto" and self.sampler.meta_batch_size % world:
            problems.append(
                f"sampler.meta_batch_size={self.sampler.meta_batch_size} does not divide by the "
                f"{world} ranks of this launch and sampler.on_uneven='error': use a multiple of "
                f"{world} or set sampler.on_uneven=pad"
            )
        workers = self.engine.workers
        named = ENGINE_KINDS.get(self.engine.kind)  # None for "auto" (a launcher sets WORLD_SIZE) or an unknown kind
        if workers != "auto" and workers > 1 and (world > 1 or (named is not None and named.distributed)):
            problems.append(
                f"engine.workers={workers} splits a one-process run between CPU processes; under "
                f"engine.kind={self.engine.kind} with {world} rank(s) the ranks split the work: "
                "set engine.workers=1 (or auto)"
            )
        problems.extend(compile_problems(self.engine))
        room = folder_room_problem(self.output_dir, what="output_dir")
        problems.extend([room] if room else [])
        path = self.engine.deepspeed_config
        if path is None or not os.path.isfile(os.path.expanduser(path)):
            return problems  # a missing file is reported by the engine section
        owned = owned_values(  # what the engine will fill in; checked here before any model
            world_size=world, grad_clip=self.optim.grad_clip,
            precision=self.precision,
        )
        try:
            resolve_ds_config(os.path.expanduser(path), owned=owned)
        except json.JSONDecodeError as err:
            problems.append(
                f"engine.deepspeed_config={path!r} is not valid JSON ({err}): fix the file"
            )
        except DSConfigError as err:
            problems.extend(f"engine.deepspeed_config={path!r}: {p}" for p in err.problems)
        return problems

