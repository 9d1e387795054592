#!/usr/bin/env python
"""Evaluate saved adapters (or the base model alone) on held-out tasks.

    python recipes/evaluate.py --run runs/default                 # every adapter of a finished run
    python recipes/evaluate.py --config recipes/configs/smoke.yaml --adapter mine=path/to/adapter
    python recipes/evaluate.py --config recipes/configs/smoke.yaml   # base model + in-context only

Honest by construction (see fmmeta.evaluation): the adaptation lr of each method is chosen on
meta-validation tasks, never on the held-out ones; every method adapts with the same inner loop
for 0..``eval.max_steps`` steps; scores are reported over ``eval.seeds`` episode draws, mean and
worst case. ``recipes/train.py`` runs the same evaluation at the end of a run.

Under a launcher (``deepspeed``, ``torchrun``, ``accelerate launch``) every rank loads the model the
way training does (partitioned under ZeRO-3) and evaluates its share of the episodes; the report is
the one a single process writes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fmmeta.config import ConfigError, describe_config, load_config
from fmmeta.engine.build import build_engine, resolve_engine_kind
from fmmeta.engine.distributed import (
    default_backend,
    init_distributed,
    strip_local_rank,
)
from fmmeta.engine.partition import partitioned_build
from fmmeta.errors import UserInputError
from fmmeta.evaluation.heldout import evaluate_run
from fmmeta.models import add_lora, build_model_and_tokenizer
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.config import build_task_set

logger = logging.getLogger("fmmeta.evaluate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Evaluate adapters on held-out tasks (base model and in-context included).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides (section.key=value):\n" + describe_config(RecipeConfig()),
    )
    parser.add_argument("--run", type=Path, help="a finished run's output_dir (its config.yaml "
                        "and every <method>/adapter in it are used)")
    parser.add_argument("--config", help="YAML config (when not using --run)")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                        help="an adapter folder in peft format to evaluate; repeatable")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(strip_local_rank(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)
    config_path = args.config
    if args.run is not None:
        config_path = config_path or str(args.run / "config.yaml")
    try:
        cfg = load_config(RecipeConfig, config_path, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    adapters: dict[str, Path] = {}
    if args.run is not None:
        adapters = {m: args.run / m / "adapter" for m in cfg.methods
                    if (args.run / m / "adapter").is_dir()}
    for spec in args.adapter:
        name, sep, path = spec.partition("=")
        if not sep or not name or not Path(path).is_dir():
            print(f"error: --adapter {spec!r} is invalid: use NAME=FOLDER with an existing "
                  "peft adapter folder", file=sys.stderr)
            return 2
        adapters[name] = Path(path)
    out = args.run if args.run is not None else Path(cfg.output_dir)
    try:
        paths = evaluate(cfg, adapters, out)
    except UserInputError as err:  # found after the config loaded: the input, not a bug
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    return 0


def evaluate(cfg: RecipeConfig, adapters: dict[str, Path], out: Path) -> dict[str, Path]:
    """Builds the model and tasks, and evaluates ``adapters`` into ``out/eval``."""
    if resolve_engine_kind(cfg.engine) != "local":
        init_distributed(default_backend(), cfg.engine.collective_timeout_s)
    precision = {"float32": "fp32", "bfloat16": "bf16"}[cfg.model.dtype]
    partitioned = partitioned_build(cfg.engine, cfg.optim, precision=precision)
    base, tokenizer = build_model_and_tokenizer(cfg.model, partitioned=partitioned)
    suite = build_task_set(cfg.tasks, tokenizer, seed=cfg.train.seed)
    model = add_lora(base, cfg.lora, seed=cfg.train.seed)  # the shared initial adapter (B = 0)
    engine = build_engine(cfg.engine, model, cfg.optim, precision=precision)
    try:
        return evaluate_run(cfg, engine, tokenizer, suite, adapters, out)
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
