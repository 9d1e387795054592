"""Benchmark: the default run's training phase eager against compiled (``engine.compile``), side by
side, compiling included: what a user pays for the meta-steps either way.

Two train recipe processes start at once, one per core (``OMP_NUM_THREADS=1``, ``engine.workers=1``,
so every method trains in turn in the one process, as ``engine.compile`` has it compile once for
all of them), with the same arguments except ``engine.compile``, and the held-out evaluation off
(the training phase is what is measured; evaluation's passes are another shape of work). Running
them at the same time is what makes the ratio fair on a shared machine: whatever else loads the
machine loads both. With ``--reps`` above 1 the pair runs again and each side's median counts.

Prints a line per pair and, as the last line, one JSON object:

* ``training_s``: per side (the median over pairs), every meta-step's wall seconds summed over
  every method (the run's ``metrics.jsonl``; the compiled side's first meta-steps include their
  compiling);
  ``speedup_per_pair``: eager over compiled, each pair's (the two sides of a pair ran under the
  same load; pairs differ by several percent on a shared machine); ``speedup``: their median, the
  figure issue 49 asks for (target 1.3);
* ``per_method_s``: the same per method (the first method to run pays most of the compiling);
* ``compile_graphs`` / ``compile_s``: what the compiled process compiled, from its telemetry
  (dynamo's graphs, every recompile counted, and the seconds compiling them);
  ``speedup_once_compiled``: eager over compiled less its compile seconds;
* ``wall_s`` and ``wall_speedup``: each process from start to exit (model load, data, training,
  checkpoints).

Usage:
    python benchmarks/training_phase.py [--tiny] [--meta-steps 20] [--reps 1] [-- key=value ...]

Arguments after ``--`` go to both runs (e.g. ``engine.pack_weights=true methods=[fomaml]``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "recipes" / "configs" / "smoke.yaml"
SIDES = {"eager": "engine.compile=false", "compiled": "engine.compile=true"}


def start(args: list[str], out: Path) -> subprocess.Popen:
    """One recipe process on one thread, its output into ``out``/``log.txt``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out.mkdir(parents=True)
    with (out / "log.txt").open("w") as log:  # the child keeps its own handle
        return subprocess.Popen([sys.executable, str(REPO / "recipes" / "train.py"), *args,
                                 f"output_dir={out / 'run'}"], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def training_seconds(run: Path) -> dict[str, float]:
    """Every method's meta-step seconds, summed (the run's ``metrics.jsonl``)."""
    per_method: dict[str, float] = defaultdict(float)
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "step_s" in record:
            per_method[record["method"]] += record["step_s"]
    return dict(per_method)


def compiled_figures(run: Path) -> tuple[int, float]:
    """The process's graphs and compile seconds (each method's telemetry has the process's
    figures so far; the largest is the whole run's)."""
    telemetry = json.loads((run / "telemetry.json").read_text())
    graphs = max(int(t.get("compile_graphs", 0)) for t in telemetry.values())
    seconds = max(float(t.get("compile_seconds", 0.0)) for t in telemetry.values())
    return graphs, seconds


def run_pair(common: list[str], folder: Path) -> dict[str, dict]:
    """Both sides at once; each side's seconds (training per method and in all, the process's
    wall time), and the compiled side's graphs and compile seconds."""
    t0 = time.perf_counter()
    procs = {side: start([*common, flag], folder / side) for side, flag in SIDES.items()}
    ended: dict[str, float] = {}
    while len(ended) < len(procs):  # polled, so each side's wall time is its own
        for side, proc in procs.items():
            if side in ended or proc.poll() is None:
                continue
            ended[side] = time.perf_counter() - t0
            if proc.returncode != 0:
                for other in procs.values():
                    other.kill()
                log = (folder / side / "log.txt").read_text()
                raise SystemExit(f"the {side} run failed (exit {proc.returncode}):\n{log[-4000:]}")
        time.sleep(0.2)
    pair: dict[str, dict] = {}
    for side in procs:
        per_method = training_seconds(folder / side / "run")
        pair[side] = {"wall_s": ended[side], "per_method_s": per_method, "training_s": sum(per_method.values())}
    pair["compiled"]["graphs"], pair["compiled"]["compile_s"] = compiled_figures(folder / "compiled" / "run")
    return pair


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the smoke config's tiny model (a smoke size)")
    ap.add_argument("--meta-steps", type=int, default=None, help="meta-steps per method (default: the recipe's)")
    ap.add_argument("--reps", type=int, default=1, help="pairs to run, one after the other")
    ap.add_argument("overrides", nargs="*", help="recipe overrides for both runs (after --)")
    args = ap.parse_args(argv)

    common = [*(["--config", str(SMOKE)] if args.tiny else []), "eval.enabled=false", "engine.workers=1",
              *([f"train.meta_steps={args.meta_steps}"] if args.meta_steps else []), *args.overrides]
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            pair = run_pair(common, Path(tmp) / f"pair_{rep}")
            pairs.append(pair)
            print(" | ".join(f"{side}: training {p['training_s']:.1f} s, process {p['wall_s']:.1f} s"
                             for side, p in pair.items()), flush=True)

    def median(side: str, key: str) -> float:
        return statistics.median(p[side][key] for p in pairs)

    training = {side: median(side, "training_s") for side in SIDES}
    ratios = [p["eager"]["training_s"] / p["compiled"]["training_s"] for p in pairs]
    wall = {side: median(side, "wall_s") for side in SIDES}
    compile_s = median("compiled", "compile_s")
    result = {
        "model": "tiny" if args.tiny else "SmolLM2-135M",
        "overrides": common,
        "training_s": {k: round(v, 2) for k, v in training.items()},
        "speedup": round(statistics.median(ratios), 3),
        "speedup_per_pair": [round(r, 3) for r in ratios],
        "per_method_s": {side: {m: round(s, 2) for m, s in pairs[-1][side]["per_method_s"].items()} for side in SIDES},
        "compile_graphs": int(median("compiled", "graphs")),
        "compile_s": round(compile_s, 2),
        "speedup_once_compiled": round(training["eager"] / (training["compiled"] - compile_s), 3),
        "wall_s": {k: round(v, 2) for k, v in wall.items()},
        "wall_speedup": round(wall["eager"] / wall["compiled"], 3),
    }
    print(f"training phase {result['speedup']:.3f}x compiled ({result['compile_graphs']} graphs, "
          f"{compile_s:.1f} s compiling), {result['speedup_once_compiled']:.3f}x once compiled")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
