"""Sampler benchmark: fmmeta's plans (tasks per rank, rows across ranks, the sampler's choice)
against the plan before packing and two baselines, on two pools.

Usage: ``python benchmarks/sampler.py [--steps 150] [--seed 0]``. The last line of output is one
JSON object: per pool (``lognormal``, ``bimodal``) and per method the figures below, then the
planning times.

Pools (``fmmeta.sampling.synthetic``), 400 tasks each, micro-batch 4, 3 inner steps:

* ``lognormal``: per-task median length lognormal around 96 tokens (sigma 0.6), sequences
  lognormal around it (sigma 0.35), shots in {1, 2, 4, 8}, ways in {generation, 2, 3, 5};
* ``bimodal``: many short classification tasks (~64 tokens, 2/3/5 ways) and 1 in 8 long
  generation tasks (~640 tokens).

Every step, fmmeta's uniform strategy draws the meta-batch and ``CostAwareSampler`` plans it;
the same episodes are then planned by

* ``fmmeta``: the packed plan (tasks to ranks by work, passes packed to one token budget);
* ``fmmeta_rows``: rows across ranks (every rank holds every task; each phase's rows dealt to the
  ranks by length and cut into equal passes), its figures including the all-reduce of the
  stacked inner gradients per inner step (the default adapter, 460,800 floats per task, priced by
  the default cost model's ``r``);
* ``fmmeta_auto``: what ``CostAwareSampler`` runs with ``placement=auto``: per step, whichever
  of the two the cost model prices lower;
* ``fmmeta_one_task``: ``plan_one_task_per_pass``, the plan fmmeta made before packing;
* ``random``: tasks dealt to ranks in a random order (equal counts), each set cut into
  micro-batches in the order drawn, one task per pass;
* ``length_grouped``: each set ordered by transformers' ``get_length_grouped_indices`` (one
  megabatch per set: longest first) and cut into micro-batches, one task per pass; tasks dealt by
  an equal-count greedy deal (LPT in rounds plus swaps, ``one_task.assign_balanced``, on each
  task's cost) and each rank runs its tasks costliest first, so similar tasks share pass indices:
  the baseline's best honest configuration (round-robin dealing would handicap it).

Baselines run the dummy passes that keep ZeRO-3 ranks in lockstep (equal task counts, every task
padded to the meta-batch's largest chunk count), as any ZeRO-3 run must.

Figures, at 8 ranks x 8 tasks (suffix ``_8``) and x 2 tasks (``_2``), means over steps of
per-step ratios, all against ONE lower bound per step: ``LB = plan_stats(packed).lower_bound``,
every task's own unpadded work (no per-pass overhead) over the ranks, identical for every plan of
those episodes. Costs come from the default :class:`~fmmeta.sampling.cost.CostModel`.

* ``lockstep_over_lb``: sum over pass indices of the slowest rank's pass, over LB: the meta-step
  under ZeRO-3, where ranks meet at every pass;
* ``makespan_over_lb``: the most loaded rank's total, over LB: the meta-step where ranks run
  independently (local, ZeRO-0/1/2);
* ``lockstep_over_lb_p95``: the 95th percentile over steps of ``lockstep_over_lb``;
* ``lockstep_over_makespan``: what lockstep costs on top of per-rank balance;
* ``padding_efficiency``: real tokens / processed tokens (padding and dummy passes included);
* ``largest_task_over_lb`` (per pool and size): ``max(1, largest task / LB)``, the floor: a plan
  that keeps every task on one rank cannot get ``makespan_over_lb`` (nor lockstep) below it;
* ``adjacent_length_corr``: lag-1 correlation of the meta-batch's mean task length over 2 x steps
  of each method's own selection stream (fmmeta's uniform strategy; i.i.d. uniform draws for
  ``random``; transformers' length-grouped ordering of the pool for ``length_grouped``).
  fmmeta's other plans share fmmeta's stream.

``plan_ms`` / ``plan_cpu_ms``: median wall / process-CPU ms of ``plan_meta_batch`` for 64 ranks
x 32 tasks (``--plan-ranks``, ``--plan-tasks-per-rank``) of a lognormal pool of as many tasks with the example lengths cached (the steady state of training);
``plan_cold_ms`` / ``plan_cold_cpu_ms`` with the length cache cleared first; ``plan_cpu_ms_bimodal``
the warm CPU figure on the bimodal pool; ``plan_rows_cpu_ms`` of ``plan_rows_across_ranks`` and
``plan_auto_cpu_ms`` of ``plan_placed`` (both placements priced, the cheaper built: the sampler's cost per step
with more than one rank); ``sample_ms`` the whole ``CostAwareSampler.sample`` (selection, drawing
2,048 episodes, planning both ways). On a shared machine wall time includes waiting for a
core: the CPU figures are the ones to compare.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks.one_task` from any folder

from benchmarks.one_task import assign_balanced, plan_one_task_per_pass  # noqa: E402
from fmmeta.sampling.cost import CostModel  # noqa: E402
from fmmeta.sampling.lengths import LENGTHS  # noqa: E402
from fmmeta.sampling.plan import (  # noqa: E402
    DUMMY_PASS,
    MetaBatchPlan,
    PackedPass,
    RankPlan,
    TaskSlot,
)
from fmmeta.sampling.planner import plan_meta_batch, plan_stats  # noqa: E402
from fmmeta.sampling.rows_plan import plan_placed, plan_rows_across_ranks  # noqa: E402
from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig  # noqa: E402
from fmmeta.sampling.synthetic import SyntheticTask, bimodal_pool, lognormal_pool  # noqa: E402
from fmmeta.tasks.episode import Episode  # noqa: E402

try:  # transformers 5 keeps it in trainer_pt_utils; other versions may move it
    from transformers.trainer_pt_utils import get_length_grouped_indices
except ImportError:  # pragma: no cover - depends on the installed transformers
    get_length_grouped_indices = None

WORLD = 8
MICRO_BATCH = 4
SUPPORT_REPEATS = 3
ADAPTER_NUMEL = 460_800  # the default LoRA on SmolLM2-135M: one task's fast weights
METHODS = ("fmmeta", "fmmeta_rows", "fmmeta_auto", "fmmeta_one_task", "random", "length_grouped")


def _sorted_desc(lengths: Sequence[float], batch_size: int, gen: torch.Generator) -> list[int]:
    """Length-grouped order of one megabatch (transformers' function where importable)."""
    if get_length_grouped_indices is not None:
        mult = max(1, math.ceil(len(lengths) / batch_size))
        return list(get_length_grouped_indices(list(lengths), batch_size, mega_batch_mult=mult, generator=gen))
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    return sorted(perm, key=lambda i: lengths[i], reverse=True)


def _chunk_passes(local: int, order: list[int], examples: Sequence, k: int) -> list[PackedPass]:
    """One task's set cut into consecutive micro-batches of ``order``, dummy passes up to ``k``."""
    out = []
    for i in range(0, len(order), MICRO_BATCH):
        idx = order[i : i + MICRO_BATCH]
        lens = [examples[j].n_tokens for j in idx]
        out.append(PackedPass((local,) * len(idx), tuple(idx), max(lens), sum(lens)))
    return out + [DUMMY_PASS] * (k - len(out))


def _baseline_plan(
    episodes: list[Episode],
    ids: list[int],
    step: int,
    deal: Callable[[np.ndarray], list[list[int]]],
    order_set: Callable[[list[int]], list[int]],
    cost_model: CostModel,
) -> MetaBatchPlan:
    """One task per pass: ``order_set`` orders each set, ``deal`` (task costs -> each rank's
    tasks, in run order) places the tasks; every task padded to the largest chunk counts."""
    k_s = max(-(-len(e.support) // MICRO_BATCH) for e in episodes)
    k_q = max(-(-len(e.query) // MICRO_BATCH) for e in episodes)
    orders = [(order_set([x.n_tokens for x in e.support]), order_set([x.n_tokens for x in e.query]))
              for e in episodes]

    def cost(i: int) -> float:
        ep, (s, q) = episodes[i], orders[i]
        price = lambda p: float(np.dot(p.features, cost_model.coefficients))
        return (SUPPORT_REPEATS * sum(map(price, _chunk_passes(0, s, ep.support, k_s)))
                + sum(map(price, _chunk_passes(0, q, ep.query, k_q))))

    costs = np.array([cost(i) for i in range(len(episodes))])
    ranks = []
    for members in deal(costs):
        slots = tuple(TaskSlot(episodes[i], ids[i], float(costs[i])) for i in members)
        support: list[PackedPass] = []
        query: list[PackedPass] = []
        for local, i in enumerate(members):
            support += _chunk_passes(local, orders[i][0], episodes[i].support, k_s)
            query += _chunk_passes(local, orders[i][1], episodes[i].query, k_q)
        ranks.append(RankPlan(slots, tuple(support), tuple(query)))
    return MetaBatchPlan(step=step, ranks=tuple(ranks), n_real_tasks=len(episodes))


def _placement(pool: list[SyntheticTask], tasks_per_rank: int, steps: int, seed: int) -> dict:
    cm = CostModel()
    cfg = SamplerConfig(meta_batch_size=WORLD * tasks_per_rank, micro_batch_size=MICRO_BATCH, placement="tasks")
    sampler = CostAwareSampler(pool, cfg, world_size=WORLD, seed=seed, support_repeats=SUPPORT_REPEATS)
    rng = np.random.default_rng([seed, 99])
    gen = torch.Generator().manual_seed(seed)

    def random_deal(costs: np.ndarray) -> list[list[int]]:
        return rng.permutation(costs.size).reshape(WORLD, tasks_per_rank).tolist()

    def greedy_deal(costs: np.ndarray) -> list[list[int]]:
        assign = assign_balanced(costs, WORLD)
        return [sorted(row, key=lambda i: -costs[i]) for row in assign.tolist()]

    def drawn_order(lengths: list[int]) -> list[int]:
        return list(range(len(lengths)))  # episodes are drawn in random order already

    def grouped_order(lengths: list[int]) -> list[int]:
        return _sorted_desc(lengths, MICRO_BATCH, gen)

    keys = ("lockstep_over_lb", "makespan_over_lb", "lockstep_over_makespan", "rows_chosen", "real", "padded")
    acc = {m: {k: [] for k in keys} for m in METHODS}
    floor = []
    for step in range(steps):
        packed = sampler.sample(step)
        eps = [s.episode for s in packed.slots]
        ids = [s.task_id for s in packed.slots]
        budget = MICRO_BATCH * max(x.n_tokens for e in eps for x in (*e.support, *e.query))
        placed = {"rng": np.random.default_rng([seed, step, 1]), "step": step, "world_size": WORLD}
        plans = {
            "fmmeta": packed,
            "fmmeta_rows": plan_rows_across_ranks(eps, ids, budget=budget, cost_model=cm, **placed),
            "fmmeta_auto": plan_placed(eps, ids, micro_batch_size=MICRO_BATCH, support_repeats=SUPPORT_REPEATS,
                                       cost_model=cm, fast_weight_numel=ADAPTER_NUMEL, **placed),
            "fmmeta_one_task": plan_one_task_per_pass(
                eps, ids, step=step, world_size=WORLD, micro_batch_size=MICRO_BATCH, support_repeats=SUPPORT_REPEATS,
                cost_model=cm, rng=np.random.default_rng([seed, step])),
            "random": _baseline_plan(eps, ids, step, random_deal, drawn_order, cm),
            "length_grouped": _baseline_plan(eps, ids, step, greedy_deal, grouped_order, cm),
        }
        lb = plan_stats(packed, support_repeats=SUPPORT_REPEATS, cost_model=cm)
        floor.append(max(1.0, lb.largest_task / lb.lower_bound))
        for method, p in plans.items():
            st = plan_stats(p, support_repeats=SUPPORT_REPEATS, cost_model=cm)
            reduce = SUPPORT_REPEATS * cm.reduce_cost(p.n_real_tasks * ADAPTER_NUMEL) if p.placement == "rows" else 0.0
            a = acc[method]
            a["lockstep_over_lb"].append((st.lockstep + reduce) / lb.lower_bound)
            a["makespan_over_lb"].append((st.makespan + reduce) / lb.lower_bound)
            a["lockstep_over_makespan"].append((st.lockstep + reduce) / (st.makespan + reduce))
            a["rows_chosen"].append(float(p.placement == "rows"))
            real, padded = _tokens(p)
            a["real"].append(real)
            a["padded"].append(padded)
    out = {m: {k: float(np.mean(a[k])) for k in keys[:4]} for m, a in acc.items()}
    for m, a in acc.items():
        out[m]["padding_efficiency"] = float(np.sum(a["real"]) / np.sum(a["padded"]))
        out[m]["lockstep_over_lb_p95"] = float(np.percentile(a["lockstep_over_lb"], 95))
    out["largest_task_over_lb"] = float(np.mean(floor))
    return out


def _tokens(plan: MetaBatchPlan) -> tuple[float, float]:
    """Real and processed tokens (padding and dummy passes included), support x inner steps."""
    real = padded = 0.0
    for r in plan.ranks:
        for passes, w in ((r.support, SUPPORT_REPEATS), (r.query, 1)):
            real += w * sum(p.n_tokens for p in passes)
            padded += w * sum(p.n_padded_tokens for p in passes)
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
    c = _adjacent_corr(fm)
    return {"fmmeta": c, "fmmeta_rows": c, "fmmeta_auto": c, "fmmeta_one_task": c, "random": _adjacent_corr(rnd),
            "length_grouped": _adjacent_corr(lg)}


def _plan_ms(pool: list[SyntheticTask], seed: int, repeats: int, ranks: int, per_rank: int) -> dict[str, float]:
    """Median ms to plan ``ranks`` x ``per_rank`` given episodes (wall, CPU; warm and cold length
    cache; and the rows and auto plans, warm).

    ``sampler.sample`` plans the same episodes first, as training does step after step with the
    task layer's cached examples, so the timed call finds their lengths cached ("warm"). The
    "cold" timing clears that cache first: the cost of the very first step, or of a task layer
    that makes new example objects for every episode.
    """
    cfg = SamplerConfig(meta_batch_size=ranks * per_rank, micro_batch_size=MICRO_BATCH)
    sampler = CostAwareSampler(pool, cfg, world_size=ranks, seed=seed, support_repeats=SUPPORT_REPEATS,
                               fast_weight_numel=ADAPTER_NUMEL)
    times: dict[str, list[float]] = {k: [] for k in ("wall", "cpu", "cold_wall", "cold_cpu", "sample",
                                                      "rows_cpu", "auto_cpu")}
    for step in range(repeats):
        t0 = time.perf_counter()
        plan = sampler.sample(step)
        times["sample"].append((time.perf_counter() - t0) * 1e3)
        eps, ids = [s.episode for s in plan.slots], [s.task_id for s in plan.slots]
        common = {"step": step, "world_size": ranks, "cost_model": sampler.cost_model,
                  "rng": np.random.default_rng([seed, step])}
        budget = MICRO_BATCH * max(x.n_tokens for e in eps for x in (*e.support, *e.query))
        def tasks() -> object:
            return plan_meta_batch(eps, ids, micro_batch_size=MICRO_BATCH, support_repeats=SUPPORT_REPEATS, **common)

        timed = {
            "": tasks,
            "cold_": tasks,  # with the length cache cleared just before
            "rows_": lambda: plan_rows_across_ranks(eps, ids, budget=budget, **common),
            "auto_": lambda: plan_placed(eps, ids, micro_batch_size=MICRO_BATCH, support_repeats=SUPPORT_REPEATS,
                                         fast_weight_numel=ADAPTER_NUMEL, **common),
        }
        for prefix, run in timed.items():
            if prefix == "cold_":
                LENGTHS.clear()
            t0, c0 = time.perf_counter(), time.process_time()
            run()
            if prefix in ("", "cold_"):
                times[prefix + "wall"].append((time.perf_counter() - t0) * 1e3)
            times[prefix + "cpu"].append((time.process_time() - c0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="meta-steps per pool and size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=400, help="pool size")
    parser.add_argument("--plan-repeats", type=int, default=15)
    parser.add_argument("--plan-ranks", type=int, default=64, help="ranks of the plan-time case")
    parser.add_argument("--plan-tasks-per-rank", type=int, default=32, help="tasks per rank of the plan-time case")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pools = {"lognormal": lognormal_pool(args.tasks, seed=args.seed),
             "bimodal": bimodal_pool(args.tasks, seed=args.seed)}
    result: dict = {}
    for name, pool in pools.items():
        at8 = _placement(pool, 8, args.steps, args.seed)
        at2 = _placement(pool, 2, args.steps, args.seed + 1)
        corr = _selection_corr(pool, 2 * args.steps, args.seed)
        res: dict = {}
        for m in METHODS:
            res[m] = {}
            for key in ("lockstep_over_lb", "makespan_over_lb", "lockstep_over_makespan", "padding_efficiency",
                        "lockstep_over_lb_p95", "rows_chosen"):
                res[m][f"{key}_8"] = round(at8[m][key], 4)
                res[m][f"{key}_2"] = round(at2[m][key], 4)
            res[m]["adjacent_length_corr"] = round(corr[m], 4)
            print(f"{name:>9} {m:>15}: " + ", ".join(f"{k}={v}" for k, v in res[m].items()), file=sys.stderr)
        res["largest_task_over_lb_8"] = round(at8["largest_task_over_lb"], 4)
        res["largest_task_over_lb_2"] = round(at2["largest_task_over_lb"], 4)
        result[name] = res
    n_plan = args.plan_ranks * args.plan_tasks_per_rank  # a pool with at least as many tasks
    plan_case = (args.seed, args.plan_repeats, args.plan_ranks, args.plan_tasks_per_rank)
    timing = _plan_ms(lognormal_pool(max(args.tasks, n_plan), seed=args.seed), *plan_case)
    result["plan_ms"] = round(timing["wall"], 2)
    result["plan_cpu_ms"] = round(timing["cpu"], 2)
    result["plan_cold_ms"] = round(timing["cold_wall"], 2)
    result["plan_cold_cpu_ms"] = round(timing["cold_cpu"], 2)
    result["plan_rows_cpu_ms"] = round(timing["rows_cpu"], 2)
    result["plan_auto_cpu_ms"] = round(timing["auto_cpu"], 2)
    result["sample_ms"] = round(timing["sample"], 2)
    result["plan_cpu_ms_bimodal"] = round(_plan_ms(bimodal_pool(max(args.tasks, n_plan), seed=args.seed),
                                                   *plan_case)["cpu"], 2)
    result["setup"] = {"tasks": args.tasks, "steps": args.steps, "ranks": WORLD, "micro_batch": MICRO_BATCH,
                       "support_repeats": SUPPORT_REPEATS, "plan_ranks": args.plan_ranks,
                       "plan_tasks_per_rank": args.plan_tasks_per_rank, "adapter_numel": ADAPTER_NUMEL,
                       "cost_r": CostModel().r}
    result["length_grouped_source"] = (
        "transformers.trainer_pt_utils.get_length_grouped_indices" if get_length_grouped_indices else "fallback sort"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
