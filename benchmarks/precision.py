"""Benchmark: a meta-step in bf16 against fp32, per method: its gradient's error, its time, its MFU.

On the default run's model (SmolLM2-135M, embedded) and settings (recipe defaults: 4 tasks of the
CLDR suite per meta-step, 4 inner steps at lr 0.1 clipped to 1.0, passes of up to 32 rows), or
with ``--tiny`` on a small random model (what ``make test`` runs). For every method the same
meta-batch goes through the fp32 model and the bf16 model (same weights, rounded), each time from
the same adapter; the bf16 model computes its forward and backward in bf16 while fast weights,
moments and sums stay fp32 (``fmmeta.models.precision``). Prints a few human lines and, as the
last line, one JSON object with, per method:

* ``grad_rel_error``: ``|g_bf16 - g_fp32| / |g_fp32|`` over all adapter tensors of the rank's
  meta-gradient (FOMAML/Meta-SGD: query gradients at phi; Reptile: theta - phi; multi-task and
  MetaICL: their loss gradients); ``cosine`` the cosine between the two.
* ``seconds``: median wall seconds of the gradient computation in each dtype (runs
  interleaved), ``bf16_speedup`` their ratio.
* ``model_flops_per_s`` and ``mfu``: 6 x non-embedding parameters x tokens (padding included) of
  the forward + backward passes, 2 x of the forward-only ones, per second, over the FLOP/s of a
  matmul of the model's shapes in the same dtype measured in this run (``peak_flops_per_s``).

Usage:
    python benchmarks/precision.py [--tiny] [--reps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluation import PassCounter, matmul_peak, median_times  # noqa: E402  (benchmarks/evaluation.py)

from fmmeta.algorithms.build import ALGORITHMS, build_algorithm  # noqa: E402
from fmmeta.config import LoraConfig, ModelConfig  # noqa: E402
from fmmeta.models import add_lora, build_model_and_tokenizer  # noqa: E402
from fmmeta.recipe_config import RecipeConfig  # noqa: E402
from fmmeta.sampling.sampler import CostAwareSampler  # noqa: E402
from fmmeta.tasks.config import build_task_set  # noqa: E402


def relative_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
    """Global relative L2 error of ``a`` against ``b``, and their cosine."""
    fa = torch.cat([t.float().flatten() for t in a])
    fb = torch.cat([t.float().flatten() for t in b])
    return float((fa - fb).norm() / fb.norm()), float(fa @ fb / (fa.norm() * fb.norm()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small random model (a smoke size)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--methods", nargs="+", default=list(ALGORITHMS))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = RecipeConfig()
    tiny = {"tiny": True, "tokenizer": "bytes"} if args.tiny else {}
    built = {}
    for dt in ("float32", "bfloat16"):
        base, tok = build_model_and_tokenizer(ModelConfig(dtype=dt, **tiny))
        model = add_lora(base, LoraConfig(r=4) if args.tiny else cfg.lora, seed=0).train()
        built[dt] = (model, [p for p in model.parameters() if p.requires_grad])
    # the same adapter in both: LoRA B is zero at init, so give it the values of a trained one
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p32, p16 in zip(built["float32"][1], built["bfloat16"][1]):
            p32.copy_(torch.randn(p32.shape, generator=gen) * 0.02)
            p16.copy_(p32)
    suite = build_task_set(cfg.tasks, tok, seed=0)
    non_embedding = sum(p.numel() for n, p in built["float32"][0].named_parameters()
                        if "embed" not in n and "lm_head" not in n)
    hf = built["float32"][0].base_model.model.config
    peak = {dt: matmul_peak(hf.hidden_size, hf.intermediate_size, 512, getattr(torch, dt), args.reps)
            for dt in built}
    counters = {dt: PassCounter(built[dt][0]) for dt in built}
    out: dict[str, dict] = {}
    for method in args.methods:
        algorithm = build_algorithm(method, cfg.algorithm, tok.pad_token_id)
        sampler = CostAwareSampler(suite.meta_train, cfg.sampler, world_size=1, seed=0,
                                   support_draws=algorithm.support_draws,
                                   support_repeats=algorithm.support_repeats)
        work = algorithm.prepare(sampler.sample(0).for_rank(0))
        grads = {dt: algorithm.rank_gradient(m, p, work).grads for dt, (m, p) in built.items()}
        err, cos = relative_error(grads["bfloat16"], grads["float32"])
        secs = median_times({dt: (lambda m=m, p=p: algorithm.rank_gradient(m, p, work))
                             for dt, (m, p) in built.items()}, args.reps)
        flops = {}
        for dt, (m, p) in built.items():
            counters[dt].tokens = {"adapt": 0, "score": 0}
            algorithm.rank_gradient(m, p, work)
            tok_n = counters[dt].tokens
            flops[dt] = (6 * tok_n["adapt"] + 2 * tok_n["score"]) * non_embedding / secs[dt]
        out[method] = {
            "grad_rel_error": round(err, 4), "cosine": round(cos, 5),
            "seconds": {dt: round(s, 3) for dt, s in secs.items()},
            "bf16_speedup": round(secs["float32"] / secs["bfloat16"], 2),
            "model_flops_per_s": {dt: round(f) for dt, f in flops.items()},
            "mfu": {dt: round(flops[dt] / peak[dt], 3) for dt in flops},
        }
        print(f"{method}: bf16 gradient error {err:.2%} (cosine {cos:.4f}); {secs['float32']:.2f}s "
              f"fp32 -> {secs['bfloat16']:.2f}s bf16; MFU fp32 {out[method]['mfu']['float32']:.3f}, "
              f"bf16 {out[method]['mfu']['bfloat16']:.3f}")
    print(json.dumps({"device": "cpu", "threads": torch.get_num_threads(), "tiny": args.tiny,
                      "peak_flops_per_s": {dt: round(v) for dt, v in peak.items()},
                      "methods": out}))


if __name__ == "__main__":
    main()
