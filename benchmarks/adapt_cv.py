"""What ``fmmeta adapt --method auto`` pays for its cross-validation, against one plain adapt.

``--method auto`` (and ``--compare``) adapts every candidate k times per task, once per fold, on
the user's support rows, before it adapts the task once with the one it chose. This measures, on
4-shot 2-way tasks (4 support rows a label) with the model loaded once, as adapt runs them:

* ``single_s``: one task adapted and its query predicted with ``--method`` (the plain call's work);
* ``cv_one_s``: that method cross-validated on the task's k folds (one grouped call), and
  ``cv_ratio`` = ``cv_one_s / single_s``, which the design holds to at most k + 1 (k folds, each
  adapted on fewer rows than the task, plus nothing else);
* ``cv_many_s``: the folds of ``--tasks`` tasks cross-validated together, against ``--tasks``
  times ``cv_one_s`` (``grouping_speedup``): many tasks' folds share passes as adapt's tasks do;
* ``auto_cv_s``: every candidate of the run cross-validated on one task (what auto adds).

Times are medians of ``--repeats``, after one untimed warm-up. On a run trained here (``--tiny``:
the smoke config's random model, seconds) or a finished run (``--run``, default ``runs/default``).

Usage:
    python benchmarks/adapt_cv.py [--run runs/default] [--method reptile] [--tasks 8] [--folds 4]
    python benchmarks/adapt_cv.py --tiny

The last line of output is one JSON object with the measurements.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from adapt_many import DEFAULT_RUN, WORDS, _tiny_run  # noqa: E402  (benchmarks/adapt_many.py: its run and words)


def _task(rng: random.Random, name: str) -> dict:
    """A 2-way task: 4 support rows a label (8) and 4 query rows, random words and label words."""
    labels = rng.sample(WORDS, 2)
    text = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))  # noqa: E731
    rows = [{"text": text(), "label": labels[i % 2]} for i in range(12)]
    return {"name": name, "support": rows[:8], "query": rows[8:]}


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first passes allocate
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cpu() -> str:
    """The CPU's model name and whether it has native bf16 (timings depend on both)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    return model + (" (avx512_bf16)" if "avx512_bf16" in info else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="train the smoke config's tiny run here first")
    ap.add_argument("--run", type=Path, default=DEFAULT_RUN, help=f"a finished run (default {DEFAULT_RUN})")
    ap.add_argument("--method", default="reptile")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from fmmeta.adaptation.cross_validation import fold_count
    from fmmeta.adaptation.method import candidate_methods
    from fmmeta.adaptation.session import Adapter
    from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, read_task

    with tempfile.TemporaryDirectory() as tmp:
        run = _tiny_run(Path(tmp)) if args.tiny else args.run
        if not (run / "eval" / "eval.json").is_file():
            raise SystemExit(f"--run {run}: no finished run there (no eval/eval.json); train one first "
                             f"(`make train` writes {DEFAULT_RUN}) or give --tiny")
        plans, skipped = candidate_methods(run)
        if args.method not in plans:
            raise SystemExit(f"--method {args.method}: not a candidate of {run} ({sorted(plans)}; {skipped})")
        rng = random.Random(args.seed)
        texts = [read_task(TaskFiles(t["name"], t["support"], t["query"], TaskFormat()))
                 for t in (_task(rng, f"t{i}") for i in range(args.tasks))]
        k = fold_count(texts, args.folds)
        adapter = Adapter(plans[args.method])
        one = adapter.build(texts[0])

        def cv(names: list[str], tasks: list) -> None:  # noqa: ANN001 - TaskTexts
            adapter.compare({n: plans[n] for n in names}, tasks, k, {}, time.perf_counter)  # adapt's own path

        single = _median(lambda: adapter.adapt([one]), args.repeats)
        cv_one = _median(lambda: cv([args.method], texts[:1]), args.repeats)
        cv_many = _median(lambda: cv([args.method], texts), args.repeats)
        auto = _median(lambda: cv(list(plans), texts[:1]), args.repeats)
    print(json.dumps({
        "run": "tiny" if args.tiny else str(args.run), "method": args.method, "folds": k, "tasks": args.tasks,
        "candidates": list(plans), "single_s": round(single, 4), "cv_one_s": round(cv_one, 4),
        "cv_ratio": round(cv_one / single, 3), "cv_many_s": round(cv_many, 4),
        "grouping_speedup": round(args.tasks * cv_one / cv_many, 3), "auto_cv_s": round(auto, 4),
        "auto_ratio": round(auto / single, 3), "cpu": _cpu(),
    }))


if __name__ == "__main__":
    main()
