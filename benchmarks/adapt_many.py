"""Many small tasks in one ``fmmeta adapt`` call against one call per task.

A user with a hundred small tasks can adapt them in one call (``--tasks FOLDER``: the model loads
once and the tasks are adapted in groups whose rows share passes) or call ``fmmeta adapt`` once per
task (a process, a model load and a few tiny passes each). This measures both, as a user runs them
(``python recipes/adapt.py`` processes, wall-clock, writing predictions and adapters), on a run
trained here: ``--tiny`` the smoke config's random model (seconds), else ``--run RUN``
(default ``runs/default``, the run ``make train`` writes; ``make bench`` trains it first when it is
missing). Separate calls are identical in size, so ``--separate K``
times K of them and scales to ``--tasks``; ``separate_calls_measured`` says how many ran.

It also compares the two calls' predictions: every candidate's log-probability of the one call
against the separate calls' (``max_rel_logprob_diff``, ``max_abs_logprob_diff``) and
``same_top_choice``, the share of classification rows whose most likely label is the same in both
(a relative difference alone overstates a log-probability near 0). Grouping changes only float
rounding, but an adaptation that amplifies rounding turns that into other labels; what these
measured, and why, is in ``docs/benchmarks.md``.

Usage:
    python benchmarks/adapt_many.py [--run runs/default] [--method reptile] [--tasks 100] [--separate 10]
    python benchmarks/adapt_many.py --tiny      # trains the smoke config's tiny run first (seconds)

The last line of output is one JSON object with the measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUN = Path("runs/default")
"""The recipe's default ``output_dir``, relative to the working directory as the recipe's is."""
WORDS = ("river stone cloud tiger piano apple garden window silver forest candle mirror ocean thunder "
         "market bridge letter winter summer castle").split()


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _python(args: list[str]) -> float:
    """Runs ``python ARGS`` as a user would; returns its wall-clock seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - start


def write_tasks(root: Path, n: int, seed: int) -> list[dict]:
    """``n`` small tasks, one folder each, and their YAML list (``root/tasks.yaml``): 2-way
    classification (4 shots per label, 4 queries) with random label words, every fifth a
    generation task (copy the last word)."""
    rng = random.Random(seed)
    items = []
    for t in range(n):
        folder = root / f"task{t:03d}"
        folder.mkdir(parents=True)
        text = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
        if t % 5 == 4:
            rows = [{"input": text()} for _ in range(8)]
            rows = [{**r, "output": r["input"].split()[-1]} for r in rows]
        else:
            labels = rng.sample(WORDS, 2)
            rows = [{"text": text(), "label": labels[i % 2]} for i in range(12)]
        for name, part in (("support", rows[:-4]), ("query", rows[-4:])):
            (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        items.append({"name": folder.name, "support": f"{folder.name}/support.jsonl",
                      "query": f"{folder.name}/query.jsonl", "builder": "dataset" if "input" in rows[0] else
                      "classification"})
    (root / "tasks.yaml").write_text("".join(f"- {json.dumps(item)}\n" for item in items))
    return items


def _tiny_run(root: Path) -> Path:
    run = root / "run"
    _python([str(REPO / "recipes" / "train.py"), "--config", str(REPO / "recipes" / "configs" / "smoke.yaml"),
             f"output_dir={run}", "methods=[reptile,metaicl]"])
    return run


def _logprobs(predictions: Path) -> dict[tuple[str, int], list[float]]:
    out = {}
    for line in predictions.read_text().splitlines():
        r = json.loads(line)
        out[(r["task"], r["row"])] = list(r["logprobs"].values()) if "logprobs" in r else [r["logprob"]]
    return out


def _top(logprobs: list[float]) -> int:
    return max(range(len(logprobs)), key=logprobs.__getitem__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="train the smoke config's tiny run here first")
    ap.add_argument("--run", type=Path, default=DEFAULT_RUN,
                    help=f"a finished run to adapt (default {DEFAULT_RUN}; ignored with --tiny)")
    ap.add_argument("--method", default="reptile")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--separate", type=int, default=10, help="separate calls to time (scaled to --tasks)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not args.tiny and not (args.run / "eval" / "eval.json").is_file():
        raise SystemExit(f"--run {args.run}: no finished run there (no eval/eval.json); train one first "
                         f"(`make train` writes {DEFAULT_RUN}) or give --tiny")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = _tiny_run(root) if args.tiny else args.run.resolve()  # the calls run in the repository
        items = write_tasks(root / "tasks", args.tasks, args.seed)
        adapt = [str(REPO / "recipes" / "adapt.py"), "--run", str(run), "--method", args.method,
                 "--max-new-tokens", "8"]
        one_call_s = _python([*adapt, "--tasks", str(root / "tasks" / "tasks.yaml"), "--out", str(root / "one")])
        together = _logprobs(root / "one" / "predictions.jsonl")
        k = min(args.separate, args.tasks)
        seconds, diff, abs_diff, same, rows = 0.0, 0.0, 0.0, 0, 0
        for t in range(k):
            folder = root / "tasks" / f"task{t:03d}"
            seconds += _python([*adapt, "--support", str(folder / "support.jsonl"), "--query",
                                str(folder / "query.jsonl"), "--name", folder.name, "--builder", items[t]["builder"],
                                "--out", str(root / f"sep{t}")])
            for key, values in _logprobs(root / f"sep{t}" / "predictions.jsonl").items():
                pairs = list(zip(together[key], values, strict=True))
                diff = max(diff, *(abs(a - b) / max(abs(b), 1e-30) for a, b in pairs))
                abs_diff = max(abs_diff, *(abs(a - b) for a, b in pairs))
                if len(values) > 1:  # a classification row: its label is the most likely candidate
                    rows += 1
                    same += _top(together[key]) == _top(values)
    separate_s = seconds / k * args.tasks
    print(json.dumps({
        "tasks": args.tasks, "method": args.method, "model": "tiny" if args.tiny else str(args.run),
        "one_call_s": round(one_call_s, 3), "separate_s_per_call": round(seconds / k, 3),
        "separate_calls_measured": k, "separate_s": round(separate_s, 3),
        "speedup": round(separate_s / one_call_s, 2), "max_rel_logprob_diff": diff,
        "max_abs_logprob_diff": abs_diff, "same_top_choice": round(same / rows, 4) if rows else None,
        "threads": int(_env()["OMP_NUM_THREADS"]), "cpus": os.cpu_count(), "python": platform.python_version(),
    }))


if __name__ == "__main__":
    main()
