"""Sampler benchmark: fmmeta's planner against two baselines on one heterogeneous task pool.

Usage: ``python benchmarks/sampler.py [--steps 200] [--seed 0]``. The last line of output is one
JSON object keyed ``fmmeta``, ``random`` and ``length_grouped`` plus a top-level ``plan_ms``.

Pool: 400 synthetic tasks (``fmmeta.sampling.synthetic.lognormal_pool``): per-task median length
lognormal around 96 tokens (sigma 0.6), sequence lengths lognormal around it (sigma 0.35),
shots in {1, 2, 4, 8}, ways in {generation, 2, 3, 5}; micro-batch 4, 3 inner steps.

Placement (padding, balance) is compared on the *same* episodes: each step, fmmeta's uniform
strategy draws the meta-batch, and

* ``fmmeta`` plans it (length-sorted chunks filling the plan's pass count, LPT + swaps);
* ``random`` deals the tasks to ranks in a random order (equal counts) and cuts each set into
  micro-batches in the order drawn;
* ``length_grouped`` orders the tasks with transformers' ``get_length_grouped_indices`` (the
  whole meta-batch as one megabatch, so sorted longest first) and deals them round-robin; each
  set is cut into micro-batches in the order the same function gives it (one megabatch per set,
  its best case).

Baselines get the dummy passes that keep ranks in lockstep (equal task counts, equal chunk counts),
as any ZeRO-3 run must. ``adjacent_length_corr`` is measured on each method's own *selection*
stream over 400 steps: fmmeta's uniform strategy, i.i.d. uniform draws for ``random``, and
transformers' length-grouped ordering of the pool (epoch after epoch) for ``length_grouped``.

Costs come from the default :class:`~fmmeta.sampling.cost.CostModel`. ``makespan_over_lb_T`` is
the most loaded rank's cost over ``LB = max(total / ranks, largest task)`` at 8 ranks and ``T``
tasks per rank, averaged over steps; ``..._equal_count_T`` divides by the tighter bound that also
counts the ``T - 1`` cheapest other tasks the rank holding the largest task must run, and
``equal_count_floor_T`` is that bound over LB, averaged: no assignment with equal task counts
can get ``makespan_over_lb_T`` below it on this pool.

``plan_ms`` / ``plan_cpu_ms`` time planning with the example lengths already cached (the steady
state of training); ``plan_cold_ms`` / ``plan_cold_cpu_ms`` with the length cache cleared first.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Callable, Sequence

import numpy as np
import torch

from fmmeta.sampling.cost import CostModel, slot_features
from fmmeta.sampling.plan import MetaBatchPlan, TaskSlot
from fmmeta.sampling.planner import _LENGTHS, plan_meta_batch, plan_stats
from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig
from fmmeta.sampling.synthetic import SyntheticTask, lognormal_pool
from fmmeta.tasks.episode import Episode

try:  # transformers 5 keeps it in trainer_pt_utils; older/newer versions may move it
    from transformers.trainer_pt_utils import get_length_grouped_indices
except ImportError:  # pragma: no cover - depends on the installed transformers
    get_length_grouped_indices = None

WORLD = 8
MICRO_BATCH = 4
INNER_STEPS = 3


def _sorted_desc(lengths: Sequence[int], batch_size: int, gen: torch.Generator) -> list[int]:
    """Length-grouped order of one megabatch (transformers' function where importable)."""
    if get_length_grouped_indices is not None:
        mult = max(1, math.ceil(len(lengths) / batch_size))
        return list(get_length_grouped_indices(list(lengths), batch_size, mega_batch_mult=mult, generator=gen))
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    return sorted(perm, key=lambda i: lengths[i], reverse=True)


def _fixed_chunks(order: list[int], k: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive micro-batches of ``order``, padded with dummy chunks to ``k``."""
    got = tuple(tuple(order[i : i + MICRO_BATCH]) for i in range(0, len(order), MICRO_BATCH))
    return got + ((),) * (k - len(got))


def _baseline_plan(
    episodes: list[Episode],
    ids: list[int],
    step: int,
    deal: Callable[[list[Episode]], list[list[int]]],
    order_set: Callable[[list[int]], list[int]],
    cost_model: CostModel,
) -> MetaBatchPlan:
    k_s = max(-(-len(e.support) // MICRO_BATCH) for e in episodes)
    k_q = max(-(-len(e.query) // MICRO_BATCH) for e in episodes)
    slots = []
    for ep, tid in zip(episodes, ids):
        s = _fixed_chunks(order_set([x.n_tokens for x in ep.support]), k_s)
        q = _fixed_chunks(order_set([x.n_tokens for x in ep.query]), k_q)
        slot = TaskSlot(ep, 1.0, s, q, 0.0, tid)
        slots.append(TaskSlot(ep, 1.0, s, q, cost_model.slot_cost(slot, inner_steps=INNER_STEPS), tid))
    ranks = deal(episodes)
    return MetaBatchPlan(step=step, ranks=tuple(tuple(slots[i] for i in r) for r in ranks), n_real_tasks=len(slots))


def _tight_lb(plan: MetaBatchPlan, lb: float) -> float:
    costs = sorted(s.cost for r in plan.ranks for s in r)
    t = len(plan.ranks[0])
    return max(lb, costs[-1] + sum(costs[: t - 1]))


def _placement(pool: list[SyntheticTask], tasks_per_rank: int, steps: int, seed: int) -> dict[str, dict[str, float]]:
    cm = CostModel()
    cfg = SamplerConfig(meta_batch_size=WORLD * tasks_per_rank, micro_batch_size=MICRO_BATCH, inner_steps=INNER_STEPS)
    sampler = CostAwareSampler(pool, cfg, world_size=WORLD, seed=seed)
    rng = np.random.default_rng([seed, 99])
    gen = torch.Generator().manual_seed(seed)

    def random_deal(eps: list[Episode]) -> list[list[int]]:
        return rng.permutation(len(eps)).reshape(tasks_per_rank, WORLD).T.tolist()

    def grouped_deal(eps: list[Episode]) -> list[list[int]]:
        tokens = [sum(x.n_tokens for x in e.support) * INNER_STEPS + sum(x.n_tokens for x in e.query) for e in eps]
        order = _sorted_desc(tokens, WORLD, gen)
        return [order[r::WORLD] for r in range(WORLD)]

    def random_order(lengths: list[int]) -> list[int]:
        return list(range(len(lengths)))  # episodes are drawn in random order already

    def grouped_order(lengths: list[int]) -> list[int]:
        return _sorted_desc(lengths, MICRO_BATCH, gen)

    acc = {m: {"real": 0.0, "padded": 0.0, "ratio": [], "tight": [], "floor": []} for m in ("fmmeta", "random", "length_grouped")}
    for step in range(steps):
        plan = sampler.sample(step)
        real_slots = [s for r in plan.ranks for s in r if not s.is_dummy]
        eps = [s.episode for s in real_slots]
        ids = [s.task_id for s in real_slots]
        plans = {
            "fmmeta": plan,
            "random": _baseline_plan(eps, ids, step, random_deal, random_order, cm),
            "length_grouped": _baseline_plan(eps, ids, step, grouped_deal, grouped_order, cm),
        }
        for method, p in plans.items():
            st = plan_stats(p, inner_steps=INNER_STEPS, cost_model=cm)
            a = acc[method]
            real, padded = _tokens(p)
            a["real"] += real
            a["padded"] += padded
            a["ratio"].append(st.makespan_over_lb)
            a["tight"].append(st.makespan / _tight_lb(p, st.lower_bound))
            a["floor"].append(_tight_lb(p, st.lower_bound) / st.lower_bound)
    return {
        m: {
            "padding_efficiency": a["real"] / a["padded"],
            "makespan_over_lb": float(np.mean(a["ratio"])),
            "makespan_over_lb_equal_count": float(np.mean(a["tight"])),
            "makespan_over_lb_p95": float(np.percentile(a["ratio"], 95)),
            "lb_floor": float(np.mean(a["floor"])),
        }
        for m, a in acc.items()
    }


def _tokens(plan: MetaBatchPlan) -> tuple[float, float]:
    """Real and processed (padding and dummy passes included) tokens of a plan."""
    real = padded = 0.0
    for r in plan.ranks:
        for s in r:
            _, pad, _, rl = slot_features(s, inner_steps=INNER_STEPS)
            real += rl
            padded += pad
    return real, padded


def _mean_length(pool: list[SyntheticTask], ids: Sequence[int]) -> float:
    return float(np.mean([np.mean(pool[i].lengths) for i in ids]))


def _adjacent_corr(means: list[float]) -> float:
    m = np.array(means)
    return float(np.corrcoef(m[:-1], m[1:])[0, 1])


def _selection_corr(pool: list[SyntheticTask], steps: int, seed: int) -> dict[str, float]:
    n = WORLD * 8
    sampler = CostAwareSampler(pool, SamplerConfig(meta_batch_size=n), world_size=WORLD, seed=seed)
    fm = [_mean_length(pool, sampler.select(s)) for s in range(steps)]
    rng = np.random.default_rng([seed, 7])
    rnd = [_mean_length(pool, rng.choice(len(pool), n, replace=False)) for _ in range(steps)]
    gen = torch.Generator().manual_seed(seed)
    task_len = [float(np.mean(t.lengths)) for t in pool]
    stream: list[int] = []
    while len(stream) < steps * n:
        if get_length_grouped_indices is not None:
            stream.extend(get_length_grouped_indices(task_len, n, generator=gen))
        else:
            stream.extend(_sorted_desc(task_len, n, gen))
    lg = [_mean_length(pool, stream[s * n : (s + 1) * n]) for s in range(steps)]
    return {"fmmeta": _adjacent_corr(fm), "random": _adjacent_corr(rnd), "length_grouped": _adjacent_corr(lg)}


def _plan_ms(pool: list[SyntheticTask], seed: int, repeats: int) -> dict[str, float]:
    """Median ms to plan 64 ranks x 32 given episodes (wall, CPU; warm and cold length cache).

    ``sampler.sample`` plans the same episodes first, as training does step after step with the
    task layer's cached examples, so the timed call finds their lengths cached ("warm"). The
    "cold" timing clears that cache first: the cost of the very first step, or of a task layer
    that makes new example objects for every episode.
    """
    cfg = SamplerConfig(meta_batch_size=64 * 32, micro_batch_size=MICRO_BATCH, inner_steps=INNER_STEPS)
    sampler = CostAwareSampler(pool, cfg, world_size=64, seed=seed)
    times: dict[str, list[float]] = {k: [] for k in ("wall", "cpu", "cold_wall", "cold_cpu", "sample")}
    for step in range(repeats):
        t0 = time.perf_counter()
        plan = sampler.sample(step)
        times["sample"].append((time.perf_counter() - t0) * 1e3)
        slots = [s for r in plan.ranks for s in r if not s.is_dummy]
        eps, ids = [s.episode for s in slots], [s.task_id for s in slots]
        for prefix in ("", "cold_"):
            if prefix:
                _LENGTHS.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            plan_meta_batch(
                eps, ids, step=step, world_size=64, micro_batch_size=MICRO_BATCH, inner_steps=INNER_STEPS,
                cost_model=sampler.cost_model, rng=np.random.default_rng([seed, step]),
            )
            times[prefix + "wall"].append((time.perf_counter() - t0) * 1e3)
            times[prefix + "cpu"].append((time.process_time() - c0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="meta-steps per configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=400, help="pool size")
    parser.add_argument("--plan-repeats", type=int, default=15)
    parser.add_argument("--shots", default="1,2,4,8", help="shots per class to draw from")
    parser.add_argument("--ways", default="gen,2,3,5", help="ways to draw from (gen = generation task)")
    parser.add_argument("--task-sigma", type=float, default=0.6, help="spread of task median lengths")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pool = lognormal_pool(
        args.tasks,
        seed=args.seed,
        task_sigma=args.task_sigma,
        shots_choices=tuple(int(x) for x in args.shots.split(",")),
        ways_choices=tuple(None if x == "gen" else int(x) for x in args.ways.split(",")),
    )
    at8 = _placement(pool, 8, args.steps, args.seed)
    at2 = _placement(pool, 2, args.steps, args.seed + 1)
    corr = _selection_corr(pool, 2 * args.steps, args.seed)
    timing = _plan_ms(pool, args.seed, args.plan_repeats)
    result: dict = {}
    for m in ("fmmeta", "random", "length_grouped"):
        result[m] = {
            "padding_efficiency": round(at8[m]["padding_efficiency"], 4),
            "padding_efficiency_2": round(at2[m]["padding_efficiency"], 4),
            "makespan_over_lb_8": round(at8[m]["makespan_over_lb"], 4),
            "makespan_over_lb_2": round(at2[m]["makespan_over_lb"], 4),
            "makespan_over_lb_equal_count_8": round(at8[m]["makespan_over_lb_equal_count"], 4),
            "makespan_over_lb_equal_count_2": round(at2[m]["makespan_over_lb_equal_count"], 4),
            "makespan_over_lb_p95_8": round(at8[m]["makespan_over_lb_p95"], 4),
            "equal_count_floor_8": round(at8[m]["lb_floor"], 4),
            "equal_count_floor_2": round(at2[m]["lb_floor"], 4),
            "adjacent_length_corr": round(corr[m], 4),
        }
        print(f"{m:>15}: " + ", ".join(f"{k}={v}" for k, v in result[m].items()), file=sys.stderr)
    result["plan_ms"] = round(timing["wall"], 2)
    result["plan_cpu_ms"] = round(timing["cpu"], 2)
    result["plan_cold_ms"] = round(timing["cold_wall"], 2)
    result["plan_cold_cpu_ms"] = round(timing["cold_cpu"], 2)
    result["sample_ms"] = round(timing["sample"], 2)
    result["pool"] = {"tasks": args.tasks, "shots": args.shots, "ways": args.ways, "task_sigma": args.task_sigma}
    result["length_grouped_source"] = (
        "transformers.trainer_pt_utils.get_length_grouped_indices" if get_length_grouped_indices else "fallback sort"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
