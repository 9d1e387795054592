#!/usr/bin/env python
"""Scores and paired differences of any rows of one or more held-out evaluations (``eval.json``).

The report compares every method with ``multitask`` and ``in_context`` only. A budget sweep names
its rows itself (``reptile@40``, ``multitask@40`` ...: ``recipes/evaluate.py --adapter NAME=PATH``)
and may score them in several evaluate calls with the same config. Episodes are drawn from the
suite and the seeds alone, so those calls score the very same episodes; this script pools their
records (checking that each (seed, episode) is the same task in every file) and prints, per
family, each row's accuracy at its headline step and each pair's paired difference, with the
report's stratified bootstrap intervals. The last line is the same figures as one JSON object.

    python scripts/compare_rows.py runs/sweep/val/eval-*/eval.json \\
        --pair reptile@40:multitask@40 --pair reptile@80:multitask@80

Two runs of the same config that differ in something else (the compute dtype, say) score the
same episodes under the same row names: ``PATH=SUFFIX`` appends ``SUFFIX`` to every row of that
file, so the rows can be paired::

    python scripts/compare_rows.py runs/fp32/eval/eval.json runs/bf16/eval/eval.json=@bf16 \\
        --pair fomaml@bf16:fomaml --pair multitask@bf16:multitask
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.evaluation.intervals import Interval
from fmmeta.evaluation.result import EpisodeRecord, EvalResult


def pooled_result(paths: list[Path], suffixes: list[str] | None = None) -> EvalResult:
    """Every file's records in one :class:`EvalResult`, each file's rows renamed with its suffix
    (none by default); a row present in several files is taken from the first. Raises ValueError
    if two files drew different tasks for one episode."""
    records: dict[tuple[str, int, int, int], EpisodeRecord] = {}
    tasks: dict[tuple[int, int], str] = {}
    methods: list[str] = []
    max_steps = n_seeds = 0
    for path, suffix in zip(paths, suffixes or [""] * len(paths)):
        data = json.loads(path.read_text())
        max_steps, n_seeds = max(max_steps, data["max_steps"]), max(n_seeds, data["n_seeds"])
        for raw in data["records"]:
            rec = EpisodeRecord.from_dict({**raw, "method": raw["method"] + suffix})
            task = tasks.setdefault((rec.seed, rec.episode), rec.task)
            if task != rec.task:
                raise ValueError(f"{path}: seed {rec.seed} episode {rec.episode} is {rec.task}, "
                                 f"another file has {task} there: not the same episodes")
            records.setdefault((rec.method, rec.seed, rec.episode, rec.step), rec)
            if rec.method not in methods:
                methods.append(rec.method)
    return EvalResult(records=list(records.values()), methods=methods, max_steps=max_steps,
                      n_seeds=n_seeds, inner_lrs={}, inner=InnerLoopConfig())


def _cell(interval: Interval) -> str:
    return f"{interval.estimate:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="eval.json files of one config, each PATH or "
                        "PATH=SUFFIX (SUFFIX appended to every row name of that file)")
    parser.add_argument("--pair", action="append", default=[], metavar="ROW:BASELINE",
                        help="a paired difference to print (repeatable)")
    args = parser.parse_args(argv)
    files = [f.partition("=") for f in args.files]
    try:
        result = pooled_result([Path(p) for p, _, _ in files], [suffix for _, _, suffix in files])
    except (OSError, ValueError, KeyError, TypeError) as err:  # unreadable, or not an eval.json
        parser.error(f"cannot pool {[str(f) for f in args.files]}: {err!r}")
    pairs = [tuple(p.split(":", 1)) for p in args.pair]
    if any(len(p) != 2 for p in pairs):
        parser.error(f"--pair {args.pair} is invalid: use ROW:BASELINE")
    unknown = sorted({m for pair in pairs for m in pair} - set(result.methods))
    if unknown:
        parser.error(f"--pair names rows {unknown} that are not in the files: {result.methods}")
    out: dict[str, dict] = {}
    for family in result.families():
        print(f"\n## {family}\n\n| row | step | accuracy | loss |\n|---|---|---|---|")
        rows = out.setdefault(family, {"rows": {}, "pairs": {}})
        for method in result.methods:
            step = result.steps_of(method)[-1]
            cell = result.summary()[method].get(family, {}).get(step)
            if cell is None:
                continue
            acc, loss = cell.interval("accuracy"), cell.interval("loss")
            print(f"| {method} | {step} | {acc.estimate:.3f} [{acc.low:.3f}, {acc.high:.3f}] "
                  f"(n={acc.n}) | {loss.estimate:.3f} |")
            rows["rows"][method] = {"step": step, "accuracy": dataclasses.asdict(acc),
                                    "loss": dataclasses.asdict(loss)}
        for method, baseline in pairs:
            diff = result.compare(method, baseline, family)
            if diff is None:
                continue
            d_acc, d_loss = diff.interval("accuracy"), diff.interval("loss")
            mark = " (excludes 0)" if d_acc.excludes_zero else ""
            print(f"\n{method} - {baseline}: accuracy {_cell(d_acc)}{mark}, loss {_cell(d_loss)}")
            rows["pairs"][f"{method}:{baseline}"] = {"accuracy": dataclasses.asdict(d_acc),
                                                     "loss": dataclasses.asdict(d_loss)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
