"""Benchmark: what held-out evaluation costs, against the path it replaced and the machine's peak.

Runs on the default run's model (SmolLM2-135M, embedded, no download) and its real held-out
episodes (the CLDR suite, real tokenizer), or with ``--tiny`` on a small random model (what
``make test`` runs). Every figure is a ratio of medians of runs interleaved in one process, so the
noise of a shared machine mostly cancels. Prints a few human lines and, as the last line, one JSON
object:

* ``classification_scoring_speedup``: one episode's query set scored one padded sequence per
  label word (the old path: ``micro_batch_size`` sequences per pass) / scored as one prefix tree
  per pass (``fmmeta.evaluation.scoring``), fp32 (target >= 2.5).
* ``in_context_scoring_speedup``: the same for the query with the support set as demonstrations
  (the old path encodes the demonstrations once per candidate; target >= 5).
* ``grouped_speedup``: a method's whole evaluation of ``--episodes`` episodes (adaptation for
  ``--steps`` steps, scoring at steps 0 and ``--steps``) one episode per pass / ``--group``
  episodes per pass, in the compute dtype.
* ``bf16_speedup``: the grouped evaluation in fp32 / in bf16 (CPU: bf16 only where the CPU has
  native bf16, see ``fmmeta.models.precision``; ``null`` elsewhere).
* ``tokens_per_s``: tokens (padding included) per second of the grouped evaluation of each
  kind of row: ``adapted_row`` (adaptation and scoring) and ``in_context_row`` (the support as
  demonstrations, scoring only), per dtype.
* ``model_flops_per_s`` and ``peak_flops_per_s``: achieved model FLOP/s of the grouped evaluation
  (each pass counted by ``fmmeta/flops.py``: the frozen base, the adapters, attention and the LM
  head where it runs; a backward where the pass has one; until 2026-12-07 it was 2 x non-embedding
  parameters x tokens per forward and 6 x per forward + backward) and a matmul of the model's
  shapes in the same dtype, measured in this run; ``mfu`` their ratio.

Usage:
    python benchmarks/evaluation.py [--tiny | --random] [--device cuda] [--reps 3] [--episodes 32] [--group 16]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402  (benchmarks/common.py)
    PassCounter,
    add_model_arguments,
    build_lora_model,
    matmul_peak,
    median_times,
    model_name,
    native_dtypes,
    non_embedding_parameters,
)

from fmmeta.algorithms.answer_loss import answer_logits  # noqa: E402
from fmmeta.algorithms.config import InnerLoopConfig  # noqa: E402
from fmmeta.config import LoraConfig  # noqa: E402
from fmmeta.evaluation.held_out import evaluate_methods  # noqa: E402
from fmmeta.evaluation.methods import IN_CONTEXT  # noqa: E402
from fmmeta.evaluation.run import draw_episodes, evaluation_tasks  # noqa: E402
from fmmeta.evaluation.scoring import score_query  # noqa: E402
from fmmeta.evaluation.settings import EvalSettings  # noqa: E402
from fmmeta.tasks.config import TasksConfig, build_task_set  # noqa: E402
from fmmeta.tasks.episode import Example, collate  # noqa: E402


def one_sequence_per_candidate(model: torch.nn.Module, examples: Sequence[Example],
                               choices: Sequence[Sequence[int]], pad_id: int, micro_batch_size: int
                               ) -> tuple[float, float]:
    """The scoring this project used before prefix trees, as its best configuration: every
    (query, label word) pair one padded sequence, ``micro_batch_size`` sequences per pass, the LM
    head on answer positions only. Returns (loss of the gold answers, accuracy)."""
    cands = [Example(ex.prompt_ids, tuple(c), ex.label) for ex in examples for c in choices]
    logprob = []
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(cands), micro_batch_size):
            batch = collate(cands[i : i + micro_batch_size], pad_id).to(device)
            logits, tgt, rows = answer_logits(model, batch)
            lp = F.log_softmax(logits.float(), -1).gather(1, tgt[:, None]).squeeze(1)
            logprob.append(torch.zeros(batch.input_ids.shape[0], device=device).index_add_(0, rows, lp).cpu())
    scores = torch.cat(logprob).view(len(examples), len(choices))
    labels = torch.tensor([ex.label for ex in examples])
    gold = scores.gather(1, labels[:, None]).squeeze(1)
    others = scores.scatter(1, labels[:, None], float("-inf")).max(dim=1).values
    return float(-gold.sum()), float((gold > others).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=32, help="held-out episodes per evaluation")
    ap.add_argument("--group", type=int, default=16, help="episodes per pass (eval.episodes_per_pass)")
    ap.add_argument("--steps", type=int, default=6, help="adaptation steps")
    ap.add_argument("--micro-batch", type=int, default=8)
    args = ap.parse_args()
    dtypes = native_dtypes(args.device)
    built = {}
    for dt in dtypes:
        model, params, tok = build_lora_model(args, dt, LoraConfig())
        built[dt] = (model.eval(), params)
    suite = build_task_set(TasksConfig(), tok, seed=0)
    episodes = draw_episodes(evaluation_tasks(suite.held_out, None), 0, 1, 1)
    classification = [ep for ep in episodes if ep.choices is not None]
    episodes = (episodes * (1 + args.episodes // len(episodes)))[: args.episodes]
    pad = tok.pad_token_id
    cfg = next(iter(built.values()))[0].base_model.model.config
    non_embedding = non_embedding_parameters(built["float32"][0])
    print(f"model {model_name(args)}: {non_embedding:,} non-embedding "
          f"parameters; {len(episodes)} episodes, {len(classification)} classification; "
          f"dtypes {dtypes}; threads {torch.get_num_threads()}")

    # 1. Scoring one classification episode, plain and with demonstrations, fp32.
    m32 = built["float32"][0]
    ep = classification[0]
    icl = ep.in_context_query(1024)
    t = median_times({
        "old": lambda: one_sequence_per_candidate(m32, ep.query, ep.choices, pad, args.micro_batch),
        "new": lambda: score_query(m32, ep, pad, micro_batch_size=args.micro_batch),
        "old_icl": lambda: one_sequence_per_candidate(m32, icl, ep.choices, pad, args.micro_batch),
        "new_icl": lambda: score_query(m32, icl, pad, choices=ep.choices,
                                       micro_batch_size=args.micro_batch),
    }, args.reps)
    old_loss, old_acc = one_sequence_per_candidate(m32, icl, ep.choices, pad, args.micro_batch)
    new = score_query(m32, icl, pad, choices=ep.choices, micro_batch_size=args.micro_batch)
    print(f"scoring one episode: {t['old']:.3f}s -> {t['new']:.3f}s; in context "
          f"{t['old_icl']:.3f}s -> {t['new_icl']:.3f}s (losses {old_loss / new.n_answer_tokens:.5f} "
          f"vs {new.loss:.5f}, accuracy {old_acc:.3f} vs {new.accuracy:.3f})")

    # 2. A method's whole evaluation: one episode per pass vs grouped, fp32 vs bf16; and the
    #    in-context row (scoring only) of the same episodes.
    inner = InnerLoopConfig(inner_lr=0.1, inner_clip_norm=1.0)
    counters = {dt: PassCounter(built[dt][0]) for dt in dtypes}

    def evaluation(dt: str, group: int, method: str = "base") -> Callable[[], object]:
        model, params = built[dt]
        settings = EvalSettings(inner=inner, max_steps=args.steps, pad_id=pad, min_seeds=1,
                                micro_batch_size=args.micro_batch, score_steps=[0], episodes_per_pass=group)
        return lambda: evaluate_methods(model, params, {method: None}, [episodes], settings)

    runs = {"float32/1": evaluation("float32", 1)}
    runs.update({f"{dt}/{args.group}": evaluation(dt, args.group) for dt in dtypes})
    runs.update({f"{dt}/{args.group}/in_context": evaluation(dt, args.group, IN_CONTEXT)
                 for dt in dtypes})
    t_eval = median_times(runs, args.reps)
    tokens_per_s: dict[str, dict[str, float]] = {}
    flops: dict[str, float] = {}
    for dt in dtypes:
        tokens_per_s[dt] = {}
        for kind, key in (("adapted_row", f"{dt}/{args.group}"),
                          ("in_context_row", f"{dt}/{args.group}/in_context")):
            counters[dt].reset()
            runs[key]()  # once more, counting its passes' tokens
            tokens_per_s[dt][kind] = sum(counters[dt].tokens.values()) / t_eval[key]
            if kind == "adapted_row":
                flops[dt] = counters[dt].model_flops() / t_eval[key]
    peak = {dt: matmul_peak(cfg.hidden_size, cfg.intermediate_size, 512,
                            getattr(torch, dt), args.reps, args.device) for dt in dtypes}
    for k, v in t_eval.items():
        print(f"evaluation {k} (dtype/episodes per pass): {v:.2f}s")
    for dt in dtypes:
        print(f"{dt}: adapted row {flops[dt] / 1e9:.1f} model GFLOP/s of a {peak[dt] / 1e9:.1f} "
              f"GFLOP/s matmul peak (mfu {flops[dt] / peak[dt]:.2f}); tokens/s {tokens_per_s[dt]}")
    result = {
        "device": args.device, "model": model_name(args), "threads": torch.get_num_threads(), "tiny": args.tiny,
        "classification_scoring_speedup": round(t["old"] / t["new"], 2),
        "in_context_scoring_speedup": round(t["old_icl"] / t["new_icl"], 2),
        "grouped_speedup": round(t_eval["float32/1"] / t_eval[f"float32/{args.group}"], 2),
        "bf16_speedup": (round(t_eval[f"float32/{args.group}"] / t_eval[f"bfloat16/{args.group}"], 2)
                         if "bfloat16" in dtypes else None),
        "seconds": {k: round(v, 3) for k, v in t_eval.items()},
        "tokens_per_s": {dt: {k: round(v, 1) for k, v in d.items()} for dt, d in tokens_per_s.items()},
        "model_flops_per_s": {dt: round(v) for dt, v in flops.items()},
        "peak_flops_per_s": {dt: round(v) for dt, v in peak.items()},
        "mfu": {dt: round(flops[dt] / peak[dt], 3) for dt in dtypes},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
