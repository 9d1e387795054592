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
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from fmmeta.startup import Terminated, ctrl_c_raises  # first: Ctrl-C during the imports below is a message

# isort: split
import torch
from tqdm import tqdm

from fmmeta.algorithms.answer_loss import check_lines
from fmmeta.algorithms.build import METHODS, build_algorithm
from fmmeta.algorithms.gather import gather_step
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.algorithms.protocol import MetaAlgorithm
from fmmeta.checkpoint import CheckpointManager, CheckpointMismatchError, load_rng_state, save_rng_state
from fmmeta.checkpoint.resume import (
    DATA_FINGERPRINT,
    RESUME_FACTS,
    check_task_pool,
    find_resume_checkpoint,
    resume_facts,
)
from fmmeta.checkpoint.run_folder import claim_output_dir
from fmmeta.checkpoint.shared_folder import SharedFolderError, check_shared_folder
from fmmeta.config import ConfigError, describe_config, flat_config, load_config, to_dict
from fmmeta.engine.build import build_engine, resolve_engine_kind
from fmmeta.engine.distributed import (
    all_gather_object,
    broadcast_from_rank0,
    check_same_on_every_rank,
    default_backend,
    init_distributed,
    strip_local_rank,
)
from fmmeta.engine.guard import NonFiniteError, NonFiniteGuard
from fmmeta.engine.partition import partitioned_build
from fmmeta.engine.protocol import Engine
from fmmeta.engine.zero import scatter_adapter
from fmmeta.errors import UserInputError
from fmmeta.evaluation.run import Replicate, evaluate_run, evaluation_tasks
from fmmeta.interrupts import Interrupted, interrupt_note
from fmmeta.library_warnings import show_library_warnings_once
from fmmeta.models import (
    add_lora,
    build_model_and_tokenizer,
    count_parameters,
    initial_adapter,
    lora_shapes,
    model_id,
)
from fmmeta.progress import Progress
from fmmeta.recipe_args import IMPORT_HELP, OneConfig, import_modules
from fmmeta.recipe_config import RecipeConfig
from fmmeta.sampling import CostAwareSampler, Prefetcher, fast_weight_megabytes
from fmmeta.shipped import shipped_path, with_shipped_paths
from fmmeta.tasks.config import build_task_set
from fmmeta.tasks.in_context import InContextTask
from fmmeta.tasks.task import tasks_fingerprint
from fmmeta.telemetry import RankWatch, save_telemetry
from fmmeta.tracking import MetricsLog, open_trackers, report_evaluation
from fmmeta.workers import Workers, in_worker

logger = logging.getLogger("fmmeta.train")

RECIPE_STATE = frozenset({"step", "prefetcher"})
"""Keys of a checkpoint's ``state.json`` the recipe owns; every other key is the algorithm's."""

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
    parser.add_argument("--config", help="YAML file holding only what differs from the defaults", action=OneConfig)
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
    """Rank 0 logs at INFO; other ranks only warnings and errors, each line naming its rank;
    library warnings are shown once per run (rank 0), not once per rank."""
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    show_library_warnings_once(rank)


def banner(cfg: RecipeConfig, method: str, engine: Engine, model: torch.nn.Module, fast_weight_numel: int) -> None:
    """The facts a person checks first: what runs where, and how much of it."""
    trainable, total = count_parameters(model)
    per_rank = cfg.sampler.meta_batch_size / engine.world_size
    budget = cfg.sampler.tokens_per_pass or f"{cfg.sampler.micro_batch_size} x longest sequence"
    logger.info(
        "== %s | model %s (%s) | params trainable %s / total %s (%.3f%%) | world size %d | %s"
        " | tasks per meta-step %d (~%.1f per rank, packed into passes of %s tokens, %s)"
        " | inner steps %d | meta-steps %d",
        method, model_id(cfg.model), cfg.model.dtype, f"{trainable:,}", f"{total:,}", 100 * trainable / total,
        engine.world_size, engine.sharding, cfg.sampler.meta_batch_size,
        per_rank, budget, "padding-free" if cfg.algorithm.padding_free else "padded",
        cfg.algorithm.inner_steps, cfg.train.meta_steps,
    )
    if engine.world_size > 1:
        n = cfg.sampler.meta_batch_size
        logger.info(
            "placement %s | rows across ranks would hold %d fast-weight copies on every rank (%.1f MiB)"
            " and all-reduce %.1f MiB per inner step", cfg.sampler.placement, n if fast_weight_numel else 0,
            fast_weight_megabytes(n, fast_weight_numel, adam=cfg.algorithm.inner_optimizer == "adam"),
            n * fast_weight_numel * 4 / 2**20,
        )


def step_line(method: str, record: dict, meta_steps: int) -> str:
    """The console line of one meta-step; ``meta-step k (k+1/N)`` numbers steps as checkpoints
    (``step_0000000k``, written after meta-step k) and messages do."""
    return (
        f"{method} meta-step {record['step']} ({record['step'] + 1}/{meta_steps})"
        f" | outer {record['outer_loss']:.3f}"
        f" | query {record['query_loss_before']:.3f} -> {record['query_loss_after']:.3f}"
        f" | {record['tokens']} tok, {record['tokens_per_s']:.0f} tok/s"
        f" | pad eff {record['padding_efficiency']:.3f}"
        + (" | rows across ranks" if record.get("placement") == "rows" else "")
        + f" | data wait {record['data_wait_fraction']:.1%}"
        f" | lr {record['lr']:.3g} | grad norm {record['grad_norm']:.3g}"
        + (f" | inner lr {record['inner_lr_mean']:.4g}" if "inner_lr_mean" in record else "")
        + (" | SKIPPED (non-finite)" if record["skipped"] else "")
    )


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
    try:
        algorithm.load_state_dict({k: v for k, v in state.items() if k not in RECIPE_STATE})
    except ValueError as err:
        raise ValueError(f"{ckpt.path / 'state.json'}: {err}") from err
    load_rng_state(ckpt, engine.rank)
    logger.info("resumed from %s (meta-step %d complete)", ckpt.path, ckpt.step)
    return ckpt.step + 1


def save_checkpoint(ckpts: CheckpointManager, step: int, cfg: RecipeConfig, method: str,
                    engine: Engine, prefetcher: Prefetcher, model: torch.nn.Module,
                    algorithm: MetaAlgorithm, data: str) -> None:
    """Adapter, optimizer (every rank's share), sampler state, RNG and step, written atomically,
    and whatever the algorithm learned besides the adapter (metasgd: its step sizes); ``data``:
    the meta-training data's fingerprint, so a resume over changed data is named."""
    state: dict[str, Any] = {"step": step, "prefetcher": prefetcher.state_dict()}
    learned = algorithm.state_dict()
    if set(learned) & RECIPE_STATE:
        raise ValueError(f"{method}'s state_dict() uses keys the recipe owns: {sorted(set(learned) & RECIPE_STATE)}")
    state.update(learned)

    def write(w: Any) -> None:
        engine.save_adapter(w.path("adapter"))
        if w.rank == 0:
            save_step_sizes(algorithm, model, w.path("adapter"))
            w.add_files(p for p in w.path("adapter").iterdir() if p.is_file())
            w.save_json("state.json", state)
        w.add_files(engine.save_optimizer(w.directory))
        save_rng_state(w)

    ckpts.save(step, write, meta={"model_id": model_id(cfg.model), "lora_shapes": lora_shapes(model),
                                  RESUME_FACTS: resume_facts(cfg, method), DATA_FINGERPRINT: data})


def save_step_sizes(algorithm: MetaAlgorithm, model: torch.nn.Module, adapter_dir: Path) -> None:
    """What the algorithm keeps next to its adapter (metasgd: ``step_sizes.json``); rank 0 calls."""
    algorithm.save_with_adapter(adapter_dir, [n for n, p in model.named_parameters() if p.requires_grad])


def fresh_engine(cfg: RecipeConfig, model: torch.nn.Module, initial: list[torch.Tensor]) -> Engine:
    """Resets the adapter to the run's initial one and wraps the (shared) model in a new engine.

    Every method starts from the same seeded adapter this way without a copy of the base; the
    previous method's engine must have been closed (it removes its ZeRO-3 hooks).
    """
    scatter_adapter([p for p in model.parameters() if p.requires_grad], initial)  # the engines' order
    return build_engine(cfg.engine, model, cfg.optim, precision=cfg.precision)


def train_method(cfg: RecipeConfig, method: str, model: torch.nn.Module, initial: list[torch.Tensor],
                 pad_id: int, suite: Any, out: Path, hosts: list[str], data: str) -> Path:
    """Meta-trains one adapter of one replicate (``cfg``: that replicate's config, ``out``: its
    folder) from the replicate's initial adapter; returns its peft folder.

    Every method starts from the replicate's training seed (dropout draws alike), so methods and
    replicates train the same one after the other or side by side in worker processes
    (``engine.workers``).
    """
    torch.manual_seed(cfg.train.seed)
    out.mkdir(parents=True, exist_ok=True)  # a replicate's own folder (train.replicates > 1)
    method_dir = out / method
    engine = NonFiniteGuard(fresh_engine(cfg, model, initial), cfg.train.nonfinite)
    watch = RankWatch(method, hosts, window=cfg.train.slow_rank_window,
                      margin=cfg.train.slow_rank_margin, rank=engine.rank)
    try:
        adapter_dir = _train(cfg, method, engine, model, pad_id, suite, out, method_dir, watch, data)
    finally:
        engine.close()
    watch.log_summary()
    if engine.rank == 0:
        save_telemetry(out / "telemetry.json", method, watch.summary())
    return adapter_dir


def _train(cfg: RecipeConfig, method: str, engine: Engine, model: torch.nn.Module, pad_id: int,
           suite: Any, out: Path, method_dir: Path, watch: RankWatch, data: str) -> Path:
    algorithm = build_algorithm(method, cfg.algorithm, pad_id)
    fast_weight_numel = count_parameters(model)[0] if algorithm.fast_weights else 0
    banner(cfg, method, engine, model, fast_weight_numel)
    if cfg.algorithm.padding_free:
        check_lines(engine.model)
    tasks = suite.meta_train
    if METHODS[method].adapts_in_context(cfg.algorithm):  # the inner loop adapts on in-context rows
        tasks = [InContextTask(t, cfg.algorithm.icl_max_length) for t in tasks]
    sampler = CostAwareSampler(
        tasks, cfg.sampler, world_size=engine.world_size, seed=cfg.train.seed,
        support_draws=algorithm.support_draws, support_repeats=algorithm.support_repeats,
        fast_weight_numel=fast_weight_numel, lockstep=engine.lockstep,
    )
    # The next step's passes are collated in the prefetcher's thread while this one trains.
    prefetcher = Prefetcher(sampler, stop_step=cfg.train.meta_steps,
                            prepare=lambda plan: algorithm.prepare(plan.for_rank(engine.rank)))
    ckpts = CheckpointManager(
        method_dir / "checkpoints", keep_last=cfg.train.keep_last, rank=engine.rank,
        world_size=engine.world_size, barrier=engine.barrier,
    )
    start = restore(method_dir, cfg, engine, prefetcher, model, algorithm)
    metrics = MetricsLog(out / "metrics.jsonl", rank=engine.rank, method=method, keep_until=start - 1,
                         trackers=open_trackers(cfg.train.report_to, out, run=method, first_step=start,
                                                rank=engine.rank, config=to_dict(cfg)))
    every = cfg.train.checkpoint_every
    bar = tqdm(total=cfg.train.meta_steps, initial=start, desc=method, dynamic_ncols=True,
               file=sys.stderr, disable=engine.rank != 0 or in_worker() or not sys.stderr.isatty())
    step = start
    with prefetcher, metrics, interrupt_note(method, ckpts, lambda: step):
        for step in range(start, cfg.train.meta_steps):
            item = prefetcher.get()
            try:
                stats = meta_step(engine, algorithm, item.plan, item.prepared, data_wait_s=item.wait_seconds)
            except NonFiniteError as err:  # raised on every rank together (train.nonfinite=stop)
                last = ckpts.latest()
                raise NonFiniteError(
                    f"{method}, meta-step {step}: {err}. Last good checkpoint: "
                    f"{last.path if last else 'none (no checkpoint written yet)'}; after the fix, "
                    "rerun with the same output_dir to resume from it"
                ) from err
            gathered = gather_step(engine, stats)  # every rank's step: one all_gather
            prefetcher.observe(gathered.observations)
            record = {"method": method, **gathered.record(), "data_wait_fraction": prefetcher.wait_fraction,
                      "placement": item.plan.placement}
            metrics.write(record)
            watch.observe(gathered)
            bar.update(1)
            if engine.rank == 0 and (step % cfg.train.log_every == 0 or step + 1 == cfg.train.meta_steps):
                bar.write(step_line(method, record, cfg.train.meta_steps))
            if (every and (step + 1) % every == 0) or step + 1 == cfg.train.meta_steps:
                save_checkpoint(ckpts, step, cfg, method, engine, prefetcher, model, algorithm, data)
    bar.close()
    adapter_dir = method_dir / "adapter"
    engine.save_adapter(adapter_dir)
    if engine.rank == 0:
        save_step_sizes(algorithm, model, adapter_dir)
    engine.barrier()
    return adapter_dir


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The run, top to bottom; what every entry point runs: ``python recipes/train.py``,
    ``python -m fmmeta.recipes.train`` (so ``torchrun -m``, ``deepspeed --module``,
    ``accelerate launch -m``) and ``fmmeta train``.

    Exit codes: 0 done, 2 bad input (config, data, run folder, resume), 3 non-finite loss
    (``train.nonfinite=stop``), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM, 1 a bug (its
    traceback logged, naming the rank).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ctrl_c_raises()
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    t0 = time.perf_counter()
    with exit_code(args.debug) as outcome:
        import_modules(args.imports)
        cfg, rank, distributed = load_run_config(args)
        # Before any model is built: methods that train side by side take this process's threads.
        with claimed_output_dir(cfg, rank) as claim, \
                Workers.for_run(cfg.engine.workers, methods=len(cfg.methods) * cfg.train.replicates,
                                distributed=distributed) as workers:
            out = Path(cfg.output_dir).expanduser()
            hosts = ranks_share(out, cfg, rank) if distributed else [socket.gethostname()]
            torch.manual_seed(cfg.train.seed)
            # Under ZeRO-3 the base is partitioned as it is built; `partitioned` stays alive all run.
            partitioned = partitioned_build(cfg.engine, cfg.optim, precision=cfg.precision)
            base, tokenizer = build_model_and_tokenizer(cfg.model, partitioned=partitioned)
            model = add_lora(base, cfg.lora, seed=cfg.train.seed)
            replicates = [Replicate(c, initial_adapter(model, c.train.seed)) for c in cfg.replicate_configs()]
            units = [(r, m) for r in replicates for m in cfg.methods]  # a method of a replicate
            suite = build_tasks(cfg, tokenizer)
            data = tasks_fingerprint(suite.meta_train)  # what every checkpoint records it was trained on
            check_task_pool(cfg, [t.name for t in suite.meta_train], data)
            if claim is not None:
                claim.accept(cfg)  # every input is accepted: only now is anything written into output_dir
            logger.info("model and %d/%d/%d meta-train/validation/held-out tasks ready in %.1fs",
                        len(suite.meta_train), len(suite.validation), len(suite.held_out),
                        time.perf_counter() - t0)
            if workers.n > 1:
                logger.info("%d worker processes of %d thread(s): %sevaluation shares out its episodes "
                            "(engine.workers)", workers.n, workers.threads,
                            "methods train side by side, " if len(units) > 1 else "")
            progress = Progress("trained", len(units) if len(units) > 1 else 0, "methods", every_s=0)
            trained = workers.map(lambda u: train_method(u[0].cfg, u[1], model, u[0].initial, tokenizer.pad_token_id,
                                                         suite, Path(u[0].cfg.output_dir), hosts, data),
                                  units, on_result=lambda _: progress.advance())
            for (replicate, method), adapter in zip(units, trained):
                replicate.adapters[method] = adapter
            if cfg.eval.enabled:
                evaluate(cfg, model, tokenizer, suite, replicates, out, workers)
        logger.info("done in %.1fs; everything is in %s", time.perf_counter() - t0, out)
    return outcome.code


class Outcome:
    """How the run ended, as its exit code (a plain class: the recipe is also loaded by path,
    outside ``sys.modules``, where a dataclass cannot resolve its annotations)."""

    def __init__(self) -> None:
        self.code = 0


@contextlib.contextmanager
def exit_code(debug: bool) -> Iterator[Outcome]:
    """Turns how the run ended into its exit code and one message (see :func:`main`)."""
    outcome = Outcome()
    try:
        yield outcome
    except SharedFolderError as err:  # raised on every rank together
        logger.error("%s", err)
        outcome.code = 2
    except (ConfigError, UserInputError, CheckpointMismatchError) as err:
        if debug:
            logger.exception("input error (traceback shown for --debug)")
        print(f"error: {err}", file=sys.stderr)
        outcome.code = 2
    except NonFiniteError as err:  # raised on every rank together (train.nonfinite=stop)
        logger.error("stopped: %s", err)
        outcome.code = 3
    except Interrupted as err:
        logger.warning("stopped: %s", err)
        outcome.code = err.code
    except KeyboardInterrupt as err:  # while loading, or during the final evaluation
        what = "SIGTERM" if isinstance(err, Terminated) else "Ctrl-C"
        logger.warning("stopped by %s outside meta-training; rerun the same command: every "
                       "complete checkpoint is resumed (train.resume=auto)", what)
        outcome.code = 143 if isinstance(err, Terminated) else 130
    except Exception:
        # Under a launcher every rank's traceback lands in one interleaved log: name the rank.
        logger.exception("rank %s failed", os.environ.get("RANK", "0"))
        outcome.code = 1


def load_run_config(args: argparse.Namespace) -> tuple[RecipeConfig, int, bool]:
    """The whole config, checked before any model is touched; joins the other ranks when the engine
    is distributed and sets up logging. Returns the config, this rank and whether it is distributed."""
    if args.config is not None and os.path.isdir(args.config):
        raise UserInputError(f"--config {args.config!r} is a folder: give the YAML file, e.g. "
                             f"{os.path.join(args.config, 'config.yaml')}")
    cfg = load_config(RecipeConfig, args.config, args.overrides)
    distributed = resolve_engine_kind(cfg.engine) != "local"
    rank = 0
    if distributed:
        rank, _, _ = init_distributed(default_backend(), cfg.engine.collective_timeout_s)
        check_same_on_every_rank(flat_config(cfg), "the config")  # before any rank builds anything
    setup_logging(rank)
    return cfg.on_this_machine(), rank, distributed


@contextlib.contextmanager
def claimed_output_dir(cfg: RecipeConfig, rank: int) -> Iterator[Any]:
    """Rank 0's claim on ``output_dir`` (``None`` on other ranks), released at the end.

    Nothing is written into output_dir before rank 0 holds its lock and has checked the resume;
    every rank learns the outcome, so all stop together or go on together.
    """
    claim, refused = None, None
    if rank == 0:
        try:
            claim = claim_output_dir(cfg)
        except UserInputError as err:
            refused = str(err)
    refused = broadcast_from_rank0(refused)
    if refused is not None:
        raise UserInputError(refused)
    try:
        yield claim
    finally:
        if claim is not None:
            claim.release()


def ranks_share(out: Path, cfg: RecipeConfig, rank: int) -> list[str]:
    """Checks that every rank sees one ``out`` folder (each writes into the checkpoints) and
    returns every rank's host name (once: the slow-rank warning names the host)."""
    check_shared_folder(out, rank=rank, all_gather=all_gather_object,
                        wait_s=min(30.0, cfg.engine.collective_timeout_s / 4))
    return all_gather_object(socket.gethostname())


def build_tasks(cfg: RecipeConfig, tokenizer: Any) -> Any:
    """The task suite, with every refusal it can cause made now, not after meta-training."""
    suite = build_task_set(cfg.tasks, tokenizer)
    if cfg.eval.enabled:
        evaluation_tasks([*suite.validation, *suite.held_out], cfg.eval.query)
    if cfg.sampler.meta_batch_size > len(suite.meta_train):  # as each method's sampler would, but now
        raise UserInputError(
            f"sampler.meta_batch_size={cfg.sampler.meta_batch_size} is larger than the meta-training "
            f"pool ({len(suite.meta_train)} tasks), so a meta-batch would hold a task twice: set "
            f"sampler.meta_batch_size to at most {len(suite.meta_train)}, or add tasks"
        )
    cut = {t.name: t.n_cut for t in [*suite.meta_train, *suite.validation, *suite.held_out] if getattr(t, "n_cut", 0)}
    if cut:  # each task's count was logged as it was built; the banner says it once more
        logger.warning("%d prompts in %d tasks cut from the left to fit tasks.max_length=%d (%s)", sum(cut.values()),
                       len(cut), cfg.tasks.max_length, ", ".join(f"{n}: {k}" for n, k in list(cut.items())[:5]))
    return suite


def evaluate(cfg: RecipeConfig, model: torch.nn.Module, tokenizer: Any, suite: Any,
             replicates: list[Replicate], out: Path, workers: Workers) -> None:
    """Every rank (or worker) evaluates its share of the episodes under one more engine on the
    same model: every replicate's adapters on the same episodes, into one report."""
    engine = fresh_engine(cfg, model, replicates[0].initial)
    try:
        paths = evaluate_run(cfg, engine, tokenizer, suite, replicates, out, workers=workers)
        report_evaluation(cfg.train.report_to, out, paths, rank=engine.rank, config=to_dict(cfg))
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
