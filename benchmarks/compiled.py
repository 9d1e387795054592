"""Benchmark: what a compiled layer stack buys one forward and backward pass, against eager.

A bf16 meta-step's model FLOP/s stays near 0.3 of a matmul of the model's shapes on one CPU thread
(``benchmarks/precision.py``, by the 6 x parameters count it was measured with; ``fmmeta/flops.py``'s
count of a LoRA pass is about 1.37x lower, docs/benchmarks.md). Most of the rest is small memory-bound operations (norms, rotary
embeddings, SiLU, casts), and only fusing them can remove that time. This measures how far fusing
goes, on one pass of the default model with its LoRA adapter: ``--rows`` rows of ``--tokens``
tokens, the loss on the last ``--answer`` positions, as in the recipe's passes. The same model runs
eager and under ``torch.compile`` (inductor, default mode; ``--backend aot_eager`` runs the same
code through dynamo and AOTAutograd with eager kernels, a quick check of the code path, as the test
suite's small run does), alternated. Prints a few human lines
and, as the last line, one JSON object:

* ``seconds``: median wall seconds of the pass, ``eager`` and ``compiled``; ``speedup`` their ratio;
* ``compile_s``: the first compiled call (compiling it; less where inductor's on-disk cache
  already holds the graphs);
* ``flops`` and ``mfu``: the pass's FLOPs (``fmmeta/flops.py``: the frozen base's forward and
  its backward to the inputs, the adapters', causal attention and the LM head at the answer
  positions) and those per second over the FLOP/s of a matmul of the model's MLP shape at the
  pass's tokens in the same dtype, measured in this run (figures recorded before 2026-12-07 counted
  6 x non-embedding parameters x tokens, which overstates a LoRA pass: see docs/benchmarks.md);
* ``grad_rel_error``: the compiled pass's adapter gradient against eager's, and
  ``grad_rel_error_vs_fp32`` each one's against the fp32 model's eager pass (in the compute dtype,
  both round; the question is whether compiling rounds worse).

With ``--meta-steps K`` (default 4; 0 skips it) it then measures what the recipe would see:
real FOMAML meta-steps (the recipe's defaults: K meta-batches drawn by its sampler from the CLDR
suite, padding-free lines) with every decoder layer compiled on its own ("regional" compiling,
``engine.compile``'s path, :func:`fmmeta.engine.compiled.compile_layers`: the layers share one
code object, so one layer's graphs serve all of them). The first round over the K meta-batches
compiles; later rounds alternate each meta-batch eager (``torch.compiler.set_stance("force_eager")``,
the same model) and compiled. Under ``meta_step``:

* ``graphs_plain``: graphs a plain ``layer.compile(dynamic=True)`` compiles over the same round
  (counted with dynamo's tracing only), the "before": a new graph wherever a guard fails, e.g. on
  whether the first layer's input requires grad or on a module attribute's shape (the task
  routing, the fast weights), which engine.compile's path removes (TaskLoRA's one-task index,
  the other guard issue 49 found, is gone from both);
* ``graphs`` (the "after": the first round with engine.compile's path), ``graphs_added_later``
  (during the timed rounds: 0 when shapes and routing no longer recompile) and ``compile_s``;
  what stays is one graph family per grad mode (the query loss before adapting runs without
  gradient), attention mask or none, and a size of 1 (one row, one task);
* ``first_round_s`` (compiling included) against ``eager_round_s``, the same meta-batches eager;
* ``seconds`` (median per meta-step, eager and compiled), ``speedup`` (their totals' ratio), ``mfu``
  (as above, every pass of the meta-steps counted, forward-only ones without a backward, side by
  side) and ``grad_rel_error`` (compiled against eager, the largest over the meta-batches).

* ``packed``: ``engine.pack_weights`` (frozen weights packed once for oneDNN's bf16 matmul): each
  meta-batch plain and packed, alternated, eager and compiled: ``seconds`` per meta-step,
  ``speedup`` (plain over packed) and ``grad_rel_error`` (the first packed, compiled round against
  eager plain); ``null`` in fp32 or without oneDNN's bf16 matmul.

One method's 20 meta-steps are shorter than their compiling on the 2-core CPU; a process
compiles once for all it runs, and the whole default run (five methods, then evaluation) repays
it, so the recipe's ``engine.compile: auto`` compiles there (docs/benchmarks.md).

``--dtype auto`` (the default) computes in what a run on this CPU would: bf16 with AMX or
AVX512-BF16, fp32 without (there bf16 is emulated, and no run computes in it).

Usage:
    python benchmarks/compiled.py [--tiny | --random] [--threads 1] [--reps 5] [--meta-steps 4]
                                  [--dtype auto|bfloat16|float32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (benchmarks/common.py)
    PassCounter,
    add_dtype_argument,
    add_model_arguments,
    build_lora_model,
    compute_dtype,
    give_trained_scale,
    matmul_peak,
    median_times,
    model_name,
    recipe_plans,
    relative_error,
    synchronize,
)

from fmmeta.algorithms.build import build_algorithm  # noqa: E402
from fmmeta.config import LoraConfig  # noqa: E402
from fmmeta.engine.compiled import RECOMPILE_LIMIT, compile_layers, decoder_layers, unique_graphs  # noqa: E402
from fmmeta.engine.packed import pack_frozen_linears, packable, packing_available  # noqa: E402
from fmmeta.flops import model_shape, pass_flops, pass_size  # noqa: E402
from fmmeta.recipe_config import RecipeConfig  # noqa: E402
from fmmeta.tasks.config import build_task_set  # noqa: E402


def plain_graph_count(model: torch.nn.Module, works: list, algorithm: object, params: list) -> int:
    """Graphs a plain per-layer ``layer.compile(dynamic=True)`` compiles over one round of the
    meta-batches: what issue 49 found (a graph per grad mode, first-layer requires-grad, row count,
    one-task index...), counted with dynamo's tracing only (backend "eager": the count is
    dynamo's, inductor would compile the same graphs), then undone."""
    layers = decoder_layers(model)
    before = unique_graphs()
    for layer in layers:
        layer.compile(backend="eager", dynamic=True)
    for work in works:
        algorithm.rank_gradient(model, params, work)  # type: ignore[attr-defined]
    graphs = unique_graphs() - before
    for layer in layers:
        layer._compiled_call_impl = None  # back to eager; the engine.compile path compiles next
    torch._dynamo.reset()
    return graphs


def packed_rounds(model: torch.nn.Module, works: list, run: Callable, reps: int,
                  eager_grads: list[list[torch.Tensor]]) -> dict | None:
    """``engine.pack_weights``: each meta-batch run with the frozen weights plain and packed
    (fmmeta.engine.packed), alternated, eager and compiled; ``None`` where nothing can be packed
    (fp32, or no oneDNN bf16 matmul). The first packed round (compiled) compiles the packed op's
    graphs; its meta-gradients are compared with eager's plain ones."""
    layers = [m for m in model.modules() if packable(m)]
    if not packing_available() or not layers:
        return None
    pack_frozen_linears(model)
    first = [run(w) for w in works]
    total = {f"{mode}_{weights}": 0.0 for mode in ("eager", "compiled") for weights in ("plain", "packed")}
    for _ in range(reps):
        for work in works:
            for mode in ("eager", "compiled"):
                with torch.compiler.set_stance("force_eager" if mode == "eager" else "default"):
                    for layer in layers:
                        layer.__dict__.pop("forward", None)  # plain again (the packed copies stay)
                    total[f"{mode}_plain"] += run(work)[1]
                    pack_frozen_linears(model)
                    total[f"{mode}_packed"] += run(work)[1]
    return {"layers": len(layers),
            "seconds": {k: round(v / reps / len(works), 4) for k, v in total.items()},
            "speedup": {m: round(total[f"{m}_plain"] / total[f"{m}_packed"], 3) for m in ("eager", "compiled")},
            "grad_rel_error": max(relative_error(p[0], e)[0] for p, e in zip(first, eager_grads))}


def meta_steps(args: argparse.Namespace, dtype: torch.dtype) -> dict:
    """Eager against regionally compiled FOMAML meta-steps (see the module docstring)."""
    cfg = RecipeConfig()
    model, params, tok = build_lora_model(args, args.dtype, cfg.lora)
    model.eval()  # no LoRA dropout: eager and compiled must compute the same gradient
    give_trained_scale(params)
    algorithm = build_algorithm("fomaml", cfg.algorithm, tok.pad_token_id)
    plans = recipe_plans(build_task_set(cfg.tasks, tok, seed=0).meta_train, cfg, algorithm, args.meta_steps)
    works = [algorithm.prepare(plan) for plan in plans]
    counter = PassCounter(model)
    hf = model.base_model.model.config
    peak = matmul_peak(hf.hidden_size, hf.intermediate_size, 512, dtype, args.reps, args.device)

    def run(work: object) -> tuple[list[torch.Tensor], float, int]:
        counter.reset()
        start = time.perf_counter()
        grads = algorithm.rank_gradient(model, params, work).grads  # type: ignore[attr-defined]
        synchronize()
        return grads, time.perf_counter() - start, counter.model_flops()

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    plain_graphs = plain_graph_count(model, works, algorithm, params)
    compiled = compile_layers(model, backend=args.backend)  # engine.compile's path
    with torch.compiler.set_stance("force_eager"):
        eager = [run(w) for w in works]
    first = [run(w) for w in works]
    graphs, compile_s = compiled.graphs, compiled.seconds
    times: dict[str, list[list[float]]] = {"eager": [[] for _ in works], "compiled": [[] for _ in works]}
    for _ in range(args.reps):
        for i, work in enumerate(works):
            with torch.compiler.set_stance("force_eager"):
                times["eager"][i].append(run(work)[1])
            times["compiled"][i].append(run(work)[1])
    added = compiled.graphs - graphs  # over the timed rounds: recompiles after the first
    packed = packed_rounds(model, works, run, args.reps, [g for g, _, _ in eager])
    per_step = {k: [statistics.median(t) for t in v] for k, v in times.items()}
    flops = sum(f for _, _, f in eager)
    return {
        "meta_batches": len(works), "layers_compiled": compiled.layers,
        "graphs_plain": plain_graphs, "graphs": graphs, "graphs_added_later": added,
        "compile_s": round(compile_s, 1),
        "first_round_s": round(sum(s for _, s, _ in first), 1),
        "eager_round_s": round(sum(s for _, s, _ in eager), 1),
        "seconds": {k: round(statistics.median(v), 4) for k, v in per_step.items()},
        "speedup": round(sum(per_step["eager"]) / sum(per_step["compiled"]), 3),
        "peak_flops_per_s": round(peak),
        "mfu": {k: round(flops / sum(v) / peak, 3) for k, v in per_step.items()},
        "grad_rel_error": max(relative_error(c[0], e[0])[0] for c, e in zip(first, eager)),
        "packed": packed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_dtype_argument(ap)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=40, help="tokens per row")
    ap.add_argument("--answer", type=int, default=6, help="positions the loss is taken on, per row")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager"],
                    help="torch.compile's backend (aot_eager: the code path without inductor's kernels)")
    ap.add_argument("--meta-steps", type=int, default=4,
                    help="FOMAML meta-batches to run eager and with compiled layers (0: none)")
    args = ap.parse_args()
    dtype = getattr(torch, compute_dtype(args))
    model, params, _ = build_lora_model(args, args.dtype, LoraConfig())
    model.eval()  # no LoRA dropout: every run must compute the same gradient
    reference, ref_params, _ = build_lora_model(args, "float32", LoraConfig())  # the same weights, in fp32
    reference.eval()
    shape = model_shape(model)  # before compiling: the count reads the model with one eager forward
    hf = model.base_model.model.config
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, hf.vocab_size, (args.rows, args.tokens), generator=gen).to(args.device)
    targets = torch.randint(0, hf.vocab_size, (args.rows * args.answer,), generator=gen).to(args.device)
    # the positions as an index tensor, as the recipe's loss asks for them (an int took 3.5x as
    # long in eager on this transformers version, 2026-12-04)
    keep = torch.arange(args.tokens - args.answer, args.tokens, device=args.device)

    def step(m: torch.nn.Module, weights: list[torch.Tensor] = params) -> list[torch.Tensor]:
        logits = m(input_ids=ids, use_cache=False, logits_to_keep=keep).logits
        F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets).backward()
        grads = [p.grad.detach().clone() for p in weights if p.grad is not None]
        for p in weights:
            p.grad = None
        return grads

    fp32 = step(reference, ref_params)
    del reference, ref_params
    eager = step(model)
    start = time.perf_counter()
    compiled_model = torch.compile(model, backend=args.backend)
    compiled = step(compiled_model)
    compile_s = time.perf_counter() - start
    seconds = median_times({"eager": lambda: step(model), "compiled": lambda: step(compiled_model)}, args.reps)
    tokens = args.rows * args.tokens
    peak = matmul_peak(hf.hidden_size, hf.intermediate_size, tokens, dtype, args.reps, args.device)
    flops = pass_flops(shape, pass_size(ids, logits_to_keep=keep, backward=True))
    mfu = {k: flops / s / peak for k, s in seconds.items()}
    error = relative_error(compiled, eager)[0]
    vs_fp32 = {"eager": relative_error(eager, fp32)[0], "compiled": relative_error(compiled, fp32)[0]}
    print(f"model {model_name(args)} in {args.dtype}, {args.rows} x {args.tokens} tokens, "
          f"threads {torch.get_num_threads()}: eager {seconds['eager']:.3f}s (MFU {mfu['eager']:.3f}), "
          f"compiled {seconds['compiled']:.3f}s (MFU {mfu['compiled']:.3f}) after {compile_s:.1f}s of "
          f"compiling; gradient error compiled vs eager {error:.2e}, against fp32: eager "
          f"{vs_fp32['eager']:.2e}, compiled {vs_fp32['compiled']:.2e}")
    steps = meta_steps(args, dtype) if args.meta_steps > 0 else None
    if steps is not None:
        print(f"meta-steps ({steps['meta_batches']} FOMAML meta-batches, {steps['layers_compiled']} layers "
              f"compiled): first round {steps['first_round_s']}s ({steps['compile_s']}s compiling) against "
              f"{steps['eager_round_s']}s eager; graphs: {steps['graphs_plain']} with a plain layer.compile, "
              f"{steps['graphs']} with engine.compile's, {steps['graphs_added_later']} more later; then {steps['seconds']['eager']:.3f}s eager, "
              f"{steps['seconds']['compiled']:.3f}s compiled per meta-step ({steps['speedup']}x), MFU "
              f"{steps['mfu']['eager']} / {steps['mfu']['compiled']}; gradient error {steps['grad_rel_error']:.2e}")
        if steps["packed"] is not None:
            packed = steps["packed"]
            print(f"frozen weights packed for oneDNN ({packed['layers']} layers; engine.pack_weights): "
                  f"{packed['speedup']['eager']}x eager, {packed['speedup']['compiled']}x compiled per meta-step, "
                  f"alternated with plain; gradient error against eager plain {packed['grad_rel_error']:.2e}")
    print(json.dumps({"device": args.device, "model": model_name(args), "dtype": args.dtype, "backend": args.backend,
                      "threads": torch.get_num_threads(), "rows": args.rows, "tokens": args.tokens,
                      "seconds": {k: round(s, 4) for k, s in seconds.items()},
                      "speedup": round(seconds["eager"] / seconds["compiled"], 3),
                      "compile_s": round(compile_s, 1), "flops": flops, "peak_flops_per_s": round(peak),
                      "mfu": {k: round(m, 3) for k, m in mfu.items()},
                      "grad_rel_error": error,
                      "grad_rel_error_vs_fp32": {k: round(e, 5) for k, e in vs_fp32.items()},
                      "meta_step": steps}))


if __name__ == "__main__":
    main()
