"""gather_step under 2-process DeepSpeed ZeRO-3 (gloo, CPU) gives every rank the same result, and
that result equals what one process computes for the same tasks: the same task observations (the
losses to 1e-4), the same real-token total, every rank's own observations in rank order.

Three FOMAML meta-steps on hand-built plans (``_common.build_plan``), so the later steps also check
that both runs' adapters moved alike. The one-process plan packs all four tasks on one rank, the
two-process plan two per rank (with dummy passes where a rank has fewer): padded tokens and pass
observations differ by construction, real tokens and task observations must not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.distributed.launch import run_worker

SPEC = "all:gather"


def _load(out: Path, engine: str, rank: int) -> list[dict]:
    return json.loads((out / f"{engine}_{SPEC.replace(':', '_')}.gathered.{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    one, two = tmp_path_factory.mktemp("gather1"), tmp_path_factory.mktemp("gather2")
    run_worker(one, [f"local:{SPEC}"], nprocs=1, launcher="python")
    run_worker(two, [f"ds3:{SPEC}"], nprocs=2, launcher="deepspeed", pg_timeout_s=30)
    return one, two


def _tasks(observations: list[dict]) -> list[tuple[int, int, float]]:
    return sorted((o["step"], o["task_id"], o["query_loss"]) for o in observations if o["kind"] == "task")


@pytest.mark.timeout(600)
def test_two_rank_gather_equals_one_process(runs: tuple[Path, Path]) -> None:
    one, two = runs
    local, rank0, rank1 = _load(one, "local", 0), _load(two, "ds3", 0), _load(two, "ds3", 1)
    assert len(local) == len(rank0) == len(rank1) == 3
    for step, (ref, a, b) in enumerate(zip(local, rank0, rank1, strict=True)):
        # every rank holds the same gathered result, made of each rank's own observations in rank order
        assert a["observations"] == b["observations"] == a["mine"] + b["mine"]
        assert {o["rank"] for o in a["observations"] if o["kind"] == "pass"} == {0, 1}
        assert a["n_real_tasks"] == ref["n_real_tasks"] == 4
        assert a["n_tokens"] == ref["n_tokens"] > 0
        rec = a["record"]
        assert rec["tokens"] == sum(rec["rank_tokens"]) == ref["n_tokens"]
        assert all(len(rec[k]) == 2 for k in ("rank_compute_s", "rank_collective_s", "rank_data_wait_s",
                                              "rank_tokens", "rank_peak_memory_mb"))
        got, want = _tasks(a["observations"]), _tasks(ref["observations"])
        assert [t[:2] for t in got] == [t[:2] for t in want] == [(step, t) for t in range(4)]
        for (_, _, x), (_, _, y) in zip(got, want, strict=True):
            assert math.isfinite(x) and abs(x - y) <= 1e-4 * abs(y), (step, got, want)
        assert rec["outer_loss"] == pytest.approx(ref["record"]["outer_loss"], rel=1e-4)
