"""fmmeta.workers: forked worker processes give the one-process answer, and a failure stops them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fmmeta.config import ConfigError
from fmmeta.errors import UserInputError
from fmmeta.workers import Workers, in_worker, resolve_workers


def test_map_in_workers_equals_the_loop_in_order_with_closures_and_tensors() -> None:
    weight = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)).requires_grad_()

    def fn(i: int) -> tuple[int, int, bool, torch.Tensor]:  # a closure over a tensor: inherited
        x = torch.full((4, 16), float(i))
        loss = (x @ weight).pow(2).sum()
        (grad,) = torch.autograd.grad(loss, [weight])
        return i, os.getpid(), in_worker(), grad

    items = list(range(7))
    seen: list[int] = []
    got = Workers(2, 1).map(fn, items, on_result=seen.append)
    want = Workers(1, 1).map(fn, items)
    assert [g[0] for g in got] == items and sorted(seen) == items
    assert all(g[2] for g in got) and not any(w[2] for w in want)  # who ran them
    assert {g[1] for g in got} - {os.getpid()} and os.getpid() not in {g[1] for g in got}
    for g, w in zip(got, want):
        assert torch.equal(g[3], w[3])
    assert not in_worker()


def _fail_first(marks: Path, i: int) -> int:
    if i == 0:  # fails once item 1 runs in the other worker
        deadline = time.monotonic() + 30
        while not (marks / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise UserInputError("item 0 is bad input")
    if i == 1:
        (marks / "started").touch()
        time.sleep(1.0)  # still running when item 0 fails: waited for, and it finishes
    (marks / str(i)).touch()
    return i


def test_a_failure_is_raised_here_and_no_worker_starts_another_item(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="item 0 is bad input"):
        Workers(2, 1).map(lambda i: _fail_first(tmp_path, i), list(range(8)))
    # Item 1 was running and finished; the worker that failed item 0 took no item after it, and
    # neither did the other once the failure was known.
    done = sorted(int(p.name) for p in tmp_path.iterdir() if p.name != "started")
    assert 1 in done and len(done) < 7, done


def test_one_worker_or_one_item_runs_here() -> None:
    pid = os.getpid()
    assert Workers(1, 2).map(lambda _: os.getpid(), [0, 1]) == [pid, pid]
    assert Workers(4, 1).map(lambda _: os.getpid(), [0]) == [pid]


def test_auto_is_one_per_thread_at_most_one_per_job_and_one_when_distributed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_workers("auto", jobs=5, distributed=False) == 4
    assert resolve_workers("auto", jobs=3, distributed=False) == 3
    assert resolve_workers("auto", jobs=None, distributed=False) == 4
    assert resolve_workers("auto", jobs=5, distributed=True) == 1
    assert resolve_workers(3, jobs=1, distributed=False) == 3  # as asked
    with pytest.raises(UserInputError, match="ranks split the work"):
        resolve_workers(2, jobs=5, distributed=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_workers("auto", jobs=5, distributed=False) == 1
    with pytest.raises(UserInputError, match="CUDA context does not survive a fork"):
        resolve_workers(2, jobs=5, distributed=False)


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="both must be >= 1"):
        Workers(0, 1)


def test_for_run_gives_workers_the_threads_only_of_a_process_that_has_not_computed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = [4]
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with Workers.for_run("auto", methods=2, distributed=False) as workers:
        assert (workers.n, workers.threads, threads[0]) == (2, 2, 1)  # this process keeps one
    assert threads[0] == 4  # given back
    with Workers.for_run("auto", methods=1, distributed=False) as workers:  # trains here
        assert (workers.n, workers.threads, threads[0]) == (4, 1, 4)
    assert (Workers.from_setting("auto").n, Workers.from_setting("auto").threads) == (4, 1)


_AFTER_COMPUTE = """
import torch
from fmmeta.workers import Workers
def matmul(_):
    a = torch.randn(512, 512)
    return float((a @ a).sum()), torch.get_num_threads()
torch.set_num_threads(4)
{before}
print(workers.map(matmul, [0, 1, 2, 3]))
"""


@pytest.mark.parametrize("before", [
    # computed on four threads first: a fork may only use one (more would hang in libgomp)
    "a = torch.randn(512, 512); a @ a\nworkers = Workers.from_setting(2)",
    # nothing computed yet: the two workers share the four threads
    "workers = Workers.for_run(2, methods=2, distributed=False)\na = torch.randn(512, 512); a @ a",
])
def test_workers_forked_from_a_real_process_finish(before: str) -> None:
    """Not a mock: a process that computed on four threads, or one that gave its threads to its
    workers, forks workers that each finish their matmuls (a hang fails the timeout)."""
    code = _AFTER_COMPUTE.format(before=before)
    env = {**os.environ, "OMP_NUM_THREADS": "4"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    results = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert len(results) == 4 and {t for _, t in results} == ({1} if "from_setting" in before else {2})


_ORPHANS = """
import os, sys, time
from pathlib import Path
from fmmeta.workers import Workers
marks = Path(sys.argv[1])
def sleep(i):
    (marks / str(os.getpid())).touch()
    time.sleep(60)
Workers(2, 1).map(sleep, [0, 1])
"""


def test_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    """SIGKILL of the run's process alone (not its group) takes its workers with it: no orphan
    goes on writing into a folder that the resumed run claims."""
    proc = subprocess.Popen([sys.executable, "-c", _ORPHANS, str(tmp_path)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.iterdir())) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=10)
        pids = [int(p.name) for p in tmp_path.iterdir()]
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids), pids
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as fh:  # a zombie waits for its reaper: dead already
            return fh.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _refuse(problems: list[str]) -> None:
    raise ConfigError(problems)


def test_a_workers_config_error_arrives_whole() -> None:
    """Exceptions cross the process boundary pickled: a ConfigError keeps its problem list."""
    with pytest.raises(ConfigError) as err:
        Workers(2, 1).map(_refuse, [["a is bad", "b is bad"], ["c is bad"]])
    assert err.value.problems in (["a is bad", "b is bad"], ["c is bad"])
