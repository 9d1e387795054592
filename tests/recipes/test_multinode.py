"""Two nodes of two processes each, on one machine (ZeRO-3, CPU/gloo, the shared short run).

Each node is its own launcher process, as a scheduler starts one per node: ``torchrun --nnodes 2``
with a c10d rendezvous, and deepspeed's launcher in ``--no_ssh --node_rank`` mode with a hostfile.
What several nodes change is checked against one process or an uninterrupted run:

* the adapter equals one process's (world size 4: packing differs from one process, so fp32
  rounding does too, as in test_launchers.py; same tolerance);
* under deepspeed's launcher, a SIGKILL of one node's launcher and workers makes the other node
  exit non-zero within the collective timeout, and restarting both nodes resumes to exactly the
  uninterrupted torchrun run (both launchers give the same world size and plans, so bitwise the
  same result: measured);
* nodes that do not see one output folder (here: a relative ``output_dir`` and a different
  working directory per node, as on node-local disks) are refused at start-up, on both nodes.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.recipes import _nodes, _recipe

RTOL = 5e-5
TIMEOUT_S = 60
"""The collective timeout of these runs (``engine.collective_timeout_s``)."""


@pytest.fixture(scope="module")
def torchrun_2x2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchrun, 2 nodes x 2 processes, the shared short run, uninterrupted."""
    out = tmp_path_factory.mktemp("multinode") / "torchrun"
    _nodes.run_nodes("torchrun", [*_recipe.SHORT, f"output_dir={out}"], out.with_name("torchrun.logs"))
    return out


def _assert_matches(run: Path, reference: Path, rtol: float) -> None:
    diff = _recipe.max_relative_diff(_recipe.adapter(run / "fomaml" / "adapter"),
                                     _recipe.adapter(reference / "fomaml" / "adapter"))
    assert diff <= rtol, diff
    got, want = _recipe.losses(run / "metrics.jsonl"), _recipe.losses(reference / "metrics.jsonl")
    assert [r[0] for r in got] == list(range(8))
    for a, b in zip(got, want, strict=True):
        assert a[0] == b[0] and a[5:] == b[5:]  # same step, tasks and tokens
        for x, y in zip(a[1:5], b[1:5]):
            assert (x is None and y is None) or abs(x - y) <= rtol * abs(y), (a, b)


@pytest.mark.timeout(600)
def test_torchrun_two_nodes_match_one_process(torchrun_2x2: Path, local_short: Path) -> None:
    assert "world size 4 | ZeRO stage 3" in (torchrun_2x2.with_name("torchrun.logs") / "node0.log").read_text() \
        + (torchrun_2x2.with_name("torchrun.logs") / "node1.log").read_text()
    _assert_matches(torchrun_2x2, local_short, RTOL)


@pytest.mark.timeout(1000)
def test_deepspeed_no_ssh_killed_node_fails_the_other_and_both_resume_to_the_same_run(
        tmp_path: Path, torchrun_2x2: Path) -> None:
    out = tmp_path / "run"
    args = [*_recipe.SHORT, f"output_dir={out}", "train.resume=auto"]
    nodes = _nodes.start_nodes("deepspeed", args, tmp_path / "killed")
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 480
    while max(_recipe.steps(metrics), default=-1) < 4:
        assert all(n.proc.poll() is None for n in nodes), "a node ended early\n" + _nodes.tails(nodes)
        assert time.monotonic() < deadline, "step 4 not reached\n" + _nodes.tails(nodes)
        time.sleep(0.05)
    # Node 0 holds global ranks 0 and 1 and the rendezvous store: losing it is the hard case.
    _recipe.kill_group(nodes[0].proc)
    killed_at = time.monotonic()
    nodes[0].proc.wait(timeout=30)
    survivor = nodes[1].proc
    try:
        survivor.wait(timeout=TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        raise AssertionError("node 1 still runs after node 0 died\n" + _nodes.tails(nodes)) from None
    finally:
        _recipe.kill_group(survivor)  # nothing of node 1 may outlive its launcher either
    waited = time.monotonic() - killed_at
    assert survivor.returncode != 0, _nodes.tails(nodes)
    assert waited < TIMEOUT_S, f"node 1 needed {waited:.0f}s to fail"
    assert not (out / "fomaml" / "adapter").exists(), "killed too late: the run had finished"

    resumed = _nodes.run_nodes("deepspeed", args, tmp_path / "resumed")
    # Node 1's launcher starts global ranks 2 and 3 and hands them --local_rank 0 and 1.
    assert "'node1': [2, 3]" in resumed[1].output() and "--local_rank=0" in resumed[1].output()
    found = re.findall(r"resumed from \S+step_(\d+) \(meta-step (\d+) complete\)",
                       "".join(n.output() for n in resumed))
    assert len(found) == 1 and int(found[0][1]) in (3, 5), _nodes.tails(resumed)
    # Bitwise the torchrun run: the same world size and plans under either launcher, and a resume
    # that restores every state exactly (test_resume.py), so nothing may differ.
    got, want = _recipe.losses(metrics), _recipe.losses(torchrun_2x2 / "metrics.jsonl")
    assert [r[0] for r in got] == list(range(8)), "each step logged exactly once after resume"
    assert got == want
    a = _recipe.adapter(out / "fomaml" / "adapter")
    b = _recipe.adapter(torchrun_2x2 / "fomaml" / "adapter")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.timeout(300)
def test_nodes_that_do_not_share_the_output_folder_are_refused(tmp_path: Path) -> None:
    cwds = (tmp_path / "node0", tmp_path / "node1")
    for d in cwds:
        d.mkdir()
    args = [*_recipe.SHORT, "output_dir=runs/x", "engine.collective_timeout_s=20"]
    nodes = _nodes.start_nodes("torchrun", args, tmp_path / "logs", cwds=cwds, procs_per_node=1)
    codes = _nodes.wait_nodes(nodes, timeout_s=240)
    assert codes[0] != 0 and codes[1] != 0, _nodes.tails(nodes)
    for node in nodes:  # each node's own console says what is wrong and how to fix it
        log = node.output()
        assert "is not one folder shared by every rank" in log, log[-3000:]
        assert f"looked in {cwds[1] / 'runs' / 'x'}: no such folder" in log \
            or f"looked in {cwds[0] / 'runs' / 'x'}: no such folder" in log, log[-3000:]
        assert "set output_dir to an absolute path" in log
    assert not any(d.joinpath("runs", "x", "fomaml").exists() for d in cwds), "training started"
