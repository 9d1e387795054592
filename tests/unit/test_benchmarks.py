"""The benchmarks this project's compute claims rest on run at a small size, so one that crashes
cannot land (their figures are measured by running them at full size, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_evaluation_benchmark_runs_small() -> None:
    out = _run("evaluation.py", "--tiny", "--reps", "1", "--episodes", "4", "--group", "2",
               "--steps", "2", "--threads", "1")
    for key in ("classification_scoring_speedup", "in_context_scoring_speedup", "grouped_speedup"):
        assert out[key] > 0, key
    assert set(out["mfu"]) == set(out["peak_flops_per_s"]) >= {"float32"}
    assert all(v > 0 for d in out["tokens_per_s"].values() for v in d.values())


@pytest.mark.timeout(300)
def test_precision_benchmark_runs_small() -> None:
    out = _run("precision.py", "--tiny", "--reps", "1", "--threads", "1",
               "--methods", "fomaml", "reptile", "metaicl")
    assert set(out["methods"]) == {"fomaml", "reptile", "metaicl"}
    for method, row in out["methods"].items():
        # bf16 compute with fp32 state: the meta-gradient keeps its direction
        assert 0 < row["grad_rel_error"] < 0.1 and row["cosine"] > 0.99, method
        assert row["seconds"]["float32"] > 0 and row["seconds"]["bfloat16"] > 0
