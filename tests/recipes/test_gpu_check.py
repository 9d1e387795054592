"""scripts/gpu_check.sh end to end in its CPU dry mode (``--cpu``), so the one GPU run it is
prepared for does not fail on a typo: every recipe run, every comparison and both device
benchmarks run here with small sizes, and the last stdout line is the JSON the README quotes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _env(python: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHON": python, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


@pytest.mark.timeout(600)
def test_cpu_dry_run_passes_every_check_and_prints_one_json_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([str(SCRIPT), "--cpu", "--out", str(out)], cwd=tmp_path, env=_env(sys.executable),
                          capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] is True and result["device"] == "cpu" and result["out"] == str(out)
    checks = result["checks"]
    assert checks["zero3_fp32"]["adapter_rel_error"] <= 1e-4
    bf16 = checks["zero3_bf16"]
    assert bf16["master_dtypes"] == ["torch.float32"], bf16  # DeepSpeed's fp32 master adapter
    assert bf16["loss_rel_error"] <= 2e-3 and bf16["adapter_rel_error"] > 0  # bf16 did run in bf16
    # Each run trained FOMAML in its own folder, and the ZeRO-3 runs really ran DeepSpeed.
    for name in ("cpu_reference", "zero3_fp32", "zero3_bf16"):
        assert (out / name / "fomaml" / "adapter" / "adapter_model.safetensors").is_file(), name
    assert "ZeRO stage 3" in (out / "zero3_bf16.log").read_text()
    assert "precision=bf16" in (out / "zero3_bf16.log").read_text()
    throughput = result["benchmarks"]["throughput"]
    for loop in ("meta_step", "plain_loop"):
        assert throughput[loop]["tokens_per_s"] > 0 and throughput[loop]["mfu"] is None  # no CPU peak
    assert throughput["tokens_per_meta_step"] > 0 and throughput["tflop_per_meta_step"] > 0
    assert result["benchmarks"]["meta_step"]["device"] == "cpu"


def test_a_missing_package_without_a_wheel_stops_with_the_fix(tmp_path: Path) -> None:
    # A python without torch, and an empty wheel folder: nothing to install from, so it stops.
    bare = "/usr/bin/python3"
    if not Path(bare).exists() or subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("needs a python without torch")
    (tmp_path / "wheels").mkdir()
    proc = subprocess.run([str(SCRIPT), "--cpu", "--wheels", str(tmp_path / "wheels")], env=_env(bare),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "python module 'torch' is missing" in proc.stderr and "scripts/gpu_wheels.sh" in proc.stderr


def test_an_unknown_argument_is_refused() -> None:
    proc = subprocess.run([str(SCRIPT), "--gpu"], env=_env(sys.executable), capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown argument '--gpu'" in proc.stderr
