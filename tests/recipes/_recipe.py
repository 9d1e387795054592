"""Launches ``recipes/train.py`` as a user would (python, deepspeed, accelerate) and fails, never hangs.

Every launch gets ``DS_ACCELERATOR=cpu``, one thread per process, a free rendezvous port, its own
process group (so a test can SIGKILL the launcher and every worker at once, as a crash would) and a
subprocess timeout; the recipe itself gets a short collective timeout through the config. A run
without a launcher (:func:`run`, :func:`run_and_kill`) is forked from a preloaded interpreter
(tests/_zygote.py); a launcher starts its ranks as fresh interpreters.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from tests._zygote import Forked, run_fresh, run_python, start_python

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "recipes" / "train.py"
SMOKE = REPO / "recipes" / "configs" / "smoke.yaml"

SHORT = [
    "methods=[fomaml]", "eval.enabled=false", "train.meta_steps=8", "train.checkpoint_every=2",
    "engine.collective_timeout_s=60", "train.slow_rank_window=4",
]
"""The shared short run: one method, 8 meta-steps, a checkpoint after steps 1, 3, 5 and 7 (0-based);
a slow-rank window short enough to be judged twice in it (the warning must not fire there)."""

DROPOUT = ["lora.dropout=0.1", "sampler.fit_cost=false"]
"""Makes the losses depend on the torch RNG stream (one process only: ranks draw different masks).

The cost model is not fitted to measured seconds here: with dropout, the order in which a rank
runs its tasks decides which masks each task draws, and an order planned from wall-clock timings
differs between two runs on a busy machine, resumed or not, so a bitwise comparison would test
the machine's load instead of the resume."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(launcher: str, args: list[str], *, nprocs: int = 1, script_path: Path = TRAIN) -> list[str]:
    """The command line a user types, with a free port for the multi-process launchers
    (``script_path``: the recipe, or a test's wrapper around it); ``--config`` is the smoke config
    unless ``args`` give one."""
    bindir = Path(sys.executable).parent
    # The smoke config unless the test names its own (a run reads one config file).
    script = [str(script_path), *([] if "--config" in args else ["--config", str(SMOKE)]), *args]
    if launcher == "python":
        return [sys.executable, *script]
    port = str(_free_port())
    if launcher == "deepspeed":
        return [str(bindir / "deepspeed"), "--num_gpus", str(nprocs), "--master_port", port, *script]
    if launcher == "torchrun":
        return [str(bindir / "torchrun"), "--nproc_per_node", str(nprocs), "--master_port", port, *script]
    if launcher == "accelerate":
        return [str(bindir / "accelerate"), "launch", "--config_file",
                str(REPO / "recipes" / "accelerate_zero3.yaml"), "--num_processes", str(nprocs),
                "--main_process_port", port, *script]
    raise ValueError(f"launcher={launcher!r} is invalid: python, deepspeed, torchrun or accelerate")


def environment() -> dict[str, str]:
    """CPU-only, single-threaded, unbuffered, with the repository importable and no stray ranks."""
    env = dict(os.environ)
    env.update({
        "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": "",
    })
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def offline(log: Path) -> dict[str, str]:
    """The environment of a run with no network: every process loads ``tests/offline``'s
    sitecustomize, which refuses and records in ``log`` each look-up or connect off this machine."""
    env = environment()
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "offline"), env["PYTHONPATH"]]),
               FMMETA_NETWORK_LOG=str(log))
    return env


def run(launcher: str, args: list[str], *, nprocs: int = 1, timeout_s: float = 180.0,
        check: bool = True, script_path: Path = TRAIN, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Runs the recipe to the end; output is stdout and stderr together. With ``check`` a non-zero
    exit or a run past ``timeout_s`` (a hang) raises ``AssertionError`` with the output tail.
    ``env`` replaces :func:`environment` (e.g. :func:`offline`)."""
    cmd = command(launcher, args, nprocs=nprocs, script_path=script_path)
    try:
        if launcher == "python":  # forked from the preloaded server (tests/_zygote.py)
            done = run_python(cmd[1:], env=env or environment(), cwd=REPO, timeout_s=timeout_s)
        else:
            done = run_fresh(cmd, env=env or environment(), cwd=REPO, timeout_s=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = e.output if isinstance(e.output, str) else ""
        raise AssertionError(f"ran past {timeout_s}s (a hang?): {' '.join(cmd)}\n{out[-4000:]}") from None
    if check and done.returncode != 0:
        raise AssertionError(f"rc={done.returncode}: {' '.join(cmd)}\n{done.stdout[-6000:]}")
    return done


def run_here(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """:func:`run` of ``python recipes/train.py ARGS`` through the recipe's ``main`` in this process:
    the same code and output (stdout and stderr together), without a new interpreter's imports
    (seconds per run). For what no launcher, environment variable or signal plays a part in."""
    return main_here("train", [*([] if "--config" in args else ["--config", str(SMOKE)]), *args], check=check)


def main_here(recipe: str, argv: list[str], *, check: bool = True, merge: bool = True,
              ) -> subprocess.CompletedProcess[str]:
    """``python recipes/RECIPE.py ARGV`` (train, evaluate, study, adapt) through its ``main`` in this
    process; output is stdout and stderr together, or apart (``stdout``, ``stderr``) without ``merge``.
    The recipe's log handler is made inside ``main``, on the redirected stderr."""
    import contextlib
    import importlib
    import io

    main = importlib.import_module(f"fmmeta.recipes.{recipe}").main
    out = io.StringIO()
    err = out if merge else io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    done = subprocess.CompletedProcess([f"{recipe}.main", *argv], code, out.getvalue(),
                                       "" if merge else err.getvalue())
    if check and code != 0:
        raise AssertionError(f"rc={code}: {recipe}.main({argv})\n{(done.stdout + done.stderr)[-6000:]}")
    return done


def kill_group(proc: Forked | subprocess.Popen[Any]) -> None:
    """SIGKILL to the launcher and every process it started (they share its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_and_kill(launcher: str, args: list[str], metrics: Path, *, at_step: int, nprocs: int = 1,
                 timeout_s: float = 180.0, log: Path | None = None) -> str:
    """Starts the recipe, SIGKILLs its whole process group once ``metrics`` shows ``at_step``,
    and returns the output; fails if the run finished (or died) before it could be killed.
    The output is kept in ``log`` (default: beside the folder of ``metrics``)."""
    cmd = command(launcher, args, nprocs=nprocs)
    log = log or metrics.parent.with_name(metrics.parent.name + ".killed.log")
    with log.open("w") as fh:
        proc: Forked | subprocess.Popen[Any]
        if launcher == "python":  # forked from the preloaded server (tests/_zygote.py)
            proc = start_python(cmd[1:], env=environment(), cwd=REPO, stdout=fh)
        else:
            proc = subprocess.Popen(cmd, cwd=REPO, env=environment(), stdout=fh,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            while max(steps(metrics), default=-1) < at_step:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"run ended (rc={proc.returncode}) before step {at_step}: {' '.join(cmd)}\n"
                        + log.read_text()[-4000:]
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(f"step {at_step} not reached in {timeout_s}s\n{log.read_text()[-4000:]}")
                time.sleep(0.02)
        finally:
            kill_group(proc)
            proc.wait(timeout=30)
    # Every worker is gone: no process of the group is left to write after the kill.
    for _ in range(100):
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"processes of group {proc.pid} survived SIGKILL")
    return log.read_text()


def steps(metrics: Path) -> list[int]:
    """Steps logged so far (complete lines only: the file may be mid-write)."""
    if not metrics.exists():
        return []
    lines = metrics.read_text().split("\n")[:-1]
    return [json.loads(line)["step"] for line in lines if line.strip()]


def records(metrics: Path) -> list[dict]:
    """Every line of ``metrics.jsonl``."""
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def adapter(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of a saved peft adapter folder."""
    return load_file(str(folder / "adapter_model.safetensors"))


def max_relative_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over tensors of max|a - b| / max|b| (keys must match)."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)).item() for k in b)


LOSS_KEYS = ("step", "outer_loss", "query_loss_before", "query_loss_after", "grad_norm", "tasks", "tokens")
"""The deterministic part of a metrics line (timings differ from run to run)."""


TIMING_KEYS = frozenset({"step_s", "tokens_per_s", "data_wait_s", "data_wait_fraction", "rank_compute_s",
                         "rank_collective_s", "rank_data_wait_s", "rank_peak_memory_mb"})
"""The timing part of a metrics line: what differs between two runs that compute the same."""


def deterministic_records(run: Path) -> list[dict]:
    """Every line of a run's ``metrics.jsonl`` without its timings, by method and step."""
    return sorted(({k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records(run / "metrics.jsonl")),
                  key=lambda r: (r["method"], r["step"]))


def losses(metrics: Path) -> list[tuple]:
    """Per-step deterministic values, in file order."""
    return [tuple(r[k] for k in LOSS_KEYS) for r in records(metrics)]
