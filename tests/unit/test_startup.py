"""SIGTERM raises :class:`~fmmeta.startup.Terminated` while a recipe runs, and nothing once it is
exiting (a launcher's SIGTERM to the rank left after another died reaches it there)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import atexit, os, signal, sys, time
    from fmmeta.startup import Terminated, ctrl_c_raises

    def sigterm_while_exiting():  # registered first, so it runs last, as torch's finalizers do
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)  # the handler runs here, between bytecodes
        print("exit handlers finished", flush=True)

    atexit.register(sigterm_while_exiting)
    ctrl_c_raises()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    except Terminated:
        print("stopped by SIGTERM", flush=True)
        sys.exit(143)
    """
)


def test_sigterm_raises_in_main_and_not_in_the_exit_handlers() -> None:
    """Before: the second SIGTERM raised inside an exit handler ("Exception ignored in atexit
    callback", the handlers after it skipped); now the exit under way finishes with its own code."""
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 143, done.stderr
    assert done.stdout.splitlines() == ["stopped by SIGTERM", "exit handlers finished"], done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
