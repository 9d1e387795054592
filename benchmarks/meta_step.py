"""Benchmark: what a FOMAML meta-step costs over a plain LoRA loop and over a clone()-style loop.

Runs on a small random Llama built from a config (no download): hidden 256, 4 layers, and by
default SmolLM2's vocabulary size (49152), so the embedding/LM-head share of the parameters and of
the compute is that of the project's real model. Prints a few human lines and, as
the last line, one JSON object:

* ``overhead_vs_plain_loop``: time of one FOMAML meta-step (``fmmeta.algorithms.meta_step``) /
  time of the same forward+backward passes on the same sequences in a plain LoRA training loop
  (``loss.backward()`` + AdamW step per pass) that uses the same loss function (target <= 1.05).
  ``overhead_vs_plain_hf_loop`` is the same against a loop using HF's built-in ``labels=`` loss.
* ``speedup_vs_clone_loop``: time of a naive meta-step that deep-copies the model and builds a new
  inner optimizer per task (learn2learn ``clone()`` style, HF loss) / time of ours (target >= 1.5).
  Part of the gain is the loss (ours runs the LM head on answer positions only, HF's ``labels=``
  loss on every position); ``speedup_vs_clone_loop_same_loss`` gives the naive loop our loss, so
  it isolates what the copies cost.
* ``per_task_memory_ratio_vs_clone``: bytes allocated and still live after the per-task set-up of
  the naive loop (deep copy + optimizer) / of ours (adapter snapshot + inner optimizer)
  (target >= 100).
* ``peak_mem_ratio_k8_k1``: peak bytes allocated during one meta-step with 8 inner steps / with 1
  (target <= 1.05).

How memory is measured: on CPU with the PyTorch profiler's allocator accounting
(``profile_memory=True``; the ``Total Allocated`` field of its ``[memory]`` events counts bytes
allocated inside the profiled region and still live, so model weights allocated before are not
counted and the ratio is not diluted by a constant baseline); on CUDA with
``torch.cuda.memory_allocated`` / ``max_memory_allocated`` relative to the start of the region.
Timings: repetitions of the methods are interleaved (rotating order) after a warm-up, and the
medians are reported. On CPU the ratios use this process's CPU time with one torch thread (the
project's machines are shared, so wall time there mostly measures other processes); wall-time
medians are reported alongside. On CUDA the ratios use wall time.

Usage:
    python benchmarks/meta_step.py [--device cuda] [--reps 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fmmeta.algorithms.first_order import AlgorithmConfig, build_algorithm  # noqa: E402
from fmmeta.algorithms.inner_loop import InnerOptimizer, answer_loss_sum, chunk_batches, snapshot  # noqa: E402
from fmmeta.algorithms.meta_step import meta_step  # noqa: E402
from fmmeta.engine.local import LocalEngine  # noqa: E402
from fmmeta.engine.optim import OuterOptimConfig  # noqa: E402
from fmmeta.sampling.plan import MetaBatchPlan, TaskSlot  # noqa: E402
from fmmeta.tasks.episode import Batch, Episode, Example  # noqa: E402

PAD_ID = 0


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """A random Llama + LoRA (r=8 on q,k,v,o), weights drawn from our own generator."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64, max_position_embeddings=4 * args.seq,
    )
    model = get_peft_model(
        LlamaForCausalLM(cfg),
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn(p.shape, generator=gen) * 0.02)
    return model.to(device).train()


def build_plan(args: argparse.Namespace) -> MetaBatchPlan:
    rng = random.Random(args.seed)
    answer = args.seq // 4

    def ex() -> Example:
        return Example(tuple(rng.randrange(1, args.vocab) for _ in range(args.seq - answer)),
                       tuple(rng.randrange(1, args.vocab) for _ in range(answer)))

    slots = []
    for t in range(args.tasks):
        ep = Episode(task=f"t{t}", support=tuple(ex() for _ in range(args.shots)),
                     query=tuple(ex() for _ in range(args.queries)), shots=args.shots)
        slots.append(TaskSlot(episode=ep, weight=1.0,
                              support_chunks=(tuple(range(args.shots)),),
                              query_chunks=(tuple(range(args.queries)),), task_id=t))
    return MetaBatchPlan(step=0, ranks=(tuple(slots),), n_real_tasks=args.tasks)


def pass_batches(plan: MetaBatchPlan, inner_steps: int, device: torch.device) -> list[Batch]:
    """The sequence of micro-batches FOMAML runs, in its order (support k times, then query)."""
    out: list[Batch] = []
    for slot in plan.for_rank(0):
        ep = slot.episode
        sup = chunk_batches(ep.support, slot.support_chunks, PAD_ID)
        qry = chunk_batches(ep.query, slot.query_chunks, PAD_ID)
        out += [b.to(device) for b in sup] * inner_steps + [b.to(device) for b in qry]
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def plain_loop(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[Batch], hf: bool) -> None:
    for b in batches:
        _loss(model, b, hf).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _loss(model: torch.nn.Module, b: Batch, hf: bool) -> torch.Tensor:
    if hf:
        return model(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=b.labels).loss
    return answer_loss_sum(model, b) / b.n_answer_tokens


def clone_loop(model: torch.nn.Module, outer: torch.optim.Optimizer, plan: MetaBatchPlan,
               inner_steps: int, inner_lr: float, device: torch.device, hf: bool) -> None:
    """learn2learn-style FOMAML: deep-copy the model per task, fresh inner optimizer, .backward().

    ``hf=True`` uses HF's ``labels=`` loss (what such a loop is usually written with); ``hf=False``
    uses our loss function, isolating the cost of the copies.
    """
    params = trainable(model)
    grad_sum = [torch.zeros_like(p) for p in params]
    for slot in plan.for_rank(0):
        ep = slot.episode
        sup = [b.to(device) for b in chunk_batches(ep.support, slot.support_chunks, PAD_ID)]
        qry = [b.to(device) for b in chunk_batches(ep.query, slot.query_chunks, PAD_ID)]
        clone = copy.deepcopy(model)
        inner = torch.optim.SGD(trainable(clone), lr=inner_lr)
        for _ in range(inner_steps):
            for b in sup:
                _loss(clone, b, hf).backward()
            inner.step()
            inner.zero_grad(set_to_none=True)
        for b in qry:
            _loss(clone, b, hf).backward()
        for acc, p in zip(grad_sum, trainable(clone)):
            acc.add_(p.grad)
        del clone, inner
    for p, g in zip(params, grad_sum):
        p.grad = g / plan.n_real_tasks
    outer.step()
    outer.zero_grad(set_to_none=True)


class AllocTracker:
    """Bytes allocated inside a region and still live at its end, and the region's peak."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.live = 0
        self.peak = 0

    def __enter__(self) -> "AllocTracker":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.live = torch.cuda.memory_allocated(self.device) - self._base
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            return
        self._prof.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        finally:
            os.unlink(path)
        mem = [e["args"] for e in events
               if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
        if not mem:
            return
        # The allocator's counter keeps bytes from earlier profiled regions that were freed while
        # not profiling; measure relative to the value just before this region's first event.
        base = mem[0]["Total Allocated"] - mem[0]["Bytes"]
        totals = [m["Total Allocated"] - base for m in mem]
        self.live = totals[-1]
        self.peak = max(0, max(totals))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=4, help="tasks per meta-step")
    ap.add_argument("--inner-steps", type=int, default=2)
    ap.add_argument("--shots", type=int, default=2, help="support examples per task (one micro-batch)")
    ap.add_argument("--queries", type=int, default=2, help="query examples per task (one micro-batch)")
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence (a quarter is answer)")
    ap.add_argument("--vocab", type=int, default=49152, help="49152 = SmolLM2's tokenizer")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 makes process CPU time equal compute time")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    inner_lr = 1e-2
    outer = OuterOptimConfig(outer_lr=1e-4, grad_clip=0.0)

    model = build_model(args, device)
    engine = LocalEngine(model, outer, device=device)
    n_total = sum(p.numel() for p in model.parameters())
    n_adapter = sum(p.numel() for p in trainable(model))
    plan = build_plan(args)
    algo = build_algorithm(AlgorithmConfig(name="fomaml", inner_steps=args.inner_steps, inner_lr=inner_lr), PAD_ID)
    batches = pass_batches(plan, args.inner_steps, device)
    # The plain and clone loops get their own optimizers over the same live parameters.
    plain_opt = torch.optim.AdamW(trainable(model), lr=1e-4, foreach=False)
    clone_outer = torch.optim.AdamW(trainable(model), lr=1e-4, foreach=False)

    methods: dict[str, Callable[[], object]] = {
        "ours": lambda: meta_step(engine, algo, plan),
        "plain": lambda: plain_loop(model, plain_opt, batches, hf=False),
        "plain_hf": lambda: plain_loop(model, plain_opt, batches, hf=True),
        "clone": lambda: clone_loop(model, clone_outer, plan, args.inner_steps, inner_lr, device, hf=True),
        "clone_same_loss": lambda: clone_loop(model, clone_outer, plan, args.inner_steps, inner_lr,
                                              device, hf=False),
    }
    times: dict[str, list[float]] = {k: [] for k in methods}
    cpu_times: dict[str, list[float]] = {k: [] for k in methods}
    names = list(methods)
    for fn in methods.values():  # warm-up (lazy optimizer state, kernels, allocator)
        fn()
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            methods[name]()
            sync(device)
            times[name].append(time.perf_counter() - t0)
            cpu_times[name].append(time.process_time() - c0)
    wall = {k: statistics.median(v) for k, v in times.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_times.items()}
    # On a shared CPU machine wall time mostly measures the neighbours; this process's CPU time
    # (one thread by default) does not. On CUDA only wall time means anything.
    med = cpu if device.type == "cpu" else wall

    # Per-task memory: what each approach allocates and keeps for the duration of one task.
    with AllocTracker(device) as naive_mem:
        clone = copy.deepcopy(model)
        inner = torch.optim.SGD(trainable(clone), lr=inner_lr)
    del clone, inner
    params = engine.adapter_parameters()
    with AllocTracker(device) as ours_mem:
        theta = snapshot(params)
        inner_state = InnerOptimizer(algo.inner, params)
    del theta, inner_state

    # Peak memory of a meta-step with 1 vs 8 inner steps (after a warm-up of each); two tasks
    # are enough to show whether anything grows with the number of steps or of tasks.
    mem_plan = MetaBatchPlan(step=0, ranks=(plan.for_rank(0)[:2],), n_real_tasks=min(2, args.tasks))
    peaks = {}
    for k in (1, 8):
        algo_k = build_algorithm(AlgorithmConfig(name="fomaml", inner_steps=k, inner_lr=inner_lr), PAD_ID)
        meta_step(engine, algo_k, mem_plan)
        with AllocTracker(device) as m:
            meta_step(engine, algo_k, mem_plan)
        peaks[k] = m.peak

    n_passes = len(batches)
    result = {
        "device": str(device),
        "model": {"vocab": args.vocab, "hidden": args.hidden, "layers": args.layers,
                  "params": n_total, "adapter_params": n_adapter},
        "meta_step": {"tasks": args.tasks, "inner_steps": args.inner_steps, "shots": args.shots,
                      "queries": args.queries, "seq": args.seq, "fwd_bwd_passes": n_passes},
        "reps": args.reps,
        "timing": "process CPU time" if device.type == "cpu" else "wall time",
        "median_seconds": med,
        "median_wall_seconds": wall,
        "overhead_vs_plain_loop": med["ours"] / med["plain"],
        "overhead_vs_plain_hf_loop": med["ours"] / med["plain_hf"],
        "speedup_vs_clone_loop": med["clone"] / med["ours"],
        "speedup_vs_clone_loop_same_loss": med["clone_same_loss"] / med["ours"],
        "per_task_bytes": {"clone": naive_mem.live, "ours": ours_mem.live},
        "per_task_memory_ratio_vs_clone": naive_mem.live / max(ours_mem.live, 1),
        "peak_bytes": {"k1": peaks[1], "k8": peaks[8]},
        "peak_mem_ratio_k8_k1": peaks[8] / max(peaks[1], 1),
        "memory_method": "cuda memory_allocated" if device.type == "cuda"
        else "torch.profiler profile_memory: allocator bytes allocated in region (live at end / peak)",
    }
    print(f"model {n_total/1e6:.1f}M params, adapter {n_adapter/1e6:.3f}M; "
          f"{n_passes} fwd+bwd passes per meta-step")
    for k, v in med.items():
        print(f"  {k:15s} median {v*1000:8.1f} ms ({'CPU' if device.type == 'cpu' else 'wall'}), "
              f"wall {wall[k]*1000:8.1f} ms over {args.reps} reps")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
