"""Benchmark: what a FOMAML meta-step costs: packed vs one task per pass, against a plain LoRA loop
and a clone()-style loop.

Runs on a small random Llama built from a config (no download): hidden 256, 4 layers, and by
default SmolLM2's vocabulary size (49152), so the embedding/LM-head share of the parameters and of
the compute is that of the project's real model. Prints a few human lines and, as
the last line, one JSON object:

* ``packed_speedup``: time of a FOMAML meta-step whose passes hold one task each (one task per
  pass, ``--shots`` rows) / time of the same meta-step with every task's rows packed into passes
  of ``--pack-rows`` rows, each row through its own task's fast weights (target >= 1.0 on CPU,
  where a bigger pass is barely cheaper per token; on a GPU a few-shot pass leaves the device idle).
  ``plain_loop_packing_speedup`` is the same ratio for the plain LoRA loop on the same passes:
  what bigger passes buy on this device with no per-task routing at all.
* ``peak_mem_ratio_t8_t1``: peak bytes of a packed meta-step with 8 tasks / with 1 task doing the
  same work (8x the shots) at one token budget (passes of ``--pack-rows`` rows in both): what
  grows with the number of tasks is only their stacked adapters (fast weights and gradients,
  about 3 x tasks x adapter bytes), not the activations (target <= 1.1).
* ``overhead_vs_plain_loop``: time of one packed FOMAML meta-step (``fmmeta.algorithms.meta_step``) /
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
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fmmeta.algorithms.answer_loss import answer_loss_sum
from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.inner_loop import InnerOptimizer
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.algorithms.task_lora import stack_adapters
from fmmeta.engine.local import LocalEngine
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.sampling.plan import MetaBatchPlan, PackedPass, RankPlan, TaskSlot
from fmmeta.tasks.episode import Batch, Episode, Example, collate

PAD_ID = 0


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """A random Llama + LoRA (r=8 on q,k,v,o), weights drawn from our own generator.

    Built and drawn on ``device`` itself: a ~1B model initialised on one CPU thread (as
    ``scripts/gpu_check.sh`` runs) took over a minute of a GPU lease before its first pass."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden,
        intermediate_size=getattr(args, "intermediate", 0) or args.hidden * 8 // 3,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64, max_position_embeddings=4 * args.seq,
    )
    with torch.device(device):
        model = get_peft_model(
            LlamaForCausalLM(cfg),
            LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        )
    gen = torch.Generator(device=device).manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.train()


def build_episodes(args: argparse.Namespace) -> list[Episode]:
    rng = random.Random(args.seed)

    def ex() -> Example:
        return Example(tuple(rng.randrange(1, args.vocab) for _ in range(args.seq - args.answer)),
                       tuple(rng.randrange(1, args.vocab) for _ in range(args.answer)))

    return [Episode(task=f"t{t}", support=tuple(ex() for _ in range(args.shots)),
                    query=tuple(ex() for _ in range(args.queries)), shots=args.shots)
            for t in range(args.tasks)]


def build_plan(episodes: list[Episode], rows_per_pass: int | None) -> MetaBatchPlan:
    """One rank's plan: ``rows_per_pass=None`` gives one task per pass (each set whole), else
    every task's rows dealt round-robin into passes of ``rows_per_pass`` rows (tasks mixed)."""
    slots = tuple(TaskSlot(ep, t) for t, ep in enumerate(episodes))

    def passes(query: bool) -> tuple[PackedPass, ...]:
        sets = [ep.query if query else ep.support for ep in episodes]
        if rows_per_pass is None:
            groups = [[(t, e) for e in range(len(s))] for t, s in enumerate(sets)]
        else:
            rows = [(t, e) for e in range(max(map(len, sets))) for t, s in enumerate(sets) if e < len(s)]
            groups = [rows[i : i + rows_per_pass] for i in range(0, len(rows), rows_per_pass)]
        out = []
        for g in groups:
            lens = [sets[t][e].n_tokens for t, e in g]
            out.append(PackedPass(tuple(t for t, _ in g), tuple(e for _, e in g), max(lens), sum(lens)))
        return tuple(out)

    return MetaBatchPlan(step=0, ranks=(RankPlan(slots, passes(False), passes(True)),), n_real_tasks=len(slots))


def pass_batches(plan: MetaBatchPlan, inner_steps: int, device: torch.device) -> list[Batch]:
    """The micro-batches FOMAML runs, in its order (support passes k times, then query passes)."""
    rank = plan.for_rank(0)
    sup = [collate(p.rows(rank.slots, query=False), PAD_ID).to(device) for p in rank.support]
    qry = [collate(p.rows(rank.slots, query=True), PAD_ID).to(device) for p in rank.query]
    return sup * inner_steps + qry


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


def clone_loop(model: torch.nn.Module, outer: torch.optim.Optimizer, episodes: list[Episode],
               inner_steps: int, inner_lr: float, device: torch.device, hf: bool) -> None:
    """learn2learn-style FOMAML: deep-copy the model per task, fresh inner optimizer, .backward().

    ``hf=True`` uses HF's ``labels=`` loss (what such a loop is usually written with); ``hf=False``
    uses our loss function, isolating the cost of the copies.
    """
    params = trainable(model)
    grad_sum = [torch.zeros_like(p) for p in params]
    for ep in episodes:
        sup = collate(ep.support, PAD_ID).to(device)
        qry = collate(ep.query, PAD_ID).to(device)
        clone = copy.deepcopy(model)
        inner = torch.optim.SGD(trainable(clone), lr=inner_lr)
        for _ in range(inner_steps):
            _loss(clone, sup, hf).backward()
            inner.step()
            inner.zero_grad(set_to_none=True)
        _loss(clone, qry, hf).backward()
        for acc, p in zip(grad_sum, trainable(clone)):
            acc.add_(p.grad)
        del clone, inner
    for p, g in zip(params, grad_sum):
        p.grad = g / len(episodes)
    outer.step()
    outer.zero_grad(set_to_none=True)


class AllocTracker:
    """Bytes allocated inside a region and still live at its end, and the region's peak."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.live = 0
        self.peak = 0

    def __enter__(self) -> AllocTracker:
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
    ap.add_argument("--tasks", type=int, default=8, help="tasks per meta-step")
    ap.add_argument("--inner-steps", type=int, default=2)
    ap.add_argument("--shots", type=int, default=4, help="support examples per task")
    ap.add_argument("--queries", type=int, default=4, help="query examples per task")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    ap.add_argument("--answer", type=int, default=3, help="answer tokens per sequence")
    ap.add_argument("--pack-rows", type=int, default=32, help="rows per packed pass")
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
    episodes = build_episodes(args)
    plan = build_plan(episodes, args.pack_rows)
    one_task = build_plan(episodes, None)
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=args.inner_steps, inner_lr=inner_lr), PAD_ID)
    batches = pass_batches(plan, args.inner_steps, device)
    one_task_batches = pass_batches(one_task, args.inner_steps, device)
    # The plain and clone loops get their own optimizers over the same live parameters.
    plain_opt = torch.optim.AdamW(trainable(model), lr=1e-4, foreach=False)
    clone_outer = torch.optim.AdamW(trainable(model), lr=1e-4, foreach=False)

    methods: dict[str, Callable[[], object]] = {
        "ours": lambda: meta_step(engine, algo, plan),
        "one_task_per_pass": lambda: meta_step(engine, algo, one_task),
        "plain": lambda: plain_loop(model, plain_opt, batches, hf=False),
        "plain_one_task_per_pass": lambda: plain_loop(model, plain_opt, one_task_batches, hf=False),
        "plain_hf": lambda: plain_loop(model, plain_opt, batches, hf=True),
        "clone": lambda: clone_loop(model, clone_outer, episodes, args.inner_steps, inner_lr, device, hf=True),
        "clone_same_loss": lambda: clone_loop(model, clone_outer, episodes, args.inner_steps, inner_lr,
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
    with AllocTracker(device) as ours_mem:  # a task's fast weights and its inner optimizer
        fast = stack_adapters(params, 1)
        inner_state = InnerOptimizer(algo.inner, fast)
    del fast, inner_state

    # Peak memory of a meta-step with 1 vs 8 inner steps (after a warm-up of each); two tasks
    # are enough to show whether anything grows with the number of steps.
    mem_plan = build_plan(episodes[:2], args.shots)
    peaks = {}
    for k in (1, 8):
        algo_k = build_algorithm("fomaml", AlgorithmConfig(inner_steps=k, inner_lr=inner_lr), PAD_ID)
        meta_step(engine, algo_k, mem_plan)
        with AllocTracker(device) as m:
            meta_step(engine, algo_k, mem_plan)
        peaks[k] = m.peak
    # Peak memory of a packed meta-step with 1 task vs 8 tasks doing the same work at one token
    # budget: the single task has 8x the shots, so both run the same rows in passes of
    # --pack-rows rows. What may grow with the number of tasks is only their stacked adapters.
    task_peaks = {}
    for t in (1, 8):
        scale = 8 // t
        shape = {**vars(args), "tasks": t, "shots": args.shots * scale, "queries": args.queries * scale}
        plan_t = build_plan(build_episodes(argparse.Namespace(**shape)), args.pack_rows)
        meta_step(engine, algo, plan_t)
        with AllocTracker(device) as m:
            meta_step(engine, algo, plan_t)
        task_peaks[t] = m.peak

    n_passes = len(batches)
    result = {
        "device": str(device),
        "model": {"vocab": args.vocab, "hidden": args.hidden, "layers": args.layers,
                  "params": n_total, "adapter_params": n_adapter},
        "meta_step": {"tasks": args.tasks, "inner_steps": args.inner_steps, "shots": args.shots,
                      "queries": args.queries, "seq": args.seq, "answer": args.answer,
                      "pack_rows": args.pack_rows, "fwd_bwd_passes": n_passes},
        "reps": args.reps,
        "timing": "process CPU time" if device.type == "cpu" else "wall time",
        "median_seconds": med,
        "median_wall_seconds": wall,
        "packed_speedup": med["one_task_per_pass"] / med["ours"],
        "plain_loop_packing_speedup": med["plain_one_task_per_pass"] / med["plain"],
        "passes_per_meta_step": {"packed": len(batches), "one_task_per_pass": len(one_task_batches)},
        "peak_bytes_tasks": {"t1": task_peaks[1], "t8": task_peaks[8]},
        "peak_mem_ratio_t8_t1": task_peaks[8] / max(task_peaks[1], 1),
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
