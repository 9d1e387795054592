"""Benchmark: what a compiled layer stack buys one forward and backward pass, against eager.

A bf16 meta-step's model FLOP/s stays near 0.3 of a matmul of the model's shapes on one CPU thread
(``benchmarks/precision.py``). Most of the rest is small memory-bound operations (norms, rotary
embeddings, SiLU, casts), and only fusing them can remove that time. This measures how far fusing
goes, on one pass of the default model with its LoRA adapter: ``--rows`` rows of ``--tokens``
tokens, the loss on the last ``--answer`` positions, as in the recipe's passes. The same model runs
eager and under ``torch.compile`` (inductor, default mode), alternated. Prints a few human lines
and, as the last line, one JSON object:

* ``seconds``: median wall seconds of the pass, ``eager`` and ``compiled``; ``speedup`` their ratio;
* ``compile_s``: the first compiled call (compiling it; less where inductor's on-disk cache
  already holds the graphs);
* ``mfu``: 6 x non-embedding parameters x tokens per second, over the FLOP/s of a matmul of the
  model's MLP shape at the pass's tokens in the same dtype, measured in this run;
* ``grad_rel_error``: the compiled pass's adapter gradient against eager's, and
  ``grad_rel_error_vs_fp32`` each one's against the fp32 model's eager pass (in the compute dtype,
  both round; the question is whether compiling rounds worse).

The recipe keeps eager: its passes change shape from pass to pass, and each new shape would
compile again.

Usage:
    python benchmarks/compiled.py [--tiny | --random] [--threads 1] [--reps 5] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (benchmarks/common.py)
    add_model_arguments,
    build_lora_model,
    matmul_peak,
    median_times,
    model_name,
    non_embedding_parameters,
    relative_error,
)

from fmmeta.config import LoraConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=40, help="tokens per row")
    ap.add_argument("--answer", type=int, default=6, help="positions the loss is taken on, per row")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    model, params, _ = build_lora_model(args, args.dtype, LoraConfig())
    model.eval()  # no LoRA dropout: every run must compute the same gradient
    reference, ref_params, _ = build_lora_model(args, "float32", LoraConfig())  # the same weights, in fp32
    reference.eval()
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
    compiled_model = torch.compile(model)
    compiled = step(compiled_model)
    compile_s = time.perf_counter() - start
    seconds = median_times({"eager": lambda: step(model), "compiled": lambda: step(compiled_model)}, args.reps)
    tokens = args.rows * args.tokens
    peak = matmul_peak(hf.hidden_size, hf.intermediate_size, tokens, dtype, args.reps, args.device)
    flops = 6 * non_embedding_parameters(model) * tokens
    mfu = {k: flops / s / peak for k, s in seconds.items()}
    error = relative_error(compiled, eager)[0]
    vs_fp32 = {"eager": relative_error(eager, fp32)[0], "compiled": relative_error(compiled, fp32)[0]}
    print(f"model {model_name(args)} in {args.dtype}, {args.rows} x {args.tokens} tokens, "
          f"threads {torch.get_num_threads()}: eager {seconds['eager']:.3f}s (MFU {mfu['eager']:.3f}), "
          f"compiled {seconds['compiled']:.3f}s (MFU {mfu['compiled']:.3f}) after {compile_s:.1f}s of "
          f"compiling; gradient error compiled vs eager {error:.2e}, against fp32: eager "
          f"{vs_fp32['eager']:.2e}, compiled {vs_fp32['compiled']:.2e}")
    print(json.dumps({"device": args.device, "model": model_name(args), "dtype": args.dtype,
                      "threads": torch.get_num_threads(), "rows": args.rows, "tokens": args.tokens,
                      "seconds": {k: round(s, 4) for k, s in seconds.items()},
                      "speedup": round(seconds["eager"] / seconds["compiled"], 3),
                      "compile_s": round(compile_s, 1), "peak_flops_per_s": round(peak),
                      "mfu": {k: round(m, 3) for k, m in mfu.items()},
                      "grad_rel_error": error,
                      "grad_rel_error_vs_fp32": {k: round(e, 5) for k, e in vs_fp32.items()}}))


if __name__ == "__main__":
    main()
