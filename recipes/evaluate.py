#!/usr/bin/env python
"""Evaluate saved adapters (or the base model alone) on held-out tasks.

    python recipes/evaluate.py --run runs/default                 # every adapter of a finished run
    python recipes/evaluate.py --config recipes/configs/smoke.yaml --adapter mine=path/to/adapter
    python recipes/evaluate.py --config recipes/configs/smoke.yaml   # base model + in-context only
    fmmeta evaluate --run runs/default --import my_pkg.tasks       # installed; a suite registered in Python

Every call writes a new report folder, ``eval-YYYYmmdd-HHMMSS`` (``-2``, ``-3`` ... if that name is
taken), inside the run folder (``--run``) or ``output_dir``: a report is never rewritten, so the one
training wrote (``<run>/eval``) and every earlier re-evaluation stay as they were.

Honest by construction (see fmmeta.evaluation): the adaptation lr of each method is chosen on
validation tasks, never on the held-out ones; every method adapts with the same inner loop
for 0..``eval.max_steps`` steps; scores are reported over ``eval.seeds`` episode draws, mean and
worst case. ``recipes/train.py`` runs the same evaluation at the end of a run.

Under a launcher (``deepspeed``, ``torchrun``, ``accelerate launch``; or ``-m fmmeta.recipes.evaluate``)
every rank loads the model the way training does (partitioned under ZeRO-3) and evaluates its share
of the episodes; the report is the one a single process writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from fmmeta.startup import Terminated, ctrl_c_raises  # first: Ctrl-C during the imports below is a message

# isort: split
from fmmeta.checkpoint.lock import RunLock, RunLockError
from fmmeta.checkpoint.resume import adapter_problems
from fmmeta.config import describe_config, flat_config, load_config
from fmmeta.engine import EngineFactory, broadcast_from_rank0, strip_local_rank
from fmmeta.errors import UserInputError
from fmmeta.evaluation.run import Replicate, evaluate_run
from fmmeta.exit_codes import exit_code
from fmmeta.library_warnings import show_library_warnings_once
from fmmeta.models import add_lora, initial_adapter
from fmmeta.recipe_args import IMPORT_HELP, OneConfig, import_modules
from fmmeta.recipe_config import RecipeConfig
from fmmeta.shipped import shipped_path, with_shipped_paths
from fmmeta.tasks.config import build_task_set
from fmmeta.workers import Workers

logger = logging.getLogger("fmmeta.evaluate")

ADAPTER_FILE = "adapter_model.safetensors"


def parse_args(argv: list[str], prog: str | None = None) -> argparse.Namespace:
    """``--run`` or ``--config``, ``--adapter`` folders, ``--import`` modules and overrides."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Evaluate adapters on held-out tasks (base model and in-context included). "
        "Each call writes a NEW report folder eval-YYYYmmdd-HHMMSS inside the run folder (--run) or "
        "output_dir; no earlier report is ever overwritten.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides (section.key=value):\n" + describe_config(RecipeConfig()),
    )
    parser.add_argument("--run", type=Path, help="a finished run's output_dir (its config.yaml "
                        "and every <method>/adapter in it are used; the report goes inside it)")
    parser.add_argument("--config", help="YAML config (when not using --run)", action=OneConfig)
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                        help="an adapter folder in peft format to evaluate; repeatable")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help=IMPORT_HELP)
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(strip_local_rank(argv))
    args.config = None if args.config is None else shipped_path(args.config)
    args.overrides = with_shipped_paths(args.overrides)
    return args


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Exit codes (:mod:`fmmeta.exit_codes`): 0 done, 2 bad input (arguments, config, run folder,
    adapters), 130 Ctrl-C, 143 SIGTERM."""
    ctrl_c_raises()
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)
    with exit_code(logger, stopped_before_report) as outcome:
        import_modules(args.imports)
        config_path = args.config or (run_config(args.run) if args.run is not None else None)
        cfg = load_config(RecipeConfig, config_path, args.overrides).on_this_machine()
        named = named_adapters(args.adapter)
        if args.run is not None:
            replicates = run_replicates(args.run, cfg)
            for replicate in replicates:
                refuse_changed_settings(replicate.cfg, Path(replicate.cfg.output_dir), list(replicate.adapters),
                                        run_config(args.run))
            if named and len(replicates) > 1:
                raise UserInputError(f"--adapter with --run {str(args.run)!r}, a run of {len(replicates)} training "
                                     "replicates: an added adapter has no replicates to pair with; evaluate it "
                                     "with --config and --adapter NAME=PATH")
        else:
            replicates = [Replicate(cfg, None)]
        replicates[0].adapters.update(named)
        out = args.run if args.run is not None else Path(cfg.output_dir).expanduser()
        paths = evaluate(cfg, replicates, out, run=args.run is not None)
        print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    return outcome.code


def stopped_before_report(err: KeyboardInterrupt) -> None:
    """The adapters and the run are only read, and an unfinished report is removed: say so."""
    print(f"stopped by {'SIGTERM' if isinstance(err, Terminated) else 'Ctrl-C'}: no report was written and "
          "nothing else was changed; rerun the same command to evaluate again", file=sys.stderr)


def run_config(run: Path) -> str:
    """The run folder's ``config.yaml``; refuses a folder that is not a run."""
    if not run.is_dir():
        raise UserInputError(f"--run {str(run)!r} is not a folder: give the output_dir of a run")
    config = run / "config.yaml"
    if not config.is_file():
        raise UserInputError(f"--run {str(run)!r} has no config.yaml: not a run folder written by "
                             "recipes/train.py (use --config and --adapter NAME=PATH instead)")
    return str(config)


def run_replicates(run: Path, cfg: RecipeConfig) -> list[Replicate]:
    """The run's training replicates, each with its ``<method>/adapter`` folders (every replicate
    needs the same methods: they are compared replicate by replicate).

    Raises:
        UserInputError: no adapter, or replicates that finished different methods.
    """
    replicates = []
    for replicate_cfg in cfg.replicate_configs():
        folder = run if cfg.train.replicates == 1 else run / Path(replicate_cfg.output_dir).name
        replicate_cfg = dataclasses.replace(replicate_cfg, output_dir=str(folder))
        replicates.append(Replicate(replicate_cfg, None, run_adapters(folder, cfg.methods)))
    finished = {Path(r.cfg.output_dir).name: sorted(r.adapters) for r in replicates}
    if len({tuple(v) for v in finished.values()}) > 1:
        raise UserInputError(f"--run {str(run)!r}: its replicates finished different methods "
                             f"({'; '.join(f'{k}: {v}' for k, v in finished.items())}); rerun training to "
                             "finish them (it resumes), then evaluate")
    return replicates


def run_adapters(run: Path, methods: tuple[str, ...]) -> dict[str, Path]:
    """Every ``<method>/adapter`` of the run; refuses a run without any, warns about missing ones."""
    found = {m: run / m / "adapter" for m in methods if (run / m / "adapter" / ADAPTER_FILE).is_file()}
    missing = [m for m in methods if m not in found]
    if not found:
        raise UserInputError(
            f"--run {str(run)!r} has no trained adapter ({', '.join(f'{m}/adapter/{ADAPTER_FILE}' for m in methods)} "
            "all missing): the run did not finish a method; rerun training to resume it, or "
            "evaluate the base model with --config"
        )
    if missing:
        logger.warning("--run %s: no adapter for %s (unfinished?); evaluating %s", run,
                       ", ".join(missing), ", ".join(found))
    return found


def refuse_changed_settings(cfg: RecipeConfig, run: Path, methods: list[str], config_path: str) -> None:
    """Refuses overrides that change what the run's adapters mean (a LoRA shape or scale, the
    base model), in the words training uses to refuse such a resume."""
    problems = adapter_problems(cfg, run, methods,
                                saved=lambda: load_config(RecipeConfig, config_path, []))
    if problems:
        raise UserInputError(f"--run {str(run)!r} refused; nothing in {str(run)!r} was changed:\n"
                             + "\n".join(f"  - {p}" for p in problems))


def named_adapters(specs: list[str]) -> dict[str, Path]:
    """``--adapter NAME=PATH`` arguments; each PATH must hold a peft adapter."""
    adapters: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not (Path(path) / ADAPTER_FILE).is_file():
            raise UserInputError(f"--adapter {spec!r} is invalid: use NAME=FOLDER with a peft "
                                 f"adapter folder (holding {ADAPTER_FILE})")
        adapters[name] = Path(path)
    return adapters


def new_report_dir(out: Path) -> Path:
    """Creates and returns ``out/eval-YYYYmmdd-HHMMSS`` (``-2``, ``-3`` ... when taken); never an
    existing folder, so no report is overwritten."""
    stem = out / time.strftime("eval-%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        folder = stem if n == 1 else stem.with_name(f"{stem.name}-{n}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
        except OSError as err:
            raise UserInputError(f"cannot create the report folder {str(folder)!r} ({err.strerror}): "
                                 "choose a run folder or output_dir you can write to") from None
    raise UserInputError(f"{str(out)!r} has 999 reports from this second: remove some")


def evaluate(cfg: RecipeConfig, replicates: list[Replicate], out: Path, *, run: bool = False) -> dict[str, Path]:
    """Builds the model and tasks, and evaluates the replicates' adapters into a new report
    folder in ``out`` (``run``: ``out`` is a run folder, held locked meanwhile)."""
    engines = EngineFactory(cfg.engine, cfg.optim, precision=cfg.precision)
    rank = engines.join(flat_config(cfg))
    show_library_warnings_once(rank)  # as in training: each library warning once, by rank 0
    # Rank 0 claims the folder before minutes of model loading (only rank 0 writes into it); every
    # rank learns the outcome, so a refusal stops all of them together.
    claimed, lock = "", None
    if rank == 0:
        try:
            lock = lock_run(out) if run else None
            claimed = "ok:" + str(new_report_dir(out))
        except UserInputError as err:
            claimed = "error:" + str(err)
    try:
        outcome, _, report = broadcast_from_rank0(claimed).partition(":")
        if outcome == "error":
            raise UserInputError(report)
        try:
            return _evaluate(engines, cfg, replicates, out, Path(report))
        except BaseException:
            if rank == 0:  # failed or stopped: leave no empty or half-written report behind
                shutil.rmtree(report, ignore_errors=True)
            raise
    finally:
        if lock is not None:
            lock.release()


def lock_run(run: Path) -> RunLock:
    """The run folder's lock, so that no training writes into it while it is scored.

    Raises:
        UserInputError: a run still trains there (its adapters and metrics are not final yet), or
            the folder cannot be locked (read-only).
    """
    try:
        return RunLock.acquire(run)
    except RunLockError as err:
        raise UserInputError(
            f"--run {str(run)!r} is in use ({err}). Its adapters and metrics are not final while it "
            "trains: wait for it to finish (or stop it), then evaluate"
        ) from None
    except OSError as err:
        raise UserInputError(
            f"--run {str(run)!r} cannot be locked ({err.strerror}: {err.filename!r}): the report is "
            "written inside the run folder, so evaluate a copy of the run in a folder you can write to"
        ) from None


def _evaluate(engines: EngineFactory, cfg: RecipeConfig, replicates: list[Replicate], out: Path,
              report: Path) -> dict[str, Path]:
    base, tokenizer = engines.build_base(cfg.model)  # under ZeRO-3 partitioned, as training builds it
    suite = build_task_set(cfg.tasks, tokenizer)
    model = add_lora(base, cfg.lora, seed=cfg.train.seed)  # replicate 0's initial adapter (B = 0)
    for replicate in replicates:  # each replicate's base is its own initial adapter
        replicate.initial = initial_adapter(model, replicate.cfg.train.seed)
    engine = engines.engine(model)
    workers = Workers.from_setting(cfg.engine.workers, distributed=engines.distributed)
    try:
        return evaluate_run(cfg, engine, tokenizer, suite, replicates, out, report_dir=report, workers=workers)
    finally:
        engine.close()


def cli(argv: list[str] | None = None, prog: str | None = None) -> int:
    """What every entry point runs: ``python recipes/evaluate.py``,
    ``python -m fmmeta.recipes.evaluate`` (and launchers' ``-m``) and ``fmmeta evaluate``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return main(argv, prog)


if __name__ == "__main__":
    sys.exit(cli())
