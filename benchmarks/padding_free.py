"""Benchmark: a meta-step's passes padded against padding-free lines (``algorithm.padding_free``).

On the default run's model (SmolLM2-135M, embedded) and settings (recipe defaults: 4 tasks of the
CLDR suite per meta-step, passes of up to 32 rows), with ``--tiny`` on a small random model (what
``make test`` runs), or with ``--random`` on random weights of SmolLM2-135M's shape; ``--device
cuda`` on a GPU, ``--meta-batch`` and ``--rows`` for the bigger passes a GPU needs, ``--attn`` for
the attention implementations to try (``sdpa`` is the library's own choice for the dtype; others,
such as ``flex_attention`` or ``flash_attention_2``, are set on the model and first probed with
:func:`fmmeta.algorithms.answer_loss.check_lines`: one that lets packed examples see each other is
reported as refused, not measured), ``--dtypes`` (fp32, and bf16 where the device has it natively,
by default). For every dtype, attention and method the same meta-batches are
collated both ways: each pass padded to its longest row, and packed into padding-free lines
(``fmmeta.tasks.lines``: examples end to end, positions restarting, LoRA routed per token). Prints
a few human lines and, as the last line, one JSON object with, per dtype, method (and attention
other than sdpa, as ``method@attn``):

* ``padding_efficiency``: real / processed tokens of the rank's passes, each layout.
* ``seconds``: median wall seconds of the rank's meta-gradient (every sampled meta-batch), runs
  interleaved; ``speedup`` = padded / padding-free (above 1: padding-free is faster);
  ``real_tokens_per_s``: the real (non-pad) tokens of the passes per second, each layout.
* ``grad_rel_error``: ``|g_lines - g_padded| / |g_padded|`` over the adapter's meta-gradient (the
  same arithmetic up to float rounding: ~1e-6 in fp32).

Usage:
    python benchmarks/padding_free.py [--tiny | --random] [--device cuda] [--attn sdpa flex_attention]
        [--reps 3] [--steps 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (benchmarks/common.py)
    add_model_arguments,
    add_pass_arguments,
    build_lora_model,
    median_times,
    model_name,
    native_dtypes,
    recipe_config,
    recipe_plans,
    relative_error,
)

from fmmeta.algorithms.answer_loss import check_lines  # noqa: E402
from fmmeta.algorithms.build import build_algorithm  # noqa: E402
from fmmeta.recipe_config import RecipeConfig  # noqa: E402
from fmmeta.tasks.config import build_task_set  # noqa: E402

LAYOUTS = ("padded", "lines")


def tokens(works: list, padded: bool) -> int:
    """Real (or processed) tokens over every pass of the works (dummy passes excluded)."""
    batches = [p.batch for w in works for p in [*w.support, *w.query] if p is not None]
    return sum(b.n_padded_tokens if padded else b.n_tokens for b in batches)


def measure(model: torch.nn.Module, params: list, method: str, suite: object, cfg: RecipeConfig,
            pad_id: int, args: argparse.Namespace) -> dict:
    """One method on one model: both layouts of the same meta-batches, side by side."""
    algos = {layout: build_algorithm(method, dataclasses.replace(cfg.algorithm, padding_free=layout == "lines"),
                                     pad_id) for layout in LAYOUTS}
    plans = recipe_plans(suite.meta_train, cfg, algos["padded"], args.steps)  # type: ignore[attr-defined]
    works = {layout: [algos[layout].prepare(plan) for plan in plans] for layout in LAYOUTS}

    def run(layout: str) -> list[torch.Tensor]:
        total: list[torch.Tensor] | None = None
        for work in works[layout]:
            grads = algos[layout].rank_gradient(model, params, work).grads
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        assert total is not None
        return total

    err, _ = relative_error(run("lines"), run("padded"))
    secs = median_times({layout: (lambda layout=layout: run(layout)) for layout in LAYOUTS}, args.reps)
    real = tokens(works["padded"], padded=False)
    return {"padding_efficiency": {layout: round(real / max(tokens(works[layout], padded=True), 1), 3)
                                   for layout in LAYOUTS},
            "seconds": {layout: round(s, 4) for layout, s in secs.items()},
            "real_tokens_per_s": {layout: round(real / s) for layout, s in secs.items()},
            "speedup": round(secs["padded"] / secs["lines"], 3), "grad_rel_error": float(f"{err:.3g}")}


def set_attention(model: torch.nn.Module, attn: str, built_with: str) -> str | None:
    """Switches the model to ``attn`` (``sdpa``: the implementation it was built with) and probes
    that lines stay apart under it; returns why it cannot be measured, or None."""
    try:
        model.base_model.model.set_attn_implementation(  # type: ignore[operator, union-attr]
            built_with if attn == "sdpa" else attn)
        check_lines(model)
    except Exception as err:  # noqa: BLE001  (reported in the JSON, not measured)
        return f"{type(err).__name__}: {str(err)[:300]}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_pass_arguments(ap)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="meta-batches per measurement")
    ap.add_argument("--dtypes", nargs="+", help="default: fp32, and bf16 where --device has it natively")
    ap.add_argument("--methods", nargs="+", default=["fomaml", "multitask", "metaicl"])
    ap.add_argument("--attn", nargs="+", default=["sdpa"], help="attention implementations to try")
    args = ap.parse_args()
    cfg = recipe_config(args)
    out: dict[str, dict] = {}
    refused: dict[str, str] = {}
    for dt in args.dtypes or native_dtypes(args.device):
        model, params, tok = build_lora_model(args, dt, cfg.lora)
        suite = build_task_set(cfg.tasks, tok, seed=0)
        built_with = model.base_model.model.config._attn_implementation  # type: ignore[union-attr]
        out[dt] = {}
        for attn in args.attn:
            why = set_attention(model, attn, built_with)
            if why is not None:
                refused[f"{dt}/{attn}"] = why
                print(f"{dt} {attn}: not measured ({why})")
                continue
            for method in args.methods:
                key = method if attn == "sdpa" else f"{method}@{attn}"
                try:
                    row = out[dt][key] = measure(model, params, method, suite, cfg, tok.pad_token_id, args)
                except Exception as err:
                    if attn == "sdpa":  # the library's own path must work
                        raise
                    refused[f"{dt}/{key}"] = f"{type(err).__name__}: {str(err)[:300]}"
                    print(f"{dt} {key}: failed ({refused[f'{dt}/{key}']})")
                    continue
                eff = row["padding_efficiency"]
                print(f"{dt} {key}: padding efficiency {eff['padded']:.3f} -> {eff['lines']:.3f}; "
                      f"{row['seconds']['padded']:.3f}s padded, {row['seconds']['lines']:.3f}s padding-free "
                      f"({row['speedup']:.2f}x); gradient error {row['grad_rel_error']:.2e}")
    print(json.dumps({"device": args.device, "model": model_name(args), "threads": torch.get_num_threads(),
                      "tiny": args.tiny, "steps": args.steps, "meta_batch_size": cfg.sampler.meta_batch_size,
                      "rows_per_pass": cfg.sampler.micro_batch_size, "results": out, "refused": refused}))


if __name__ == "__main__":
    main()
