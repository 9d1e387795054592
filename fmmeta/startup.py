"""Ctrl-C while a recipe starts up: a message and exit code 130, not an import traceback; and
SIGTERM in a recipe's ``main``, handled as Ctrl-C is (:class:`Terminated`).

The recipes import torch, transformers, peft and DeepSpeed before their ``main`` runs (seconds),
and a Ctrl-C there would print a traceback from deep inside an import. Importing this module
first (before those imports) installs a handler that exits at once; nothing has been written by
then (the output folder is claimed in ``main``), and ``main`` puts Python's own handler back.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

__all__ = ["Terminated", "ctrl_c_raises", "stopping"]


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's pre-emption, ``kill``): stops a run as Ctrl-C does, with one message
    naming the last checkpoint, but exit code 143 (128 + SIGTERM), which schedulers expect."""


_stop_under_way = False
"""Set by :func:`stopping`; read by the SIGTERM handler."""


def stopping() -> None:
    """Says that this run is stopping (Ctrl-C, SIGTERM or a lost rank, its message being written):
    from now on SIGTERM does not raise.

    Why: when one rank dies, torchrun sends SIGTERM to the rest, and it reaches a rank that is
    already stopping on gloo's broken connection at any moment. Raised while that rank looks up its
    last checkpoint, it replaced the lost-rank message with "stopped by SIGTERM outside
    meta-training" and no checkpoint named. Errors do not call this: a study goes on after a trial
    that failed, and SIGTERM must still stop it.
    """
    global _stop_under_way
    _stop_under_way = True


def _terminate(signum: int, frame: FrameType | None) -> None:
    """Raises :class:`Terminated`, unless a stop is already under way (:func:`stopping`) or the
    program is exiting.

    Why the second: once the main thread has finished, Python runs its exit handlers (gloo's drain,
    torch's library finalizers), and a SIGTERM raised inside one printed "Exception ignored in
    atexit callback" and a traceback after the run's own message. The stop or exit under way
    already ends the run, with its own message and code.
    """
    del signum, frame
    if threading.main_thread().is_alive() and not _stop_under_way:
        raise Terminated()


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    sys.stderr.write("stopped by Ctrl-C while starting up; nothing was written\n")
    raise SystemExit(130)


def ctrl_c_raises() -> None:
    """Ctrl-C raises ``KeyboardInterrupt`` again, and SIGTERM raises :class:`Terminated` (the
    recipes' ``main`` handles both; SIGTERM is left alone where something else handles it)."""
    if signal.getsignal(signal.SIGINT) is _exit_quietly:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)


# Only where Ctrl-C would raise: a shell that starts the recipe in the background ignores SIGINT,
# and that choice is kept.
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _exit_quietly)
