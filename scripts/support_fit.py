#!/usr/bin/env python
"""Does an inner-loop setting fit the support set? Support and query scores along an adaptation.

For a run's config (and optionally a trained adapter), adapts on every episode of one split's
tasks (one episode per task, seed ``tasks.seed``, the evaluation's first draw) for ``--steps``
steps with each ``--try`` setting, and prints the mean support and query loss and accuracy after
the scored steps. Choose settings on ``validation`` tasks, or on the CLDR suite's validation layout
(``'tasks.options={score_on: validation}'`` with ``--split held_out``), never on held-out ones.
The last line is every figure as one JSON object.

    python scripts/support_fit.py --config runs/default/config.yaml \\
        --adapter runs/default/multitask/adapter --split held_out \\
        'tasks.options={score_on: validation}' --steps 6 --try sgd:0.1:1.0 --try sgd:0.3:1.0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.inner_loop import restore
from fmmeta.config import load_config
from fmmeta.evaluation.run import draw_episodes, read_adapter_state
from fmmeta.evaluation.support_fit import support_fit
from fmmeta.models import add_lora, build_model_and_tokenizer
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.config import build_task_set


def parse_setting(text: str) -> InnerLoopConfig:
    """``OPTIMIZER:LR[:CLIP]`` (``sgd:0.1:1.0``; no clip or ``none`` = unclipped) as an inner loop."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"--try {text!r} is malformed: write OPTIMIZER:LR[:CLIP], e.g. sgd:0.1:1.0")
    try:
        clip = None if len(parts) == 2 or parts[2] == "none" else float(parts[2])
        cfg = InnerLoopConfig(inner_optimizer=parts[0], inner_lr=float(parts[1]), inner_clip_norm=clip)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--try {text!r}: {err}") from err
    problems = cfg.validate()
    if problems:
        raise argparse.ArgumentTypeError(f"--try {text!r}: " + "; ".join(problems))
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the run's YAML config")
    parser.add_argument("--adapter", type=Path, help="adapter folder to start from (default: the base)")
    parser.add_argument("--split", required=True, choices=["validation", "held_out"],
                        help="whose tasks to adapt on")
    parser.add_argument("--steps", type=int, default=6, help="adaptation steps (default 6)")
    parser.add_argument("--score", type=int, nargs="*", default=None, metavar="STEP",
                        help="steps to score (default: 0, 2, steps/2 and steps)")
    parser.add_argument("--try", dest="settings", action="append", type=parse_setting, required=True,
                        metavar="OPT:LR[:CLIP]", help="an inner-loop setting (repeatable)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    cfg = load_config(RecipeConfig, args.config, args.overrides)
    model, tokenizer = build_model_and_tokenizer(cfg.model)
    model = add_lora(model, cfg.lora, seed=cfg.train.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    if args.adapter is not None:
        restore(params, read_adapter_state(model, args.adapter))
    tasks = getattr(build_task_set(cfg.tasks, tokenizer), args.split)
    episodes = draw_episodes(tasks, cfg.tasks.seed, 1, 1)
    score = args.score if args.score is not None else sorted({0, min(2, args.steps), args.steps // 2})
    print(f"{len(episodes)} episodes of {args.split}: {', '.join(t.name for t in tasks)}", flush=True)
    out = []
    for setting in args.settings:
        for p in support_fit(model, params, episodes, setting, args.steps, tokenizer.pad_token_id,
                             score_steps=score, micro_batch_size=cfg.eval.micro_batch_size):
            row = {"optimizer": setting.inner_optimizer, "lr": setting.inner_lr,
                   "clip": setting.inner_clip_norm, **dataclasses.asdict(p)}
            out.append(row)
            print(f"{row['optimizer']} lr {row['lr']:g} clip {row['clip']} step {p.step}: support "
                  f"acc {p.support_accuracy:.3f} loss {p.support_loss:.3f} | query acc "
                  f"{p.query_accuracy:.3f} loss {p.query_loss:.3f}", flush=True)
    print(json.dumps({"episodes": len(episodes), "split": args.split, "points": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
