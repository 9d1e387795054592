"""Benchmark: a meta-step in bf16 against fp32, per method: its gradient's error, its time, its MFU.

On the default run's model (SmolLM2-135M, embedded) and settings (recipe defaults: 4 tasks of the
CLDR suite per meta-step, 4 inner steps at lr 0.1 clipped to 1.0, passes of up to 32 rows), with
``--tiny`` on a small random model (what ``make test`` runs), or with ``--random`` on random
weights of SmolLM2-135M's shape; ``--device cuda`` on a GPU, ``--meta-batch`` and ``--rows`` for
the bigger passes a GPU needs. For every method the same meta-batch goes through three
variants of the same weights, each time from the same adapter:

* ``float32``: the fp32 model;
* ``bfloat16``: the model in bf16 (what ``model.dtype=bfloat16`` runs): forward and backward in
  bf16, while fast weights, moments and sums stay fp32 (``fmmeta.models.precision``);
* ``autocast``: the fp32 model under ``torch.autocast(device, torch.bfloat16)``, the alternative
  (bf16 matmuls, fp32 weights), measured so the choice between the two rests on a number.

Prints a few human lines and, as the last line, one JSON object with, per method:

* ``grad_rel_error`` / ``cosine``: ``|g - g_fp32| / |g_fp32|`` over all adapter tensors of the
  rank's meta-gradient (FOMAML/Meta-SGD: query gradients at phi; Reptile: theta - phi;
  multi-task and MetaICL: their loss gradients), and the cosine, per bf16 variant.
* ``seconds``: median wall seconds of the gradient computation per variant (runs interleaved);
  ``bf16_speedup`` and ``autocast_speedup``: fp32 seconds over theirs.
* ``tokens_per_s``, ``model_flops_per_s`` and ``mfu``: tokens (padding included) per second;
  the passes' FLOPs (``fmmeta/flops.py``: the frozen base's forward and its backward to the
  inputs, the adapters', causal attention, the LM head at answer positions; until 2026-12-07,
  6 x non-embedding parameters x tokens of the forward + backward passes, 2 x of the forward-only
  ones) per second; over the FLOP/s of a matmul of the model's MLP shape in the compute dtype,
  measured on the same device in this run (``peak_flops_per_s``).

Usage:
    python benchmarks/precision.py [--tiny | --random] [--device cuda] [--reps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (benchmarks/common.py)
    PassCounter,
    add_model_arguments,
    add_pass_arguments,
    build_lora_model,
    give_trained_scale,
    matmul_peak,
    median_times,
    model_name,
    recipe_config,
    recipe_plans,
    relative_error,
)

from fmmeta.algorithms.build import ALGORITHMS, build_algorithm  # noqa: E402
from fmmeta.tasks.config import build_task_set  # noqa: E402

VARIANTS = {"float32": "float32", "bfloat16": "bfloat16", "autocast": "float32"}
"""Each variant's model dtype (autocast computes in bf16 over the fp32 model)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_pass_arguments(ap)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=list(ALGORITHMS))
    args = ap.parse_args()
    cfg = recipe_config(args)
    built = {dt: build_lora_model(args, dt, cfg.lora) for dt in ("float32", "bfloat16")}
    tok = built["float32"][2]
    give_trained_scale(built["float32"][1])
    with torch.no_grad():  # the same adapter in both
        for p32, p16 in zip(built["float32"][1], built["bfloat16"][1]):
            p16.copy_(p32)
    suite = build_task_set(cfg.tasks, tok, seed=0)
    hf = built["float32"][0].base_model.model.config
    peak = {dt: matmul_peak(hf.hidden_size, hf.intermediate_size, 512, getattr(torch, dt), args.reps,
                            args.device) for dt in built}
    counters = {dt: PassCounter(built[dt][0]) for dt in built}
    device_type = torch.device(args.device).type

    def gradient(variant: str, algorithm: object, work: object) -> list[torch.Tensor]:
        model, params, _ = built[VARIANTS[variant]]
        ctx = (torch.autocast(device_type, dtype=torch.bfloat16) if variant == "autocast"
               else contextlib.nullcontext())
        with ctx:
            return algorithm.rank_gradient(model, params, work).grads  # type: ignore[attr-defined]

    out: dict[str, dict] = {}
    for method in args.methods:
        algorithm = build_algorithm(method, cfg.algorithm, tok.pad_token_id)
        work = algorithm.prepare(recipe_plans(suite.meta_train, cfg, algorithm, 1)[0])
        grads = {v: gradient(v, algorithm, work) for v in VARIANTS}
        errors = {v: relative_error(grads[v], grads["float32"]) for v in VARIANTS if v != "float32"}
        secs = median_times({v: (lambda v=v: gradient(v, algorithm, work)) for v in VARIANTS}, args.reps)
        flops, tokens = {}, {}
        for v, dt in VARIANTS.items():
            counters[dt].reset()
            gradient(v, algorithm, work)
            tokens[v] = sum(counters[dt].tokens.values()) / secs[v]
            flops[v] = counters[dt].model_flops() / secs[v]
        mfu = {v: flops[v] / peak["float32" if v == "float32" else "bfloat16"] for v in VARIANTS}
        out[method] = {
            "grad_rel_error": round(errors["bfloat16"][0], 4), "cosine": round(errors["bfloat16"][1], 5),
            "autocast_grad_rel_error": round(errors["autocast"][0], 4),
            "autocast_cosine": round(errors["autocast"][1], 5),
            "seconds": {v: round(s, 4) for v, s in secs.items()},
            "bf16_speedup": round(secs["float32"] / secs["bfloat16"], 2),
            "autocast_speedup": round(secs["float32"] / secs["autocast"], 2),
            "tokens_per_s": {v: round(t) for v, t in tokens.items()},
            "model_flops_per_s": {v: round(f) for v, f in flops.items()},
            "mfu": {v: round(m, 3) for v, m in mfu.items()},
        }
        print(f"{method}: bf16 gradient error {errors['bfloat16'][0]:.2%} (autocast "
              f"{errors['autocast'][0]:.2%}); {secs['float32']:.3f}s fp32 -> {secs['bfloat16']:.3f}s "
              f"bf16, {secs['autocast']:.3f}s autocast; MFU fp32 {mfu['float32']:.3f}, bf16 "
              f"{mfu['bfloat16']:.3f}, autocast {mfu['autocast']:.3f}")
    print(json.dumps({"device": args.device, "model": model_name(args),
                      "threads": torch.get_num_threads(), "tiny": args.tiny,
                      "meta_batch_size": cfg.sampler.meta_batch_size,
                      "rows_per_pass": cfg.sampler.micro_batch_size,
                      "peak_flops_per_s": {dt: round(v) for dt, v in peak.items()},
                      "methods": out}))


if __name__ == "__main__":
    main()
