"""Stopping meta-training by hand, by the scheduler or by a rank's death: one message naming the
last checkpoint.

Ctrl-C (``KeyboardInterrupt``) or SIGTERM (:class:`~fmmeta.startup.Terminated`) inside a method's
meta-steps becomes :class:`Interrupted`, which says where that method's last complete checkpoint
is and that the same command resumes from it; the recipe turns it into exit code 130 or 143. A
collective that fails because another rank is gone (gloo: "Connection reset by peer") becomes
the same kind of message on every surviving rank, exit code 1, instead of a library traceback.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from fmmeta.checkpoint import CheckpointManager
from fmmeta.startup import Terminated, stopping

__all__ = ["PEER_LOST", "Interrupted", "interrupt_note"]

PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
"""What gloo's error says when the rank at the other end of a collective has died."""


class Interrupted(Exception):
    """Ctrl-C, SIGTERM or a lost rank during meta-training; the message says where the last
    checkpoint is, and ``code`` is the exit code (130; 143 for SIGTERM; 1 for a lost rank). Both
    travel in ``args``, so it crosses from a worker process whole."""

    def __init__(self, message: str, code: int = 130) -> None:
        super().__init__(message, code)
        self.code = code

    def __str__(self) -> str:
        return str(self.args[0])


@contextlib.contextmanager
def interrupt_note(method: str, ckpts: CheckpointManager, step: Callable[[], int]) -> Iterator[None]:
    """Turns Ctrl-C, SIGTERM or a collective broken by a dead rank into :class:`Interrupted` naming
    the last checkpoint and how to resume."""
    try:
        yield
    except RuntimeError as err:
        lost = next((marker for marker in PEER_LOST if marker in str(err)), None)
        if lost is None:
            raise
        stopping()  # torchrun's SIGTERM, sent when the other rank died, must not replace this message
        last = ckpts.latest(verify=False)
        # With two ranks the dead one is known; with more, gloo's error names only an address
        # (the launcher's own log names the rank that exited).
        other = f"the other rank (rank {1 - ckpts.rank})" if ckpts.world_size == 2 else "another rank"
        raise Interrupted(
            f"{method}, meta-step {step()}: {other} stopped answering (gloo: {lost}): "
            "it died or was killed; its own log says why. Last checkpoint: "
            + (f"{last.path} (after meta-step {last.step})" if last else "none yet")
            + ". Rerun the same command on every rank to resume from it (train.resume=auto)",
            code=1,
        ) from None
    except KeyboardInterrupt as err:
        stopping()
        last = ckpts.latest(verify=False)
        raise Interrupted(
            f"{method} {'stopped by SIGTERM' if isinstance(err, Terminated) else 'interrupted'} during "
            f"meta-step {step()}. Last checkpoint: "
            + (f"{last.path} (after meta-step {last.step})" if last else "none yet")
            + ". Rerun the same command to resume from it (train.resume=auto)",
            code=143 if isinstance(err, Terminated) else 130,
        ) from None
