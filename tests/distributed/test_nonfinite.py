"""Non-finite meta-gradient on ONE rank of two (DeepSpeed ZeRO-3, gloo, torchrun).

Only rank 1 produces a NaN meta-gradient, at step 1 of 3. With ``skip`` both ranks must skip that
step together (a rank deciding alone would desynchronise ZeRO's collectives) and end with identical
adapters, equal to a run that never had step 1's update. With ``stop`` both ranks must raise
:class:`NonFiniteError` and exit non-zero within seconds, not hang at the next collective.

This file is also the worker: ``torchrun ... test_nonfinite.py --worker --out DIR --policy P``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
BAD_STEP = 1
BAD_RANK = 1


def _grads(params: list[torch.Tensor], step: int, rank: int) -> list[torch.Tensor]:
    """This rank's deterministic meta-gradient sum for ``step`` (NaN on the chosen rank/step)."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    grads = [torch.randn(p.shape, generator=gen) * 0.1 for p in params]
    if step == BAD_STEP and rank == BAD_RANK:
        grads[0].view(-1)[0] = math.nan
    return grads


def _worker(out: Path, policy: str, timeout_s: float) -> int:
    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO))
    from safetensors.torch import save_file

    from fmmeta.engine.deepspeed_engine import DeepSpeedEngine
    from fmmeta.engine.distributed import init_distributed
    from fmmeta.engine.guard import NonFiniteError, NonFiniteGuard
    from fmmeta.engine.optim import OuterOptimConfig
    from tests.distributed._common import build_model

    rank, _, world = init_distributed("gloo", timeout_s)
    ds_cfg = json.loads((REPO / "ds_configs" / "zero3.json").read_text())
    optim = OuterOptimConfig(outer_lr=1e-2, grad_clip=0.0)

    def engine() -> DeepSpeedEngine:
        return DeepSpeedEngine(build_model(), optim, ds_cfg, precision="fp32")

    def snapshot(e: DeepSpeedEngine) -> dict[str, torch.Tensor]:
        return {f"p{i}": p.detach().clone().contiguous() for i, p in enumerate(e.adapter_parameters())}

    guarded = NonFiniteGuard(engine(), policy)  # type: ignore[arg-type]
    initial = snapshot(guarded.inner)
    skipped = []
    try:
        for step in range(STEPS):
            stats = guarded.outer_step(_grads(guarded.adapter_parameters(), step, rank), 2 * world)
            skipped.append(stats["skipped"])
    except NonFiniteError as err:
        (out / f"error_rank{rank}.txt").write_text(str(err))
        return 3
    reference = engine()
    for step in range(STEPS):
        if step != BAD_STEP:  # the reference never had the bad step at all
            reference.outer_step(_grads(reference.adapter_parameters(), step, rank), 2 * world)
    save_file(initial, str(out / f"initial_rank{rank}.safetensors"))
    save_file(snapshot(guarded.inner), str(out / f"guarded_rank{rank}.safetensors"))
    save_file(snapshot(reference), str(out / f"reference_rank{rank}.safetensors"))
    (out / f"stats_rank{rank}.json").write_text(
        json.dumps({"skipped": skipped, "skipped_steps": guarded.skipped_steps})
    )
    guarded.barrier()
    return 0


def _launch(out: Path, policy: str, timeout_s: float = 150.0) -> tuple[subprocess.CompletedProcess[str], float]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update({"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])})
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2",
           "--master_port", str(port), str(Path(__file__).resolve()),
           "--worker", "--out", str(out), "--policy", policy, "--timeout", "20"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"torchrun ran past {timeout_s}s with policy={policy} (a hang)") from None
    return proc, time.perf_counter() - t0


@pytest.mark.timeout(200)
def test_skip_on_one_rank_skips_on_both(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    proc, _ = _launch(tmp_path, "skip")
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in (0, 1):
        stats = json.loads((tmp_path / f"stats_rank{rank}.json").read_text())
        assert stats == {"skipped": [0.0, 1.0, 0.0], "skipped_steps": 1}
    g0, g1 = (load_file(str(tmp_path / f"guarded_rank{r}.safetensors")) for r in (0, 1))
    ref = load_file(str(tmp_path / "reference_rank0.safetensors"))
    init = load_file(str(tmp_path / "initial_rank0.safetensors"))
    for k in g0:
        assert torch.equal(g0[k], g1[k]), f"ranks disagree on {k}"
        assert torch.isfinite(g0[k]).all()
        assert torch.allclose(g0[k], ref[k], rtol=0, atol=1e-7), f"{k} differs from the no-bad-step run"
    assert any(not torch.equal(g0[k], init[k]) for k in g0), "no update was applied at all"


@pytest.mark.timeout(200)
def test_stop_on_one_rank_stops_both_fast(tmp_path: Path) -> None:
    proc, seconds = _launch(tmp_path, "stop")
    assert proc.returncode != 0
    for rank in (0, 1):
        msg = (tmp_path / f"error_rank{rank}.txt").read_text()
        assert "non-finite meta-gradient on 1 of 2 ranks" in msg
        assert f"(this rank: {'yes' if rank == BAD_RANK else 'no'})" in msg
        assert "train.nonfinite=skip" in msg
    assert not list(tmp_path.glob("guarded_rank*.safetensors"))
    assert seconds < 120, f"stopping took {seconds:.0f}s (collective timeout is 20s)"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--policy", choices=["skip", "stop"], required=True)
    parser.add_argument("--timeout", type=float, default=20.0)
    args, _ = parser.parse_known_args()
    code = _worker(Path(args.out), args.policy, args.timeout)
    from tests.distributed._common import exit_worker  # importable once _worker has set sys.path

    exit_worker(code)
