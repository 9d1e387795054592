#!/usr/bin/env python
"""Adapt a finished run's meta-trained adapter to your own new task(s), and predict.

    fmmeta adapt --run runs/default --method reptile --support support.csv --query query.csv --out adapted
    python recipes/adapt.py --run runs/default --method metaicl --tasks my_tasks/ --out adapted
    fmmeta adapt --run runs/own_tasks --method fomaml --source topic --support s.csv --query q.csv

The method adapts exactly as the run's held-out evaluation adapted it: its inner loop on fp32 fast
weights, at the lr the evaluation chose on validation tasks (Meta-SGD: its learned step sizes;
MetaICL and in_context: the support as demonstrations, no steps), for the evaluation's number of
steps; ``--steps`` and ``--lr`` override. Writes into ``--out`` (a new or empty folder):
``predictions.jsonl`` (every query: the chosen label with every candidate's log-probability, or
the greedy text with its log-probability), ``adapters/<task>/`` (peft format) and
``summary.json``. Query rows that carry their label get accuracy and loss reported; labels never
reach adaptation.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from fmmeta.startup import Terminated, ctrl_c_raises  # first: Ctrl-C during the imports below is a message

# isort: split
from fmmeta.adaptation import Adapted, Adapter, TaskFiles, TaskFormat, resolve_method
from fmmeta.adaptation.cross_validation import (
    DEFAULT_FOLDS,
    DEFAULT_METRIC,
    Comparison,
    below_base,
    cv_metric,
    fold_count,
)
from fmmeta.adaptation.method import AUTO, RunMethod, candidate_methods, load_run_config
from fmmeta.adaptation.task_files import read_task
from fmmeta.adaptation.task_format import adapt_builders, describe_source, format_keys, key_help
from fmmeta.adaptation.task_list import task_list
from fmmeta.errors import UserInputError
from fmmeta.library_warnings import show_library_warnings_once
from fmmeta.path_names import check_path_names, folder_room_problem
from fmmeta.progress import Progress
from fmmeta.strict_json import dumps_strict

logger = logging.getLogger("fmmeta.adapt")


def parse_args(argv: list[str], prog: str | None = None) -> argparse.Namespace:
    """The run and method, the task files and their format, and the overrides."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a finished run's output_dir")
    p.add_argument("--method", required=True, help="a method the run trained, base / in_context, or auto: the "
                   "one that does best in cross-validation on the support rows")
    p.add_argument("--compare", action="store_true", help="with a named --method: also cross-validate every "
                   "candidate on the support rows, report them and warn if the method trails the base model")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help="cross-validation folds of auto / --compare "
                   f"(default {DEFAULT_FOLDS}; fewer where a label has fewer support rows)")
    p.add_argument("--cv-metric", default=DEFAULT_METRIC, help="the registered metric auto / --compare choose by, "
                   "in its direction, candidates it cannot tell apart then by loss (default accuracy; e.g. loss: any "
                   "registered metric that applies to the tasks, as a study's study.metric)")
    p.add_argument("--replicate", type=int, default=0, help="training replicate (runs of train.replicates > 1)")
    p.add_argument("--adapter", type=Path, help="adapt this peft adapter folder the way --method adapts, instead "
                   "of the method's own (it must fit the run's model and LoRA)")
    p.add_argument("--support", type=Path, help="labelled support rows of one task (any format tasks read)")
    p.add_argument("--query", type=Path, help="rows to predict (labels optional, never used to adapt)")
    p.add_argument("--tasks", type=Path, help="many tasks: a folder of task folders (support.* + query.*) "
                   "or a YAML list of {name, support, query, ...}")
    p.add_argument("--name", default="task", help="the task's name with --support (default: task)")
    p.add_argument("--out", type=Path, default=Path("adapted"), help="output folder, new or empty")
    p.add_argument("--source", help="read rows as this tasks.collection source of the run's config does")
    p.add_argument("--builder", choices=adapt_builders(), help="the task builder the files are read with: "
                   + ", ".join(adapt_builders()) + " (dataset: generation); each takes its own keys below")
    p.add_argument("--template", help="as a YAML task source's template (not chat)")
    p.add_argument("--answer-template", help="as a YAML task source's answer_template (not chat)")
    p.add_argument("--labels", help="classification: the label set, comma-separated (default: the verbalizer's "
                   "words, else the support's labels)")
    add_builder_keys(p)
    p.add_argument("--steps", type=int, help="adaptation steps (default: the run's evaluation's)")
    p.add_argument("--lr", type=float, help="adaptation lr (default: the one the evaluation chose on validation)")
    p.add_argument("--max-new-tokens", type=int, help="longest greedy answer (generation; default 64, at most the "
                   "run's tasks.max_length)")
    p.add_argument("--tasks-per-pass", type=int, help="tasks adapted together (default: eval.episodes_per_pass)")
    p.add_argument("--no-adapters", action="store_true", help="write predictions only, no adapter folders")
    return p.parse_args(argv)


def add_builder_keys(p: argparse.ArgumentParser) -> None:
    """A flag per key of the builders' own sections, its help the builders that take it and its doc."""
    for key, text in key_help().items():
        p.add_argument("--" + key.replace("_", "-"), dest=key, help=text)


def task_files(args: argparse.Namespace) -> list[TaskFiles]:
    """The tasks named on the command line, each with its format (``--source``, then options)."""
    fmt = TaskFormat()
    if args.source is not None:
        sources = {describe_source(s): s for s in load_run_config(args.run).tasks.collection}
        if args.source not in sources:
            raise UserInputError(f"--source {args.source!r} is not a source of the run's config: it has "
                                 f"{sorted(sources) or 'none (a built-in suite)'}")
        fmt = TaskFormat.from_source(sources[args.source])
    fmt = fmt.replace(**{k: getattr(args, k) for k in format_keys()})
    if (args.tasks is None) == (args.support is None):
        raise UserInputError("give either --support FILE (with --query FILE) for one task, or --tasks for many")
    if args.tasks is not None:
        return task_list(args.tasks, fmt)
    if args.query is None:
        raise UserInputError("--support without --query: give the rows to predict with --query FILE")
    return [TaskFiles(args.name, args.support, args.query, fmt)]


CLAIM = ".fmmeta-adapt-writing"
"""The file that claims ``--out`` for one ``fmmeta adapt`` while it writes (created exclusively)."""


def out_folder(out: Path, run: Path) -> Path:
    """``out``, created and claimed for this call; refused if it holds anything (nothing is ever
    overwritten), if another adapt claimed it first, or if it lies inside the run (whose folder
    belongs to training: an extension of the run would find it there)."""
    if out.resolve().is_relative_to(run.resolve()):
        raise UserInputError(f"--out {str(out)!r} is inside the run {str(run)!r}, which training owns: write "
                             "somewhere outside it")
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {str(out)!r} is a file: choose a new folder (nothing is overwritten)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        os.close(os.open(out / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # one adapt at a time
    except FileExistsError:
        raise UserInputError(f"--out {str(out)!r} is being written by another fmmeta adapt (or by one that stopped "
                             f"before it finished, which left {CLAIM} there): choose another folder") from None
    except OSError as err:
        raise UserInputError(f"--out {str(out)!r} cannot be created ({err.strerror})") from None
    if any(p.name != CLAIM for p in out.iterdir()):
        (out / CLAIM).unlink()
        raise UserInputError(f"--out {str(out)!r} exists and is not an empty folder: choose a new one "
                             "(nothing is overwritten)")
    return out


def number_problems(args: argparse.Namespace, max_length: int) -> list[str]:
    """What is out of range among the numbers that only adapt takes (the run's config checked the
    rest): a greedy answer of no token, or longer than any example the run could hold, and tasks
    per pass below one."""
    problems = []
    if args.max_new_tokens is not None and not 1 <= args.max_new_tokens <= max_length:
        problems.append(f"--max-new-tokens {args.max_new_tokens} is invalid: must be >= 1 and <= the run's "
                        f"tasks.max_length={max_length} (an example's whole token budget)")
    if args.tasks_per_pass is not None and args.tasks_per_pass < 1:
        problems.append(f"--tasks-per-pass {args.tasks_per_pass} is invalid: must be >= 1 (tasks adapted together)")
    return problems


def summary(plan: RunMethod, adapter: Adapter, done: list[Adapted], seconds: float,
            comparison: Comparison | None = None, warning: str | None = None) -> dict[str, Any]:
    """Tasks, rows, seconds, and accuracy and loss over the queries whose labels were given; with
    auto / --compare, every candidate's cross-validated score and the choice."""
    rows = [r for a in done for r in a.predictions]
    known = [r for r in rows if "correct" in r]
    tokens = sum(r["answer_tokens"] for r in known)
    return {"run": str(plan.run), "method": plan.method, "seed": plan.cfg.train.seed, "lr": plan.lr,
            "lr_source": plan.lr_source, "steps": adapter.steps, "tasks": len(done), "query_rows": len(rows),
            "labelled_rows": len(known), "seconds": round(seconds, 3),
            "prompts_cut": sum(a.task.n_cut for a in done),
            "accuracy": sum(r["correct"] for r in known) / len(known) if known else None,
            "loss": -sum(r["answer_logprob"] for r in known) / tokens if tokens else None,
            **({"cross_validation": comparison.as_dict(), "warning": warning} if comparison else {})}


def _plans(args: argparse.Namespace) -> tuple[RunMethod | None, dict[str, RunMethod], dict[str, str]]:
    """The named method's plan (None for auto), and with auto / --compare every candidate's."""
    auto = args.method == AUTO
    if auto and (args.lr is not None or args.steps is not None or args.adapter is not None):
        raise UserInputError(f"--method {AUTO} compares the run's methods as its evaluation adapts them: drop --lr, "
                             "--steps and --adapter, or name the method they apply to (with --compare to compare)")
    plan = None if auto else resolve_method(args.run, args.method, replicate=args.replicate, steps=args.steps,
                                            lr=args.lr, adapter=args.adapter)
    if not (auto or args.compare):
        if args.folds != DEFAULT_FOLDS:
            raise UserInputError(f"--folds {args.folds} with --method {args.method}: folds are for cross-validation; "
                                 f"add --compare, or use --method {AUTO}")
        if args.cv_metric != DEFAULT_METRIC:
            raise UserInputError(f"--cv-metric {args.cv_metric} with --method {args.method}: the metric is for "
                                 f"cross-validation; add --compare, or use --method {AUTO}")
        return plan, {}, {}
    plans, skipped = candidate_methods(args.run, args.replicate)
    for method, why in skipped.items():
        logger.warning("%s is not compared: %s", method, why)
    return plan, plans, skipped


def adapt(args: argparse.Namespace) -> dict[str, Any]:
    """Checks everything that needs no model, then loads it once, cross-validates the candidates
    (auto / --compare) and adapts every task."""
    start = time.monotonic()
    plan, plans, skipped = _plans(args)
    files = task_files(args)
    problems = [] if args.no_adapters else check_path_names([f.name for f in files], what="task name")
    max_length = (plan or next(iter(plans.values()))).cfg.tasks.max_length
    problems += number_problems(args, max_length)
    problems += [p for p in [folder_room_problem(str(args.out), what="--out")] if p]
    if problems:  # each names a folder of --out/adapters
        raise UserInputError("; ".join(problems))
    texts = [read_task(f) for f in files]  # every file checked before the model loads
    k = fold_count(texts, args.folds) if plans else 0
    if plans:
        cv_metric(args.cv_metric, texts)
    out = out_folder(args.out, args.run)
    adapter = Adapter(plan or next(iter(plans.values())), tasks_per_pass=args.tasks_per_pass,
                      max_new_tokens=args.max_new_tokens or min(64, max_length))
    comparison = warning = None
    if plans:
        logger.info("cross-validating %s on the support rows of %d task(s), %d folds", ", ".join(plans), len(texts), k)
        comparison = adapter.compare(plans, texts, k, skipped, time.monotonic, args.cv_metric)
        plan = plan or plans[comparison.chosen]
        adapter = adapter.with_method(plan)
        warning = below_base(plan.method, comparison.scores, args.cv_metric)
    assert plan is not None
    logger.info("adapting %d task(s) with %s of %s: %s, %d step(s)", len(texts), plan.method, plan.run,
                f"lr {plan.lr:g} ({plan.lr_source})" if plan.lr is not None else plan.lr_source, plan.steps)
    progress = Progress("adapted", len(texts), "tasks", every_s=10.0)
    done = adapter.adapt([adapter.build(t) for t in texts], on_group=progress.advance)
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as fh:
        for adapted in done:
            fh.writelines(dumps_strict(r) + "\n" for r in adapted.predictions)
    if not args.no_adapters:
        for adapted in done:
            adapted.save(out / "adapters" / adapted.task.name)
    result = summary(plan, adapter, done, time.monotonic() - start, comparison, warning)
    (out / "summary.json").write_text(dumps_strict(result, indent=1) + "\n", encoding="utf-8")  # NaN: null
    (out / CLAIM).unlink()  # complete: a crash leaves the claim, and the folder is refused as not empty
    return result


def quiet_file_reads() -> None:
    """No progress bar and no log line per file read: a hundred tasks are two hundred small files,
    and their lines would bury the progress and the summary."""
    import datasets

    datasets.disable_progress_bars()
    logging.getLogger("fmmeta.tasks.data").setLevel(logging.WARNING)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Exit codes: 0 done, 2 bad input (arguments, run, method, task files), 130 Ctrl-C, 143 SIGTERM."""
    ctrl_c_raises()
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    show_library_warnings_once(0)
    quiet_file_reads()
    try:
        result = adapt(args)
    except UserInputError as err:  # the input, not a bug
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print(f"stopped by {'SIGTERM' if isinstance(err, Terminated) else 'Ctrl-C'}: the run was only read; "
              f"{str(args.out)!r} may hold part of the output", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    cv = result.get("cross_validation")
    if cv is not None:
        print(f"cross-validated on the support rows ({cv['folds']} folds):")
        for method, score in cv["candidates"].items():
            digits = {m: 3 if m == args.cv_metric else 4 for m in score if m + "_se" in score}  # as `why` says them
            values = [f"{m} {score[m]:.{d}f} ± {score[m + '_se']:.{d}f}" for m, d in digits.items()]
            print(f"  {method:<12} " + "   ".join(values) + ("   <- best" if method == cv["chosen"] else ""))
        if args.method == AUTO:
            print(f"auto chose {cv['chosen']}: {cv['why']}")
        if result["warning"]:
            print(f"warning: {result['warning']}")
    accuracy = "" if result["accuracy"] is None else (
        f", accuracy {result['accuracy']:.3f} and loss {result['loss']:.4f} on {result['labelled_rows']} labelled rows")
    print(f"adapted {result['tasks']} task(s), {result['query_rows']} query rows, with {result['method']} in "
          f"{result['seconds']:.1f} s{accuracy}: {args.out}")
    return 0


def cli(argv: list[str] | None = None, prog: str | None = None) -> int:
    """What every entry point runs: ``python recipes/adapt.py`` and ``fmmeta adapt``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return main(argv, prog)


if __name__ == "__main__":
    sys.exit(cli())
