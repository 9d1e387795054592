"""``python SCRIPT ARGS`` for the test helpers, forked from a process that imported the heavy
libraries once, instead of a new interpreter that imports them again.

Why: a test launch of a recipe or benchmark spent most of its CPU importing torch, transformers,
peft, DeepSpeed and accelerate (about 6 s per process on the 2-core CI machine, against 1-3 s of
the run's own work), and the suite makes dozens of such launches. Each pytest worker starts one
server per launch environment; the server imports those libraries with that environment, then
forks a child per launch, which runs the script as ``python SCRIPT ARGS`` would: its own session
and process group, the caller's stdout and stderr, working directory, environment, ``sys.argv``
and ``sys.path[0]``, ``__name__ == "__main__"``, and the exit code (negative: killed by a signal).

What makes a forked child stand for a fresh interpreter, and what the server checks before it
serves (otherwise every launch runs in a new interpreter, as before):

* the same environment: a server serves only launches whose environment equals the one it was
  started with (``PYTEST_CURRENT_TEST`` aside: no library reads it); what its imports added to
  the environment (torch names its inductor cache folder) is added to the child's, as the same
  imports would add it in a fresh interpreter;
* nothing of the imports is visible: they printed nothing and warned nothing (a child would not
  show a warning a fresh interpreter shows once), and no thread runs when the server forks;
* fmmeta itself is not preloaded: its import-time side effects (the recipes' Ctrl-C handler, the
  library warning filters) run in the child, in the order a fresh interpreter runs them.

A launch a test signals or kills while it runs (:func:`start_python`) is forked too: its handle
answers as a ``subprocess.Popen`` does (``pid``, ``poll``, ``wait``, ``returncode``), and SIGINT
reaches the child as it reaches a fresh interpreter started from this process (ignored where this
process ignores it, ``KeyboardInterrupt`` otherwise, or from a terminal where the test asks).

What differs, and so stays on fresh interpreters: a launch under deepspeed, torchrun or accelerate
(the launcher starts the ranks), and a test about start-up itself (a Ctrl-C while the libraries
import: in a forked child they are imported already). Forked children share the server's
hash seed; the tests that compare runs under different seeds set ``PYTHONHASHSEED``, a different
environment, so they run fresh. ``FMMETA_TEST_FRESH=1`` runs every launch fresh.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

PRELOAD = (
    "torch", "transformers", "transformers.models.llama.modeling_llama", "peft", "accelerate",
    "deepspeed", "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.muon.muon_optimizer",
    "safetensors.torch", "yaml",
)
"""What the server imports: what every recipe, worker and benchmark process imports anyway.
Not ``datasets``: pyarrow starts a jemalloc thread at import, and a fork copies no thread."""

PRELOAD_VARIABLE = "FMMETA_ZYGOTE_PRELOAD"
"""Environment variable naming (comma-separated) the modules to import instead of :data:`PRELOAD`:
its tests' light servers."""

VOLATILE = ("PYTEST_CURRENT_TEST",)
"""Environment variables that differ from launch to launch and that no preloaded library reads."""

MAX_SERVERS = 2
"""Servers per test process: one per distinct launch environment, each ~0.5 GB shared until written."""

FRESH_FIRST = 1
"""Launches of an environment that run fresh before its server starts: a server costs one fresh
interpreter's imports, which an environment a test makes for one launch would not repay."""

_servers: dict[tuple[tuple[str, str], ...], _Server | None] = {}
_launches: dict[tuple[tuple[str, str], ...], int] = {}


def run_python(args: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float,
               merge: bool = True) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output, text=True,
    timeout=timeout_s)``, forked from a preloaded server where one serves ``env``. With ``merge``,
    stderr goes into stdout (``stderr=subprocess.STDOUT``). On a timeout the child's process group
    is killed and ``subprocess.TimeoutExpired`` raised, with the output so far."""
    cmd = [sys.executable, *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = _fork(args, env=env, cwd=cwd, stdout=out, stderr=out if merge else err, sigint=_inherited_sigint())
        if child is None:
            return run_fresh(cmd, env=env, cwd=cwd, timeout_s=timeout_s, merge=merge)
        code: int | None
        try:
            code = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child.pid)
            child.wait(30)  # reaped
            code = None
        text = [_read(f) for f in (out, err)]
    if code is None:
        raise subprocess.TimeoutExpired(cmd, timeout_s, output=text[0], stderr=text[1])
    return subprocess.CompletedProcess(cmd, code, text[0], "" if merge else text[1])


def start_python(args: list[str], *, env: dict[str, str], cwd: Path, stdout: IO[Any],
                 sigint_default: bool = False, fresh: bool = False) -> Forked | subprocess.Popen[bytes]:
    """``subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=stdout,
    stderr=subprocess.STDOUT, start_new_session=True)`` for a launch a test signals or kills while
    it runs, forked from a preloaded server where one serves ``env`` (a new interpreter with
    ``fresh``). ``sigint_default``: Ctrl-C is delivered as from a terminal even where this process
    ignores SIGINT (a shell that starts a command in the background, ``make test &``, sets it to
    ignored, and a child inherits that)."""
    sigint = "default" if sigint_default else _inherited_sigint()
    child = None if fresh else _fork(args, env=env, cwd=cwd, stdout=stdout, stderr=stdout, sigint=sigint)
    if child is not None:
        return child
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_sigint_to_default if sigint_default else None)


def _sigint_to_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _inherited_sigint() -> str:
    """What a fresh interpreter started from this process does with SIGINT: ignores it where this
    process ignores it (an exec keeps only that), raises ``KeyboardInterrupt`` otherwise."""
    return "ignore" if signal.getsignal(signal.SIGINT) == signal.SIG_IGN else "default"


def _fork(args: list[str], *, env: dict[str, str], cwd: Path, stdout: IO[Any], stderr: IO[Any],
          sigint: str) -> Forked | None:
    """The launch forked from the server for ``env``, or ``None`` where it must run fresh: a ``-c``
    or ``-m`` launch, no server for ``env``, or a server that refused (then no later launch of
    ``env`` asks it)."""
    server = None if args[0].startswith("-") else _server_for(env)  # a script: no -c, no -m
    if server is None:
        return None
    child = server.fork(args, env=env, cwd=cwd, stdout=stdout, stderr=stderr, sigint=sigint)
    if isinstance(child, str):
        sys.stderr.write(f"tests/_zygote.py: launches run fresh from now on: {child}\n")
        server.stop()
        _servers[_key(env)] = None
        return None
    return child


def run_fresh(cmd: list[str], *, env: dict[str, str], cwd: Path, timeout_s: float,
               merge: bool = True) -> subprocess.CompletedProcess[str]:
    """``cmd`` (a new interpreter, or a launcher) in its own session as a forked child is, its whole
    process group killed at ``timeout_s``."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout_s, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "" if merge else err)


def _read(f: Any) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE))


def _server_for(env: dict[str, str]) -> _Server | None:
    if os.environ.get("FMMETA_TEST_FRESH") == "1":
        return None
    key = _key(env)
    _launches[key] = _launches.get(key, 0) + 1
    if key not in _servers:
        if _launches[key] <= FRESH_FIRST or sum(s is not None for s in _servers.values()) >= MAX_SERVERS:
            return None
        _servers[key] = _Server.start(env)
    return _servers[key]


class _Server:
    """The test process's handle on one server: starts it, asks it for children, stops it."""

    def __init__(self, proc: subprocess.Popen[bytes], path: str) -> None:
        self.proc, self.path = proc, path
        atexit.register(self.stop)  # where the test process exits without it, the server sees that itself

    @classmethod
    def start(cls, env: dict[str, str]) -> _Server | None:
        """A ready server, or ``None`` (with the reason on stderr) where it refused to serve."""
        folder = tempfile.mkdtemp(prefix="fmmeta-zygote-")
        path = os.path.join(folder, "socket")
        with open(os.path.join(folder, "server.log"), "wb") as log:
            proc = subprocess.Popen([sys.executable, __file__, path], env=env, cwd=folder, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server's one line: ready, or why not
        status = json.loads(line) if line.strip() else {"ready": False, "why": f"exited rc={proc.wait()}"}
        server = cls(proc, path)
        if not status["ready"]:
            sys.stderr.write(f"tests/_zygote.py: launches run fresh, the server refused: {status['why']}\n")
            server.stop()
            return None
        return server

    def fork(self, args: list[str], *, env: dict[str, str], cwd: Path, stdout: IO[Any], stderr: IO[Any],
             sigint: str) -> Forked | str:
        """The forked child, or why the server refused to fork (the launch then runs fresh)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        buf = bytearray()
        try:
            with open(os.devnull, "rb") as stdin:
                conn.connect(self.path)
                header = json.dumps({"args": args, "env": env, "cwd": str(cwd), "sigint": sigint}).encode()
                socket.send_fds(conn, [header], [stdin.fileno(), stdout.fileno(), stderr.fileno()])
            first = _reply(conn, buf)
        except BaseException:
            conn.close()
            raise
        if "refused" in first:
            conn.close()
            return str(first["refused"])
        return Forked(conn, buf, int(first["pid"]), [sys.executable, *args])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


class Forked:
    """A forked launch, as a test holds a ``subprocess.Popen``: ``pid`` (its process group's and
    session's id too), ``returncode``, ``poll()``, ``wait(timeout)``. The server reaps the child
    and sends its exit code (negative: the signal that killed it) over ``conn``."""

    def __init__(self, conn: socket.socket, buf: bytearray, pid: int, args: list[str]) -> None:
        self.conn, self.buf, self.pid, self.args = conn, buf, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and (self.buf or select.select([self.conn], [], [], 0)[0]):
            self.wait(None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.conn.settimeout(timeout)
            try:
                self.returncode = int(_reply(self.conn, self.buf)["returncode"])
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            self.conn.close()
        return self.returncode


def _reply(conn: socket.socket, buf: bytearray) -> dict[str, Any]:
    """The server's next one-line JSON reply on ``conn`` (``buf`` keeps what came after it)."""
    while b"\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("the launch server went away")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return dict(json.loads(line))


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
            return
        except ProcessLookupError:
            continue


# ---- the server (``python tests/_zygote.py SOCKET``) ---------------------------------------------


def _preload() -> str | None:
    """Imports :data:`PRELOAD` (or what :data:`PRELOAD_VARIABLE` names); returns why the server must
    not serve, or ``None``."""
    import warnings

    before = os.fstat(2).st_size
    saved = os.dup(1)
    os.dup2(2, 1)  # anything the imports print lands in the server's log
    try:
        with warnings.catch_warnings(record=True) as caught:
            named = [name for name in os.environ.get(PRELOAD_VARIABLE, "").split(",") if name]
            for name in named or PRELOAD:
                __import__(name)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if os.fstat(2).st_size != before:
        return "the preloaded imports printed something (see the server's log)"
    if caught:
        return f"the preloaded imports warned: {caught[0].message}"
    return _threads_problem()


def _threads_problem() -> str | None:
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:
        names = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in tasks]
        return f"threads run in the server, which a fork would not copy: {names}"
    return None


def _serve(path: str) -> dict[str, Any] | None:
    """Forks a child per request until the test process ends; returns the request in a child."""
    env_before = dict(os.environ)
    why = _preload()
    added = {k: v for k, v in os.environ.items() if k not in env_before}
    # What the imports made is never freed: frozen, a child's collections skip it, which would
    # otherwise write to (and so copy) most of the server's memory once per launch: 1.3 s a launch
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print(json.dumps({"ready": why is None, "why": why}), flush=True)
    if why is not None:
        return None
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    parent = os.pidfd_open(os.getppid())
    sel.register(parent, selectors.EVENT_READ, "parent")
    while True:
        for key, _ in sel.select():
            if key.data == "parent":  # the test process ended
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                return None
            if key.data == "accept":
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
                request = json.loads(msg)
                problem = _threads_problem()
                if problem:  # the caller runs this launch, and every later one, fresh
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(json.dumps({"refused": problem}).encode() + b"\n")
                    conn.close()
                    continue
                in_session, ready = os.pipe()
                pid = os.fork()
                if pid == 0:
                    for obj in (listener, conn):
                        obj.close()
                    for k in list(sel.get_map().values()):
                        if isinstance(k.fileobj, int):
                            os.close(k.fileobj)
                    sel.close()
                    os.close(in_session)
                    _become(request, fds, added, ready)
                    return request
                for fd in (*fds, ready):
                    os.close(fd)
                # the pid goes back once the child leads its own process group, as Popen(...,
                # start_new_session=True) returns only then: a test may signal the group at once
                os.read(in_session, 1)
                os.close(in_session)
                sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            else:
                pid, conn = key.data
                sel.unregister(key.fileobj)
                os.close(key.fileobj)  # type: ignore[arg-type]
                _, status = os.waitpid(pid, 0)
                try:
                    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass  # the caller gave up (a timeout) and went away
                conn.close()


def _become(request: dict[str, Any], fds: list[int], added: dict[str, str], ready: int) -> None:
    """Turns the forked child into ``python SCRIPT ARGS`` as the request has it; closes ``ready``
    once it is in its own session, with its SIGINT set."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler if request["sigint"] == "default" else signal.SIG_IGN)
    os.close(ready)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    env = {**added, **request["env"]}
    os.environ.clear()
    os.environ.update(env)
    script = request["args"][0]
    sys.argv = list(request["args"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))


def _run_script() -> None:
    """Runs ``sys.argv[0]`` as ``__main__``; exceptions and ``SystemExit`` end the child as they
    end an interpreter."""
    import runpy

    runpy.run_path(sys.argv[0], run_name="__main__")
    sys.exit(0)


if __name__ == "__main__":
    if _serve(sys.argv[1]) is None:
        os._exit(0)  # the server: nothing of the imports' exit handlers is a test's concern
    _run_script()
