"""Rows across ranks: every rank adapts every task of the meta-batch, on a share of its rows.

Why. Under ZeRO-3 ranks meet at every pass, so a meta-step costs the sum over pass indices of
the slowest rank's pass. A plan that keeps each task on one rank (:mod:`fmmeta.sampling.planner`)
cannot beat its largest task: with 2 tasks per rank, one long generation task leaves every
other rank waiting. But a task's inner gradient is a *sum over its support rows*. If every rank
holds the fast weights of every task (``T`` stacked adapter copies), any rank can run any row,
and rows can be dealt by tokens alone: the ranks add their partial inner gradients with one
all-reduce per inner step, and every rank applies the same update to every task's fast weights.
The query phase and the outer step need nothing extra: the meta-gradient is a sum over query
rows, and the outer step's all-reduce already adds the ranks.

The plan, per phase (support, query): every row of every task, sorted longest first, is dealt
pass by pass. In pass ``g`` each rank takes the next run of rows up to the same cost, the pass's
share of the work left; a run pays its first row's width. So a rank that takes one long row
runs beside ranks that take many short ones at the same cost, and every pass index costs about
the same on every rank (within one row), however unevenly the lengths fall. The fewest passes the
token budget allows are preferred, because each pass has a fixed overhead. A rank left without a
row in the last pass runs a dummy pass.

What it costs (:func:`plan_cost`): the passes under lockstep, plus per inner step one
all-reduce of the stacked inner gradients (``T`` x the adapter's floats), priced by
:meth:`~fmmeta.sampling.cost.CostModel.reduce_cost`. Memory: ``T`` fast-weight copies on every
rank (three times that with an Adam inner loop, for its moments).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.lengths import gc_paused, set_lengths
from fmmeta.sampling.plan import (
    DUMMY_PASS,
    MetaBatchPlan,
    PackedPass,
    PricedPlan,
    RankPlan,
    TaskSlot,
    _make_many,
    bucket_widths,
)
from fmmeta.sampling.planner import OnUneven, _check_arguments, _plan
from fmmeta.sampling.sorting import lex_order
from fmmeta.tasks.episode import Episode

__all__ = ["PLACEMENTS", "PlacementChoice", "fast_weight_megabytes", "plan_placed",
           "plan_cost", "plan_rows_across_ranks"]

PlacementChoice = Literal["auto", "tasks", "rows"]
PLACEMENTS = ("auto", "tasks", "rows")


def _aligned_cut(width: np.ndarray, world_size: int, budget: int,
                 cost_model: CostModel) -> tuple[np.ndarray, np.ndarray, float]:
    """Deals rows sorted longest first (``width[i]``: row ``i``'s tokens) to passes and seats so
    that every pass index costs about the same on every seat; returns each row's pass, each row's
    seat and the passes' lockstep price (the sum over passes of the costliest seat's pass).

    Pass by pass, the seats take consecutive runs of the sorted rows, each run priced at its first
    (longest) row's width, up to one target: the pass's share of the remaining work, and never
    less than the next row alone. So where one seat runs a single long row, the others run many
    short ones of the same cost, and a long row no longer leaves the other ranks waiting. A run
    stops either below the target or nearest to it, aiming at the fewest passes the token budget
    allows or one more (each pass has a fixed overhead, but more passes cut closer): all four
    variants are priced and the cheapest is kept (a tie keeps the first, fewest passes below)."""
    a, b, c = cost_model.coefficients
    w = width.astype(np.float64)
    per = b * w + c * w * w
    left = np.r_[np.cumsum(per[::-1])[::-1], 0.0].tolist()  # the work from row i on
    per_row, fits = per.tolist(), np.maximum(1, budget // np.maximum(width, 1)).tolist()
    fewest = -(-int(width.sum()) // (world_size * budget))
    n, dummy = width.size, cost_model.dummy_pass_cost
    best: tuple[float, list[int]] | None = None
    for extra in (0, 1):
        for half in (0.0, 0.5):
            starts: list[int] = []  # where each run starts, seat by seat; -1 ends a pass
            total, i, g = 0.0, 0, 0
            while i < n:
                target = max(per_row[i], left[i] / (world_size * max(1, fewest + extra - g)))
                costliest = dummy
                for _ in range(world_size):  # plain arithmetic, no calls: a 64 x 32 plan runs ~5,000
                    if i == n:
                        break
                    row = per_row[i]
                    k = int(target / row + half) if row > 0 else n
                    k = fits[i] if k > fits[i] else k if k > 1 else 1
                    k = n - i if k > n - i else k
                    starts.append(i)
                    if a + k * row > costliest:
                        costliest = a + k * row
                    i += k
                starts.append(-1)
                total += costliest
                g += 1
            if best is None or total < best[0]:
                best = (total, starts)
    assert best is not None
    total, marked = best
    runs = np.array(marked, dtype=np.int64)
    is_end = runs < 0
    position = np.arange(runs.size)
    seat = position - np.maximum.accumulate(np.where(is_end, position, -1)) - 1  # runs since its pass began
    pass_index = np.cumsum(is_end, dtype=np.int64) - is_end  # passes ended before it
    sizes = np.diff(np.r_[runs[~is_end], n])
    return np.repeat(pass_index[~is_end], sizes), np.repeat(seat[~is_end], sizes), total


def _deal_phase(lengths: np.ndarray, counts: np.ndarray, world_size: int, budget: int,
                rank_order: np.ndarray, cost_model: CostModel
                ) -> tuple[float, Callable[[], list[tuple[PackedPass, ...]]]]:
    """One phase's lockstep price and the maker of its passes for every rank: every row of every
    task, longest first, dealt by :func:`_aligned_cut`, so pass ``g`` costs about the same on
    every rank. A rank without rows in the last pass runs a dummy pass there."""
    total = int(counts.sum())
    if total == 0:
        return cost_model.dummy_pass_cost, lambda: [(DUMMY_PASS,)] * world_size
    order = lex_order(-lengths)  # longest first; ties in (task, example) order
    pass_of, seat_of, price = _aligned_cut(lengths[order], world_size, budget, cost_model)
    return price, lambda: _make_passes(lengths, counts, world_size, rank_order, order, pass_of, seat_of)


def _make_passes(lengths: np.ndarray, counts: np.ndarray, world_size: int, rank_order: np.ndarray,
                 order: np.ndarray, pass_of: np.ndarray, seat_of: np.ndarray) -> list[tuple[PackedPass, ...]]:
    """The :class:`PackedPass` objects of a deal (row ``order[i]`` in pass ``pass_of[i]`` on seat
    ``seat_of[i]``), each rank's in pass order, dummies filling up."""
    total = int(counts.sum())
    slot = np.repeat(np.arange(counts.size), counts)
    example = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    n_passes = int(pass_of[-1]) + 1
    pass_id = np.empty(total, dtype=np.int64)
    pass_id[order] = pass_of * world_size + rank_order[seat_of]
    by_pass = lex_order(pass_id)  # a pass's rows in (task, example) order
    pid = pass_id[by_pass]
    slot, example, length = slot[by_pass], example[by_pass], lengths[by_pass]
    cut = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])
    slots_t, examples_t = tuple(slot.tolist()), tuple(example.tolist())
    lo, hi = cut.tolist(), np.r_[cut[1:], total].tolist()
    made = _make_many(PackedPass, list(map(slots_t.__getitem__, map(slice, lo, hi))),
                      list(map(examples_t.__getitem__, map(slice, lo, hi))),
                      np.maximum.reduceat(length, cut).tolist(), np.add.reduceat(length, cut).tolist())
    table = [DUMMY_PASS] * (world_size * n_passes)
    for k, p in zip(pid[cut].tolist(), made):
        g, r = divmod(k, world_size)
        table[r * n_passes + g] = p
    return [tuple(table[r * n_passes:(r + 1) * n_passes]) for r in range(world_size)]


def plan_rows_across_ranks(
    episodes: Sequence[Episode],
    task_ids: Sequence[int],
    *,
    step: int,
    world_size: int,
    budget: int,
    cost_model: CostModel,
    rng: np.random.Generator,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> MetaBatchPlan:
    """The rows-across-ranks plan of one meta-batch (see the module docstring).

    Args:
        episodes: the meta-batch, one episode per task; every rank holds all of them.
        task_ids: pool index of each episode's task.
        step: the meta-step.
        world_size: data-parallel ranks.
        budget: padded tokens per pass (a row longer than it gets a pass of its own).
        cost_model: prices the candidate packings.
        rng: shuffles which rank takes each lap's longest row.
        lengths: the :func:`~fmmeta.sampling.lengths.set_lengths` of the episodes' support sets
            then query sets, when the caller has them already.
    """
    return _rows_plan(episodes, task_ids, step, world_size, budget, cost_model, rng, lengths).build()


def _rows_plan(episodes: Sequence[Episode], task_ids: Sequence[int], step: int, world_size: int, budget: int,
               cost_model: CostModel, rng: np.random.Generator,
               lengths: tuple[np.ndarray, np.ndarray] | None) -> PricedPlan:
    """:func:`plan_rows_across_ranks`, priced before it is built."""
    n = len(episodes)
    flat, counts = lengths or set_lengths([ep.support for ep in episodes] + [ep.query for ep in episodes])
    split = int(counts[:n].sum())
    rank_order = rng.permutation(world_size)
    s_price, support = _deal_phase(flat[:split], counts[:n], world_size, budget, rank_order, cost_model)
    q_price, query = _deal_phase(flat[split:], counts[n:], world_size, budget, rank_order, cost_model)

    def build() -> MetaBatchPlan:
        slots = tuple(_make_many(TaskSlot, list(episodes), list(map(int, task_ids)), [0.0] * n))
        ranks = tuple(RankPlan(slots, s, q, shared=True) for s, q in zip(support(), query()))
        return MetaBatchPlan(step=step, ranks=ranks, n_real_tasks=n, placement="rows")

    return PricedPlan(s_price, q_price, build)


def plan_placed(
    episodes: Sequence[Episode],
    task_ids: Sequence[int],
    *,
    step: int,
    world_size: int,
    micro_batch_size: int,
    support_repeats: int,
    cost_model: CostModel,
    rng: np.random.Generator,
    tokens_per_pass: int | None = None,
    on_uneven: OnUneven = "pad",
    tol: float = 1e-3,
    placement: PlacementChoice = "auto",
    fast_weight_numel: int = 0,
    lockstep: bool = True,
    length_buckets: Sequence[int] = (),
) -> MetaBatchPlan:
    """The meta-batch's plan under ``placement``: :func:`~fmmeta.sampling.planner.plan_meta_batch`
    (``"tasks"``), :func:`plan_rows_across_ranks` (``"rows"``), or with ``"auto"`` both, and the
    one the cost model prices lower (ties: ``"tasks"``, which needs no collective inside the inner
    loop), with the prices of the plans weighed in ``plan.predicted`` (a forced ``"rows"`` weighs
    only that one). Under ``lockstep`` the planners' own prices decide and only the chosen plan's
    objects are made; otherwise per-rank totals need both plans built. One rank always plans
    ``"tasks"``.

    Args:
        fast_weight_numel: floats of one task's fast weights (the adapter's size; 0 for methods
            that adapt nothing), for pricing the rows placement's all-reduces.
        lockstep: price plans as ZeRO-3 runs them (ranks meet at every pass); ``False`` for
            engines whose ranks meet only at collectives (local, ZeRO-0/1/2).
        length_buckets: plan (pack, budget, price) every row at its bucket width, the width it
            will run at (``sampler.length_buckets``; the sampler then records them on the plan).
        (the others: as :func:`~fmmeta.sampling.planner.plan_meta_batch`, which checks them.)
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r} is invalid: allowed {', '.join(PLACEMENTS)}")
    priced: dict[str, PricedPlan] = {}
    with gc_paused():  # one collection afterwards for the plan's objects
        known = set_lengths([ep.support for ep in episodes] + [ep.query for ep in episodes])
        known = (bucket_widths(known[0], length_buckets), known[1])
        if world_size == 1 or placement != "rows":
            _check_arguments(len(episodes), task_ids, world_size, micro_batch_size, tokens_per_pass, on_uneven)
            priced["tasks"] = _plan(episodes, task_ids, step, world_size, micro_batch_size, support_repeats,
                                    cost_model, rng, tokens_per_pass, tol, known)
            if world_size == 1 or placement == "tasks":
                return priced["tasks"].build()
        budget = tokens_per_pass or micro_batch_size * int(known[0].max(initial=1))
        priced["rows"] = _rows_plan(episodes, task_ids, step, world_size, budget, cost_model, rng, known)
        # Under lockstep the planners' own prices decide and only the chosen plan is built;
        # per-rank totals (ranks meeting less often) need the plans built.
        built: dict[str, MetaBatchPlan] = {}
        if lockstep:
            reduce = _inner_reduce_price(len(episodes), support_repeats, cost_model, fast_weight_numel)
            predicted = {name: p.price(support_repeats) + (reduce if name == "rows" else 0.0)
                         for name, p in priced.items()}
        else:
            built = {name: p.build() for name, p in priced.items()}
            predicted = {name: plan_cost(p, support_repeats=support_repeats, cost_model=cost_model,
                                         fast_weight_numel=fast_weight_numel, lockstep=False)
                         for name, p in built.items()}
        name = min(predicted, key=predicted.__getitem__)  # a tie keeps "tasks", listed first
        chosen = built[name] if name in built else priced[name].build()
    return dataclasses.replace(chosen, predicted=predicted)


def plan_cost(plan: MetaBatchPlan, *, support_repeats: int, cost_model: CostModel,
              fast_weight_numel: int, lockstep: bool = True) -> float:
    """A plan's predicted price: its passes (:meth:`MetaBatchPlan.compute_cost`), plus for rows
    across ranks :func:`_inner_reduce_price`."""
    passes = plan.compute_cost(cost_model, support_repeats=support_repeats, lockstep=lockstep)
    if plan.placement != "rows" or len(plan.ranks) == 1:
        return passes
    return passes + _inner_reduce_price(plan.n_real_tasks, support_repeats, cost_model, fast_weight_numel)


def _inner_reduce_price(n_tasks: int, support_repeats: int, cost_model: CostModel, fast_weight_numel: int) -> float:
    """What rows across ranks adds to its passes: ``support_repeats`` all-reduces of every task's inner
    gradient (``n_tasks x fast_weight_numel`` floats)."""
    return support_repeats * cost_model.reduce_cost(n_tasks * fast_weight_numel)


def fast_weight_megabytes(n_tasks: int, fast_weight_numel: int, *, adam: bool = False,
                          bytes_per_float: int = 4) -> float:
    """Memory of the stacked fast weights every rank holds with rows across ranks (MiB): the
    weights, their gradient, and Adam's two moments for an Adam inner loop."""
    copies = 2 + (2 if adam else 0)
    return n_tasks * fast_weight_numel * bytes_per_float * copies / 2**20
