"""Held-out evaluation of a run: the glue between a config, a task suite and saved adapters.

``recipes/train.py`` calls :func:`evaluate_run` at the end of a run (report in ``<run>/eval``) and
``recipes/evaluate.py`` calls it on saved adapters (a new report folder each time), so both report
the same way. It runs on every rank of the engine that
wraps the model (episodes split over ranks), so the base is never needed whole anywhere.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

import numpy as np
import torch

from fmmeta.algorithms.answer_loss import check_lines
from fmmeta.algorithms.build import METHODS, method_of
from fmmeta.algorithms.meta_sgd import load_step_sizes
from fmmeta.engine.protocol import Engine
from fmmeta.errors import UserInputError
from fmmeta.evaluation.held_out import evaluate_held_out
from fmmeta.evaluation.methods import BASE, IN_CONTEXT, EvalMethod
from fmmeta.evaluation.report import format_markdown, write_report
from fmmeta.evaluation.result import EpisodeRecord, EvalResult, merge_replicates
from fmmeta.evaluation.settings import EvalSettings
from fmmeta.models.build import adapter_names
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.episode import Episode
from fmmeta.tasks.task import Task
from fmmeta.workers import Workers

logger = logging.getLogger(__name__)

EVAL_STREAM = 7919
"""Seed stream of evaluation episode draws, apart from the training draws of the same seed."""


def draw_episodes(tasks: Any, seed: int, draw: int, per_task: int) -> list[Episode]:
    """``per_task`` fresh episodes of every task, from a generator owned by this draw."""
    rng = np.random.default_rng([seed, EVAL_STREAM, draw])
    return [task.sample_episode(rng) for task in tasks for _ in range(per_task)]


def evaluation_tasks(tasks: Sequence[Task], query: int | None) -> list[Task]:
    """``tasks`` as evaluation draws them: with ``query`` query examples per class (per episode
    for generation tasks) where ``eval.query`` sets it, each task's own shape otherwise.

    Raises:
        UserInputError: if a task has too few examples for episodes of that shape.
    """
    if query is None:
        return list(tasks)
    out = []
    for task in tasks:
        try:
            out.append(task.with_spec(dataclasses.replace(task.spec, query=query)))
        except ValueError as err:
            raise UserInputError(
                f"eval.query={query} is too many for task {task.name!r} ({err}); lower eval.query "
                "or set it to null to keep each task's own query size"
            ) from err
    return out


def read_adapter_state(model: torch.nn.Module, folder: Path) -> list[torch.Tensor]:
    """The adapter saved in ``folder`` (peft format) as tensors in the model's parameter order.

    The model's adapter tensors must be resident (an engine keeps them so); they are put back.

    Raises:
        FileNotFoundError: the folder holds no adapter file.
        UserInputError: the file is cut short or damaged, or made for another model width or rank.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = folder / "adapter_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(
            f"{file} does not exist: pass a folder written by engine.save_adapter / "
            "PeftModel.save_pretrained"
        )
    try:
        state = load_file(str(file))
    except Exception as err:  # safetensors raises its own SafetensorError on a torn or foreign file
        raise UserInputError(
            f"{file} cannot be read as an adapter ({type(err).__name__}: {err}): the file is cut short "
            "or damaged (a full disk, an interrupted copy); copy it again, or retrain that method "
            "(its last checkpoint holds the adapter too)"
        ) from None
    params = [p for p in model.parameters() if p.requires_grad]
    initial = [p.detach().clone() for p in params]
    try:
        set_peft_model_state_dict(model, state)
    except RuntimeError as err:  # torch's load_state_dict: "size mismatch for <name>: ..."
        mismatch = [line.strip() for line in str(err).splitlines() if "size mismatch" in line]
        if not mismatch:
            raise
        raise UserInputError(
            f"{file} does not fit this model's adapter ({mismatch[0]}"
            + (f"; and {len(mismatch) - 1} more" if len(mismatch) > 1 else "")
            + "): it was made for another base model or LoRA rank; use it with the model and LoRA it was "
            "trained with (the config.yaml of its run)"
        ) from None
    loaded = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, initial, strict=True):
            p.copy_(v)
    if all(torch.equal(a, b) for a, b in zip(loaded, initial, strict=True)):
        raise ValueError(f"adapter {folder} did not change any adapter tensor: wrong model or LoRA?")
    return loaded


def eval_methods(
    cfg: RecipeConfig,
    states: Mapping[str, list[torch.Tensor] | None],
    names: Sequence[str],
    step_sizes: Mapping[str, list[float]] | None = None,
    in_context: Collection[str] | None = None,
) -> dict[str, EvalMethod]:
    """The report's rows, each scored as its method says (:class:`~fmmeta.algorithms.build.Method`):
    adapted on the support (the adapter tensors it adapts in training, named ``names``; at its
    learned step sizes where ``step_sizes`` has them) and scored plainly; adapted and scored on
    in-context rows where it was meta-trained on them (``algorithm.inner_format``); or, for a
    method scored with demonstrations (MetaICL), scored with them and no adaptation. A row that is
    no method (``base``, an adapter a user names) adapts plainly; with ``eval.in_context`` the base
    is also scored with in-context demonstrations; and ``<method>+demos`` for every method of
    ``eval.with_demonstrations`` (adapted, then scored with the demonstrations). ``in_context``
    names the methods trained on in-context rows when they were not all trained as
    ``cfg.algorithm`` says (a study's chosen adapters); ``None``: as it says."""
    learned = step_sizes or {}
    rows: dict[str, EvalMethod] = {}
    for name, state in states.items():
        method = method_of(name)
        adapted = None if method is None else method.adapted_tensors(cfg.algorithm, names)
        if method is not None and method.scoring == "demonstrations":
            rows[name] = EvalMethod(state, demonstrations=True, adapt=False)
            continue
        trained_in_context = (method is not None and method.adapts_in_context(cfg.algorithm)
                              if in_context is None else name in in_context)
        rows[name] = EvalMethod(state, demonstrations=trained_in_context, in_context_support=trained_in_context,
                                step_sizes=learned.get(name), adapted=adapted)
        if name == BASE and cfg.eval.in_context:
            rows[IN_CONTEXT] = EvalMethod(state, demonstrations=True, adapt=False)
    for name in cfg.eval.with_demonstrations:
        method = method_of(name)
        rows[f"{name}+demos"] = EvalMethod(
            states[name], demonstrations=True, step_sizes=learned.get(name),
            adapted=None if method is None else method.adapted_tensors(cfg.algorithm, names))
    return rows


def report_families(tasks: Sequence[Task], declared: Sequence[str] = ()) -> dict[str, str]:
    """Task name -> the family the report gives a table of its own.

    A task without a family is its own family (``Task.family`` defaults to the task's name), and
    a table per such task would only repeat the rows, so those are left out; but a family the
    config holds out by name (``tasks.split.held_out_families``) keeps its table even when its
    only task bears its name (a source ``boolq`` with ``family: boolq`` vanished from the report).
    """
    named = set(declared)
    return {t.name: t.family for t in tasks if t.family != t.name or t.family in named}


def _with_rows_of(result: EvalResult, first: EvalResult, names: Sequence[str]) -> EvalResult:
    """``result`` with the rows ``names`` taken from ``first``, rows and records in ``first``'s order."""
    methods = [m for m in first.methods if m in result.methods or m in names]
    by_method: dict[str, list[EpisodeRecord]] = {m: [] for m in methods}
    for record in (*result.records, *(r for r in first.records if r.method in names)):
        by_method[record.method].append(record)
    return dataclasses.replace(result, records=[r for m in methods for r in by_method[m]], methods=methods,
                               _summary=None, _comparisons={})


def _replicate_states(model: torch.nn.Module, params: Sequence[torch.Tensor], replicate: Replicate
                      ) -> tuple[dict[str, list[torch.Tensor] | None], dict[str, list[float]]]:
    """A replicate's adapter states (``"base"``: its initial adapter) and learned step sizes."""
    states: dict[str, list[torch.Tensor] | None] = {
        BASE: None if replicate.initial is None else [t.to(p.dtype) for t, p in zip(replicate.initial, params)]
    }
    learned: dict[str, list[float]] = {}
    names = adapter_names(model)
    for name, folder in replicate.adapters.items():
        states[name] = read_adapter_state(model, Path(folder))
        sizes = load_step_sizes(folder, names)
        if sizes is not None:
            learned[name] = sizes
    return states, learned


def eval_settings(cfg: RecipeConfig, pad_id: int, *, min_seeds: int = 3) -> EvalSettings:
    """The run's ``eval`` and ``algorithm`` sections as the evaluation's settings: the inner loop
    meta-training used, ``eval.max_steps`` steps, the lr grid, pass sizes and steps scored."""
    e = cfg.eval
    return EvalSettings(inner=cfg.algorithm.inner_loop, max_steps=e.max_steps, pad_id=pad_id, lr_grid=e.lr_grid,
                        micro_batch_size=e.micro_batch_size, min_seeds=min_seeds,
                        icl_max_length=cfg.algorithm.icl_max_length, score_steps=e.score_steps or None,
                        episodes_per_pass=e.episodes_per_pass)


def budget_notes(cfg: RecipeConfig) -> list[str]:
    """How much training each compared adapter got, and the rule each method follows."""
    s, a = cfg.sampler, cfg.algorithm
    r = cfg.train.replicates
    notes = [
        f"Every method: {cfg.train.meta_steps} meta-steps x {s.batch_description()} episodes, "
        f"outer lr {cfg.optim.outer_lr:g}, from the same initial adapter and the same episode draws"
        + (f"; {r} training replicates (training seeds {cfg.train.seed}..{cfg.train.seed + r - 1}: "
           "initial adapter, episode draws, dropout), each scored on the same held-out episodes."
           if r > 1 else ".")
    ]
    notes += [f"{m}: {METHODS[m].budget_rule(a)}" for m in cfg.methods if m in METHODS]
    in_context = [m for m in cfg.methods if m in METHODS and METHODS[m].adapts_in_context(a)]
    if in_context:
        notes.append(f"{', '.join(in_context)}: adapted on in-context rows (algorithm.inner_format="
                     "in_context: each support row with the other support examples as demonstrations), "
                     "in training and here, and scored with the support as demonstrations.")
    notes.append("base / in_context: the initial adapter (LoRA B = 0), no meta-training.")
    return notes


@dataclass
class Replicate:
    """One training replicate of a run (``train.replicates``).

    Attributes:
        cfg: its config as a one-replicate run (:meth:`RecipeConfig.replicate_configs`):
            ``cfg.train.seed`` is its training seed, ``cfg.output_dir`` its folder.
        initial: its initial adapter (LoRA B = 0), in the order of the adapter parameters, scored
            as ``"base"``; ``None``: the engine's adapter as it is.
        adapters: method -> the folder of the adapter it trained (filled as training finishes).
    """

    cfg: RecipeConfig
    initial: list[torch.Tensor] | None
    adapters: dict[str, Path] = field(default_factory=dict)


def evaluate_run(
    cfg: RecipeConfig, engine: Engine, tokenizer: Any, suite: Any,
    adapters: Mapping[str, Path] | Sequence[Replicate], out: Path, report_dir: Path | None = None,
    notes: Sequence[str] | None = None, in_context: Collection[str] | None = None,
    workers: Workers | None = None,
) -> dict[str, Path]:
    """Evaluates the base model, in-context demonstrations and every adapter; writes the report.

    Every rank of ``engine`` must call it; they split the episodes and all get the same result;
    rank 0 writes the report.

    Args:
        engine: the engine wrapping the peft model, whose adapter holds the run's initial adapter
            (scored as ``"base"``: LoRA B is zero).
        adapters: name -> adapter folder (one replicate, its base the engine's adapter), or the
            run's training replicates: each is evaluated on the very same episodes, its
            adaptation lrs chosen on validation for its own adapters, into one report whose
            intervals count the training variance between them.
        out: the run's folder (its ``metrics.jsonl``, or replicate 0's, gives the training curves).
        report_dir: where the report goes; ``None`` = ``out/eval``.
        notes: how each compared adapter was trained, for the report; ``None`` = every method
            trained as ``cfg`` says (a study's chosen adapters were each trained their own way).
        in_context: the adapters trained on in-context rows, scored in that format; ``None`` =
            those ``cfg.algorithm`` says (see :func:`eval_methods`).
        workers: in a one-process run, the processes that share out the episodes
            (:class:`~fmmeta.workers.Workers`); ``None`` = this process alone.

    Returns:
        Name -> path of each report file (eval.json, eval.md, PNG plots); empty on other ranks.
    """
    model = engine.model
    params = engine.adapter_parameters()
    replicates = ([Replicate(cfg, None, dict(adapters))] if isinstance(adapters, Mapping)
                  else list(adapters))
    if cfg.algorithm.padding_free:  # adaptation's passes are laid out in lines too
        check_lines(model)
    seed, query = cfg.tasks.seed, cfg.eval.query
    validation = draw_episodes(evaluation_tasks(suite.validation, query), seed, 0, cfg.eval.val_episodes_per_task)
    held_out = evaluation_tasks(suite.held_out, query)
    held_out_draws = [draw_episodes(held_out, seed, 1 + s, cfg.eval.episodes_per_task) for s in range(cfg.eval.seeds)]
    results: list[EvalResult] = []
    for r, replicate in enumerate(replicates):
        states, learned = _replicate_states(model, params, replicate)
        methods = eval_methods(cfg, states, adapter_names(model), learned, in_context)
        # In-context demonstrations score the initial adapter, whose B = 0 makes LoRA add exactly
        # nothing: every replicate's scores are replicate 0's, bit for bit, so they are copied.
        shared = [IN_CONTEXT] if r > 0 and IN_CONTEXT in methods else []
        logger.info(
            "evaluating %s%s on %d held-out tasks x %d seeds x %d episodes (lr chosen on %d validation "
            "episodes)", ", ".join(m for m in methods if m not in shared),
            f" of replicate {r} ({r + 1}/{len(replicates)}, training seed {replicate.cfg.train.seed})"
            if len(replicates) > 1 else "",
            len(suite.held_out), cfg.eval.seeds, cfg.eval.episodes_per_task, len(validation),
        )
        result = evaluate_held_out(
            model, params, {m: e for m, e in methods.items() if m not in shared}, validation, held_out_draws,
            eval_settings(cfg, tokenizer.pad_token_id, min_seeds=min(3, cfg.eval.seeds)),
            families=report_families(suite.held_out, cfg.tasks.split.held_out_families),
            ranks=engine, workers=workers,
        )
        results.append(_with_rows_of(result, results[0], shared) if shared else result)
    result = merge_replicates(results, [rep.cfg.train.seed for rep in replicates])
    result.notes = budget_notes(cfg) if notes is None else list(notes)
    result.format_shift = list(suite.format_shift)
    if query is not None:
        result.notes.append(f"Every evaluation episode has {query} query examples per class (per "
                            "episode for generation tasks; eval.query), not each task's own.")
    if engine.rank != 0:
        return {}
    # Several replicates: replicate 0's training curves (each replicate's are in its folder).
    metrics = (out if len(replicates) == 1 else Path(replicates[0].cfg.output_dir)) / "metrics.jsonl"
    paths = write_report(result, report_dir or out / "eval",
                         metrics_jsonl=metrics if metrics.exists() else None)
    logger.info("held-out evaluation:\n%s", format_markdown(result))
    return paths
