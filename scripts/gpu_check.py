"""The CUDA checks behind ``scripts/gpu_check.sh``: correctness first, then speed, one JSON line.

Every run goes through the real recipe (``recipes/train.py`` on the smoke config, FOMAML only) or a
real benchmark, each in its own process, and is compared with a one-process CPU run of the same
config, the reference every engine is held to:

* ``local_fp32``: the plain torch engine on the device, fp32 (TF32 stays off, torch's default for
  matmuls), against the CPU reference: only kernel rounding may differ (see :data:`TOLERANCES`);
* ``zero3_fp32``: DeepSpeed ZeRO-3 in one process on the device, fp32;
* ``zero3_bf16``: the same in bf16; DeepSpeed keeps fp32 master copies of the adapter in its
  optimizer, which the check reads back from the run's last checkpoint (the optimizer file must
  hold float32 flat groups); the adapter and the logged losses may differ from the fp32 reference
  by bf16 rounding;
* ``benchmarks/meta_step.py`` and ``benchmarks/throughput.py`` (~1B random Llama, bf16: tokens/s
  and MFU of a meta-step, of a plain LoRA loop and of Hugging Face ``Trainer`` + peft on the same
  tokens);
* ``benchmarks/precision.py`` on random weights of SmolLM2-135M's shape: fp32, bf16 weights and
  bf16 autocast side by side (gradient error, tokens/s, MFU against a matmul peak measured on the
  GPU), at the recipe's pass size and at a GPU's (16 tasks, 256 rows per pass);
* ``benchmarks/padding_free.py``: padded passes against padding-free lines under SDPA in fp32 and
  bf16 (gradient error, padding efficiency, tokens/s), and under FlexAttention (probed first:
  refused if it lets packed examples see each other);
* ``benchmarks/evaluation.py``: the evaluation's scoring and grouped adaptation, tokens/s, MFU.

A check or benchmark that fails is recorded with its error and the rest still run (one GPU lease
buys one try), and ``--budget-s`` skips what would start after that many seconds.

``--device cpu`` runs all of it on the CPU with small sizes (what the test suite does), so the
script is known to work end to end before a GPU is spent on it.

Usage: ``python scripts/gpu_check.py --device cuda --out gpu_check_out`` (normally through
``scripts/gpu_check.sh``, which installs what is missing first).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "recipes" / "train.py"
SMOKE = REPO / "recipes" / "configs" / "smoke.yaml"

REQUIRED_MODULES = ("torch", "transformers", "peft", "accelerate", "deepspeed", "datasets", "gguf", "safetensors",
                    "yaml", "babel")
"""What the checks' processes import. :func:`missing_module` imports each in this process before any
check starts, so a machine that lacks one stops in seconds with its name, not minutes into a lease;
this process needs most of them anyway, so the check costs next to nothing (torch and safetensors
are imported inside the functions that use them, after it)."""

TOLERANCES = {"local_fp32": 1e-4, "zero3_fp32": 1e-4, "zero3_bf16": 1e-1}
"""Largest relative adapter error ``||a - ref|| / ||ref||`` each check accepts. fp32 differs from
the CPU only in summation order (ZeRO-3 on the CPU: 1.5e-6 after 2 steps). bf16 differs much more
than its rounding (eps 3.9e-3) suggests: LoRA B starts at zero and Adam's normalised update turns
a sign flip of a tiny gradient entry into a full step the other way (measured 1.9e-2 on the CPU
after 2 steps), so for bf16 the losses are the sharper check."""

LOSS_TOLERANCE_BF16 = 2e-3
"""Largest relative difference of a logged loss between the bf16 run and the fp32 reference
(measured 6.5e-5 on the CPU)."""

_RANDOM_CUDA = ["--random", "--device", "cuda"]
_TINY_CPU = ["--tiny", "--device", "cpu", "--reps", "1"]
BENCH_ARGS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "cuda": {  # those the first H200 run (2026-12-04) did not reach come first
        "throughput": ("throughput", ["--device", "cuda", "--profile"]),
        # the same loops with every decoder layer compiled (engine.compile's path, inductor)
        "throughput_compiled": ("throughput", ["--device", "cuda", "--compile", "inductor", "--reps", "3",
                                               "--profile"]),
        # both loops ran at 0.11 MFU: is it the MLP width (5461, not a multiple of 8)?
        "throughput_mlp5632": ("throughput", ["--device", "cuda", "--intermediate", "5632", "--reps", "3",
                                              "--profile", "--liger", "off"]),  # Liger: in "throughput"
        "meta_step": ("meta_step", ["--device", "cuda"]),
        "evaluation": ("evaluation", [*_RANDOM_CUDA, "--reps", "2", "--episodes", "16"]),
        "padding_free": ("padding_free", [*_RANDOM_CUDA, "--reps", "5", "--steps", "2"]),
        "precision": ("precision", [*_RANDOM_CUDA, "--reps", "5"]),
        "precision_gpu_passes": ("precision", [*_RANDOM_CUDA, "--reps", "5", "--meta-batch", "16",
                                               "--rows", "256", "--methods", "fomaml", "multitask"]),
        "padding_free_flex": ("padding_free", [*_RANDOM_CUDA, "--reps", "2", "--steps", "1", "--dtypes",
                                               "bfloat16", "--methods", "fomaml",
                                               "--attn", "flex_attention", "flash_attention_2"]),
    },
    "cpu": {  # the benchmarks' small runs in make test too (tests/recipes/test_gpu_check.py)
        "precision": ("precision", [*_TINY_CPU, "--threads", "1",
                                    "--methods", "fomaml", "multitask", "reptile", "metaicl"]),
        "padding_free": ("padding_free", [*_TINY_CPU, "--steps", "1", "--threads", "1", "--dtypes", "float32",
                                          "--methods", "fomaml", "metaicl"]),
        "throughput": ("throughput", [*_TINY_CPU, "--intermediate", "256", "--profile", "--top", "5"]),
        "throughput_compiled": ("throughput", [*_TINY_CPU, "--compile", "aot_eager"]),
        "meta_step": ("meta_step", ["--device", "cpu", "--reps", "1", "--tasks", "2", "--shots", "2",
                                    "--queries", "2", "--seq", "8", "--vocab", "128", "--hidden", "64",
                                    "--layers", "1", "--pack-rows", "4"]),
        "evaluation": ("evaluation", [*_TINY_CPU, "--threads", "1", "--episodes", "4", "--group", "2",
                                      "--steps", "2"]),
    },
}
"""Each device benchmark (name -> script, arguments), most wanted first: full size on a GPU,
seconds-long sizes for the dry run."""

BENCH_TIMEOUT_S = 240
"""No single benchmark may take more of a lease than this; one that does is recorded as failed."""
RECIPE_TIMEOUT_S = 300
"""Likewise for one recipe run of the correctness checks."""


def missing_module() -> str | None:
    """The first of :data:`REQUIRED_MODULES` that does not import, or None. An import, not a lookup:
    a wheel installed without its dependencies must still import. An import that takes the process
    down (a wheel built for another CUDA) is named by the traceback faulthandler prints."""
    faulthandler.enable()
    for name in REQUIRED_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  (ImportError, or whatever a broken package raises on import)
            return name
    return None


def run(cmd: list[str], log: Path, env: dict[str, str], timeout_s: float) -> str:
    """Runs ``cmd`` with its output in ``log``; raises with the log's tail if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                              timeout=timeout_s, check=False)
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"rc={proc.returncode}: {' '.join(cmd)}\n{text[-4000:]}")
    return text


def environment(*, hide_gpu: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def recipe_run(out: Path, name: str, extra: list[str], *, steps: int, hide_gpu: bool) -> Path:
    """One short FOMAML run of the smoke config; returns its output folder."""
    folder = out / name
    args = ["--config", str(SMOKE), "methods=[fomaml]", "eval.enabled=false",
            f"train.meta_steps={steps}", "engine.collective_timeout_s=300", f"output_dir={folder}", *extra]
    run([sys.executable, str(TRAIN), *args], out / f"{name}.log", environment(hide_gpu=hide_gpu), RECIPE_TIMEOUT_S)
    return folder


def adapter_error(run_dir: Path, reference: Path) -> float:
    """``||a - b|| / ||b||`` over all adapter tensors together, in float64.

    A norm over everything, not a per-tensor maximum: LoRA B starts at zero, so after a few steps
    some of its entries are tiny and a per-element ratio would measure bf16's rounding of noise.
    """
    from safetensors.torch import load_file

    a = load_file(str(run_dir / "fomaml" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(reference / "fomaml" / "adapter" / "adapter_model.safetensors"))
    if sorted(a) != sorted(b):
        raise RuntimeError(f"adapter tensors differ in names: {sorted(set(a) ^ set(b))[:3]}")
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b)
    return (num / sum(float(b[k].double().pow(2).sum()) for k in b)) ** 0.5


def loss_error(run_dir: Path, reference: Path) -> float:
    """Largest relative difference of a logged loss (outer, query before and after) between runs."""
    def losses(folder: Path) -> list[float]:
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line]
        return [r[k] for r in rows for k in ("outer_loss", "query_loss_before", "query_loss_after")]

    got, want = losses(run_dir), losses(reference)
    if len(got) != len(want):
        raise RuntimeError(f"{run_dir} logged {len(got)} losses, the reference {len(want)}")
    return max(abs(x - y) / abs(y) for x, y in zip(got, want))


def master_dtypes(run_dir: Path) -> list[str]:
    """Dtypes of the fp32 flat groups in the last checkpoint's optimizer files (ZeRO's master copy)."""
    import torch

    last = sorted((run_dir / "fomaml" / "checkpoints").glob("step_*"))[-1]
    found = set()
    for file in last.rglob("*"):
        if not file.is_file() or file.suffix not in (".pt", ".bin"):
            continue
        state = torch.load(file, map_location="cpu", weights_only=True)
        groups = state.get("optimizer", {}).get("fp32_flat_groups", []) if isinstance(state, dict) else []
        found.update(str(t.dtype) for t in groups if isinstance(t, torch.Tensor))
    return sorted(found)


def last_json(text: str) -> dict[str, Any]:
    return json.loads(text.strip().splitlines()[-1])


def failure(err: Exception) -> dict[str, Any]:
    """A check or benchmark that could not run, as the JSON records it (the log has the rest)."""
    return {"ok": False, "error": f"{type(err).__name__}: {str(err)[-1500:]}"}


def correctness(out: Path, device: str, steps: int) -> dict[str, Any]:
    """The recipe checks against the CPU reference (on a CPU, ``local_fp32`` would be the
    reference itself, so the dry run skips it)."""
    on_cpu = device == "cpu"
    try:
        ref = recipe_run(out, "cpu_reference", [], steps=steps, hide_gpu=True)
    except Exception as err:  # noqa: BLE001  (nothing to compare with: every check fails)
        return {"cpu_reference": failure(err)}
    zero3 = ["engine.deepspeed_config=ds_configs/zero3.json"]
    wanted = {"local_fp32": [], "zero3_fp32": zero3, "zero3_bf16": [*zero3, "model.dtype=bfloat16"]}
    checks: dict[str, Any] = {}
    for name, extra in wanted.items():
        if on_cpu and name == "local_fp32":
            checks[name] = {"skipped": "on a CPU this run is the reference itself", "ok": True}
            continue
        try:
            folder = recipe_run(out, name, extra, steps=steps, hide_gpu=on_cpu)
            err = adapter_error(folder, ref)
            checks[name] = {"adapter_rel_error": err, "tolerance": TOLERANCES[name],
                            "ok": err <= TOLERANCES[name]}
            if name == "zero3_bf16":
                masters, losses = master_dtypes(folder), loss_error(folder, ref)
                checks[name].update(master_dtypes=masters, loss_rel_error=losses,
                                    loss_tolerance=LOSS_TOLERANCE_BF16)
                checks[name]["ok"] &= masters == ["torch.float32"] and losses <= LOSS_TOLERANCE_BF16
        except Exception as err:  # noqa: BLE001  (recorded; the other checks still run)
            checks[name] = failure(err)
    return checks


def benchmarks(out: Path, device: str, deadline: float, only: list[str] | None = None) -> dict[str, Any]:
    """The device benchmarks' JSON lines (the figures the README quotes), all or the ``only``
    ones; one that fails is recorded with its error, one that would start after ``deadline`` is
    skipped."""
    figures: dict[str, Any] = {}
    for name, (script, extra) in BENCH_ARGS[device].items():
        if only is not None and name not in only:
            continue
        if time.perf_counter() > deadline:
            figures[name] = {"skipped": "past --budget-s"}
            continue
        try:
            text = run([sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *extra],
                       out / f"bench_{name}.log", environment(hide_gpu=device == "cpu"), BENCH_TIMEOUT_S)
            figures[name] = last_json(text)
        except Exception as err:  # noqa: BLE001  (recorded; the other benchmarks still run)
            figures[name] = failure(err)
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", default="", help="folder for run outputs and logs (default: a temporary one)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no benchmark after this many seconds (0: no limit)")
    ap.add_argument("--only", default="",
                    help="comma-separated benchmarks to run, without the correctness checks (a second "
                         "try of a lease); names: " + ", ".join(BENCH_ARGS["cuda"]))
    ap.add_argument("--wheels", default="wheels", help="the wheel folder gpu_check.sh installed from (for messages)")
    args = ap.parse_args()
    only = [name for name in args.only.split(",") if name] or None
    unknown = sorted(set(only or []) - set(BENCH_ARGS[args.device]))
    if unknown:
        print(f"error: --only names unknown benchmarks {unknown}; allowed: {', '.join(BENCH_ARGS[args.device])}",
              file=sys.stderr)
        return 2
    module = missing_module()
    if module is not None:
        print(f"error: python module '{module}' is missing and {args.wheels}/ holds no wheel for it: prepare the "
              "folder with scripts/gpu_wheels.sh on a machine with the package index, copy it here, rerun",
              file=sys.stderr)
        return 2
    import deepspeed
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU; use --cpu for the dry run", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="gpu_check_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # the dry run: one meta-step is enough to run every path (checkpoint and fp32 master included)
    # and to compare (bf16 vs fp32 after 1 step: adapter 2.6e-3, losses 3.1e-6; fp32: 1.8e-8)
    steps = 8 if args.device == "cuda" else 1
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "deepspeed": deepspeed.__version__,
        "cuda": torch.version.cuda, "meta_steps": steps, "out": str(out),
    }
    result["checks"] = correctness(out, args.device, steps) if only is None else {}
    deadline = t0 + args.budget_s if args.budget_s > 0 else float("inf")
    result["benchmarks"] = benchmarks(out, args.device, deadline, only)
    result["ok"] = (all(c["ok"] for c in result["checks"].values())
                    and not any("error" in b for b in result["benchmarks"].values()))
    result["seconds"] = time.perf_counter() - t0
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
