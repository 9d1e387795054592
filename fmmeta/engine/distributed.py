"""Process-group set-up that works under every launcher.

Launchers disagree on how a process learns its rank (docs/design.md, "Launchers differ"):
``deepspeed`` appends ``--local_rank=N`` to the script's arguments, while ``torchrun`` and
``accelerate launch`` set ``LOCAL_RANK``. A rank that exits early leaves the others blocked until
the collective timeout (docs/design.md, "A rank that exits early"), whose default is many minutes;
:func:`init_distributed` takes a short, explicit timeout so a dead rank turns into a prompt failure.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from fmmeta.errors import UserInputError

logger = logging.getLogger(__name__)

_BACKENDS = ("gloo", "nccl")


def local_rank_from_env_or_argv(argv: Sequence[str] | None = None) -> int:
    """Returns this process's local rank from the launcher's arguments or environment.

    ``--local_rank=N``, ``--local_rank N``, ``--local-rank=N`` and ``--local-rank N`` in ``argv``
    win over ``LOCAL_RANK`` in the environment; with neither, the process is alone (rank 0).

    Args:
        argv: command-line arguments (without the program name); ``None`` means none.

    Raises:
        ValueError: if the value given is not a non-negative integer.

    Example:
        >>> local_rank_from_env_or_argv(["--lr", "3", "--local_rank=1"])
        1
    """
    args = list(argv or [])
    value: str | None = None
    source = ""
    for i, arg in enumerate(args):
        for flag in ("--local_rank", "--local-rank"):
            if arg == flag and i + 1 < len(args):
                value, source = args[i + 1], flag
            elif arg.startswith(flag + "="):
                value, source = arg.split("=", 1)[1], flag
    if value is None and "LOCAL_RANK" in os.environ:
        value, source = os.environ["LOCAL_RANK"], "LOCAL_RANK"
    if value is None:
        return 0
    try:
        rank = int(value)
    except ValueError:
        rank = -1
    if rank < 0:
        raise ValueError(
            f"{source}={value!r} is invalid: the local rank must be an integer >= 0 "
            "(set by the launcher: deepspeed passes --local_rank=N, torchrun sets LOCAL_RANK)"
        )
    return rank


def strip_local_rank(argv: Sequence[str]) -> list[str]:
    """Returns ``argv`` without the launcher's ``--local_rank`` flag, so a recipe's own parser
    never has to know about it."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in ("--local_rank", "--local-rank"):
            skip = i + 1 < len(argv)
            continue
        if arg.startswith(("--local_rank=", "--local-rank=")):
            continue
        out.append(arg)
    return out


def default_backend() -> str:
    """The process-group backend for this machine: nccl with CUDA, else gloo (the one place that
    chooses it, so every launcher and engine agrees)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


@contextlib.contextmanager
def _sigterm_ends_at_once() -> Iterator[None]:
    """Inside the block, SIGTERM ends the process at once (the system's default action) where a
    Python handler is installed (the recipes' :class:`fmmeta.startup.Terminated`).

    Why: a Python handler runs only between bytecodes, and the rendezvous blocks in C++ until rank 0
    answers or the collective timeout passes. When rank 0 failed first (its port in use, a bad
    input), the launcher (deepspeed's, torchrun) sends the other ranks SIGTERM and SIGKILLs them
    only 30 s later: the run took that long to end after rank 0's message. Nothing has been written
    before the group is up, so there is nothing a handler could save. Off the main thread, where
    handlers cannot be set, and where SIGTERM is ignored, it is left as it is.
    """
    handler = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        yield
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, handler)


def init_distributed(
    backend: str = "gloo", timeout_s: float = 60.0, argv: Sequence[str] | None = None
) -> tuple[int, int, int]:
    """Initialises the default process group once, with a short collective timeout.

    Under a launcher (``WORLD_SIZE`` set) it joins the group through the ``env://`` rendezvous;
    alone it creates a one-process group on a free local port, so the same code path (including
    DeepSpeed, which needs a process group) runs in a plain ``python script.py``. Calling it again
    when the group exists is a no-op that returns the current ranks.

    Args:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (GPU).
        timeout_s: seconds a collective may wait before failing; keep it short in tests so a
            dead or diverged rank fails fast instead of hanging (docs/design.md, "A rank that exits early").
        argv: command-line arguments, read for ``--local_rank`` (deepspeed's launcher).

    Returns:
        ``(rank, local_rank, world_size)``.

    Raises:
        ValueError: for an unknown backend or a non-positive timeout.
    """
    if backend not in _BACKENDS:
        raise ValueError(
            f"backend={backend!r} is invalid: allowed are {_BACKENDS} "
            "(gloo for CPU runs, nccl for GPUs)"
        )
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} is invalid: it must be > 0 seconds")
    local_rank = local_rank_from_env_or_argv(argv)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), local_rank, dist.get_world_size()
    if "WORLD_SIZE" not in os.environ:
        refuse_bare_multiprocess_launch()
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ["LOCAL_RANK"] = "0"
        os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise UserInputError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: a launcher (deepspeed, torchrun, "
            "accelerate launch) sets them all for every process. Launch with one, or unset "
            "WORLD_SIZE to run in this one process"
        )
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    try:
        with _sigterm_ends_at_once():  # a launcher's SIGTERM must not wait for the rendezvous
            dist.init_process_group(
                backend=backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s)
            )
    except (RuntimeError, OSError) as err:  # torch's DistNetworkError is a RuntimeError
        if "address already in use" not in str(err).lower():
            raise
        raise UserInputError(
            f"MASTER_PORT={os.environ['MASTER_PORT']} on {os.environ['MASTER_ADDR']} is already in use (another "
            "run or program holds it), so rank 0 cannot open the rendezvous there: launch with another port "
            "(deepspeed --master_port N, torchrun --master_port N, accelerate launch --main_process_port N)"
        ) from None
    if backend == "gloo":
        atexit.unregister(let_gloo_threads_finish)  # once per process, however often a group is made
        atexit.register(let_gloo_threads_finish)
    rank, world = dist.get_rank(), dist.get_world_size()
    logger.info(
        "process group up: backend=%s rank=%d local_rank=%d world_size=%d timeout=%.0fs",
        backend, rank, local_rank, world, timeout_s,
    )
    return rank, local_rank, world


_BARE_LAUNCHERS = {
    "OMPI_COMM_WORLD_SIZE": "mpirun (OpenMPI)",
    "PMI_SIZE": "mpirun (MPICH / Intel MPI)",
    "SLURM_STEP_NUM_TASKS": "srun",
}
"""Variables with which launchers that start the script itself (no ``WORLD_SIZE``) count its copies."""


def refuse_bare_multiprocess_launch() -> None:
    """Raises if an MPI or SLURM launcher started several copies of the script without ``WORLD_SIZE``.

    ``mpirun``/``srun`` (also under ``deepspeed --launcher openmpi|slurm``) start every process
    directly and set only their own rank variables; each copy would then make a one-process group
    and train alone, writing into the same folder as the others.

    Raises:
        UserInputError: naming the launcher and the ways to launch that work.
    """
    for var, launcher in _BARE_LAUNCHERS.items():
        count = os.environ.get(var, "1")
        if count.isdigit() and int(count) > 1:
            raise UserInputError(
                f"{var}={count}: {launcher} started {count} copies of this script without setting "
                "WORLD_SIZE/RANK, so each would train alone. Start one launcher per node instead: "
                "`torchrun --nnodes N --node_rank I ...` or `deepspeed --hostfile FILE --no_ssh "
                "--node_rank I ...` (under SLURM: srun --ntasks-per-node=1 around it), or "
                "deepspeed's default pdsh launcher; see docs/multinode.md"
            )


def refuse_missing_accelerator() -> None:
    """Raises if ``DS_ACCELERATOR`` names an accelerator this machine cannot give.

    Why: with ``DS_ACCELERATOR=cuda`` and no GPU visible, DeepSpeed fails deep inside torch
    (``module 'torch._C' has no attribute '_cuda_setDevice'``), and the single-process engine,
    which does not read the variable, would train on the CPU while the user believes it is on a
    GPU. A name DeepSpeed does not know fails inside DeepSpeed alike.

    Raises:
        UserInputError: naming the value, what this machine has and the fix.
    """
    name = os.environ.get("DS_ACCELERATOR")
    if name is None or name == "cpu":
        return
    if name == "cuda":
        if torch.cuda.is_available():
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise UserInputError(
            "DS_ACCELERATOR=cuda is set but torch sees no CUDA GPU"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
            + f" and was built {'with CUDA ' + torch.version.cuda if torch.version.cuda else 'without CUDA'}: "
            "run where a GPU is visible, or set DS_ACCELERATOR=cpu (or unset it) to run on the CPU"
        )
    known: list[str] | None = None
    try:  # a first import of deepspeed reads the variable itself, and refuses an unknown name
        from deepspeed.accelerator.real_accelerator import SUPPORTED_ACCELERATOR_LIST

        known = list(SUPPORTED_ACCELERATOR_LIST)
    except ValueError:
        pass
    if known is None or name not in known:
        raise UserInputError(
            f"DS_ACCELERATOR={name!r} is not an accelerator DeepSpeed knows: use "
            + (f"one of {', '.join(known)} " if known else "")
            + "(cuda for NVIDIA GPUs, cpu), or unset it"
        )


GLOO_DRAIN_S = 0.05
"""How long :func:`let_gloo_threads_finish` gives gloo's threads at exit; a thread that only waits
for the GIL needs microseconds, so this is a margin for a busy machine, paid once per process."""


def let_gloo_threads_finish() -> None:
    """Registered at exit by :func:`init_distributed` for gloo: releases the GIL for a moment
    before the interpreter finalizes, so a finished run exits 0 instead of aborting.

    Why: a gloo thread may still be letting go of a finished collective whose tensor Python made,
    which needs the GIL; once finalization has begun, that thread is made to exit inside a C++
    destructor and the process aborts with rc -6 (docs/design.md, "A finished gloo run must not
    abort at exit"). Exit handlers run while the interpreter is whole, so a waiting thread takes
    the GIL here and finishes. gloo offers no way to wait for its threads, so this narrows the
    window rather than closing it.
    """
    try:
        time.sleep(GLOO_DRAIN_S)
    except KeyboardInterrupt:  # Ctrl-C while leaving (SIGTERM does not raise here: fmmeta.startup)
        pass


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order, over the default process group (``[obj]`` without one).

    For start-up checks that run before any engine exists (an engine has its own
    ``all_gather_object``, which is what everything after start-up uses).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def check_same_on_every_rank(values: dict[str, Any], what: str) -> None:
    """Refuses ``values`` (flat ``key -> value``) that differ between ranks, on every rank alike.

    Why: ranks launched with different configs trained to the end and recorded rank 0's values
    (an ``inner_lr`` of 0.1 on one rank and 0.5 on another), or died in a raw gloo abort on a
    shape (``lora.r``); the config is agreed before anything is built or written.

    Raises:
        UserInputError: naming each differing key with every rank's value.
    """
    every = all_gather_object(values)
    keys = sorted({k for v in every for k in v if len({repr(w.get(k)) for w in every}) > 1})
    if keys:
        shown = "; ".join(f"{k}: " + ", ".join(f"rank {r} {w.get(k)!r}" for r, w in enumerate(every)) for k in keys[:8])
        raise UserInputError(
            f"{what} differs between the {len(every)} ranks ({shown}{'; ...' if len(keys) > 8 else ''}): launch "
            "every rank with the same --config and overrides (and the same files on every node)"
        )


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broadcast_from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (``obj`` itself without a process group).

    Why: decisions only rank 0 can make before any engine exists (is the output folder ours, may
    this run resume) must reach every rank, so that all of them stop together or go on together.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


SHM_DIR = "/dev/shm"
_shm_released = False


def shm_buffer_path(rank: int) -> str:
    """Where DeepSpeed's CPU all-reduce keeps this run's shared-memory segment for ``rank``.

    The name is DeepSpeed's own (``deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``),
    so it must follow the one in DeepSpeed's ``shm.cpp``.
    """
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return f"{SHM_DIR}/deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"


def release_shm_buffers() -> None:
    """Unlinks this rank's DeepSpeed CPU all-reduce segment, which DeepSpeed itself never does.

    On CPU, when every rank is on one machine (the ``deepspeed`` launcher sets ``LOCAL_SIZE``),
    DeepSpeed's communication layer creates a 66 MB shared-memory segment per rank and never
    unlinks it, so every run leaves 66 MB x ranks in ``/dev/shm``, which is memory: a day of tests
    or sweeps on a 24 GB machine filled 18 GB and sent it into reclaim thrashing. DeepSpeed maps
    every peer's segment while it initialises (it waits until each exists), so after a barrier all
    ranks hold their mappings; unlinking the names then frees the memory when the processes exit,
    however they exit (a killed run included). Call it once DeepSpeed's communication layer is up;
    every rank must call it (it holds a barrier). A no-op without a process group, and for ranks
    with no segment (GPU runs, launchers that do not set ``LOCAL_SIZE``).
    """
    global _shm_released
    if _shm_released or not (dist.is_available() and dist.is_initialized()):
        return
    _shm_released = True
    dist.barrier()
    path = shm_buffer_path(dist.get_rank())
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    logger.debug("unlinked %s (DeepSpeed's CPU all-reduce segment; still mapped until exit)", path)
