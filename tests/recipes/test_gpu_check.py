"""scripts/gpu_check.sh end to end in its CPU dry mode (``--cpu``), so the one GPU run it is
prepared for does not fail on a typo: every recipe run, every comparison and every device
benchmark run here with small sizes, and the last stdout line is the JSON the README quotes. These
small runs of precision, padding_free, throughput, meta_step and evaluation are those benchmarks'
only ones in make test, so the dry run asserts their figures too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
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


@pytest.mark.timeout(900)
def test_cpu_dry_run_passes_every_check_and_prints_one_json_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([str(SCRIPT), "--cpu", "--out", str(out)], cwd=tmp_path, env=_env(sys.executable),
                          capture_output=True, text=True, timeout=880)
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
    _assert_benchmarks(result["benchmarks"])
    assert not any("error" in b or "skipped" in b for b in result["benchmarks"].values())


def _assert_benchmarks(bench: dict) -> None:
    """The device benchmarks' figures: these small runs are also the benchmarks' own ones in make
    test (tests/unit/test_benchmarks.py leaves these five to this run)."""
    throughput = bench["throughput"]
    for loop in ("meta_step", "plain_loop", "hf_trainer"):
        assert throughput[loop]["tokens_per_s"] > 0 and throughput[loop]["mfu"] is None  # no CPU peak
    assert throughput["tokens_per_meta_step"] > 0 and throughput["tflop_per_meta_step"] > 0
    assert throughput["compile"] is None and throughput["hf_trainer"]["median_s"] > 0
    # no Liger on a CPU (its kernels are Triton's): the plain Trainer is the only one
    assert throughput["hf_trainer_best"] == "hf_trainer" and "hf_trainer_liger" not in throughput
    assert throughput["plain_vs_hf_trainer"] == pytest.approx(
        throughput["plain_loop"]["tokens_per_s"] / throughput["hf_trainer"]["tokens_per_s"])
    assert throughput["model"]["intermediate"] == 256
    for loop in ("meta_step", "plain_loop"):  # the profile names the operators that took the time
        prof = throughput["profile"][loop]
        assert len(prof["top"]) == 5 and 0 < sum(op["share"] for op in prof["top"]) <= 1 + 1e-6
        assert 0 < prof["matmul_share"] < 1 and prof["total_ms"] > 0
    compiled = bench["throughput_compiled"]  # the same loops, layers compiled
    assert compiled["compile"]["backend"] == "aot_eager" and compiled["compile"]["graphs"] > 0, compiled
    assert all(compiled[loop]["tokens_per_s"] > 0 for loop in ("meta_step", "plain_loop", "hf_trainer"))
    steps = bench["meta_step"]
    assert steps["device"] == "cpu" and steps["passes_per_meta_step"] == {"packed": 3, "one_task_per_pass": 6}
    assert all(v > 0 for v in steps["median_seconds"].values())
    assert steps["per_task_bytes"]["ours"] < steps["per_task_bytes"]["clone"]
    _assert_precision_and_padding(bench)
    evaluation = bench["evaluation"]
    assert evaluation["device"] == "cpu"
    for key in ("classification_scoring_speedup", "in_context_scoring_speedup", "grouped_speedup"):
        assert evaluation[key] > 0, key
    assert set(evaluation["mfu"]) == set(evaluation["peak_flops_per_s"]) >= {"float32"}
    assert all(v > 0 for d in evaluation["tokens_per_s"].values() for v in d.values())


def _assert_precision_and_padding(bench: dict) -> None:
    methods = bench["precision"]["methods"]
    assert set(methods) == {"fomaml", "multitask", "reptile", "metaicl"}
    # bf16 weights and autocast side by side, each with its MFU against a peak measured here;
    # bf16 compute with fp32 state: the meta-gradient keeps its direction
    for method, row in methods.items():
        assert set(row["mfu"]) == {"float32", "bfloat16", "autocast"}, method
        assert all(v > 0 for v in row["tokens_per_s"].values()), method
        assert 0 < row["grad_rel_error"] < 0.1 and row["cosine"] > 0.99, method
        assert 0 < row["autocast_grad_rel_error"] < 0.1 and row["autocast_cosine"] > 0.99, method
        assert all(row["seconds"][v] > 0 and row["mfu"][v] > 0 for v in ("float32", "bfloat16", "autocast"))
    padding = bench["padding_free"]["results"]["float32"]
    assert set(padding) == {"fomaml", "metaicl"}
    for method, row in padding.items():
        assert row["grad_rel_error"] < 1e-5 and row["real_tokens_per_s"]["lines"] > 0, method
        eff = row["padding_efficiency"]  # the same arithmetic, rounded differently
        assert 0 < eff["padded"] <= eff["lines"] <= 1, method
        assert row["seconds"]["padded"] > 0 and row["seconds"]["lines"] > 0


def test_a_failing_benchmark_is_recorded_and_the_rest_still_run(tmp_path: Path, monkeypatch) -> None:
    # One lease buys one try: a benchmark that fails must not take the others down with it, and
    # past the time budget the rest are reported as skipped, not silently dropped.
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "scripts"))
    monkeypatch.setitem(gpu_check.BENCH_ARGS, "cpu", {
        "broken": ("precision", ["--no-such-flag"]),
        "episodes": ("episodes", ["--tasks", "8", "--examples", "60", "--classes", "5", "--seconds", "0.05"]),
    })
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    figures = gpu_check.benchmarks(tmp_path, "cpu", deadline=float("inf"))
    assert figures["broken"]["ok"] is False and "--no-such-flag" in figures["broken"]["error"]
    assert "error" not in figures["episodes"], figures["episodes"]
    skipped = gpu_check.benchmarks(tmp_path, "cpu", deadline=0.0)
    assert skipped == {"broken": {"skipped": "past --budget-s"}, "episodes": {"skipped": "past --budget-s"}}


def _probe_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel (module ``fmmeta_probe``), written by hand: a zip with the
    module, its METADATA, WHEEL and RECORD."""
    name = "fmmeta_probe-1.0"
    path = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("fmmeta_probe.py", "VALUE = 42\n")
        whl.writestr(f"{name}.dist-info/METADATA", "Metadata-Version: 2.1\nName: fmmeta-probe\nVersion: 1.0\n")
        whl.writestr(f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        whl.writestr(f"{name}.dist-info/RECORD", "")
    return path


@pytest.mark.timeout(300)
def test_missing_packages_come_from_the_wheel_folder_and_what_is_left_stops_it(tmp_path: Path) -> None:
    # A bare venv (no torch) and a wheel folder with one package it lacks: the script installs
    # that wheel offline, then stops on torch, which no wheel provides, naming the fix.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=240)
    python = str(venv / "bin" / "python")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _probe_wheel(wheels)
    proc = subprocess.run([str(SCRIPT), "--cpu", "--wheels", str(wheels)], env=_env(python),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"installing 1 wheels from {wheels}" in proc.stderr
    assert "python module 'torch' is missing" in proc.stderr and "scripts/gpu_wheels.sh" in proc.stderr
    probe = subprocess.run([python, "-c", "import fmmeta_probe; print(fmmeta_probe.VALUE)"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "42", probe.stderr


def test_an_unknown_argument_is_refused() -> None:
    proc = subprocess.run([str(SCRIPT), "--gpu"], env=_env(sys.executable), capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown argument '--gpu'" in proc.stderr


@pytest.mark.timeout(300)
def test_only_reruns_the_named_benchmarks_without_the_checks(tmp_path: Path) -> None:
    # the second try of a lease: just what the first one did not get to
    # (meta_step: the quickest of them; the dry run above asserts every benchmark's figures)
    proc = subprocess.run([str(SCRIPT), "--cpu", "--out", str(tmp_path), "--only", "meta_step"],
                          env=_env(sys.executable), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checks"] == {} and list(result["benchmarks"]) == ["meta_step"]
    assert result["benchmarks"]["meta_step"]["passes_per_meta_step"] == {"packed": 3, "one_task_per_pass": 6}
    assert not (tmp_path / "cpu_reference").exists()
    bad = subprocess.run([str(SCRIPT), "--cpu", "--out", str(tmp_path), "--only", "padding_fre"],
                         env=_env(sys.executable), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown benchmarks ['padding_fre']" in bad.stderr
