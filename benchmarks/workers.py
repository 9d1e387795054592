"""Benchmark: a run's methods one after the other in one process, against side by side in worker
processes (``engine.workers``), timed as the user pays it: the whole ``recipes/train.py``.

Each layout is the train recipe started as its own process (a fresh process, as from a shell:
workers must fork from a process that has not computed on several threads, see
``fmmeta.workers``), with the same arguments except ``engine.workers``: ``1`` (every method and
every evaluation group in the recipe's process, on all of torch's threads) against ``--workers``
(default ``auto``: one worker per thread, each on one thread). The default is the default run
(SmolLM2-135M, five methods, the held-out evaluation) at ``--meta-steps`` meta-steps; ``--tiny``
is the smoke config (what ``make test`` runs, with two methods and one evaluation seed given as
recipe overrides after ``--``). With ``--reps`` above 1 the layouts alternate.

Prints a line per run and, as the last line, one JSON object:

* ``seconds``: per layout, the wall seconds of each run (process start to exit: model load,
  training and evaluation); ``speedup``: the median one-process time over the median worker time.
* ``workers`` / ``threads``: what the recipe's ``auto`` resolved to on this machine (its log).
* ``eval_loss_max_rel_diff``: the largest relative difference between the two layouts' held-out
  losses (a thread count rounds sums differently; 0 when both run on one thread).
* ``overrides``: the recipe overrides both layouts ran with.

Usage:
    python benchmarks/workers.py [--tiny] [--meta-steps 6] [--reps 1] [--workers auto] [-- OVERRIDES]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "recipes" / "configs" / "smoke.yaml"


def run_recipe(args: list[str], out: Path) -> tuple[float, str]:
    """Wall seconds of one recipe run (as a process) and its log."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "recipes" / "train.py"), *args, f"output_dir={out}"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"the recipe failed (exit {done.returncode}):\n{log[-4000:]}")
    return seconds, log


def eval_losses(out: Path) -> dict[tuple, float]:
    records = json.loads((out / "eval" / "eval.json").read_text())["records"]
    return {(r["method"], r["seed"], r["episode"], r["step"]): r["loss"] for r in records}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the smoke config's tiny model (a smoke size)")
    ap.add_argument("--meta-steps", type=int, default=6, help="meta-steps per method")
    ap.add_argument("--reps", type=int, default=1, help="runs per layout, alternating")
    ap.add_argument("--workers", default="auto", help="engine.workers of the side-by-side layout")
    ap.add_argument("overrides", nargs="*", help="recipe overrides for both layouts (after --)")
    args = ap.parse_args(argv)

    common = [*(["--config", str(SMOKE)] if args.tiny else []), f"train.meta_steps={args.meta_steps}",
              "train.checkpoint_every=0", *args.overrides]
    layouts = {"one_process": "engine.workers=1", "workers": f"engine.workers={args.workers}"}
    seconds: dict[str, list[float]] = {k: [] for k in layouts}
    losses: dict[str, dict[tuple, float]] = {}
    workers, threads = 1, 1
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = list(layouts) if rep % 2 == 0 else list(layouts)[::-1]
            for name in order:
                out = Path(tmp) / f"{name}_{rep}"
                s, log = run_recipe([*common, layouts[name]], out)
                seconds[name].append(s)
                losses[name] = eval_losses(out)
                found = re.search(r"(\d+) worker processes of (\d+) thread", log)
                if name == "workers" and found:
                    workers, threads = int(found.group(1)), int(found.group(2))
                print(f"{name}: {s:.1f} s", flush=True)
    one, two = losses["one_process"], losses["workers"]
    if one.keys() != two.keys():
        raise SystemExit("the two layouts scored different episodes")
    diff = max(abs(one[k] - two[k]) / max(abs(one[k]), 1e-12) for k in one)
    result = {
        "model": "tiny" if args.tiny else "SmolLM2-135M",
        "meta_steps": args.meta_steps,
        "overrides": args.overrides,
        "seconds": seconds,
        "speedup": statistics.median(seconds["one_process"]) / statistics.median(seconds["workers"]),
        "workers": workers,
        "threads": threads,
        "eval_loss_max_rel_diff": diff,
    }
    print(f"speedup {result['speedup']:.2f}x with {workers} worker(s) of {threads} thread(s)")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
