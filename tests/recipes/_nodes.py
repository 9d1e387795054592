"""Two "nodes" on one machine: each node is its own launcher process (torchrun, or deepspeed's
launcher in ``--no_ssh`` mode), started as a separate process group with its own working
directory and log, exactly as a job scheduler starts one launcher per node."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.recipes import _recipe

NODES = 2
PROCS_PER_NODE = 2


def node_command(launcher: str, node_rank: int, port: int, args: list[str], *, hostfile: Path | None = None,
                 procs_per_node: int = PROCS_PER_NODE) -> list[str]:
    """What a user types on node ``node_rank`` (both nodes name the same rendezvous port)."""
    bindir = Path(sys.executable).parent
    script = [str(_recipe.TRAIN), "--config", str(_recipe.SMOKE), *args]
    if launcher == "torchrun":
        return [str(bindir / "torchrun"), "--nnodes", str(NODES), "--nproc_per_node", str(procs_per_node),
                "--node_rank", str(node_rank), "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "fmmeta-test", "--max_restarts", "0",
                *script]
    if launcher == "deepspeed":
        if hostfile is None:
            raise ValueError("deepspeed's launcher needs a hostfile naming both nodes")
        return [str(bindir / "deepspeed"), "--hostfile", str(hostfile), "--no_ssh", "--node_rank",
                str(node_rank), "--master_addr", "127.0.0.1", "--master_port", str(port), *script]
    raise ValueError(f"launcher={launcher!r} is invalid: torchrun or deepspeed")


def write_hostfile(folder: Path, procs_per_node: int = PROCS_PER_NODE) -> Path:
    """A DeepSpeed hostfile for two nodes (names only matter to ssh, which --no_ssh skips)."""
    path = folder / "hostfile"
    path.write_text("".join(f"node{i} slots={procs_per_node}\n" for i in range(NODES)))
    return path


@dataclass
class Node:
    """One node's launcher: its process (a group of its own) and its log file."""

    proc: subprocess.Popen[str]
    log: Path

    def output(self) -> str:
        return self.log.read_text()


def start_nodes(launcher: str, args: list[str], logs: Path, *, cwds: tuple[Path, ...] = (),
                procs_per_node: int = PROCS_PER_NODE) -> list[Node]:
    """Starts every node's launcher; ``cwds`` gives each node its working directory (default:
    the repository)."""
    logs.mkdir(parents=True, exist_ok=True)
    port = _recipe._free_port()
    hostfile = write_hostfile(logs, procs_per_node) if launcher == "deepspeed" else None
    nodes = []
    for i in range(NODES):
        log = logs / f"node{i}.log"
        cmd = node_command(launcher, i, port, args, hostfile=hostfile, procs_per_node=procs_per_node)
        with log.open("w") as fh:
            proc = subprocess.Popen(cmd, cwd=cwds[i] if cwds else _recipe.REPO, env=_recipe.environment(),
                                    stdout=fh, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        nodes.append(Node(proc, log))
    return nodes


def wait_nodes(nodes: list[Node], timeout_s: float) -> list[int]:
    """Every node's exit code; kills them all and fails if any runs past ``timeout_s`` (a hang)."""
    deadline = time.monotonic() + timeout_s
    try:
        for node in nodes:
            node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"nodes ran past {timeout_s}s (a hang?)\n" + tails(nodes)) from None
    finally:
        for node in nodes:
            _recipe.kill_group(node.proc)
            node.proc.wait(timeout=30)
    return [node.proc.returncode for node in nodes]


def run_nodes(launcher: str, args: list[str], logs: Path, *, timeout_s: float = 480.0) -> list[Node]:
    """Runs both nodes to the end; fails with both logs' tails unless both exit 0."""
    nodes = start_nodes(launcher, args, logs)
    codes = wait_nodes(nodes, timeout_s)
    if codes != [0] * NODES:
        raise AssertionError(f"exit codes {codes}\n" + tails(nodes))
    return nodes


def tails(nodes: list[Node], chars: int = 3000) -> str:
    return "\n".join(f"--- node {i} ({n.log}):\n{n.output()[-chars:]}" for i, n in enumerate(nodes))
