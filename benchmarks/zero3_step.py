"""Benchmark: real FOMAML meta-steps on 2 DeepSpeed ZeRO-3 ranks: one task per pass, packed passes, rows across ranks.

Under ZeRO-3 every forward and backward all-gathers each layer's parameters, so ranks wait for each
other inside every pass: a meta-step costs about the sum over passes of the slowest rank's pass.
This runs the three plans of the *same* episodes, step after step on the same engine, and times them:

* ``one_task_per_pass``: the plan before packing (``benchmarks/one_task.py``:
  equal task counts, balanced per-rank totals, each pass one task's micro-batch of
  ``--micro-batch`` rows);
* ``packed``: the sampler's plan with whole tasks per rank (``fmmeta.sampling.plan_meta_batch``:
  tasks balanced by work, several tasks per pass, every pass index about equally full on both ranks);
* ``rows``: rows across ranks (``fmmeta.sampling.plan_rows_across_ranks``): both ranks hold every
  task, each runs a share of every task's rows, and every inner step all-reduces the stacked
  inner gradients.

Per pool (``lognormal`` and ``bimodal`` from ``fmmeta.sampling.synthetic``) it reports the median
wall seconds of a meta-step (barrier to barrier, the slowest rank), ``speedup`` = one-task-per-pass
time / packed time and ``rows_speedup`` = packed time / rows time, and beside each what the
project's cost model predicts (``predicted_*``: ratios of the plans' lockstep prices, the rows
plan's all-reduces included), so model and measurement can be compared.

It also measures what the cost model's all-reduce price ``r`` should be here: the seconds of one
gloo all-reduce of the stacked inner gradients (``allreduce_s_per_mfloat``) over the seconds one
cost-model unit (a token-equivalent) takes in the packed meta-steps (``s_per_cost_unit``):
``r_measured`` (the default model's ``r`` is printed beside it), and
``predicted_rows_speedup_measured_r`` reprices the rows plan with it.

Steps rotate which plan runs first. Run it on a quiet machine: two ranks on two cores are easily
slowed by anything else running.

Usage: ``python benchmarks/zero3_step.py [--steps 6] [--tasks-per-rank 4] [--pools bimodal] [--cost-a 200]``; it
launches itself with ``deepspeed --num_gpus 2`` (CPU, gloo). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="timed meta-steps per pool (after 1 warm-up)")
    ap.add_argument("--tasks-per-rank", type=int, default=4)
    ap.add_argument("--inner-steps", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=4, help="rows per pass of the one-task plan")
    ap.add_argument("--median-length", type=float, default=48.0, help="median sequence length (tokens)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--cost-a", type=float, default=None,
                    help="the cost model's per-pass overhead for every plan (default: the model's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pools", nargs="+", default=["lognormal", "bimodal"], choices=["lognormal", "bimodal"])
    ap.add_argument("--out", help=argparse.SUPPRESS)  # set by the launching process
    ap.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _launch(argv: list[str]) -> None:
    """Runs this file under ``deepspeed --num_gpus 2`` and prints the workers' result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        cmd = [str(Path(sys.executable).with_name("deepspeed")), "--num_gpus", "2", __file__, *argv,
               "--out", str(out)]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            sys.exit(f"zero3_step workers failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result = json.loads(out.read_text())
    for pool, r in result["pools"].items():
        print(f"{pool:>10}: one task per pass {r['one_task_per_pass_s']:.3f} s, packed {r['packed_s']:.3f} s "
              f"-> speedup {r['speedup']:.2f} (cost model predicts {r['predicted_speedup']:.2f}); rows "
              f"{r['rows_s']:.3f} s -> {r['rows_speedup']:.2f} over packed (predicts {r['predicted_rows_speedup']:.2f}, "
              f"{r['predicted_rows_speedup_measured_r']:.2f} with r_measured)",
              file=sys.stderr)
    print(f"all-reduce {result['allreduce_s_per_mfloat'] * 1e3:.1f} ms per million floats = "
          f"{result['r_measured']:.2f} cost units (the default model's r: {result['r_default']})", file=sys.stderr)
    print(json.dumps(result))


def _worker(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from benchmarks.one_task import plan_one_task_per_pass
    from fmmeta.algorithms.build import build_algorithm
    from fmmeta.algorithms.config import AlgorithmConfig
    from fmmeta.algorithms.meta_step import meta_step
    from fmmeta.engine.deepspeed_engine import DeepSpeedEngine
    from fmmeta.engine.distributed import init_distributed
    from fmmeta.engine.optim import OuterOptimConfig
    from fmmeta.sampling import CostAwareSampler, CostModel, SamplerConfig, plan_cost, plan_rows_across_ranks
    from fmmeta.sampling.synthetic import bimodal_pool, lognormal_pool

    torch.set_num_threads(1)
    rank, _, world = init_distributed("gloo", 120.0, sys.argv[1:])
    engine = DeepSpeedEngine(_model(args), OuterOptimConfig(outer_lr=1e-4),
                             json.loads((REPO / "ds_configs" / "zero3.json").read_text()), precision="fp32")
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=args.inner_steps, inner_lr=1e-2), pad_id=0)
    cost_model = CostModel() if args.cost_a is None else CostModel(a=args.cost_a)
    pools = {
        "lognormal": lambda: lognormal_pool(200, seed=args.seed, median_length=args.median_length),
        "bimodal": lambda: bimodal_pool(200, seed=args.seed, short_length=args.median_length / 2,
                                        long_length=args.median_length * 5),
    }
    cfg = SamplerConfig(meta_batch_size=world * args.tasks_per_rank, micro_batch_size=args.micro_batch,
                        placement="tasks", cost_a=cost_model.a)
    numel = sum(p.numel() for p in engine.adapter_parameters())
    n_floats = cfg.meta_batch_size * numel  # the stacked inner gradients of one inner step
    flat = torch.zeros(n_floats)
    reduce_s = []
    for _ in range(6):
        engine.barrier()
        t0 = time.perf_counter()
        engine.all_reduce_sum(flat)
        reduce_s.append(max(engine.all_gather_object(time.perf_counter() - t0)))
    unit_s: list[float] = []
    result: dict = {"world_size": world, "tasks_per_rank": args.tasks_per_rank,
                    "inner_steps": args.inner_steps, "model": {"hidden": args.hidden, "layers": args.layers},
                    "steps": args.steps, "pools": {}}
    for name in args.pools:
        sampler = CostAwareSampler(pools[name](), cfg, world_size=world, seed=args.seed,
                                   support_repeats=args.inner_steps)
        times: dict[str, list[float]] = {"packed": [], "one_task_per_pass": [], "rows": []}
        predicted: dict[str, list[float]] = {"packed": [], "one_task_per_pass": [], "rows": []}
        passes_price: dict[str, list[float]] = {"packed": [], "one_task_per_pass": [], "rows": []}
        for step in range(args.steps + 1):
            packed = sampler.sample(step)
            slots = packed.slots
            eps, ids = [s.episode for s in slots], [s.task_id for s in slots]
            budget = args.micro_batch * max(x.n_tokens for e in eps for x in (*e.support, *e.query))
            plans = {
                "packed": packed,
                "one_task_per_pass": plan_one_task_per_pass(
                    eps, ids, step=step, world_size=world, micro_batch_size=args.micro_batch,
                    support_repeats=args.inner_steps, cost_model=cost_model, rng=np.random.default_rng([args.seed, step])),
                "rows": plan_rows_across_ranks(eps, ids, step=step, world_size=world, budget=budget,
                                               cost_model=cost_model, rng=np.random.default_rng([args.seed, step])),
            }
            order = [list(plans)[(i + step) % len(plans)] for i in range(len(plans))]  # rotate who runs first
            for key in order:
                engine.barrier()
                t0 = time.perf_counter()
                meta_step(engine, algo, plans[key])
                engine.barrier()
                seconds = max(engine.all_gather_object(time.perf_counter() - t0))
                if step > 0:  # step 0 warms up allocators and ZeRO-3's parameter trace
                    times[key].append(seconds)
                    passes = plan_cost(plans[key], support_repeats=args.inner_steps, cost_model=cost_model,
                                       fast_weight_numel=0)
                    price = plan_cost(plans[key], support_repeats=args.inner_steps, cost_model=cost_model,
                                      fast_weight_numel=numel)
                    predicted[key].append(price)
                    passes_price[key].append(passes)
                    if key == "packed":
                        unit_s.append(seconds / price)
        one, pk, rw = (statistics.median(times[k]) for k in ("one_task_per_pass", "packed", "rows"))
        mean = {k: statistics.mean(v) for k, v in predicted.items()}
        result["pools"][name] = {
            "one_task_per_pass_s": one,
            "packed_s": pk,
            "rows_s": rw,
            "speedup": one / pk,
            "predicted_speedup": mean["one_task_per_pass"] / mean["packed"],
            "rows_speedup": pk / rw,
            "predicted_rows_speedup": mean["packed"] / mean["rows"],
            # the rows plan's passes alone and its all-reduces in floats, to reprice with r_measured
            "rows_pass_price": statistics.mean(passes_price["rows"]),
            "packed_price": mean["packed"],
            "passes_per_step": {k: len(p.for_rank(0).support) * args.inner_steps + len(p.for_rank(0).query)
                                for k, p in plans.items()},
        }
    result["allreduce_s_per_mfloat"] = statistics.median(reduce_s[1:]) / (n_floats / 1e6)
    result["s_per_cost_unit"] = statistics.median(unit_s)
    result["r_measured"] = result["allreduce_s_per_mfloat"] / result["s_per_cost_unit"]
    result["r_default"] = CostModel().r
    reduce_units = args.inner_steps * n_floats / 1e6 * result["r_measured"]
    for r in result["pools"].values():
        r["predicted_rows_speedup_measured_r"] = r.pop("packed_price") / (r.pop("rows_pass_price") + reduce_units)
    result["adapter_numel"] = numel
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(result))
    engine.barrier()


def _model(args: argparse.Namespace):
    """A random Llama + LoRA (r=8 on q, v), weights from our own generator (same on both ranks)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=2048, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                      num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                      num_key_value_heads=max(1, args.hidden // 64), max_position_embeddings=2048)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                              target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn(p.shape, generator=gen) * 0.02)
    return model


if __name__ == "__main__":
    parsed = _args(sys.argv[1:])
    if parsed.local_rank is not None:  # the deepspeed launcher passes it to each worker
        _worker(parsed)
    else:
        _launch(sys.argv[1:])
