"""Benchmark: host memory per rank under DeepSpeed ZeRO-3 with the base built partitioned.

Builds a random Llama of a few hundred million parameters (by default hidden 1024, 18 layers,
SmolLM2's vocabulary of 49152: 332M parameters, 1.33 GB in fp32) the way ``recipes/train.py`` does
(``partitioned_build`` + ``build_model_and_tokenizer`` + ``add_lora`` + the DeepSpeed engine), then
runs FOMAML meta-steps on short random episodes, under ``deepspeed --num_gpus N`` on CPU for
N = 1 and 2. Each rank reports:

* ``peak_rss_bytes``: the process's peak resident memory (``getrusage`` ``ru_maxrss``), which
  includes Python, torch, transformers and DeepSpeed themselves;
* ``held_bytes_after_build`` / ``held_bytes_after_steps``: bytes of parameters this rank holds
  (its ZeRO-3 partitions plus whatever is gathered whole: the LoRA adapter and the small
  parameters under DeepSpeed's persistence threshold), next to the whole model's bytes.

The target is ``peak_rss_bytes <= model_bytes / N + 1.5 GB`` for every rank; ``--compare-whole`` adds the
old way (the base built whole on every rank, then wrapped) for comparison. The last stdout line is
one JSON object with every figure.

``--model`` measures a real checkpoint instead (for instance ``--model smollm2``, the embedded GGUF
file, which transformers de-quantizes whole on every rank before partitioning it).

Usage:
    python benchmarks/memory.py [--ranks 1 2] [--layers 18] [--hidden 1024] [--compare-whole]
    python benchmarks/memory.py --model smollm2 --ranks 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OVERHEAD_BYTES = 1.5e9
"""Allowed per-rank overhead over ``model_bytes / ranks`` (the issue's target)."""
GB = 1e9


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def model_config(args: argparse.Namespace) -> Any:
    from fmmeta.config import ModelConfig

    if args.model:
        return ModelConfig(name_or_path=args.model)
    return ModelConfig(
        tiny=True, tokenizer="bytes", tiny_vocab_size=args.vocab, tiny_hidden_size=args.hidden,
        tiny_intermediate_size=args.intermediate, tiny_num_layers=args.layers,
        tiny_num_heads=args.hidden // 64, tiny_num_kv_heads=args.hidden // 64, tiny_seed=0,
    )


def build_plan(step: int, world: int, args: argparse.Namespace) -> Any:
    """``args.tasks`` short random tasks per rank, each rank's support rows in one pass and its
    query rows in another."""
    from fmmeta.sampling.plan import MetaBatchPlan, PackedPass, RankPlan, TaskSlot
    from fmmeta.tasks.episode import Episode, Example

    rng = random.Random(step)

    def ex() -> Example:
        return Example(tuple(rng.randrange(4, 260) for _ in range(args.seq - 4)),
                       tuple(rng.randrange(4, 260) for _ in range(4)))

    def one_pass(n_rows_per_task: int) -> PackedPass:
        local = [t for t in range(args.tasks) for _ in range(n_rows_per_task)]
        examples = [e for _ in range(args.tasks) for e in range(n_rows_per_task)]
        return PackedPass(tuple(local), tuple(examples), args.seq, args.seq * len(local))

    ranks = []
    for r in range(world):
        slots = tuple(TaskSlot(Episode(task=f"t{r}_{t}", support=(ex(), ex()), query=(ex(),), shots=2),
                               task_id=r * args.tasks + t, cost=1.0) for t in range(args.tasks))
        ranks.append(RankPlan(slots, (one_pass(2),), (one_pass(1),)))
    return MetaBatchPlan(step=step, ranks=tuple(ranks), n_real_tasks=world * args.tasks)


def held_bytes(model: Any) -> int:
    from fmmeta.engine.zero import held_elements

    size = next(model.parameters()).element_size()
    return held_elements(model.parameters())[0] * size


def worker(args: argparse.Namespace) -> None:
    """One rank: build, wrap, run meta-steps; writes ``rank<N>.json`` into ``args.out``."""
    import torch

    from fmmeta.algorithms.build import build_algorithm
    from fmmeta.algorithms.config import AlgorithmConfig
    from fmmeta.algorithms.meta_step import meta_step
    from fmmeta.config import EngineConfig, LoraConfig
    from fmmeta.engine.build import build_engine
    from fmmeta.engine.distributed import init_distributed
    from fmmeta.engine.optim import OuterOptimConfig
    from fmmeta.engine.partition import partitioned_build
    from fmmeta.engine.zero import held_elements
    from fmmeta.models import add_lora, build_model_and_tokenizer

    torch.set_num_threads(1)
    rank, _, world = init_distributed("gloo", 300.0)
    engine_cfg = EngineConfig(kind="deepspeed", deepspeed_config=args.ds_config)
    optim = OuterOptimConfig(outer_lr=1e-3)
    t0 = time.perf_counter()
    partitioned = None if args.build_whole else partitioned_build(engine_cfg, optim, precision="fp32")
    base, tok = build_model_and_tokenizer(model_config(args), partitioned=partitioned)
    full = held_elements(base.parameters())[1]
    after_build = held_bytes(base)
    rss_build = peak_rss_bytes()
    build_s = time.perf_counter() - t0
    model = add_lora(base, LoraConfig(r=8, alpha=16, target_modules=("q_proj", "v_proj")), seed=0)
    engine = build_engine(engine_cfg, model, optim, precision="fp32")
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=1, inner_lr=0.01), pad_id=0)
    t1 = time.perf_counter()
    for step in range(args.steps):
        meta_step(engine, algo, build_plan(step, world, args))
    steps_s = time.perf_counter() - t1
    result = {
        "rank": rank, "world": world, "mode": "whole" if args.build_whole else "partitioned",
        "model_params": full, "model_bytes": full * 4,
        "held_bytes_after_build": after_build, "held_bytes_after_steps": held_bytes(engine.model),
        "peak_rss_after_build_bytes": rss_build, "peak_rss_bytes": peak_rss_bytes(),
        "build_s": round(build_s, 1), "meta_steps_s": round(steps_s, 1),
    }
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))
    engine.close()
    torch.distributed.barrier()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(ranks: int, whole: bool, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Runs the worker under ``deepspeed --num_gpus ranks`` on CPU; returns each rank's figures."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(ranks),
               "--master_port", str(_free_port()), str(Path(__file__).resolve()), "--worker",
               "--out", out, "--layers", str(args.layers), "--hidden", str(args.hidden),
               "--intermediate", str(args.intermediate), "--vocab", str(args.vocab),
               "--steps", str(args.steps), "--tasks", str(args.tasks), "--seq", str(args.seq)]
        if args.model:
            cmd += ["--model", args.model]
        if args.ds_config:
            cmd += ["--ds-config", str(Path(args.ds_config).resolve())]
        if whole:
            cmd.append("--build-whole")
        env = dict(os.environ)
        env.update({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])})
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
            raise SystemExit(f"{ranks}-rank run failed with rc={proc.returncode}")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--ds-config", default=None,
                        help="DeepSpeed JSON (ZeRO-3); default: the engine's own ZeRO-3 config")
    parser.add_argument("--model", default=None,
                        help="load this model (hub id, folder, .gguf, or smollm2) instead of a random one")
    parser.add_argument("--steps", type=int, default=2, help="FOMAML meta-steps per run")
    parser.add_argument("--tasks", type=int, default=2, help="tasks per rank per meta-step")
    parser.add_argument("--seq", type=int, default=32, help="tokens per example")
    parser.add_argument("--compare-whole", action="store_true",
                        help="also run the old way: the base built whole on every rank, then wrapped")
    parser.add_argument("--build-whole", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()  # the deepspeed launcher appends --local_rank
    if args.worker:
        worker(args)
        return
    runs = []
    modes = [False, True] if args.compare_whole else [False]
    for whole in modes:
        for n in args.ranks:
            per_rank = launch(n, whole, args)
            model_bytes = per_rank[0]["model_bytes"]
            target = model_bytes / n + OVERHEAD_BYTES
            for r in per_rank:
                print(
                    f"{r['mode']:11s} ranks={n} rank={r['rank']}: peak RSS {r['peak_rss_bytes'] / GB:.2f} GB "
                    f"({r['peak_rss_bytes'] / model_bytes:.2f}x model; target <= {target / GB:.2f} GB) | "
                    f"params held after build {r['held_bytes_after_build'] / GB:.3f} GB "
                    f"({r['held_bytes_after_build'] / model_bytes:.3f} of model), after meta-steps "
                    f"{r['held_bytes_after_steps'] / GB:.3f} GB | build {r['build_s']}s, "
                    f"{args.steps} meta-steps {r['meta_steps_s']}s",
                    flush=True,
                )
            runs.append({
                "mode": "whole" if whole else "partitioned", "ranks": n, "target_bytes": int(target),
                "within_target": all(r["peak_rss_bytes"] <= target for r in per_rank),
                "per_rank": per_rank,
            })
    first = runs[0]["per_rank"][0]
    print(f"model: {first['model_params']:,} parameters, {first['model_bytes'] / GB:.2f} GB fp32")
    print(json.dumps({"model_params": first["model_params"], "model_bytes": first["model_bytes"],
                      "overhead_allowed_bytes": int(OVERHEAD_BYTES), "runs": runs}))


if __name__ == "__main__":
    main()
