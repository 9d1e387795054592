"""Turns a meta-batch of episodes into a packed :class:`MetaBatchPlan`: every pass on every rank
carries about the same tokens.

Why packing: under ZeRO-3 ranks meet at every pass, so a meta-step costs the sum over passes of
the slowest rank's pass. With one task per pass that sum is far above balanced time whenever the
tasks of a meta-batch differ in size, however tasks are dealt (see ``benchmarks/one_task.py``).
Here a pass holds sequences of several tasks (the executor gives each row its own task's fast
adapter), so passes can be filled to one token budget and every rank runs equally full passes.

1. **Assignment.** A task's cost is its own work, unpadded: ``support_repeats`` x its support
   sequences plus its query sequences, each priced ``b * len + c * len^2`` by the cost model.
   Tasks go to ranks by LPT (largest first, to the least loaded rank), then single-task moves from
   the most to the least loaded rank while they lower the maximum. Task counts per rank may
   differ; only pass counts must match. A task is never split across ranks (its inner loop needs
   its whole support gradient at every step), so a task larger than ``total / ranks`` bounds the
   balance from below.
2. **Packing.** Each phase (support, query) is packed on its own. A rank's rows are sorted
   longest first; the pass count ``P`` is the most passes any rank needs when greedily filling
   passes to ``tokens_per_pass`` padded tokens. Every rank then cuts its sorted rows into at
   most ``P`` contiguous passes (dummy passes fill up) whose largest padded work is as small as
   the budget allows, so a rank's passes cost about the same and similar lengths share a pass
   (little padding); balanced ranks then make every pass index cost about the same everywhere.

Rank order is shuffled with the caller's generator, so which rank gets the heavy work is not
predictable from the step. The plan is a pure function of its inputs: every rank computes the same.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
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
)
from fmmeta.sampling.sorting import lex_order
from fmmeta.tasks.episode import Episode

OnUneven = Literal["pad", "error"]


def _row_costs(lengths: np.ndarray, cost_model: CostModel) -> np.ndarray:
    """Unpadded cost of each sequence: its share of a pass's token and attention terms."""
    lens = lengths.astype(np.float64)
    _, b, c = cost_model.coefficients
    return b * lens + c * lens * lens


def assign_tasks(costs: np.ndarray, world_size: int, *, tol: float = 1e-3) -> list[list[int]]:
    """Splits tasks over ranks (counts free) with a small maximum rank cost.

    LPT, then moves of one task from the most to the least loaded rank while the maximum drops by
    more than ``tol`` of the lower bound ``total / world_size``.

    Returns:
        ``world_size`` lists of task indices, each sorted.
    """
    costs = np.asarray(costs, dtype=np.float64)
    heap = [(0.0, r) for r in range(world_size)]
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    replace = heapq.heapreplace
    # (load, rank) is a total order, so popping the least loaded rank picks what heappop would.
    for i, c in zip(np.argsort(-costs, kind="stable").tolist(), (-np.sort(-costs, kind="stable")).tolist()):
        load, r = heap[0]
        ranks[r].append(i)
        replace(heap, (load + c, r))
    owner = np.empty(costs.size, dtype=np.int64)
    for r, members in enumerate(ranks):
        owner[members] = r
    loads = np.bincount(owner, weights=costs, minlength=world_size)
    bound = costs.sum() / world_size * tol
    for _ in range(4 * world_size):
        hi, lo = int(loads.argmax()), int(loads.argmin())
        gap = loads[hi] - loads[lo]
        if gap <= bound or not ranks[hi]:
            break
        # Moving cost x gives max(load_hi - x, load_lo + x): best near x = gap / 2, must be < gap.
        cand = costs[ranks[hi]]
        j = int(np.argmin(np.abs(cand - gap / 2)))
        if not cand[j] < gap - bound:
            break
        task = ranks[hi].pop(j)
        ranks[lo].append(task)
        loads[hi] -= costs[task]
        loads[lo] += costs[task]
    return [sorted(r) for r in ranks]


@dataclass
class _Rows:
    """Every rank's rows of one phase in one table, sorted by rank, then longest first."""

    rank: np.ndarray  # rank of each row
    slot: np.ndarray  # the row's task, as an index into its rank's slots
    example: np.ndarray  # index into that task's set
    length: np.ndarray
    work: np.ndarray  # cost of the row padded to itself: b * len + c * len^2
    end: np.ndarray  # per row, the end of its rank's rows (exclusive)
    first: np.ndarray  # per rank that has rows, its first row (ascending)

    @classmethod
    def build(cls, members: list[list[int]], lengths: np.ndarray, offsets: np.ndarray,
              counts: np.ndarray, row_work: np.ndarray) -> _Rows:
        """The rows of the sets ``members[r]`` (indices into ``offsets``/``counts``) of every rank."""
        per_rank = np.fromiter(map(len, members), dtype=np.int64, count=len(members))
        sets = np.fromiter(itertools.chain.from_iterable(members), dtype=np.int64, count=int(per_rank.sum()))
        set_rank = np.repeat(np.arange(len(members)), per_rank)
        set_slot = np.arange(sets.size) - np.repeat(np.cumsum(per_rank) - per_rank, per_rank)
        sizes = counts[sets]
        total = int(sizes.sum())
        owner = np.repeat(np.arange(sets.size), sizes)  # set (within `sets`) of each row
        example = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        idx = offsets[sets][owner] + example
        rank, length = set_rank[owner], lengths[idx]
        # Rows are made in (rank, slot, example) order, so a stable order by (rank, longest
        # first) sorts them like a lexsort on (rank, -length, slot, example).
        order = lex_order(-length, rank)
        rank = rank[order]
        counts_r = np.bincount(rank, minlength=len(members))
        ends = np.cumsum(counts_r)
        first = (ends - counts_r)[counts_r > 0]
        return cls(rank, set_slot[owner][order], example[order], length[order], row_work[idx][order],
                   ends[rank], first)


# Cost caps tried per phase besides the token budget alone, as fractions of the heaviest rank's
# work over the fewest passes the budget allows: fewer, fuller passes pay less per-pass overhead;
# more, smaller passes pad less and split the work into finer, better aligned pieces. (Each of
# them is the best choice for some meta-batches of the lognormal and the bimodal pools.)
_SPLITS = (1.0, 1.5, 2.0, 3.0)
_SLACKS = (1.0, 1.1, 1.25)


@dataclass
class _Passes:
    """The passes of several candidate packings at once, sorted by (candidate, rank, start).

    A *chain* is one rank's passes under one candidate cap: chain ``k`` is candidate
    ``k // n`` on the ``k % n``-th rank that has rows (``n`` such ranks).
    """

    chain: np.ndarray
    start: np.ndarray  # first row of each pass
    size: np.ndarray  # rows of each pass


def _cut(rows: _Rows, budget_take: np.ndarray, caps: np.ndarray) -> _Passes:
    """Every rank's passes for every cap in ``caps``, all at once by pointer jumps: a pass that
    starts at a row takes, longest rows first, as many rows as fit in the token budget
    (``budget_take`` of that row) and in the cap's padded work."""
    first = rows.first
    n = first.size
    pos = np.tile(first, caps.size)
    limit = np.tile(rows.end[first], caps.size)
    cap = np.repeat(caps, n)
    chain = np.arange(pos.size)
    got_pos, got_chain = [pos], [chain]
    while pos.size:
        with np.errstate(divide="ignore", invalid="ignore"):
            # fmin: a NaN cap (a zero-work cost model) leaves the budget alone.
            take = np.floor(np.fmin(budget_take[pos], cap / rows.work[pos]))
        nxt = pos + np.maximum(take, 1.0).astype(np.int64)
        alive = nxt < limit
        pos, limit, cap, chain = nxt[alive], limit[alive], cap[alive], chain[alive]
        got_pos.append(pos)
        got_chain.append(chain)
    start = np.concatenate(got_pos)
    chain = np.concatenate(got_chain)
    # Each jump appends chains in ascending order, so a stable sort by chain alone puts every
    # chain's passes in row order (a radix sort where chain ids fit 16 bits).
    key = chain.astype(np.int16) if int(chain.max(initial=0)) < 1 << 15 else chain
    order = np.argsort(key, kind="stable")
    start, chain = start[order], chain[order]
    nxt = np.empty_like(start)
    nxt[:-1] = start[1:]
    last = np.r_[chain[1:] != chain[:-1], True]
    nxt[last] = rows.end[start[last]]
    return _Passes(chain, start, nxt - start)


def _lockstep_all(rows: _Rows, passes: _Passes, n_caps: int, cost_model: CostModel
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per cap, the sum over pass indices of the most expensive pass, each rank's passes sorted
    by cost (costliest first: sorting every rank the same way minimises the sum of maxima).

    Only sorted *values* are needed here, so each cap's ranks x passes table is sorted row by
    row (no index sort, no tie-breaking); :func:`_pass_order` orders the chosen cap's passes.
    Returns the totals (one per cap) and every pass's cost."""
    n = rows.first.size
    width = rows.length[passes.start].astype(np.float64)
    a, b, c = cost_model.coefficients
    cost = a + b * passes.size * width + c * passes.size * width * width
    counts = np.bincount(passes.chain, minlength=n_caps * n)
    begin = np.cumsum(counts) - counts
    pos = np.arange(cost.size) - begin[passes.chain]  # passes are sorted by chain
    bounds = np.r_[begin[::n], cost.size].tolist()
    widest = counts.reshape(n_caps, n).max(axis=1).tolist()
    totals = np.empty(n_caps)
    for k in range(n_caps):
        lo, hi = bounds[k], bounds[k + 1]
        table = np.zeros((n, max(1, widest[k])))  # costs are >= 0: an empty cell never wins a max
        table[passes.chain[lo:hi] - k * n, pos[lo:hi]] = cost[lo:hi]
        table.sort(axis=1)
        totals[k] = table.max(axis=0).sum()
    return totals, cost


def _pass_order(chain: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Each pass's index within its chain once every chain is sorted costliest first (ties in
    row order: a stable sort, so every CPU orders them alike)."""
    order = np.lexsort((-cost, chain))
    counts = np.bincount(chain)
    index = np.empty(cost.size, dtype=np.int64)
    index[order] = np.arange(cost.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return index


@dataclass
class _PhaseCut:
    """One phase's chosen passes, as row runs (``rows`` is None for a phase without rows)."""

    rows: _Rows | None
    start: np.ndarray
    size: np.ndarray
    index: np.ndarray
    n_passes: int
    price: float  # the sum over pass indices of the costliest rank's pass

    def passes(self, n_ranks: int) -> list[tuple[PackedPass, ...]]:
        """Every rank's :class:`PackedPass` objects (dummies filling up)."""
        if self.rows is None:
            return [(DUMMY_PASS,)] * n_ranks
        return _materialise(self.rows, self.start, self.size, self.rows.rank[self.start], self.index,
                            self.n_passes, n_ranks)


def _pack_phase(rows: _Rows, n_ranks: int, budget: int, cost_model: CostModel) -> _PhaseCut:
    """Packs one phase of every rank into the same number of passes (see the module docstring).

    Every candidate cap is cut and priced at once (two :func:`_cut` calls: the budget alone,
    which sets the caps, then all caps); the cheapest under lockstep is kept."""
    if rows.length.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return _PhaseCut(None, empty, empty, empty, 1, cost_model.dummy_pass_cost)
    budget_take = (budget // rows.length).astype(np.float64)
    plain = _cut(rows, budget_take, np.array([np.inf]))
    fewest = max(1, int(np.bincount(plain.chain).max()))
    heaviest = float(np.bincount(rows.rank, weights=rows.work, minlength=n_ranks).max())
    caps = np.array([heaviest / (fewest * split) * slack for split in _SPLITS for slack in _SLACKS])
    capped = _cut(rows, budget_take, caps)
    both = _Passes(np.concatenate([plain.chain, capped.chain + rows.first.size]),
                   np.concatenate([plain.start, capped.start]), np.concatenate([plain.size, capped.size]))
    totals, cost = _lockstep_all(rows, both, caps.size + 1, cost_model)
    best = int(np.argmin(totals))  # the first of equal totals, the budget alone before any cap
    pick = both.chain // rows.first.size == best
    start, size = both.start[pick], both.size[pick]
    index = _pass_order(both.chain[pick], cost[pick])
    n_passes = max(1, int(index.max(initial=0)) + 1)
    return _PhaseCut(rows, start, size, index, n_passes, float(totals[best]))


def _materialise(rows: _Rows, start: np.ndarray, size: np.ndarray, pass_rank: np.ndarray,
                 index: np.ndarray, n_passes: int, n_ranks: int) -> list[tuple[PackedPass, ...]]:
    """The :class:`PackedPass` objects, each rank's in ``index`` order, dummies filling up.

    ``start`` must be ascending (passes in row order); the tuples are cut from two flat tuples
    and the objects made by C-level ``map`` chains (a 64 x 32 plan has ~1,300 passes)."""
    pass_of_row = np.repeat(np.arange(start.size), size)
    # Rows of one task side by side inside a pass: the executor then finds single-task passes cheaply.
    order = lex_order(rows.example, rows.slot, pass_of_row)
    slot = tuple(rows.slot[order].tolist())
    example = tuple(rows.example[order].tolist())
    lo = start.tolist()
    hi = (start + size).tolist()
    made = _make_many(PackedPass, list(map(slot.__getitem__, map(slice, lo, hi))),
                      list(map(example.__getitem__, map(slice, lo, hi))),
                      rows.length[start].tolist(), np.add.reduceat(rows.length, start).tolist())
    table = [DUMMY_PASS] * (n_ranks * n_passes)
    for k, p in zip((pass_rank * n_passes + index).tolist(), made):
        table[k] = p
    return [tuple(table[r * n_passes:(r + 1) * n_passes]) for r in range(n_ranks)]


def plan_meta_batch(
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
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> MetaBatchPlan:
    """Builds the packed plan for one meta-step from the chosen episodes.

    Args:
        episodes: the meta-batch, one episode per chosen task.
        task_ids: pool index of each episode's task (stored in the slots).
        step: the meta-step.
        world_size: number of data-parallel ranks.
        micro_batch_size: with ``tokens_per_pass`` unset, the budget is ``micro_batch_size`` x the
            meta-batch's longest sequence (so a pass never holds more than one such batch).
        support_repeats: how often each support pass runs (the algorithm's inner steps; weights
            the support cost).
        cost_model: prices sequences for the assignment.
        rng: shuffles the rank order (pass a generator derived from seed and step).
        tokens_per_pass: padded tokens per pass (peak activation memory follows it); a sequence
            longer than the budget gets a pass of its own.
        on_uneven: ``"error"`` refuses a meta-batch that does not divide by ``world_size``;
            ``"pad"`` lets ranks hold different task counts (packing keeps passes equal).
        tol: balance tolerance relative to ``total / ranks``.
        lengths: the :func:`~fmmeta.sampling.lengths.set_lengths` of the episodes' support sets
            then query sets, when the caller has them already.

    Raises:
        ValueError: for an empty meta-batch, mismatched lengths, bad sizes, or uneven counts with
            ``on_uneven="error"``.

    Example:
        >>> plan = plan_meta_batch(eps, ids, step=0, world_size=2, micro_batch_size=4,
        ...                        support_repeats=1, cost_model=CostModel(), rng=np.random.default_rng(0))
    """
    _check_arguments(len(episodes), task_ids, world_size, micro_batch_size, tokens_per_pass, on_uneven)
    with gc_paused():
        return _plan(episodes, task_ids, step, world_size, micro_batch_size, support_repeats,
                     cost_model, rng, tokens_per_pass, tol, lengths).build()


def _check_arguments(n: int, task_ids: Sequence[int], world_size: int, micro_batch_size: int,
                     tokens_per_pass: int | None, on_uneven: str) -> None:
    """Raises :func:`plan_meta_batch`'s errors for a meta-batch of ``n`` episodes."""
    if n == 0:
        raise ValueError("plan_meta_batch() got no episodes: meta_batch_size must be >= 1")
    if len(task_ids) != n:
        raise ValueError(f"got {n} episodes but {len(task_ids)} task_ids; pass one id per episode")
    if world_size < 1:
        raise ValueError(f"world_size={world_size} is invalid: must be >= 1")
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} is invalid: must be >= 1")
    if tokens_per_pass is not None and tokens_per_pass < 1:
        raise ValueError(f"tokens_per_pass={tokens_per_pass} is invalid: must be >= 1, or None")
    if on_uneven not in ("pad", "error"):
        raise ValueError(f"on_uneven={on_uneven!r} is invalid: allowed 'pad' or 'error'")
    if n % world_size and on_uneven == "error":
        raise ValueError(
            f"meta_batch_size={n} does not divide by world_size={world_size} and "
            f"on_uneven='error'; use a multiple of {world_size} or on_uneven='pad' "
            "(ranks then hold different task counts)"
        )


def _plan(
    episodes: Sequence[Episode],
    task_ids: Sequence[int],
    step: int,
    world_size: int,
    micro_batch_size: int,
    support_repeats: int,
    cost_model: CostModel,
    rng: np.random.Generator,
    tokens_per_pass: int | None,
    tol: float,
    known: tuple[np.ndarray, np.ndarray] | None,
) -> PricedPlan:
    """:func:`plan_meta_batch` after its arguments are checked, priced before it is built."""
    n = len(episodes)
    lengths, counts = known or set_lengths([ep.support for ep in episodes] + [ep.query for ep in episodes])
    offsets = np.cumsum(counts) - counts
    row_work = _row_costs(lengths, cost_model)
    set_work = np.bincount(np.repeat(np.arange(2 * n), counts), weights=row_work, minlength=2 * n)
    task_cost = support_repeats * set_work[:n] + set_work[n:]
    budget = tokens_per_pass or micro_batch_size * int(lengths.max(initial=1))
    members = assign_tasks(task_cost, world_size, tol=tol)
    members = [members[r] for r in rng.permutation(world_size).tolist()]
    support = _pack_phase(_Rows.build(members, lengths, offsets, counts, row_work),
                          world_size, budget, cost_model)
    query = _pack_phase(_Rows.build([[n + i for i in m] for m in members], lengths, offsets, counts, row_work),
                        world_size, budget, cost_model)

    def build() -> MetaBatchPlan:
        # One C-level map makes every slot; each rank then takes its members' objects.
        every = _make_many(TaskSlot, episodes, list(map(int, task_ids)), task_cost.tolist())
        ranks = tuple(RankPlan(tuple(map(every.__getitem__, m)), s, q)
                      for m, s, q in zip(members, support.passes(world_size), query.passes(world_size)))
        return MetaBatchPlan(step=step, ranks=ranks, n_real_tasks=n)

    return PricedPlan(support.price, query.price, build)


@dataclass(frozen=True)
class PlanStats:
    """How good a plan is, under both regimes that run it.

    Attributes:
        padding_efficiency: real tokens / processed tokens (padding and dummy passes included).
        makespan: the most loaded rank's total cost: what a meta-step costs where ranks run
            their passes independently (local, ZeRO-0/1/2).
        lockstep: sum over passes of the slowest rank's pass: what it costs under ZeRO-3.
        lower_bound: ``total / ranks``, the total being every task's own unpadded work with no
            per-pass overhead; the same for any plan of the same meta-batch.
        largest_task: the largest task's own work (no plan that keeps tasks whole beats it;
            rows across ranks can).
        rank_costs: every rank's cost.
        placement: the plan's placement (``"tasks"`` or ``"rows"``).
        predicted: the planner's price of each placement it weighed (``MetaBatchPlan.predicted``).
    """

    padding_efficiency: float
    makespan: float
    lockstep: float
    lower_bound: float
    largest_task: float
    rank_costs: tuple[float, ...]
    placement: str = "tasks"
    predicted: tuple[tuple[str, float], ...] = ()

    @property
    def makespan_over_lb(self) -> float:
        """Balance of per-rank totals: 1.0 is perfect."""
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0

    @property
    def lockstep_over_lb(self) -> float:
        """Balance under ZeRO-3's per-pass lockstep: 1.0 is perfect."""
        return self.lockstep / self.lower_bound if self.lower_bound > 0 else 1.0


def pass_cost(p: PackedPass, cost_model: CostModel) -> float:
    """Cost of one pass (padding included)."""
    return float(np.dot(p.features, cost_model.coefficients))


def plan_stats(plan: MetaBatchPlan, *, support_repeats: int, cost_model: CostModel) -> PlanStats:
    """Measures a plan's padding efficiency, per-rank and lockstep cost under ``cost_model``."""
    coef = np.array(cost_model.coefficients)

    def phase(attr: str) -> tuple[np.ndarray, float, float]:
        feats = np.array([[p.features for p in getattr(r, attr)] for r in plan.ranks])  # R x P x 3
        cost = feats @ coef if feats.size else np.zeros((len(plan.ranks), 0))
        real = sum(p.n_tokens for r in plan.ranks for p in getattr(r, attr))
        padded = sum(p.n_padded_tokens for r in plan.ranks for p in getattr(r, attr))
        return cost, float(real), float(padded)

    s_cost, s_real, s_pad = phase("support")
    q_cost, q_real, q_pad = phase("query")
    rank_costs = support_repeats * s_cost.sum(axis=1) + q_cost.sum(axis=1)
    lockstep = support_repeats * s_cost.max(axis=0).sum() + q_cost.max(axis=0).sum()
    _, b, c = cost_model.coefficients

    def own(examples: Sequence) -> float:
        lens = np.array([e.n_tokens for e in examples], dtype=np.float64)
        return float((b * lens + c * lens * lens).sum())

    task_work = [support_repeats * own(s.episode.support) + own(s.episode.query) for s in plan.slots]
    real = support_repeats * s_real + q_real
    padded = support_repeats * s_pad + q_pad
    return PlanStats(
        padding_efficiency=real / padded if padded else 1.0,
        makespan=float(rank_costs.max()),
        lockstep=float(lockstep),
        lower_bound=sum(task_work) / len(plan.ranks),
        largest_task=max(task_work, default=0.0),
        rank_costs=tuple(float(x) for x in rank_costs),
        placement=plan.placement,
        predicted=tuple(sorted(plan.predicted.items())),
    )


__all__ = ["OnUneven", "PlanStats", "assign_tasks", "pass_cost", "plan_meta_batch", "plan_stats"]
