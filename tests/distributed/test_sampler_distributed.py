"""Two real processes build the same plans independently (gloo, CPU).

Each rank constructs its own sampler with the same seed, samples, trains nothing, gathers
observations from both ranks (as the trainer does) and feeds them back; plan digests are
all-gathered and must agree at every step, including after a prefetcher checkpoint and resume.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.distributed._common import exit_worker

WORLD = 2
STEPS = 6


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from fmmeta.sampling import (
        CostAwareSampler,
        PassObservation,
        Prefetcher,
        SamplerConfig,
        TaskObservation,
        observation_from_dict,
    )
    from fmmeta.sampling.synthetic import lognormal_pool

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        cfg = SamplerConfig(meta_batch_size=5, micro_batch_size=4, strategy="hard")

        def build() -> CostAwareSampler:
            return CostAwareSampler(lognormal_pool(24, seed=3), cfg, world_size=WORLD, seed=17, support_repeats=2)

        def gathered_observations(plan, step: int) -> list:
            # each rank reports only its own tasks and passes, with rank-dependent "measurements"
            mine = plan.for_rank(rank)
            obs = [TaskObservation(task_id=s.task_id, step=step,
                                   query_loss=1.0 + 0.1 * ((s.task_id + rank + step) % 7))
                   for s in mine.slots]
            obs += [PassObservation(step=step, rank=rank, phase="support", index=i, features=p.features,
                                    seconds=0.01 * (1 + rank) * (1 + i))
                    for i, p in enumerate(mine.support)]
            everyone: list = [None] * WORLD
            dist.all_gather_object(everyone, [o.to_dict() for o in obs])
            return [observation_from_dict(o) for part in everyone for o in part]

        digests: list[list[str]] = []
        state = None
        with Prefetcher(build()) as pf:
            for step in range(STEPS):
                item = pf.get()
                both: list = [None] * WORLD
                dist.all_gather_object(both, item.plan.digest())
                digests.append(both)
                pf.observe(gathered_observations(item.plan, step))
                if step == 2:
                    state = json.dumps(pf.state_dict())
        resumed_digests = []
        with Prefetcher(build()) as pf:
            pf.load_state_dict(json.loads(state))
            for step in range(3, STEPS):
                item = pf.get()
                resumed_digests.append(item.plan.digest())
                pf.observe(gathered_observations(item.plan, step))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"digests": digests, "resumed": resumed_digests}))
    except BaseException:
        dist.destroy_process_group()
        raise
    exit_worker()  # not a plain return: see exit_worker


@pytest.mark.timeout(90)
def test_plans_identical_across_two_processes(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    digests = results[0]["digests"]
    assert len(digests) == STEPS
    for step, both in enumerate(digests):
        assert both[0] == both[1], f"ranks disagree at step {step}"
    assert len({both[0] for both in digests}) == STEPS  # plans do change from step to step
    for r in range(WORLD):
        assert results[r]["resumed"] == [d[0] for d in digests[3:]]
