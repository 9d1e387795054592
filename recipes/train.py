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
import logging
import os
import socket
import sys
import time
from pathlib import Path

from fmmeta.startup import Terminated, ctrl_c_raises  # first: Ctrl-C during the imports below is a message

# isort: split
import torch
from tqdm import tqdm

from fmmeta.algorithms.answer_loss import check_lines
from fmmeta.algorithms.build import METHODS, build_algorithm
from fmmeta.algorithms.gather import gather_step
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.checkpoint.resume import check_task_pool
from fmmeta.checkpoint.run_folder import claimed_output_dir
from fmmeta.checkpoint.shared_folder import check_shared_folder
from fmmeta.checkpoint.training import TrainingState
from fmmeta.config import describe_config, flat_config, load_config, to_dict
from fmmeta.console import banner, step_line
from fmmeta.engine import (
    Engine,
    EngineFactory,
    NonFiniteError,
    NonFiniteGuard,
    all_gather_object,
    broadcast_from_rank0,
    strip_local_rank,
)
from fmmeta.errors import UserInputError
from fmmeta.evaluation.run import Replicate, evaluate_run, evaluation_tasks
from fmmeta.exit_codes import exit_code
from fmmeta.interrupts import interrupt_note
from fmmeta.library_warnings import setup_logging
from fmmeta.models import add_lora, count_parameters, initial_adapter
from fmmeta.progress import Progress
from fmmeta.recipe_args import IMPORT_HELP, OneConfig, import_modules
from fmmeta.recipe_config import RecipeConfig
from fmmeta.sampling import CostAwareSampler, NoiseObservation, Prefetcher, check_pool_size
from fmmeta.sampling.noise_scale import GradientNoise, NoiseScale
from fmmeta.shipped import shipped_path, with_shipped_paths
from fmmeta.tasks.config import build_task_set
from fmmeta.tasks.in_context import InContextTask
from fmmeta.tasks.task import TaskSet, tasks_fingerprint
from fmmeta.telemetry import RankWatch, save_telemetry
from fmmeta.tracking import MetricsLog, open_trackers, report_evaluation
from fmmeta.workers import Workers, in_worker

logger = logging.getLogger("fmmeta.train")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The run, top to bottom; what every entry point runs: ``python recipes/train.py``,
    ``python -m fmmeta.recipes.train`` (so ``torchrun -m``, ``deepspeed --module``,
    ``accelerate launch -m``) and ``fmmeta train``.

    Exit codes (:mod:`fmmeta.exit_codes`): 0 done, 2 bad input (config, data, run folder, resume),
    3 non-finite loss (``train.nonfinite=stop``), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM,
    1 a bug (its traceback logged, naming the rank).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ctrl_c_raises()
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    t0 = time.perf_counter()
    with exit_code(logger, stopped_outside_training, debug=args.debug, log_bugs=True) as outcome:
        import_modules(args.imports)
        cfg, engines, rank = load_run_config(args)
        # Before any model is built: methods that train side by side take this process's threads.
        with claimed_output_dir(cfg, rank, broadcast_from_rank0) as claim, \
                Workers.for_run(cfg.engine.workers, methods=len(cfg.methods) * cfg.train.replicates,
                                distributed=engines.distributed) as workers:
            out = Path(cfg.output_dir).expanduser()
            hosts = ranks_share(out, cfg, rank) if engines.distributed else [socket.gethostname()]
            torch.manual_seed(cfg.train.seed)
            base, tokenizer = engines.build_base(cfg.model)  # under ZeRO-3 partitioned as it is built
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
            trained = workers.map(lambda u: train_method(engines, u[0].cfg, u[1], model, u[0].initial,
                                                         tokenizer.pad_token_id, suite, hosts, data),
                                  units, on_result=lambda _: progress.advance())
            for (replicate, method), adapter in zip(units, trained):
                replicate.adapters[method] = adapter
            if cfg.eval.enabled:
                evaluate(engines, cfg, model, tokenizer, suite, replicates, out, workers)
        logger.info("done in %.1fs; everything is in %s", time.perf_counter() - t0, out)
    return outcome.code


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


def stopped_outside_training(err: KeyboardInterrupt) -> None:
    """Ctrl-C or SIGTERM while loading, or during the final evaluation (a stop during
    meta-training names its checkpoint: :class:`fmmeta.interrupts.Interrupted`)."""
    logger.warning("stopped by %s outside meta-training; rerun the same command: every "
                   "complete checkpoint is resumed (train.resume=auto)",
                   "SIGTERM" if isinstance(err, Terminated) else "Ctrl-C")


def load_run_config(args: argparse.Namespace) -> tuple[RecipeConfig, EngineFactory, int]:
    """The whole config, checked before any model is touched; joins the other ranks when the engine
    is distributed and sets up logging. Returns the config, the run's engine factory and this rank."""
    if args.config is not None and os.path.isdir(args.config):
        raise UserInputError(f"--config {args.config!r} is a folder: give the YAML file, e.g. "
                             f"{os.path.join(args.config, 'config.yaml')}")
    cfg = load_config(RecipeConfig, args.config, args.overrides)
    engines = EngineFactory(cfg.engine, cfg.optim, precision=cfg.precision)
    rank = engines.join(flat_config(cfg))  # every rank checks the config before any builds anything
    setup_logging(rank)  # rank 0 at INFO, the others warnings and errors; library warnings once
    return cfg.on_this_machine(), engines, rank


def ranks_share(out: Path, cfg: RecipeConfig, rank: int) -> list[str]:
    """Checks that every rank sees one ``out`` folder (each writes into the checkpoints) and
    returns every rank's host name (once: the slow-rank warning names the host)."""
    check_shared_folder(out, rank=rank, all_gather=all_gather_object,
                        wait_s=min(30.0, cfg.engine.collective_timeout_s / 4))
    return all_gather_object(socket.gethostname())


def build_tasks(cfg: RecipeConfig, tokenizer: object) -> TaskSet:
    """The task suite, with every refusal it can cause made now, not after meta-training."""
    suite = build_task_set(cfg.tasks, tokenizer)
    if cfg.eval.enabled:
        evaluation_tasks([*suite.validation, *suite.held_out], cfg.eval.query)
    check_pool_size(cfg.sampler, len(suite.meta_train))  # as each method's sampler will, but now
    cut = {t.name: t.n_cut for t in [*suite.meta_train, *suite.validation, *suite.held_out] if getattr(t, "n_cut", 0)}
    if cut:  # each task's count was logged as it was built; the banner says it once more
        logger.warning("%d prompts in %d tasks cut from the left to fit tasks.max_length=%d (%s)", sum(cut.values()),
                       len(cut), cfg.tasks.max_length, ", ".join(f"{n}: {k}" for n, k in list(cut.items())[:5]))
    return suite


def train_method(engines: EngineFactory, cfg: RecipeConfig, method: str, model: torch.nn.Module,
                 initial: list[torch.Tensor], pad_id: int, suite: TaskSet, hosts: list[str], data: str) -> Path:
    """Meta-trains one adapter of one replicate (``cfg``: that replicate's config, its ``output_dir``
    the replicate's folder) from the replicate's initial adapter; returns its peft folder.

    Every method starts from the replicate's training seed (dropout draws alike), so methods and
    replicates train the same one after the other or side by side in worker processes
    (``engine.workers``). The previous method's engine was closed, so a new one wraps the model.
    """
    torch.manual_seed(cfg.train.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)  # a replicate's own folder (train.replicates > 1)
    engine = NonFiniteGuard(engines.engine(model, initial), cfg.train.nonfinite)
    watch = RankWatch(method, hosts, window=cfg.train.slow_rank_window,
                      margin=cfg.train.slow_rank_margin, rank=engine.rank)
    try:
        adapter_dir = meta_train(cfg, method, engine, model, pad_id, suite, watch, data)
    finally:
        engine.close()
    watch.log_summary()
    if engine.rank == 0:
        save_telemetry(out / "telemetry.json", method, watch.summary())
    return adapter_dir


def meta_train(cfg: RecipeConfig, method: str, engine: Engine, model: torch.nn.Module, pad_id: int,
               suite: TaskSet, watch: RankWatch, data: str) -> Path:
    """Resumes ``method`` from its latest complete checkpoint, runs the remaining meta-steps
    (plan -> meta_step -> gather observations -> log -> checkpoint) and saves its adapter."""
    out = Path(cfg.output_dir)
    algorithm = build_algorithm(method, cfg.algorithm, pad_id)
    fast_weight_numel = count_parameters(model)[0] if METHODS[method].fast_weights else 0
    banner(cfg, method, engine, model, fast_weight_numel)
    if cfg.algorithm.padding_free:
        check_lines(engine.model)
    tasks = suite.meta_train
    if METHODS[method].adapts_in_context(cfg.algorithm):  # the inner loop adapts on in-context rows
        tasks = [InContextTask(t, cfg.algorithm.icl_max_length) for t in tasks]
    sampler = CostAwareSampler(
        tasks, cfg.sampler, world_size=engine.world_size, seed=cfg.train.seed,
        support_draws=algorithm.support_draws, support_repeats=algorithm.support_repeats,
        fast_weight_numel=fast_weight_numel, lockstep=engine.lockstep, name=method,
    )
    # The next step's passes are collated in the prefetcher's thread while this one trains.
    prefetcher = Prefetcher(sampler, stop_step=cfg.train.meta_steps,
                            prepare=lambda plan: algorithm.prepare(plan.for_rank(engine.rank)))
    state = TrainingState(cfg, method, engine, model, algorithm, prefetcher, data)
    ckpts = state.checkpoints(out / method)
    start = state.restore(out / method)
    metrics = MetricsLog(out / "metrics.jsonl", rank=engine.rank, method=method, keep_until=start - 1,
                         trackers=open_trackers(cfg.train.report_to, out, run=method, first_step=start,
                                                rank=engine.rank, config=to_dict(cfg)))
    every = cfg.train.checkpoint_every
    bar = tqdm(total=cfg.train.meta_steps, initial=start, desc=method, dynamic_ncols=True,
               file=sys.stderr, disable=engine.rank != 0 or in_worker() or not sys.stderr.isatty())
    step = start
    noise_scale = NoiseScale.replayed(metrics.history)  # a resume goes on with the run's average
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
            record = {"method": method, **gathered.record(), "data_wait_fraction": prefetcher.wait_fraction,
                      "placement": item.plan.placement}
            noise = GradientNoise.from_record(record)
            seen = [NoiseObservation(step=step, tasks=noise.tasks, task_sq_mean=noise.task_sq_mean,
                                     mean_sq=noise.mean_sq)] if noise is not None else []
            prefetcher.observe([*gathered.observations, *seen])  # meta_batch_size auto chooses from the noise
            if noise is not None:  # B_noise over the run so far
                record["noise_scale"] = noise_scale.observe(noise)
            metrics.write(record)
            watch.observe(gathered)
            bar.update(1)
            if engine.rank == 0 and (step % cfg.train.log_every == 0 or step + 1 == cfg.train.meta_steps):
                bar.write(step_line(method, record, cfg.train.meta_steps))
            if (every and (step + 1) % every == 0) or step + 1 == cfg.train.meta_steps:
                state.save(ckpts, step)
    bar.close()
    return state.save_adapter(out / method / "adapter")


def evaluate(engines: EngineFactory, cfg: RecipeConfig, model: torch.nn.Module, tokenizer: object,
             suite: TaskSet, replicates: list[Replicate], out: Path, workers: Workers) -> None:
    """Every rank (or worker) evaluates its share of the episodes under one more engine on the
    same model: every replicate's adapters on the same episodes, into one report."""
    engine = engines.engine(model, replicates[0].initial)
    try:
        paths = evaluate_run(cfg, engine, tokenizer, suite, replicates, out, workers=workers)
        report_evaluation(cfg.train.report_to, out, paths, rank=engine.rank, config=to_dict(cfg))
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
