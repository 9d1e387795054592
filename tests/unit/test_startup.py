"""SIGTERM raises :class:`~fmmeta.startup.Terminated` while a recipe runs, and nothing once a stop
is under way or the program is exiting: the launcher's SIGTERM to the rank left after another died
reaches that rank at any moment of its own stop. Each case runs in a child process, whose signal
handlers and stop are its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SIGTERM_TO_SELF = """
import atexit, logging, os, signal, sys, time
from fmmeta.startup import Terminated, ctrl_c_raises

def sigterm_to_self():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # the handler runs here, between bytecodes

ctrl_c_raises()
"""

_EXITING = """
def last_exit_handler():  # registered first, so it runs last, as torch's library finalizers do
    sigterm_to_self()
    print("exit handlers finished", flush=True)

atexit.register(last_exit_handler)
try:
    sigterm_to_self()
except Terminated:
    print("stopped by SIGTERM", flush=True)
    sys.exit(143)
"""

_LOST_RANK = """
from fmmeta.exit_codes import exit_code
from fmmeta.interrupts import interrupt_note

class Checkpoints:  # the SIGTERM arrives while the lost rank's note looks up the last checkpoint
    rank, world_size = 0, 2

    def latest(self, verify):
        sigterm_to_self()
        return None

logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
with exit_code(logging.getLogger("recipe"), lambda err: print("stopped outside")) as outcome:
    with interrupt_note("fomaml", Checkpoints(), lambda: 5):
        raise RuntimeError("[gloo] Connection reset by peer")
print("exit code", outcome.code)
"""

_STOPPED_TWICE = """
from fmmeta.exit_codes import exit_code

def stopped(err):  # a second SIGTERM while the first one's message is written
    sigterm_to_self()
    print("stopped by", type(err).__name__)

with exit_code(logging.getLogger("recipe"), stopped) as outcome:
    sigterm_to_self()
print("exit code", outcome.code)
"""


@pytest.mark.parametrize(("child", "code", "lines"), [
    pytest.param(_EXITING, 143, ["stopped by SIGTERM", "exit handlers finished"], id="exiting"),
    pytest.param(_LOST_RANK, 0, [
        "stopped: fomaml, meta-step 5: the other rank (rank 1) stopped answering (gloo: Connection reset by "
        "peer): it died or was killed; its own log says why. Last checkpoint: none yet. Rerun the same "
        "command on every rank to resume from it (train.resume=auto)", "exit code 1"], id="lost-rank"),
    pytest.param(_STOPPED_TWICE, 0, ["stopped by Terminated", "exit code 143"], id="stopped-twice"),
])
def test_a_sigterm_during_a_stop_changes_nothing(child: str, code: int, lines: list[str]) -> None:
    """Before: the second SIGTERM raised inside an exit handler ("Exception ignored in atexit
    callback"), replaced the lost-rank message with "stopped by SIGTERM outside meta-training", or
    cut a stop's message short with a traceback; now the stop under way ends the run, as it says."""
    source = textwrap.dedent(_SIGTERM_TO_SELF) + textwrap.dedent(child)
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stdout + done.stderr
    assert done.stdout.splitlines() == lines, done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
