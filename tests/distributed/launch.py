"""Runs ``tests/distributed/worker.py`` with 1 or 2 real CPU processes and fails, never hangs.

Launchers: ``python`` (one process, no launcher), ``deepspeed`` (``deepspeed --num_gpus N``, which
passes ``--local_rank=N``), ``torchrun`` and ``accelerate`` (both set ``LOCAL_RANK``). Every launch
gets ``DS_ACCELERATOR=cpu``, a free rendezvous port, a short process-group timeout inside the
worker and a subprocess timeout outside it, so a hung collective turns into a test failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from fmmeta.engine.distributed import SHM_DIR
from tests._zygote import run_python

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LAUNCH_LIMIT_S = 600.0
"""Wall-clock limit of one launch: a backstop, not the hang detector. A rank stuck in a collective
fails after the worker's short process-group timeout (``pg_timeout_s``); this limit only has to
stay above an honest launch on a loaded machine. Launches that run a dozen configurations took
up to 280 s while four test suites shared two cores, so a limit of 240 s failed runs that would
have passed."""


def run_worker(
    out: Path,
    configs: list[str] | None,
    *,
    nprocs: int = 1,
    launcher: str = "python",
    timeout_s: float = LAUNCH_LIMIT_S,
    pg_timeout_s: float = 60.0,
    extra: list[str] | None = None,
    worker: Path = WORKER,
    accelerate_config: str = "accelerate_zero3.yaml",
) -> subprocess.CompletedProcess[str]:
    """Launches ``worker`` (``--configs`` only when ``configs`` is given) and returns the finished
    process; raises ``AssertionError`` with its output tail when it fails or runs past ``timeout_s``.
    ``accelerate_config`` names the shipped file (under ``recipes/``) an accelerate launch uses."""
    bindir = Path(sys.executable).parent
    port = _free_port()
    script = [str(worker), "--out", str(out), *(["--configs", ",".join(configs)] if configs else []),
              "--timeout", str(pg_timeout_s), *(extra or [])]
    if launcher == "python":
        if nprocs != 1:
            raise ValueError("launcher='python' runs one process; use deepspeed/torchrun/accelerate for more")
        cmd = [sys.executable, *script]
    elif launcher == "deepspeed":
        cmd = [str(bindir / "deepspeed"), "--num_gpus", str(nprocs), "--master_port", str(port), *script]
    elif launcher == "torchrun":
        cmd = [str(bindir / "torchrun"), "--nproc_per_node", str(nprocs), "--master_port", str(port), *script]
    elif launcher == "accelerate":
        cmd = [str(bindir / "accelerate"), "launch", "--config_file",
               str(REPO / "recipes" / accelerate_config), "--num_processes", str(nprocs),
               "--main_process_port", str(port), *script]
    else:
        raise ValueError(f"launcher={launcher!r} is invalid: python, deepspeed, torchrun or accelerate")
    env = dict(os.environ)
    env.update({
        "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": "",
    })
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    try:
        if launcher == "python":  # forked from the preloaded server (tests/_zygote.py)
            proc = run_python(cmd[1:], env=env, cwd=REPO, timeout_s=timeout_s, merge=False)
        else:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        tail = ((e.stdout or b"") if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace"))
        raise AssertionError(f"{launcher} launch ran past {timeout_s}s (a hang?): {' '.join(cmd)}\n{tail[-3000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(
            f"{launcher} launch failed with rc={proc.returncode}: {' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    leaked = leaked_shm_buffers(port)
    assert not leaked, f"{launcher} launch left DeepSpeed shared-memory segments behind: {leaked}"
    return proc


def leaked_shm_buffers(port: int) -> list[str]:
    """DeepSpeed CPU all-reduce segments of the launch on ``port`` still in ``/dev/shm`` (each is
    66 MB of memory that outlives the run unless fmmeta unlinks it)."""
    return sorted(str(p) for p in Path(SHM_DIR).glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
