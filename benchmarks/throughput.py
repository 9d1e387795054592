"""Benchmark: tokens/s and model FLOP utilisation (MFU) of a FOMAML meta-step against a plain LoRA
training loop on the same tokens, on a ~1B-parameter random Llama (a GPU benchmark; on a CPU its
defaults are the default model's shape and a smaller meta-step, :data:`SIZES`).

The model is built from a config (no download; on a GPU hidden 2048, 16 layers, SmolLM2's
49,152-token vocabulary: 1.0B parameters) with LoRA r=8 on q,k,v,o, and runs in ``--dtype``, base
and adapter alike, as fmmeta's local engine runs a bf16 model (``auto`` by default: bf16 where the
device has it natively, fp32 on a CPU without it, as a run's ``model.dtype=auto``). One meta-step
is 16 tasks x 8 support and 8 query sequences of 256 tokens (16 answer tokens), 2 inner steps,
packed into passes of 32 rows; the plain loop runs exactly the same passes (``loss.backward()`` +
AdamW step per pass, the same loss function), so both process the same tokens.

FLOPs are counted per pass by ``fmmeta/flops.py``, the one count every benchmark uses (frozen
base, so its backward is the gradient to the inputs only: about 4 x the body's weights per token,
plus the adapters' own terms, causal attention from each sequence's length and the LM head where it
runs, at answer positions only in both loops), over the passes each loop ran in its warm-up
(the meta-step's forward-only passes included). MFU = counted FLOPs/s / the device's dense peak
for the dtype (``--peak-tflops``; known for H100/H200/A100 in bf16).

The baseline a user would pick instead, Hugging Face ``Trainer`` with the same peft LoRA model, runs
the same passes' rows, one ``Trainer`` step per pass (``benchmarks/trainer_baseline.py`` says how
it is configured); its MFU counts the LM head at every position, which it computes
(:func:`trainer_baseline.trainer_flops`).

Where Liger's kernels are installed (``liger_kernel``; Triton, so on a GPU), the Trainer also runs
with ``use_liger_kernel``, its own switch for them: RMSNorm, SwiGLU and RoPE kernels and a fused
linear cross-entropy that never holds the logits of every position. That is the Trainer's best
configuration, so ``plain_vs_hf_trainer`` compares against the faster of the two
(``hf_trainer_best`` names it). It runs last: Liger patches the model in place. fmmeta's loops
need no fused cross-entropy (their LM head runs at answer positions only).

Prints a few human lines and, as the last line, one JSON object: ``tokens_per_s``, ``tflop`` (per
meta-step's worth of passes) and ``mfu`` of ``meta_step``, ``plain_loop``, ``hf_trainer`` (and
``hf_trainer_liger``), ``tflop_per_meta_step`` (the meta-step's), ``meta_step_vs_plain``
(time ratio, target <= 1.05 as on CPU) and ``plain_vs_hf_trainer`` (tokens/s ratio, target >= 1.0).

Both loops measured 0.11 MFU on an H200 (2026-12-04), low for a 1B model; two options are there to
find out why. ``--intermediate`` sets the MLP width (default ``hidden * 8 // 3``, 5461 at hidden
2048: not a multiple of 8, which bf16 tensor-core matmuls want; Llama rounds it up to a multiple
of 256, 5632). ``--profile`` runs one more of each loop under ``torch.profiler`` and adds
``profile``: per loop, the ``--top`` operators by self time on the device (CPU time on a CPU)
with their share of it, and the share of all matmul kernels (``mm``, ``bmm``, ``addmm``, GEMM).

``--compile BACKEND`` (``inductor``; ``aot_eager`` for a quick check of the code path) compiles
every decoder layer in place as ``engine.compile`` does, before the warm-up, so all three loops
(the Trainer's too: it runs the same model) run the compiled layers; ``compile`` in the JSON gives
the backend, the graphs and the seconds the warm-up spent compiling.

Usage:
    python benchmarks/throughput.py --device cuda [--reps 5] [--intermediate 5632] [--profile]
                                    [--compile inductor] [--liger auto|on|off]
    python benchmarks/throughput.py             # on a CPU: SIZES["cpu"], minutes
    python benchmarks/throughput.py --tiny      # a seconds-long smoke run of the same code on CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import meta_step as bench  # noqa: E402  (benchmarks/meta_step.py: model, episodes, plans, loop)
from common import PassCounter, add_dtype_argument, compute_dtype  # noqa: E402  (benchmarks/common.py)
from trainer_baseline import trainer_flops, trainer_step_seconds  # noqa: E402

from fmmeta.algorithms.build import build_algorithm  # noqa: E402
from fmmeta.algorithms.config import AlgorithmConfig  # noqa: E402
from fmmeta.algorithms.meta_step import meta_step  # noqa: E402
from fmmeta.engine.compiled import compile_layers  # noqa: E402
from fmmeta.engine.local import LocalEngine  # noqa: E402
from fmmeta.engine.optim import OuterOptimConfig  # noqa: E402

PEAK_TFLOPS_BF16 = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
"""Dense bf16 peaks on paper (SXM parts), matched against the CUDA device name."""

SIZES = {
    "gpu": {"hidden": 2048, "layers": 16, "vocab": 49152, "tasks": 16, "shots": 8, "queries": 8, "seq": 256,
            "answer": 16, "pack_rows": 32},
    "cpu": {"hidden": 576, "layers": 30, "vocab": 49152, "tasks": 4, "shots": 4, "queries": 4, "seq": 64,
            "answer": 8, "pack_rows": 16},
    "tiny": {"hidden": 128, "layers": 2, "vocab": 512, "tasks": 4, "shots": 2, "queries": 2, "seq": 32,
             "answer": 4, "pack_rows": 4},
}
"""Default sizes per device, each overridden by its own flag. ``gpu``: the ~1B model and a meta-step
of 8,192 tokens per pass. ``cpu``: the default model's shape (SmolLM2-135M: hidden 576, 30 layers)
with a meta-step of a few thousand tokens, minutes on a 2-core CPU where the GPU size would take
hours. ``tiny`` (``--tiny``): the same code path in seconds."""


def fill_sizes(args: argparse.Namespace, device: torch.device) -> str:
    """Sets every size flag left out to its default for the device and returns which ``SIZES``
    entry that was; a flag given wins, with ``--tiny`` too (``--tiny --seq 64``: the tiny model
    on longer sequences)."""
    size = "tiny" if args.tiny else "gpu" if device.type == "cuda" else "cpu"
    for key, value in SIZES[size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return size


def peak_flops(args: argparse.Namespace, device: torch.device) -> float | None:
    """The device's dense peak in FLOP/s, or None where it is unknown (CPU, fp32, unlisted GPU)."""
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if device.type != "cuda" or args.dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return next((t * 1e12 for key, t in PEAK_TFLOPS_BF16.items() if key in name), None)


MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear")
"""Operators counted as matmuls on a CPU."""
GEMM_KERNEL_MARKS = ("gemm", "cutlass", "matmul", "sm90_xmma", "nvjet")
"""Parts of a GPU kernel's name that mark it a matmul (cuBLAS, cuBLASLt, CUTLASS)."""


def _is_matmul(name: str, cuda: bool) -> bool:
    return any(k in name.lower() for k in GEMM_KERNEL_MARKS) if cuda else name in MATMUL_OPS


def top_operators(fn: object, device: torch.device, top: int) -> dict[str, object]:
    """One run of ``fn`` under ``torch.profiler``: its ``top`` operators (kernels on a GPU) by
    self time, each with its share, the matmuls' share of all, and the total in ms."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    bench.sync(device)
    with profile(activities=activities) as prof:
        fn()  # type: ignore[operator]
        bench.sync(device)
    times: dict[str, float] = {}
    if cuda:  # the kernels themselves: what the device spent its time on
        for e in prof.events():
            if e.device_type.name == "CUDA" and e.device_time_total > 0:
                times[e.name] = times.get(e.name, 0.0) + e.device_time_total
    else:
        times = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(times.values()) or 1.0
    ranked = sorted(times.items(), key=lambda kv: -kv[1])[:top]
    return {"total_ms": total / 1e3,
            "matmul_share": round(sum(t for k, t in times.items() if _is_matmul(k, cuda)) / total, 4),
            "top": [{"op": k[:120], "share": round(t / total, 4)} for k, t in ranked]}


def use_liger(ap: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> bool:
    """Whether the Trainer also runs with Liger's kernels (``--liger``; see the module docstring)."""
    installed = importlib.util.find_spec("liger_kernel") is not None
    if args.liger == "on" and (device.type != "cuda" or not installed):
        ap.error("--liger on needs a CUDA device and liger_kernel installed (its kernels are Triton's)")
    if args.liger == "on":
        return True
    # Liger's patches replace module forwards that compiled layers have traced: not combined.
    return args.liger == "auto" and device.type == "cuda" and installed and not args.compile


def time_trainer(model: torch.nn.Module, batches: list, device: torch.device, steps: int, *,
                 liger: bool, tokens: int, flops: float, peak: float | None) -> dict[str, object]:
    """The Trainer's median seconds per meta-step's worth of passes (one step per pass), its
    tokens/s and MFU (``tokens`` and ``flops``: what it processes and computes in those passes)."""
    step_s = statistics.median(trainer_step_seconds(model, batches, device, steps=steps, liger=liger))
    per_meta_step = step_s * len(batches)
    mfu = flops / per_meta_step / peak if peak else None
    name = "hf_trainer_liger" if liger else "hf_trainer"
    print(f"{name:10s} median {per_meta_step * 1000:9.1f} ms  {tokens / per_meta_step:10.0f} tokens/s"
          + (f"  MFU {mfu:.3f}" if mfu else ""))
    return {"median_s": per_meta_step, "tokens_per_s": tokens / per_meta_step, "mfu": mfu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_dtype_argument(ap)
    ap.add_argument("--reps", type=int, default=5)
    sized = "(default: SIZES for the device)"
    ap.add_argument("--hidden", type=int, help=sized)
    ap.add_argument("--layers", type=int, help=sized)
    ap.add_argument("--vocab", type=int, help=sized)
    ap.add_argument("--tasks", type=int, help=f"tasks per meta-step {sized}")
    ap.add_argument("--inner-steps", type=int, default=2)
    ap.add_argument("--shots", type=int, help=f"support sequences per task {sized}")
    ap.add_argument("--queries", type=int, help=f"query sequences per task {sized}")
    ap.add_argument("--seq", type=int, help=f"tokens per sequence {sized}")
    ap.add_argument("--answer", type=int, help=f"answer tokens per sequence {sized}")
    ap.add_argument("--pack-rows", type=int, help=f"rows per packed pass {sized}")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="the device's dense peak (0: known table)")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes: a CPU smoke run of the same code")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--intermediate", type=int, default=0, help="MLP width (0: hidden * 8 // 3)")
    ap.add_argument("--profile", action="store_true", help="add the top operators of each loop")
    ap.add_argument("--top", type=int, default=12, help="operators listed per loop with --profile")
    ap.add_argument("--compile", default="", choices=["", "inductor", "aot_eager"],
                    help="compile the decoder layers with this backend (engine.compile's path)")
    ap.add_argument("--liger", default="auto", choices=["auto", "on", "off"],
                    help="also time the Trainer with Liger's kernels (auto: on a GPU where installed)")
    args = ap.parse_args()
    device = torch.device(args.device)
    liger = use_liger(ap, args, device)
    size = fill_sizes(args, device)
    dtype = getattr(torch, compute_dtype(args))

    model = bench.build_model(args, device).to(dtype)
    engine = LocalEngine(model, OuterOptimConfig(outer_lr=1e-4, grad_clip=0.0), device=device)
    n_total = sum(p.numel() for p in model.parameters())
    n_adapter = sum(p.numel() for p in bench.trainable(model))
    plan = bench.build_plan(bench.build_episodes(args), args.pack_rows)
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=args.inner_steps, inner_lr=1e-2),
                           bench.PAD_ID)
    batches = bench.pass_batches(plan, args.inner_steps, device)
    plain_opt = torch.optim.AdamW(bench.trainable(model), lr=1e-4)
    methods = {
        "meta_step": lambda: meta_step(engine, algo, plan),
        "plain_loop": lambda: bench.plain_loop(model, plain_opt, batches, hf=False),
    }
    counter = PassCounter(model)  # reads the model's shape with one eager forward: before compiling
    compiled = compile_layers(model, backend=args.compile) if args.compile else None
    flops: dict[str, int] = {}
    for name, fn in methods.items():  # warm-up: kernels, allocator, optimizer state (and compiling)
        counter.reset()
        fn()
        flops[name] = counter.model_flops()  # the passes it ran, counted once
    times: dict[str, list[float]] = {k: [] for k in methods}
    for rep in range(args.reps):
        for name in (list(methods) if rep % 2 == 0 else list(methods)[::-1]):
            bench.sync(device)
            t0 = time.perf_counter()
            methods[name]()
            bench.sync(device)
            times[name].append(time.perf_counter() - t0)

    tokens = sum(int(b.attention_mask.sum()) for b in batches)
    peak = peak_flops(args, device)
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": args.dtype, "size": size,
        "model": {"params": n_total, "adapter_params": n_adapter, "hidden": args.hidden,
                  "intermediate": model.base_model.model.config.intermediate_size,
                  "layers": args.layers, "vocab": args.vocab},
        "meta_step_shape": {"tasks": args.tasks, "inner_steps": args.inner_steps, "shots": args.shots,
                            "queries": args.queries, "seq": args.seq, "passes": len(batches)},
        "tokens_per_meta_step": tokens,
        "tflop_per_meta_step": flops["meta_step"] / 1e12,
        "peak_tflops": peak / 1e12 if peak else None,
        "reps": args.reps,
        "compile": None if compiled is None else {"backend": args.compile, "graphs": compiled.graphs,
                                                  "seconds": round(compiled.seconds, 1)},
    }
    for name, ts in times.items():
        med = statistics.median(ts)
        result[name] = {"median_s": med, "tokens_per_s": tokens / med, "tflop": flops[name] / 1e12,
                        "mfu": flops[name] / med / peak if peak else None}
        print(f"{name:10s} median {med * 1000:9.1f} ms  {tokens / med:10.0f} tokens/s"
              + (f"  MFU {flops[name] / med / peak:.3f}" if peak else ""))
    result["meta_step_vs_plain"] = result["meta_step"]["median_s"] / result["plain_loop"]["median_s"]  # type: ignore[index]
    # The same passes through Hugging Face Trainer: one step per pass, so a meta-step's worth of
    # passes costs len(batches) median steps.
    hf_flops = trainer_flops(counter.shape, batches)  # the LM head at every position
    trainer_steps = args.reps * len(batches)
    result["hf_trainer"] = time_trainer(model, batches, device, trainer_steps, liger=False,
                                        tokens=tokens, flops=hf_flops, peak=peak)
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if args.profile:
        try:  # the figures above must survive a profiler that fails on some device
            result["profile"] = {name: top_operators(fn, device, args.top) for name, fn in methods.items()}
        except Exception as err:  # noqa: BLE001  (recorded in the JSON line, not raised)
            result["profile"] = {"error": f"{type(err).__name__}: {err}"}
        for name, prof in result["profile"].items():  # type: ignore[union-attr]
            if name != "error":
                print(f"{name}: matmuls {prof['matmul_share']:.0%} of {prof['total_ms']:.0f} ms; top: "
                      + ", ".join(f"{op['op']} {op['share']:.0%}" for op in prof["top"][:5]))
    trainers = ["hf_trainer"]
    if liger:  # last: Liger patches the model in place
        try:  # the figures above must survive a Liger that does not fit this transformers
            result["hf_trainer_liger"] = time_trainer(model, batches, device, trainer_steps, liger=True,
                                                      tokens=tokens, flops=hf_flops, peak=peak)
            trainers.append("hf_trainer_liger")
        except Exception as err:  # noqa: BLE001  (recorded in the JSON line, not raised)
            result["hf_trainer_liger"] = {"error": f"{type(err).__name__}: {err}"}
    best = min(trainers, key=lambda name: result[name]["median_s"])  # type: ignore[index]
    result["hf_trainer_best"] = best
    result["plain_vs_hf_trainer"] = (result["plain_loop"]["tokens_per_s"]  # type: ignore[index]
                                     / result[best]["tokens_per_s"])  # type: ignore[index]
    print(f"model {n_total / 1e9:.2f}B params, {tokens} tokens and {len(batches)} passes per meta-step")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
