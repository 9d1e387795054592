"""tests/_zygote.py: a launch forked from the preloaded server gives what a fresh interpreter gives
(the reference: the same launch with ``FMMETA_TEST_FRESH=1``), and the server refuses to serve
where a fork could not stand for a fresh interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import _zygote
from tests.recipes._recipe import environment

PROBE = """\
import json, os, signal, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
                  "file": __file__, "mine": os.environ.get("ZYGOTE_PROBE"), "session": os.getsid(0) == os.getpid(),
                  "group": os.getpgid(0) == os.getpid(), "stdin": sys.stdin.read()}))
print(f"parent {os.getppid()}", file=sys.stderr)
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "raise":
    raise ValueError("the probe fails")
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "sleep":
    import subprocess, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("sleeping", flush=True)
    time.sleep(600)
sys.exit(int(how))
"""

STARTED = """\
import signal, sys, time
print("sigint", "ignored" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "raises", flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""
"""A launch a test signals: says what SIGINT does to it, then waits for it."""


@pytest.fixture(autouse=True)
def _own_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts its own servers, from its first launch, and stops them."""
    servers: dict = {}
    monkeypatch.setattr(_zygote, "_servers", servers)
    monkeypatch.setattr(_zygote, "_launches", {})
    monkeypatch.setattr(_zygote, "FRESH_FIRST", 0)
    yield
    for server in servers.values():
        if server is not None:
            server.stop()


def _parent(done: subprocess.CompletedProcess[str]) -> int:
    """The pid of the process that started the launch (the probe's stderr says it)."""
    return int(next(line for line in (done.stdout + done.stderr).splitlines() if line.startswith("parent "))[7:])


def _both(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], cwd: Path,
          merge: bool) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The launch forked, then fresh."""
    monkeypatch.delenv("FMMETA_TEST_FRESH", raising=False)
    forked = _zygote.run_python(args, env=env, cwd=cwd, timeout_s=120, merge=merge)
    monkeypatch.setenv("FMMETA_TEST_FRESH", "1")
    fresh = _zygote.run_python(args, env=env, cwd=cwd, timeout_s=120, merge=merge)
    assert _parent(forked) != os.getpid() and _parent(fresh) == os.getpid()  # forked by the server, and not
    return forked, fresh


def test_a_forked_launch_gives_what_a_fresh_interpreter_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    env = {**environment(), "ZYGOTE_PROBE": "mine"}
    for how, rc in (("0", 0), ("3", 3), ("raise", 1), ("kill", -9)):  # the server serves each in turn
        forked, fresh = _both(monkeypatch, [str(script), how, "x y"], env, tmp_path, merge=False)
        assert forked.returncode == fresh.returncode == rc, (how, forked, fresh)
        assert forked.stdout == fresh.stdout, how  # argv, cwd, sys.path[0], __main__, environment, session
        seen = json.loads(forked.stdout.splitlines()[0])
        assert seen["argv"] == [str(script), how, "x y"] and seen["path0"] == str(script.parent), seen
        assert seen["mine"] == "mine" and seen["session"] and seen["group"] and seen["stdin"] == "", seen
        # the same stderr, up to the frames a traceback shows of the server around the script
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1], (forked.stderr, fresh.stderr)
    forked, fresh = _both(monkeypatch, [str(script), "0"], env, tmp_path, merge=True)
    assert forked.stdout.endswith("to stderr\n") and fresh.stdout.endswith("to stderr\n")
    assert forked.stdout.splitlines()[0] == fresh.stdout.splitlines()[0]


def test_a_launch_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    start = time.monotonic()
    env = {**environment(), _zygote.PRELOAD_VARIABLE: "json"}  # a light server: the kill is the point
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _zygote.run_python([str(script), "sleep"], env=env, cwd=tmp_path, timeout_s=4)
    assert time.monotonic() - start < 60 and "sleeping" in caught.value.output
    assert f"parent {os.getpid()}\n" not in caught.value.output  # the server forked it
    for _ in range(100):  # the launch's own child goes with it
        if subprocess.run(["pgrep", "-f", "time.sleep\\(600\\)"], capture_output=True).returncode == 1:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the launch's own child outlived the kill")


@pytest.mark.parametrize("module, why", [
    ("print('hello from an import')", "printed something"),
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
     "threads run in the server"),
    ("import warnings\nwarnings.warn('an import-time warning')", "warned: an import-time warning"),
])
def test_the_server_refuses_where_its_imports_would_show(tmp_path: Path, module: str, why: str,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """An import that prints, warns or starts a thread would not show in a forked child as it shows
    in a fresh interpreter: the server says why, and the launch runs fresh."""
    (tmp_path / "noisy_import.py").write_text(module + "\n")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**environment(), "PYTHONPATH": os.pathsep.join([str(tmp_path), environment()["PYTHONPATH"]]),
           _zygote.PRELOAD_VARIABLE: "noisy_import"}  # no more: the refusal is about this import
    monkeypatch.delenv("FMMETA_TEST_FRESH", raising=False)
    done = _zygote.run_python([str(script), "0"], env=env, cwd=tmp_path, timeout_s=120, merge=False)
    assert done.returncode == 0 and _parent(done) == os.getpid()  # this process started it
    assert why in capsys.readouterr().err


@pytest.mark.parametrize("sigint_default", [True, False])
def test_a_started_launch_is_signalled_as_a_fresh_one_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         sigint_default: bool) -> None:
    """start_python's handle answers as ``subprocess.Popen`` does (pid and process group, poll,
    wait with a timeout, returncode), and SIGINT reaches the child as it reaches a fresh interpreter,
    here from a process that ignores SIGINT (as under ``make test &``): ``KeyboardInterrupt`` where
    the test asks for a terminal's Ctrl-C, ignored otherwise."""
    script = tmp_path / "started.py"
    script.write_text(STARTED)
    env = {**environment(), _zygote.PRELOAD_VARIABLE: "json"}  # a light server: the signals are the point
    seen = {}
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for fresh in (False, True):
            if fresh:
                monkeypatch.setenv("FMMETA_TEST_FRESH", "1")
            else:
                monkeypatch.delenv("FMMETA_TEST_FRESH", raising=False)
            log = tmp_path / f"fresh_{fresh}.log"
            with log.open("w") as fh:
                proc = _zygote.start_python([str(script)], env=env, cwd=tmp_path, stdout=fh,
                                            sigint_default=sigint_default)
            assert isinstance(proc, _zygote.Forked) is not fresh
            assert os.getpgid(proc.pid) == proc.pid  # its own process group from the start, as Popen's
            deadline = time.monotonic() + 60
            while "sigint" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
            assert proc.returncode is None
            os.killpg(proc.pid, signal.SIGINT)
            if not sigint_default:  # ignored: still running until killed
                time.sleep(0.5)
                assert proc.poll() is None, log.read_text()
                os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait(timeout=30)
            assert proc.returncode == proc.poll() == rc
            seen[fresh] = (rc, log.read_text())
    finally:
        signal.signal(signal.SIGINT, before)
    want = (130, "sigint raises\ninterrupted\n") if sigint_default else (-9, "sigint ignored\n")
    assert seen[False] == seen[True] == want, seen
