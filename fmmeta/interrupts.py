"""Stopping meta-training by hand or by the scheduler: one message naming the last checkpoint.

Ctrl-C (``KeyboardInterrupt``) or SIGTERM (:class:`~fmmeta.startup.Terminated`) inside a method's
meta-steps becomes :class:`Interrupted`, which says where that method's last complete checkpoint
is and that the same command resumes from it; the recipe turns it into exit code 130 or 143.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from fmmeta.checkpoint import CheckpointManager
from fmmeta.startup import Terminated

__all__ = ["Interrupted", "interrupt_note"]


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during meta-training; the message says where the last checkpoint is, and
    ``code`` is the exit code (130, or 143 for SIGTERM). Both travel in ``args``, so it crosses
    from a worker process whole."""

    def __init__(self, message: str, code: int = 130) -> None:
        super().__init__(message, code)
        self.code = code

    def __str__(self) -> str:
        return str(self.args[0])


@contextlib.contextmanager
def interrupt_note(method: str, ckpts: CheckpointManager, step: Callable[[], int]) -> Iterator[None]:
    """Turns Ctrl-C or SIGTERM into :class:`Interrupted` naming the last checkpoint and how to resume."""
    try:
        yield
    except KeyboardInterrupt as err:
        last = ckpts.latest(verify=False)
        raise Interrupted(
            f"{method} {'stopped by SIGTERM' if isinstance(err, Terminated) else 'interrupted'} during "
            f"meta-step {step()}. Last checkpoint: "
            + (f"{last.path} (after meta-step {last.step})" if last else "none yet")
            + ". Rerun the same command to resume from it (train.resume=auto)",
            code=143 if isinstance(err, Terminated) else 130,
        ) from None
