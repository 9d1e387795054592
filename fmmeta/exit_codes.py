"""How a recipe's run ended, as its exit code: one mapping shared by the train, evaluate and study
recipes.

Why one place: a study runs the train recipe for every trial and reads its exit code (2: the input
was refused, 3: the trial diverged), and schedulers read 130 and 143 as "stopped, rerun me". Each
recipe mapping exceptions its own way let the codes drift apart; here an exception type has one
code for every recipe. What a recipe says when it stops differs (training names its checkpoints,
an evaluation that nothing was written), so each passes its own ``stopped`` message.

==== ==========================================================================================
0    done
1    a bug (its traceback shown, naming the rank under a launcher)
2    bad input: :class:`~fmmeta.config.ConfigError`, :class:`~fmmeta.errors.UserInputError`, a
     checkpoint that does not match the run, a folder the ranks do not share
3    a non-finite loss with ``train.nonfinite=stop`` (:data:`NONFINITE`)
130  stopped by Ctrl-C
143  stopped by SIGTERM (128 + 15)
==== ==========================================================================================
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Callable, Iterator

from fmmeta.checkpoint import CheckpointMismatchError
from fmmeta.checkpoint.shared_folder import SharedFolderError
from fmmeta.config import ConfigError
from fmmeta.engine import NonFiniteError
from fmmeta.errors import UserInputError
from fmmeta.interrupts import Interrupted
from fmmeta.startup import Terminated, stopping

__all__ = ["BAD_INPUT", "CTRL_C", "NONFINITE", "SIGTERM", "Outcome", "exit_code", "stop_code"]

BAD_INPUT = 2
"""The input was refused (config, data, run folder, resume); the message says which and the fix."""
NONFINITE = 3
"""The loss went non-finite under ``train.nonfinite=stop``: for a study, the trial diverged."""
CTRL_C = 130
"""Stopped by Ctrl-C (128 + SIGINT)."""
SIGTERM = 143
"""Stopped by SIGTERM (128 + SIGTERM), what schedulers expect of a pre-empted job."""


@dataclass
class Outcome:
    """How the run ended, as its exit code; the recipe returns ``code`` after the ``with`` block."""

    code: int = 0


def stop_code(err: KeyboardInterrupt) -> int:
    """The exit code of a stop: 143 for SIGTERM (:class:`~fmmeta.startup.Terminated`), else 130."""
    return SIGTERM if isinstance(err, Terminated) else CTRL_C


@contextlib.contextmanager
def exit_code(
    logger: logging.Logger,
    stopped: Callable[[KeyboardInterrupt], None],
    *,
    debug: bool = False,
    log_bugs: bool = False,
) -> Iterator[Outcome]:
    """Turns how the ``with`` block ended into ``Outcome.code`` and one message.

    Args:
        logger: the recipe's logger, so a message names the recipe as its other lines do.
        stopped: says that Ctrl-C or SIGTERM stopped the run, and what to do next (the recipe's
            own words: what it leaves behind differs).
        debug: also log an input error's traceback (``--debug``).
        log_bugs: log any other exception with its traceback and exit 1 (training: under a
            launcher every rank's traceback lands in one log, so the line names the rank);
            otherwise it propagates and Python prints it, exiting 1 as well.
    """
    outcome = Outcome()
    try:
        yield outcome
    except SharedFolderError as err:  # raised on every rank together
        logger.error("%s", err)
        outcome.code = BAD_INPUT
    except (ConfigError, UserInputError, CheckpointMismatchError) as err:  # the input, not a bug
        if debug:
            logger.exception("input error (traceback shown for --debug)")
        print(f"error: {err}", file=sys.stderr)
        outcome.code = BAD_INPUT
    except NonFiniteError as err:  # raised on every rank together (train.nonfinite=stop)
        logger.error("stopped: %s", err)
        outcome.code = NONFINITE
    except Interrupted as err:  # during meta-training: the message names the last checkpoint
        stopping()  # here too: it may come from a worker process
        logger.warning("stopped: %s", err)
        outcome.code = err.code
    except KeyboardInterrupt as err:
        stopping()
        stopped(err)
        outcome.code = stop_code(err)
    except Exception:
        if not log_bugs:
            raise
        logger.exception("rank %s failed", os.environ.get("RANK", "0"))
        outcome.code = 1
