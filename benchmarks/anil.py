"""Benchmark: what ANIL's inner step costs against FOMAML's, on the same meta-batch and model.

ANIL adapts only the top ``--layers`` decoder layers' adapter tensors in its inner loop, and the
other tensors stop requiring grad while it runs, so a support pass records no graph below the
lowest adapted layer: its backward covers ``--layers`` layers instead of all of them, while the
forward is the same. This measures how much of an inner step that saves on the default run's
first meta-batch (the recipe's sampler, one rank) and model: one inner step over every support
pass (:func:`~fmmeta.algorithms.inner_loop.adapt_tasks`, ``steps=1``, fresh fast weights each
time) and a whole meta-step (``rank_gradient``: the inner steps, then the query passes, which
both methods run over every tensor). The two methods alternate (rotating order, after a warm-up;
medians). Prints a line per figure and, as the last line, one JSON object:

* ``inner_step_s`` and ``meta_step_s``: median wall seconds per method;
* ``inner_step_ratio`` / ``meta_step_ratio``: ANIL's over FOMAML's (below 1: ANIL is cheaper);
* ``layers`` (adapted by ANIL) of ``model_layers``, and the adapted share of the adapter tensors.

Usage:
    python benchmarks/anil.py [--tiny | --random] [--threads 1] [--reps 5] [--layers 2]
                              [--dtype auto|bfloat16|float32]
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
    add_dtype_argument,
    add_model_arguments,
    add_pass_arguments,
    compute_dtype,
    median_times,
    model_name,
    recipe_config,
    recipe_plans,
    trained_model_and_tasks,
)

from fmmeta.algorithms.build import build_algorithm  # noqa: E402
from fmmeta.algorithms.config import ANILConfig  # noqa: E402
from fmmeta.algorithms.inner_loop import adapt_tasks, only_adapting  # noqa: E402
from fmmeta.algorithms.protocol import RankWork  # noqa: E402
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_pass_arguments(ap)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2, help="top layers ANIL adapts")
    add_dtype_argument(ap)
    args = ap.parse_args()
    compute_dtype(args)
    cfg = recipe_config(args)
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, anil=ANILConfig(layers=args.layers)))
    model, params, tok, suite = trained_model_and_tasks(args, cfg)
    algorithms = {m: build_algorithm(m, cfg.algorithm, tok.pad_token_id) for m in ("fomaml", "anil")}
    # Both run FOMAML's plan: the same passes, so only the tensors the inner loop adapts differ.
    work = algorithms["fomaml"].prepare(recipe_plans(suite.meta_train, cfg, algorithms["fomaml"], 1)[0])
    lora = TaskLoRA(model, params)
    adapted = {m: a.adapted_tensors(model, params) for m, a in algorithms.items()}  # type: ignore[attr-defined]

    def inner_step(method: str, work: RankWork = work) -> None:
        fast = stack_adapters(params, max(work.n_tasks, 1))
        with lora.active(fast), only_adapting(fast, adapted[method]) as weights:
            adapt_tasks(model, weights, work.support, work.support_answers, cfg.algorithm.inner_loop,
                        lora=lora, steps=1)

    inner = median_times({m: (lambda m=m: inner_step(m)) for m in algorithms}, args.reps)
    whole = median_times({m: (lambda a=a: a.rank_gradient(model, params, work)) for m, a in algorithms.items()},
                         args.reps)
    layers = model.base_model.model.config.num_hidden_layers
    share = len(adapted["anil"] or params) / len(params)
    for what, secs in (("inner step", inner), ("meta-step", whole)):
        print(f"{what}: fomaml {secs['fomaml']:.3f}s, anil (top {args.layers} of {layers} layers) "
              f"{secs['anil']:.3f}s: {secs['anil'] / secs['fomaml']:.2f}x")
    print(json.dumps({
        "device": args.device, "model": model_name(args), "dtype": args.dtype, "threads": torch.get_num_threads(),
        "meta_batch_size": cfg.sampler.meta_batch_size, "support_passes": len(work.support),
        "layers": args.layers, "model_layers": layers, "adapted_tensor_share": round(share, 4),
        "inner_step_s": {m: round(s, 4) for m, s in inner.items()},
        "meta_step_s": {m: round(s, 4) for m, s in whole.items()},
        "inner_step_ratio": round(inner["anil"] / inner["fomaml"], 3),
        "meta_step_ratio": round(whole["anil"] / whole["fomaml"], 3),
    }))


if __name__ == "__main__":
    main()
