#!/usr/bin/env python
"""Meta-train LoRA adapters (FOMAML, Meta-SGD, Reptile and the multi-task baseline), then evaluate them.

Run with no arguments it meta-trains SmolLM2-135M on the built-in CLDR task suite and evaluates
every method on held-out tasks. Any launcher works, with the same arguments:

    python recipes/train.py                                          # the embedded default
    python recipes/train.py --config recipes/configs/smoke.yaml output_dir=runs/smoke
    deepspeed --num_gpus 2 recipes/train.py --config recipes/configs/smoke.yaml
    torchrun --nproc_per_node 2 recipes/train.py --config recipes/configs/smoke.yaml
    accelerate launch --config_file recipes/accelerate_zero3.yaml recipes/train.py ...
    fmmeta train --config recipes/configs/smoke.yaml                 # installed: the same recipe
    torchrun --nproc_per_node 2 -m fmmeta.recipes.train ...          # (deepspeed --module, accelerate launch -m)

The story, top to bottom: load and validate the whole config (before any model is touched), build
the model (under ZeRO-3 already partitioned, so no rank holds it whole) and the task suite, add the
seeded initial adapter once, then for each method: reset the adapter to that initial one, wrap the
model in an engine, resume from the latest complete checkpoint, run meta-steps (plan -> meta_step
-> gather observations -> log -> checkpoint), save the adapter and release the engine. Finally every
rank evaluates its share of the held-out episodes under one more engine on the same model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from tqdm import tqdm

from fmmeta.algorithms.first_order import build_algorithm
from fmmeta.algorithms.meta_sgd import MetaSGD, save_inner_lrs
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.algorithms.protocol import MetaAlgorithm
from fmmeta.checkpoint import CheckpointManager, CheckpointMismatchError, load_rng_state, save_rng_state
from fmmeta.checkpoint.resume import RESUME_FACTS, find_resume_checkpoint, resume_facts
from fmmeta.checkpoint.run_folder import claim_output_dir
from fmmeta.checkpoint.shared_folder import SharedFolderError, check_shared_folder
from fmmeta.config import ConfigError, describe_config, load_config
from fmmeta.engine.build import build_engine, resolve_engine_kind
from fmmeta.engine.distributed import (
    all_gather_object,
    broadcast_from_rank0,
    default_backend,
    init_distributed,
    strip_local_rank,
)
from fmmeta.engine.guard import NonFiniteError, NonFiniteGuard
from fmmeta.engine.partition import partitioned_build
from fmmeta.engine.protocol import Engine
from fmmeta.engine.zero import scatter_adapter
from fmmeta.errors import UserInputError
from fmmeta.evaluation.run import evaluate_run
from fmmeta.models import (
    add_lora,
    build_model_and_tokenizer,
    count_parameters,
    lora_shapes,
    model_id,
)
from fmmeta.recipe_args import IMPORT_HELP, import_modules
from fmmeta.recipe_config import RecipeConfig
from fmmeta.sampling import CostAwareSampler, Prefetcher, observation_from_dict
from fmmeta.shipped import shipped_path, with_shipped_paths
from fmmeta.strict_json import dumps_strict
from fmmeta.tasks.config import build_task_set

logger = logging.getLogger("fmmeta.train")

PRECISION = {"float32": "fp32", "bfloat16": "bf16"}


def parse_args(argv: list[str], prog: str | None = None) -> argparse.Namespace:
    """Parses ``--config`` and ``section.key=value`` overrides; ignores the launcher's --local_rank.

    A ``--config`` path or ``engine.deepspeed_config`` that does not exist here but names a file
    fmmeta ships (``recipes/configs/smoke.yaml``, ``ds_configs/zero3.json``) means that file, so
    an installed package runs the README's commands from any folder (:mod:`fmmeta.shipped`).
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Meta-train LoRA adapters with FOMAML / Reptile (and the multi-task baseline) "
        "on a task suite, then evaluate them on held-out tasks.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="overrides (section.key=value; the defaults a run uses shown):\n"
        + describe_config(RecipeConfig()),
    )
    parser.add_argument("--config", help="YAML file holding only what differs from the defaults")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of input errors too (they exit with code 2)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help=IMPORT_HELP)
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.meta_steps=10")
    args = parser.parse_args(strip_local_rank(argv))
    args.config = None if args.config is None else shipped_path(args.config)
    args.overrides = with_shipped_paths(args.overrides)
    return args


def setup_logging(rank: int) -> None:
    """Rank 0 logs at INFO; other ranks only warnings and errors, each line naming its rank."""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )


def banner(cfg: RecipeConfig, method: str, engine: Engine, model: torch.nn.Module) -> None:
    """The facts a person checks first: what runs where, and how much of it."""
    trainable, total = count_parameters(model)
    per_rank = cfg.sampler.meta_batch_size / engine.world_size
    budget = cfg.sampler.tokens_per_pass or f"{cfg.sampler.micro_batch_size} x longest sequence"
    logger.info(
        "== %s | model %s | params trainable %s / total %s (%.3f%%) | world size %d | ZeRO stage %s"
        " | tasks per meta-step %d (~%.1f per rank, packed into passes of %s tokens)"
        " | inner steps %d | meta-steps %d",
        method, model_id(cfg.model), f"{trainable:,}", f"{total:,}", 100 * trainable / total,
        engine.world_size, getattr(engine, "zero_stage", "-"), cfg.sampler.meta_batch_size,
        per_rank, budget, cfg.algorithm.inner_steps, cfg.train.meta_steps,
    )


def step_record(method: str, gathered: list[tuple[list[dict], dict]], item_wait: float) -> dict:
    """One meta-step's metrics over all ranks (what metrics.jsonl and the log line show)."""
    summaries = [s for _, s in gathered]
    n = sum(s["n_real_tasks"] for s in summaries)

    def mean(key: str) -> float:
        vals = [(s[key], s["n_real_tasks"]) for s in summaries if not math.isnan(s[key])]
        w = sum(k for _, k in vals)
        return sum(v * k for v, k in vals) / w if w else math.nan

    tokens = sum(s["n_tokens"] for s in summaries)
    padded = sum(s["n_padded_tokens"] for s in summaries)
    seconds = max(s["seconds"] for s in summaries)
    first = summaries[0]
    return {
        "method": method,
        "step": first["step"],
        "outer_loss": mean("outer_loss"),
        "query_loss_before": mean("query_loss_before"),
        "query_loss_after": mean("query_loss_after"),
        "tasks": n,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
        "padding_efficiency": tokens / padded if padded else math.nan,
        "step_s": seconds,
        "data_wait_s": item_wait,
        "grad_norm": first["outer"].get("grad_norm", math.nan),
        "lr": first["outer"].get("lr", math.nan),
        "skipped": first["outer"].get("skipped", 0.0),
        # metasgd: its learned inner step sizes after this step (identical on every rank)
        **{k: v for k, v in first["outer"].items() if k.startswith("inner_lr_")},
    }


class MetricsLog:
    """``metrics.jsonl`` on rank 0; on resume, lines after the checkpoint's step are dropped so
    the file reads as if the run had never stopped."""

    def __init__(self, path: Path, *, rank: int, method: str, keep_until: int) -> None:
        self.path, self.rank = path, rank
        if rank != 0 or not path.exists():
            return
        kept = [
            line for line in path.read_text().splitlines()
            if line.strip() and (
                json.loads(line)["method"] != method or json.loads(line)["step"] <= keep_until
            )
        ]
        path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        if self.rank == 0:
            with self.path.open("a") as fh:
                fh.write(dumps_strict(record) + "\n")


def restore(method_dir: Path, cfg: RecipeConfig, engine: Engine, prefetcher: Prefetcher,
            model: torch.nn.Module, algorithm: MetaAlgorithm) -> int:
    """Loads the checkpoint ``train.resume`` selects; returns the first step still to run.

    Its settings were compared with this run's before anything was written
    (``claim_output_dir``); the model and LoRA shapes are compared here, with the model built.
    """
    ckpt = find_resume_checkpoint(cfg.train, method_dir)
    if ckpt is None:
        return 0
    ckpt.check_compatible(model_id=model_id(cfg.model), lora_shapes=lora_shapes(model))
    engine.load_adapter(ckpt.path / "adapter")
    engine.load_optimizer(ckpt.path)
    state = ckpt.load_json("state.json")
    prefetcher.load_state_dict(state["prefetcher"])
    if isinstance(algorithm, MetaSGD):
        if "step_sizes" not in state:
            raise ValueError(f"{ckpt.path / 'state.json'} has no learned step sizes ('step_sizes'): "
                             "not a metasgd checkpoint; use a fresh output_dir or train.resume=never")
        algorithm.step_sizes.load_state_dict(state["step_sizes"])
    load_rng_state(ckpt, engine.rank)
    logger.info("resumed from %s (meta-step %d complete)", ckpt.path, ckpt.step)
    return ckpt.step + 1


def save_checkpoint(ckpts: CheckpointManager, step: int, cfg: RecipeConfig, method: str,
                    engine: Engine, prefetcher: Prefetcher, model: torch.nn.Module,
                    algorithm: MetaAlgorithm) -> None:
    """Adapter, optimizer (every rank's share), sampler state, RNG and step, written atomically;
    for metasgd also its step sizes and their optimizer state."""
    state: dict[str, Any] = {"step": step, "prefetcher": prefetcher.state_dict()}
    if isinstance(algorithm, MetaSGD):
        state["step_sizes"] = algorithm.step_sizes.state_dict()

    def write(w: Any) -> None:
        engine.save_adapter(w.path("adapter"))
        if w.rank == 0:
            save_step_sizes(algorithm, model, w.path("adapter"))
            w.add_files(p for p in w.path("adapter").iterdir() if p.is_file())
            w.save_json("state.json", state)
        w.add_files(engine.save_optimizer(w.directory))
        save_rng_state(w)

    ckpts.save(step, write, meta={"model_id": model_id(cfg.model), "lora_shapes": lora_shapes(model),
                                  RESUME_FACTS: resume_facts(cfg, method)})


class Interrupted(Exception):
    """Ctrl-C during meta-training; the message says where the last checkpoint is."""


@contextlib.contextmanager
def interrupt_note(method: str, ckpts: CheckpointManager, step: Callable[[], int]) -> Iterator[None]:
    """Turns Ctrl-C into :class:`Interrupted` naming the last checkpoint and how to resume."""
    try:
        yield
    except KeyboardInterrupt:
        last = ckpts.latest(verify=False)
        raise Interrupted(
            f"{method} interrupted during meta-step {step()}. Last checkpoint: "
            + (f"{last.path} (after meta-step {last.step})" if last else "none yet")
            + ". Rerun the same command to resume from it (train.resume=auto)"
        ) from None


def adapter_tensors(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The LoRA tensors, in the order every engine uses (``named_parameters``)."""
    return [p for p in model.parameters() if p.requires_grad]


def save_step_sizes(algorithm: MetaAlgorithm, model: torch.nn.Module, adapter_dir: Path) -> None:
    """metasgd: its learned inner lrs as ``inner_lrs.json`` in the adapter folder (rank 0 calls)."""
    if isinstance(algorithm, MetaSGD):
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        save_inner_lrs(adapter_dir, names, algorithm.step_sizes.lrs(len(names)))


def fresh_engine(cfg: RecipeConfig, model: torch.nn.Module, initial: list[torch.Tensor]) -> Engine:
    """Resets the adapter to the run's initial one and wraps the (shared) model in a new engine.

    Every method starts from the same seeded adapter this way without a copy of the base; the
    previous method's engine must have been closed (it removes its ZeRO-3 hooks).
    """
    scatter_adapter(adapter_tensors(model), initial)
    return build_engine(cfg.engine, model, cfg.optim, precision=PRECISION[cfg.model.dtype])


def train_method(cfg: RecipeConfig, method: str, model: torch.nn.Module, initial: list[torch.Tensor],
                 pad_id: int, suite: Any, out: Path) -> Path:
    """Meta-trains one adapter from the shared initial adapter; returns its peft folder."""
    method_dir = out / method
    engine = NonFiniteGuard(fresh_engine(cfg, model, initial), cfg.train.nonfinite)
    try:
        return _train(cfg, method, engine, model, pad_id, suite, out, method_dir)
    finally:
        engine.close()


def _train(cfg: RecipeConfig, method: str, engine: Engine, model: torch.nn.Module, pad_id: int,
           suite: Any, out: Path, method_dir: Path) -> Path:
    banner(cfg, method, engine, model)
    algorithm = build_algorithm(method, cfg.algorithm, pad_id)
    sampler = CostAwareSampler(
        suite.meta_train, cfg.sampler, world_size=engine.world_size, seed=cfg.train.seed,
        support_draws=algorithm.support_draws, support_repeats=algorithm.support_repeats,
    )
    # The next step's passes are collated in the prefetcher's thread while this one trains.
    prefetcher = Prefetcher(sampler, stop_step=cfg.train.meta_steps,
                            prepare=lambda plan: algorithm.prepare(plan.for_rank(engine.rank)))
    ckpts = CheckpointManager(
        method_dir / "checkpoints", keep_last=cfg.train.keep_last, rank=engine.rank,
        world_size=engine.world_size, barrier=engine.barrier,
    )
    start = restore(method_dir, cfg, engine, prefetcher, model, algorithm)
    metrics = MetricsLog(out / "metrics.jsonl", rank=engine.rank, method=method, keep_until=start - 1)
    every = cfg.train.checkpoint_every
    bar = tqdm(total=cfg.train.meta_steps, initial=start, desc=method, dynamic_ncols=True,
               file=sys.stderr, disable=engine.rank != 0 or not sys.stderr.isatty())
    step = start
    with prefetcher, interrupt_note(method, ckpts, lambda: step):
        for step in range(start, cfg.train.meta_steps):
            item = prefetcher.get()
            try:
                stats = meta_step(engine, algorithm, item.plan, item.prepared)
            except NonFiniteError as err:  # raised on every rank together (train.nonfinite=stop)
                last = ckpts.latest()
                raise NonFiniteError(
                    f"{method}, meta-step {step}: {err}. Last good checkpoint: "
                    f"{last.path if last else 'none (no checkpoint written yet)'}; after the fix, "
                    "rerun with the same output_dir to resume from it"
                ) from err
            summary = {k: getattr(stats, k) for k in (
                "step", "outer_loss", "query_loss_before", "query_loss_after", "n_real_tasks",
                "n_tokens", "n_padded_tokens", "seconds", "outer")}
            mine = [o.to_dict() for o in stats.observations]
            gathered = engine.all_gather_object((mine, summary))
            prefetcher.observe([observation_from_dict(o) for obs, _ in gathered for o in obs])
            record = step_record(method, gathered, item.wait_seconds)
            record["data_wait_fraction"] = prefetcher.wait_fraction
            metrics.write(record)
            bar.update(1)
            if engine.rank == 0 and (step % cfg.train.log_every == 0 or step + 1 == cfg.train.meta_steps):
                bar.write(
                    f"{method} meta-step {step} ({step + 1}/{cfg.train.meta_steps})"
                    f" | outer {record['outer_loss']:.3f}"
                    f" | query {record['query_loss_before']:.3f} -> {record['query_loss_after']:.3f}"
                    f" | {record['tokens']} tok, {record['tokens_per_s']:.0f} tok/s"
                    f" | pad eff {record['padding_efficiency']:.3f}"
                    f" | data wait {record['data_wait_fraction']:.1%}"
                    + (f" | inner lr {record['inner_lr_mean']:.4g}" if "inner_lr_mean" in record else "")
                    + (" | SKIPPED (non-finite)" if record["skipped"] else "")
                )
            if (every and (step + 1) % every == 0) or step + 1 == cfg.train.meta_steps:
                save_checkpoint(ckpts, step, cfg, method, engine, prefetcher, model, algorithm)
    bar.close()
    adapter_dir = method_dir / "adapter"
    engine.save_adapter(adapter_dir)
    if engine.rank == 0:
        save_step_sizes(algorithm, model, adapter_dir)
    engine.barrier()
    return adapter_dir


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Exit codes: 0 done, 2 bad input (config, data, run folder, resume), 3 non-finite loss
    (``train.nonfinite=stop``), 130 interrupted; anything else is a bug and keeps its traceback."""
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    try:
        import_modules(args.imports)
        return run(args)
    except (ConfigError, UserInputError, CheckpointMismatchError) as err:
        if args.debug:
            logger.exception("input error (traceback shown for --debug)")
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Interrupted as err:
        logger.warning("stopped: %s", err)
        return 130
    except KeyboardInterrupt:  # while loading, or during the final evaluation
        logger.warning("stopped by Ctrl-C outside meta-training; rerun the same command: every "
                       "complete checkpoint is resumed (train.resume=auto)")
        return 130


def run(args: argparse.Namespace) -> int:
    if args.config is not None and os.path.isdir(args.config):
        raise UserInputError(f"--config {args.config!r} is a folder: give the YAML file, e.g. "
                             f"{os.path.join(args.config, 'config.yaml')}")
    cfg = load_config(RecipeConfig, args.config, args.overrides)
    kind = resolve_engine_kind(cfg.engine)
    rank = 0
    if kind != "local":
        rank, _, _ = init_distributed(default_backend(), cfg.engine.collective_timeout_s)
    setup_logging(rank)
    # Nothing is written into output_dir before rank 0 holds its lock and has checked the resume;
    # every rank learns the outcome, so all stop together or go on together.
    lock, refused = None, None
    if rank == 0:
        try:
            lock = claim_output_dir(cfg)
        except UserInputError as err:
            refused = str(err)
    refused = broadcast_from_rank0(refused)
    if refused is not None:
        raise UserInputError(refused)
    out = Path(cfg.output_dir).expanduser()
    try:
        if kind != "local":  # every rank writes into the checkpoint folders: one folder for all
            try:
                check_shared_folder(out, rank=rank, all_gather=all_gather_object,
                                    wait_s=min(30.0, cfg.engine.collective_timeout_s / 4))
            except SharedFolderError as err:  # raised on every rank together
                logger.error("%s", err)
                return 2
        return train_and_evaluate(cfg, out)
    finally:
        if lock is not None:
            lock.release()


def train_and_evaluate(cfg: RecipeConfig, out: Path) -> int:
    torch.manual_seed(cfg.train.seed)
    t0 = time.perf_counter()
    # Under ZeRO-3 the base is partitioned as it is built; `partitioned` stays alive all run.
    partitioned = partitioned_build(cfg.engine, cfg.optim, precision=PRECISION[cfg.model.dtype])
    base, tokenizer = build_model_and_tokenizer(cfg.model, partitioned=partitioned)
    model = add_lora(base, cfg.lora, seed=cfg.train.seed)
    initial = [p.detach().clone() for p in adapter_tensors(model)]
    suite = build_task_set(cfg.tasks, tokenizer, seed=cfg.train.seed)
    logger.info(
        "model and %d/%d/%d meta-train/val/test tasks ready in %.1fs",
        len(suite.meta_train), len(suite.meta_val), len(suite.meta_test), time.perf_counter() - t0,
    )
    try:
        adapters = {m: train_method(cfg, m, model, initial, tokenizer.pad_token_id, suite, out)
                    for m in cfg.methods}
    except NonFiniteError as err:
        logger.error("stopped: %s", err)
        return 3
    if cfg.eval.enabled:
        engine = fresh_engine(cfg, model, initial)  # "base" is evaluated at the initial adapter
        try:
            evaluate_run(cfg, engine, tokenizer, suite, adapters, out)
        finally:
            engine.close()
    logger.info("done in %.1fs; everything is in %s", time.perf_counter() - t0, out)
    return 0


def cli(argv: list[str] | None = None, prog: str | None = None) -> int:
    """What every entry point runs: ``python recipes/train.py``, ``python -m fmmeta.recipes.train``
    (so ``torchrun -m``, ``deepspeed --module``, ``accelerate launch -m``) and ``fmmeta train``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return main(argv, prog)
    except Exception:
        # Under a launcher every rank's traceback lands in one interleaved log: name the rank.
        logger.exception("rank %s failed", os.environ.get("RANK", "0"))
        return 1


if __name__ == "__main__":
    sys.exit(cli())
