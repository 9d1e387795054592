"""Turns a meta-batch of episodes into a packed :class:`MetaBatchPlan`: every pass on every rank
carries about the same tokens.

Why packing: under ZeRO-3 ranks meet at every pass, so a meta-step costs the sum over passes of
the slowest rank's pass. With one task per pass that sum is far above balanced time whenever the
tasks of a meta-batch differ in size, however tasks are dealt (see :mod:`fmmeta.sampling.one_task`).
Here a pass holds sequences of several tasks (the executor gives each row its own task's fast
adapter), so passes can be filled to one token budget and every rank runs equally full passes.

1. **Assignment.** A task's cost is its own work, unpadded: ``inner_steps`` x its support
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
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.lengths import gc_paused, set_lengths
from fmmeta.sampling.plan import DUMMY_PASS, MetaBatchPlan, PackedPass, RankPlan, TaskSlot
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
    heap = [(0.0, r) for r in range(world_size)]
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for i in np.argsort(-costs, kind="stable").tolist():
        load, r = heapq.heappop(heap)
        ranks[r].append(i)
        heapq.heappush(heap, (load + float(costs[i]), r))
    loads = np.array([costs[r].sum() if r else 0.0 for r in ranks])
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

    @classmethod
    def build(cls, members: list[list[int]], lengths: np.ndarray, offsets: np.ndarray,
              counts: np.ndarray, row_work: np.ndarray) -> "_Rows":
        """The rows of the sets ``members[r]`` (indices into ``offsets``/``counts``) of every rank."""
        sets = np.array([m for ms in members for m in ms], dtype=np.int64)
        set_rank = np.repeat(np.arange(len(members)), [len(ms) for ms in members])
        set_slot = np.concatenate([np.arange(len(ms)) for ms in members]) if sets.size else sets
        sizes = counts[sets]
        total = int(sizes.sum())
        owner = np.repeat(np.arange(sets.size), sizes)  # set (within `sets`) of each row
        example = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        idx = offsets[sets][owner] + example
        rank, slot, length = set_rank[owner], set_slot[owner], lengths[idx]
        order = np.lexsort((example, slot, -length, rank))
        rank = rank[order]
        ends = np.searchsorted(rank, np.arange(len(members)), side="right")
        return cls(rank, slot[order], example[order], length[order], row_work[idx][order], ends[rank])


def _pass_starts(rows: _Rows, budget: int, cap: float) -> np.ndarray:
    """Starts of every rank's passes when each pass takes, longest rows first, as many rows as
    fit in ``budget`` padded tokens and ``cap`` padded work: all ranks at once, by pointer jumps."""
    n = rows.length.size
    take = budget // rows.length
    if np.isfinite(cap):
        take = np.minimum(take, np.floor(cap / rows.work).astype(np.int64))
    nxt = np.minimum(np.arange(n) + np.maximum(take, 1), rows.end)
    pos = np.flatnonzero(np.r_[True, rows.rank[1:] != rows.rank[:-1]]) if n else np.empty(0, np.int64)
    limit = rows.end[pos]
    starts = [pos]
    while pos.size:
        pos = nxt[pos]
        alive = pos < limit
        pos, limit = pos[alive], limit[alive]
        starts.append(pos)
    return np.sort(np.concatenate(starts))


def _pass_table(rows: _Rows, starts: np.ndarray, n_ranks: int, cost_model: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """Per pass (in ``starts`` order): its rank and its cost."""
    sizes = np.diff(np.r_[starts, rows.length.size])
    width = rows.length[starts].astype(np.float64)
    a, b, c = cost_model.coefficients
    return rows.rank[starts], a + b * sizes * width + c * sizes * width * width


def _lockstep(pass_rank: np.ndarray, cost: np.ndarray, n_ranks: int) -> tuple[float, np.ndarray, int]:
    """Sum over pass indices of the most expensive pass, each rank's passes sorted by cost
    (costliest first: sorting every rank the same way minimises the sum of maxima). Returns the
    sum, each pass's index after sorting, and the pass count."""
    order = np.lexsort((-cost, pass_rank))
    counts = np.bincount(pass_rank, minlength=n_ranks)
    n_passes = max(1, int(counts.max(initial=0)))
    index = np.empty(cost.size, dtype=np.int64)
    index[order] = np.arange(cost.size) - np.repeat(np.cumsum(counts) - counts, counts)
    table = np.zeros((n_ranks, n_passes))
    table[pass_rank, index] = cost
    return float(table.max(axis=0).sum()), index, n_passes


# Cost caps tried per phase besides the token budget alone, as fractions of the heaviest rank's
# work over the fewest passes the budget allows: fewer, fuller passes pay less per-pass overhead;
# more, smaller passes pad less and split the work into finer, better aligned pieces.
_SPLITS = (1.0, 1.5, 2.0, 3.0)
_SLACKS = (1.0, 1.1, 1.25)


def _pack_phase(rows: _Rows, n_ranks: int, budget: int, cost_model: CostModel) -> list[tuple[PackedPass, ...]]:
    """Packs one phase of every rank into the same number of passes (see the module docstring)."""
    if rows.length.size == 0:
        return [(DUMMY_PASS,)] * n_ranks
    fewest = max(1, int(np.bincount(rows.rank[_pass_starts(rows, budget, np.inf)]).max()))
    heaviest = float(np.bincount(rows.rank, weights=rows.work, minlength=n_ranks).max())
    caps = [np.inf] + [heaviest / (fewest * split) * slack for split in _SPLITS for slack in _SLACKS]
    best: tuple[float, np.ndarray, np.ndarray, np.ndarray, int] | None = None
    for cap in caps:
        starts = _pass_starts(rows, budget, cap)
        pass_rank, cost = _pass_table(rows, starts, n_ranks, cost_model)
        total, index, n_passes = _lockstep(pass_rank, cost, n_ranks)
        if best is None or total < best[0]:
            best = (total, starts, pass_rank, index, n_passes)
    assert best is not None
    _, starts, pass_rank, index, n_passes = best
    return _materialise(rows, starts, pass_rank, index, n_passes, n_ranks)


def _materialise(rows: _Rows, starts: np.ndarray, pass_rank: np.ndarray, index: np.ndarray,
                 n_passes: int, n_ranks: int) -> list[tuple[PackedPass, ...]]:
    """The :class:`PackedPass` objects, each rank's in ``index`` order, dummies filling up."""
    n = rows.length.size
    pass_of_row = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, n]))
    # Rows of one task side by side inside a pass: the executor then finds single-task passes cheaply.
    order = np.lexsort((rows.example, rows.slot, pass_of_row))
    slot = rows.slot[order].tolist()
    example = rows.example[order].tolist()
    bounds = np.r_[starts, n].tolist()
    width = rows.length[starts].tolist()
    tokens = np.add.reduceat(rows.length, starts).tolist()
    table: list[list[PackedPass]] = [[DUMMY_PASS] * n_passes for _ in range(n_ranks)]
    for k, (r, i) in enumerate(zip(pass_rank.tolist(), index.tolist())):
        lo, hi = bounds[k], bounds[k + 1]
        table[r][i] = PackedPass(tuple(slot[lo:hi]), tuple(example[lo:hi]), width[k], tokens[k])
    return [tuple(t) for t in table]


def plan_meta_batch(
    episodes: Sequence[Episode],
    task_ids: Sequence[int],
    *,
    step: int,
    world_size: int,
    micro_batch_size: int,
    inner_steps: int,
    cost_model: CostModel,
    rng: np.random.Generator,
    tokens_per_pass: int | None = None,
    on_uneven: OnUneven = "pad",
    tol: float = 1e-3,
) -> MetaBatchPlan:
    """Builds the packed plan for one meta-step from the chosen episodes.

    Args:
        episodes: the meta-batch, one episode per chosen task.
        task_ids: pool index of each episode's task (stored in the slots).
        step: the meta-step.
        world_size: number of data-parallel ranks.
        micro_batch_size: with ``tokens_per_pass`` unset, the budget is ``micro_batch_size`` x the
            meta-batch's longest sequence (so a pass never holds more than one such batch).
        inner_steps: inner steps per task (weights the support cost).
        cost_model: prices sequences for the assignment.
        rng: shuffles the rank order (pass a generator derived from seed and step).
        tokens_per_pass: padded tokens per pass (peak activation memory follows it); a sequence
            longer than the budget gets a pass of its own.
        on_uneven: ``"error"`` refuses a meta-batch that does not divide by ``world_size``;
            ``"pad"`` lets ranks hold different task counts (packing keeps passes equal).
        tol: balance tolerance relative to ``total / ranks``.

    Raises:
        ValueError: for an empty meta-batch, mismatched lengths, bad sizes, or uneven counts with
            ``on_uneven="error"``.

    Example:
        >>> plan = plan_meta_batch(eps, ids, step=0, world_size=2, micro_batch_size=4,
        ...                        inner_steps=1, cost_model=CostModel(), rng=np.random.default_rng(0))
    """
    n = len(episodes)
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
    with gc_paused():
        return _plan(episodes, task_ids, step, world_size, micro_batch_size, inner_steps,
                     cost_model, rng, tokens_per_pass, tol)


def _plan(
    episodes: Sequence[Episode],
    task_ids: Sequence[int],
    step: int,
    world_size: int,
    micro_batch_size: int,
    inner_steps: int,
    cost_model: CostModel,
    rng: np.random.Generator,
    tokens_per_pass: int | None,
    tol: float,
) -> MetaBatchPlan:
    """:func:`plan_meta_batch` after its arguments are checked."""
    n = len(episodes)
    sets = [ep.support for ep in episodes] + [ep.query for ep in episodes]
    lengths, counts = set_lengths(sets)
    offsets = np.cumsum(counts) - counts
    row_work = _row_costs(lengths, cost_model)
    set_work = np.bincount(np.repeat(np.arange(2 * n), counts), weights=row_work, minlength=2 * n)
    task_cost = inner_steps * set_work[:n] + set_work[n:]
    budget = tokens_per_pass or micro_batch_size * int(lengths.max(initial=1))
    members = assign_tasks(task_cost, world_size, tol=tol)
    members = [members[r] for r in rng.permutation(world_size).tolist()]
    support = _pack_phase(_Rows.build(members, lengths, offsets, counts, row_work),
                          world_size, budget, cost_model)
    query = _pack_phase(_Rows.build([[n + i for i in m] for m in members], lengths, offsets, counts, row_work),
                        world_size, budget, cost_model)
    cost_list = task_cost.tolist()
    ranks = tuple(
        RankPlan(tuple(TaskSlot(episodes[i], int(task_ids[i]), cost_list[i]) for i in m), s, q)
        for m, s, q in zip(members, support, query)
    )
    return MetaBatchPlan(step=step, ranks=ranks, n_real_tasks=n)


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
        largest_task: the largest task's own work (no plan that keeps tasks whole beats it).
        rank_costs: every rank's cost.
    """

    padding_efficiency: float
    makespan: float
    lockstep: float
    lower_bound: float
    largest_task: float
    rank_costs: tuple[float, ...]

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


def plan_stats(plan: MetaBatchPlan, *, inner_steps: int, cost_model: CostModel) -> PlanStats:
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
    rank_costs = inner_steps * s_cost.sum(axis=1) + q_cost.sum(axis=1)
    lockstep = inner_steps * s_cost.max(axis=0).sum() + q_cost.max(axis=0).sum()
    _, b, c = cost_model.coefficients

    def own(examples: Sequence) -> float:
        lens = np.array([e.n_tokens for e in examples], dtype=np.float64)
        return float((b * lens + c * lens * lens).sum())

    task_work = [inner_steps * own(s.episode.support) + own(s.episode.query) for s in plan.slots]
    real = inner_steps * s_real + q_real
    padded = inner_steps * s_pad + q_pad
    return PlanStats(
        padding_efficiency=real / padded if padded else 1.0,
        makespan=float(rank_costs.max()),
        lockstep=float(lockstep),
        lower_bound=sum(task_work) / len(plan.ranks),
        largest_task=max(task_work, default=0.0),
        rank_costs=tuple(float(x) for x in rank_costs),
    )


__all__ = ["OnUneven", "PlanStats", "assign_tasks", "pass_cost", "plan_meta_batch", "plan_stats"]
