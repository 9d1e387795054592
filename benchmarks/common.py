"""What the compute benchmarks share: the model they measure, the device, timing and counting.

One home for the pieces ``evaluation.py``, ``precision.py`` and ``padding_free.py`` each need:

* the model: the default run's (SmolLM2-135M, embedded), ``--tiny`` (a smoke size for
  ``make test``) or ``--random`` (random weights of SmolLM2-135M's shape with the byte tokenizer,
  for a machine where the embedded model cannot be installed, such as an offline GPU machine);
* ``--device``: where the model computes (``cpu`` or ``cuda``);
* timings that wait for the device (:func:`median_times`), a matmul peak measured on that device in
  the compute dtype (:func:`matmul_peak`), and each forward's tokens and FLOPs counted
  (:class:`PassCounter`, by ``fmmeta/flops.py``'s one count).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fmmeta.config import LoraConfig, ModelConfig
from fmmeta.flops import PassSize, attended_keys, head_positions, model_shape, pass_flops
from fmmeta.models import add_lora, build_model_and_tokenizer
from fmmeta.models.precision import native_bf16, resolve_dtype
from fmmeta.recipe_config import RecipeConfig
from fmmeta.sampling.plan import RankPlan
from fmmeta.sampling.sampler import CostAwareSampler

SMOLLM2_SHAPE = {"tiny_vocab_size": 49152, "tiny_hidden_size": 576, "tiny_intermediate_size": 1536,
                 "tiny_num_layers": 30, "tiny_num_heads": 9, "tiny_num_kv_heads": 3,
                 "tiny_max_positions": 2048}
"""SmolLM2-135M's sizes (its GGUF file's config) for ``--random``."""


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """``--tiny``, ``--random``, ``--device`` and ``--threads``, the same in every benchmark."""
    ap.add_argument("--tiny", action="store_true", help="small random model (a smoke size)")
    ap.add_argument("--random", action="store_true",
                    help="random weights of SmolLM2-135M's shape, byte tokenizer (no model package needed)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")


def add_dtype_argument(ap: argparse.ArgumentParser) -> None:
    """``--dtype``, ``auto`` by default: what a run's ``model.dtype=auto`` computes in on the
    benchmark's ``--device`` (bf16 where it is native, fp32 where bf16 would be emulated), so a
    figure is what a user of that device pays; resolve it with :func:`compute_dtype`."""
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="compute dtype (auto: bf16 where --device has it natively, else fp32)")


def compute_dtype(args: argparse.Namespace) -> str:
    """``args.dtype`` with ``auto`` resolved for ``args.device``; sets it on ``args`` too."""
    args.dtype = resolve_dtype(args.dtype, device=args.device)
    return str(args.dtype)


def native_dtypes(device: str) -> list[str]:
    """fp32, and bf16 where ``device`` computes it natively: the dtypes a benchmark comparing both
    measures by default (emulated bf16 is slower than fp32 and no run computes in it)."""
    return ["float32"] + (["bfloat16"] if native_bf16(device=device)[0] else [])


def add_pass_arguments(ap: argparse.ArgumentParser) -> None:
    """``--meta-batch`` and ``--rows``: a meta-step's size, for devices that need bigger passes."""
    ap.add_argument("--meta-batch", type=int, default=0, help="tasks per meta-step (0: the recipe's)")
    ap.add_argument("--rows", type=int, default=0, help="rows per pass (0: the recipe's)")


def recipe_config(args: argparse.Namespace) -> RecipeConfig:
    """The recipe's defaults, with ``--meta-batch`` tasks and ``--rows`` rows per pass if given."""
    cfg = RecipeConfig()
    sampler = cfg.sampler
    if args.meta_batch:
        sampler = dataclasses.replace(sampler, meta_batch_size=args.meta_batch)
    if args.rows:
        sampler = dataclasses.replace(sampler, micro_batch_size=args.rows)
    return dataclasses.replace(cfg, sampler=sampler)


def model_name(args: argparse.Namespace) -> str:
    return "tiny" if args.tiny else "random SmolLM2-135M shape" if args.random else "SmolLM2-135M"


def model_config(args: argparse.Namespace, dtype: str) -> ModelConfig:
    """The model section a benchmark builds its model from (see :func:`add_model_arguments`)."""
    if args.tiny:
        return ModelConfig(dtype=dtype, tiny=True, tokenizer="bytes")  # type: ignore[arg-type]
    if args.random:
        return ModelConfig(dtype=dtype, tiny=True, tokenizer="bytes", **SMOLLM2_SHAPE)  # type: ignore[arg-type]
    return ModelConfig(dtype=dtype)  # type: ignore[arg-type]


def build_lora_model(args: argparse.Namespace, dtype: str, lora: LoraConfig
                     ) -> tuple[torch.nn.Module, list[torch.nn.Parameter], object]:
    """The benchmark's model in ``dtype`` with a LoRA adapter (r=4 for ``--tiny``), on
    ``args.device``, in train mode; returns ``(model, adapter parameters, tokenizer)``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    base, tok = build_model_and_tokenizer(model_config(args, dtype))
    model = add_lora(base, LoraConfig(r=4) if args.tiny else lora, seed=0).to(args.device).train()
    return model, [p for p in model.parameters() if p.requires_grad], tok


def give_trained_scale(params: Sequence[torch.Tensor], seed: int = 1) -> None:
    """Fills the adapter with values of a trained one's scale (normal, std 0.02, from ``seed``):
    LoRA B is zero at init, and a zero B would leave A without a gradient."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def trained_model_and_tasks(args: argparse.Namespace, cfg: RecipeConfig) -> tuple[torch.nn.Module, list[torch.nn.Parameter], Any, Any]:
    """The benchmark's model with an adapter of a trained one's scale (:func:`give_trained_scale`)
    and the recipe's task set for ``cfg``; returns ``(model, adapter parameters, tokenizer, suite)``."""
    from fmmeta.tasks.config import build_task_set

    model, params, tok = build_lora_model(args, args.dtype, cfg.lora)
    give_trained_scale(params)
    return model, params, tok, build_task_set(cfg.tasks, tok, seed=0)


def recipe_plans(tasks: Sequence[Any], cfg: RecipeConfig, algorithm: Any, steps: int) -> list[RankPlan]:
    """The first ``steps`` meta-batches the recipe's sampler (one rank, seed 0) plans for
    ``algorithm`` from ``tasks``: the work a benchmark times as a run would."""
    sampler = CostAwareSampler(tasks, cfg.sampler, world_size=1, seed=0, support_draws=algorithm.support_draws,
                               support_repeats=algorithm.support_repeats)
    return [sampler.sample(step).for_rank(0) for step in range(steps)]


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters outside the embedding and LM head (a model's size as printed; FLOPs are
    counted by :class:`PassCounter`)."""
    return sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)


def synchronize() -> None:
    """Waits for queued GPU work (a no-op on a CPU), so a wall-clock time covers it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def median_times(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median wall seconds of each function, runs interleaved (rotating order) after a warm-up."""
    for fn in fns.values():
        fn()
    synchronize()
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(reps):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            synchronize()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def matmul_peak(hidden: int, inner: int, tokens: int, dtype: torch.dtype, reps: int,
                device: str = "cpu") -> float:
    """FLOP/s of ``[tokens, hidden] @ [hidden, inner]`` in ``dtype`` on ``device`` (the model's
    MLP shape at ``tokens`` rows: the rate this model's largest matmuls can reach there)."""
    a = torch.randn(tokens, hidden, dtype=dtype, device=device)
    b = torch.randn(hidden, inner, dtype=dtype, device=device)
    t = median_times({"mm": lambda: [a @ b for _ in range(10)]}, reps)["mm"]
    return 10 * 2 * tokens * hidden * inner / t


class PassCounter:
    """The model's forward passes since the reset, as :class:`fmmeta.flops.PassSize` pieces read
    from what each forward was given (a pass with gradient enabled is counted with its backward),
    and their FLOPs by :func:`fmmeta.flops.pass_flops` on the model's shape, read once here
    (before the counting hook, so that forward is not counted)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.shape = model_shape(model)
        self.reset()
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module: object, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        # kept as tensors where they come from tensors: read after the timed runs, not synchronised here
        self._passes.append((int(ids.numel()), attended_keys(ids, kwargs.get("position_ids")),
                             head_positions(ids, kwargs.get("logits_to_keep")), torch.is_grad_enabled()))
        self.tokens["adapt" if torch.is_grad_enabled() else "score"] += int(ids.numel())

    def passes(self) -> list[PassSize]:
        """The passes since the reset."""
        return [PassSize(tokens, int(keys), int(head), backward) for tokens, keys, head, backward in self._passes]

    def model_flops(self) -> int:
        """The FLOPs of the passes since the reset (:func:`fmmeta.flops.pass_flops`)."""
        return sum(pass_flops(self.shape, p) for p in self.passes())

    def reset(self) -> None:
        """Counts from zero (the passes seen so far are dropped)."""
        self.tokens = {"adapt": 0, "score": 0}
        self._passes: list[tuple[int, torch.Tensor | int, torch.Tensor | int, bool]] = []


def relative_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
    """Global relative L2 error of ``a`` against ``b``, and their cosine."""
    fa = torch.cat([t.float().flatten().cpu() for t in a])
    fb = torch.cat([t.float().flatten().cpu() for t in b])
    return float((fa - fb).norm() / fb.norm()), float(fa @ fb / (fa.norm() * fb.norm()))
