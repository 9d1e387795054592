"""Benchmark: a meta-step's passes padded against padding-free lines (``algorithm.padding_free``).

On the default run's model (SmolLM2-135M, embedded) and settings (recipe defaults: 4 tasks of the
CLDR suite per meta-step, passes of up to 32 rows), or with ``--tiny`` on a small random model
(what ``make test`` runs). For every method and compute dtype the same meta-batches are collated
both ways: each pass padded to its longest row, and packed into padding-free lines
(``fmmeta.tasks.lines``: examples end to end, positions restarting, LoRA routed per token). Prints
a few human lines and, as the last line, one JSON object with, per dtype and method:

* ``padding_efficiency``: real / processed tokens of the rank's passes, each layout.
* ``seconds``: median wall seconds of the rank's meta-gradient (every sampled meta-batch), runs
  interleaved; ``speedup`` = padded / padding-free (above 1: padding-free is faster).
* ``grad_rel_error``: ``|g_lines - g_padded| / |g_padded|`` over the adapter's meta-gradient (the
  same arithmetic up to float rounding: ~1e-6 in fp32).

Usage:
    python benchmarks/padding_free.py [--tiny] [--reps 3] [--steps 2] [--threads 1]
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

from evaluation import median_times  # noqa: E402  (benchmarks/evaluation.py)
from precision import relative_error  # noqa: E402  (benchmarks/precision.py)

from fmmeta.algorithms.build import build_algorithm  # noqa: E402
from fmmeta.config import LoraConfig, ModelConfig  # noqa: E402
from fmmeta.models import add_lora, build_model_and_tokenizer  # noqa: E402
from fmmeta.recipe_config import RecipeConfig  # noqa: E402
from fmmeta.sampling.sampler import CostAwareSampler  # noqa: E402
from fmmeta.tasks.config import build_task_set  # noqa: E402

LAYOUTS = ("padded", "lines")


def efficiency(works: list) -> float:
    """Real / processed tokens over every pass of the works (dummy passes excluded)."""
    batches = [p.batch for w in works for p in [*w.support, *w.query] if p is not None]
    return sum(b.n_tokens for b in batches) / max(sum(b.n_padded_tokens for b in batches), 1)


def measure(model: torch.nn.Module, params: list, method: str, suite: object, cfg: RecipeConfig,
            pad_id: int, args: argparse.Namespace) -> dict:
    """One method on one model: both layouts of the same meta-batches, side by side."""
    algos = {layout: build_algorithm(method, dataclasses.replace(cfg.algorithm, padding_free=layout == "lines"),
                                     pad_id) for layout in LAYOUTS}
    sampler = CostAwareSampler(suite.meta_train, cfg.sampler, world_size=1, seed=0,  # type: ignore[attr-defined]
                               support_draws=algos["padded"].support_draws,
                               support_repeats=algos["padded"].support_repeats)
    plans = [sampler.sample(step).for_rank(0) for step in range(args.steps)]
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
    return {"padding_efficiency": {layout: round(efficiency(works[layout]), 3) for layout in LAYOUTS},
            "seconds": {layout: round(s, 3) for layout, s in secs.items()},
            "speedup": round(secs["padded"] / secs["lines"], 3), "grad_rel_error": float(f"{err:.3g}")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small random model (a smoke size)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="meta-batches per measurement")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--methods", nargs="+", default=["fomaml", "multitask", "metaicl"])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = RecipeConfig()
    tiny = {"tiny": True, "tokenizer": "bytes"} if args.tiny else {}
    out: dict[str, dict] = {}
    for dt in args.dtypes:
        base, tok = build_model_and_tokenizer(ModelConfig(dtype=dt, **tiny))
        model = add_lora(base, LoraConfig(r=4) if args.tiny else cfg.lora, seed=0).train()
        params = [p for p in model.parameters() if p.requires_grad]
        suite = build_task_set(cfg.tasks, tok, seed=0)
        out[dt] = {}
        for method in args.methods:
            row = out[dt][method] = measure(model, params, method, suite, cfg, tok.pad_token_id, args)
            eff = row["padding_efficiency"]
            print(f"{dt} {method}: padding efficiency {eff['padded']:.3f} -> {eff['lines']:.3f}; "
                  f"{row['seconds']['padded']:.2f}s padded, {row['seconds']['lines']:.2f}s padding-free "
                  f"({row['speedup']:.2f}x); gradient error {row['grad_rel_error']:.2e}")
    print(json.dumps({"device": "cpu", "threads": torch.get_num_threads(), "tiny": args.tiny,
                      "steps": args.steps, "results": out}))


if __name__ == "__main__":
    main()
