"""What recording the meta-gradient's noise costs a meta-step (the issue's bound: <= 2%).

Every meta-step of FOMAML, Meta-SGD, ANIL and Reptile takes each task's outer-gradient squared
norm before the tasks are summed (:mod:`fmmeta.sampling.noise_scale`). This times the recipe's
meta-step (the default run's first meta-batches, the default model) with it and without it, the
two interleaved in one process (:func:`common.median_times`), on a local engine; ``overhead`` is
the ratio of the medians less one. "Without" is the same code with the per-task norm returning
nothing, so the meta-step records no statistics and runs no extra all-reduce.

Usage:
    python benchmarks/noise_scale.py [--method fomaml] [--reps 5] [--threads 1]
    python benchmarks/noise_scale.py --tiny       # a random tiny model: seconds

The last line of output is one JSON object with the measurements.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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

import fmmeta.algorithms.first_order as first_order  # noqa: E402
from fmmeta.algorithms.build import build_algorithm  # noqa: E402
from fmmeta.algorithms.meta_step import meta_step  # noqa: E402
from fmmeta.engine.local import LocalEngine  # noqa: E402
from fmmeta.sampling.plan import MetaBatchPlan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_pass_arguments(ap)
    add_dtype_argument(ap)
    ap.add_argument("--method", default="fomaml", choices=["fomaml", "metasgd", "anil", "reptile"])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    compute_dtype(args)
    cfg = recipe_config(args)
    model, params, tok, suite = trained_model_and_tasks(args, cfg)
    algorithm = build_algorithm(args.method, cfg.algorithm, tok.pad_token_id)
    rank = recipe_plans(suite.meta_train, cfg, algorithm, 1)[0]
    plan = MetaBatchPlan(step=0, ranks=(rank,), n_real_tasks=len(rank.slots))
    work = algorithm.prepare(rank)
    engine = LocalEngine(model, cfg.optim)
    recorded = first_order.task_sq_norms
    seen: dict[str, object] = {}

    def step(on: bool) -> None:
        first_order.task_sq_norms = recorded if on else (lambda per_task, n: None)  # type: ignore[assignment]
        try:
            seen[str(on)] = meta_step(engine, algorithm, plan, work).outer.get("grad_task_sq")
        finally:
            first_order.task_sq_norms = recorded

    times = median_times({"on": lambda: step(True), "off": lambda: step(False)}, args.reps)
    assert seen["True"] is not None and seen["False"] is None  # each side ran as named
    print(json.dumps({
        "model": model_name(args), "dtype": args.dtype, "method": args.method, "tasks": len(rank.slots),
        "meta_step_s_on": round(times["on"], 4), "meta_step_s_off": round(times["off"], 4),
        "overhead": round(times["on"] / times["off"] - 1, 4), "threads": args.threads,
    }))


if __name__ == "__main__":
    main()
