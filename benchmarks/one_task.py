"""One task per pass: the plan fmmeta made before packing, kept as the baseline packing is measured against.

Not part of the library (training plans with :mod:`fmmeta.sampling.planner`): the benchmarks
(``benchmarks/sampler.py``, ``benchmarks/zero3_step.py``) and the planner's tests import it as
``benchmarks.one_task`` from the repository root.

Every rank gets the same number of tasks and every task the same number of support and query
chunks (``K = max ceil(n / micro_batch_size)`` over the meta-batch), so pass counts match
across ranks; each pass carries one task's chunk. Under ZeRO-3's lockstep this costs the sum
over passes of the slowest rank's pass, and tasks of one meta-batch differ by 10x in size, so no
assignment with one task per pass gets close to balanced time on a heterogeneous pool. The
packed planner (:mod:`fmmeta.sampling.planner`) replaces it for training; benchmarks and tests
use this one as the plan before packing and as a reference.

1. **Chunking (padding).** A task with fewer sequences than ``K`` chunks spreads them over
   ``min(K, n)`` chunks: sorted by length (longest first) and cut into contiguous groups, either
   of as-equal-as-possible size or full groups at the short end and singletons at the long end
   (isolates a long outlier), whichever the cost model prices lower for that set.
2. **Assignment (balance).** Slots are dealt by LPT in rounds (one slot per rank per round, so
   counts stay equal), then pairwise swaps between the most loaded rank and any other rank lower
   the makespan until it is within ``tol`` of ``LB = max(total / ranks, largest slot)``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fmmeta.sampling.cost import CostModel
from fmmeta.sampling.lengths import gc_paused, set_lengths
from fmmeta.sampling.plan import (
    DUMMY_PASS,
    MetaBatchPlan,
    PackedPass,
    RankPlan,
    TaskSlot,
)
from fmmeta.tasks.episode import Episode


@dataclass
class _Chunking:
    """Chunks of every set: python tuples for the plan, numpy stats for the cost."""

    chunks: list[tuple[tuple[int, ...], ...]]
    n_chunks: np.ndarray  # K of every set
    real_cost: np.ndarray  # per set: cost of its real chunks
    n_dummy: np.ndarray  # per set: dummy chunks


def _chunk_tuples(local: np.ndarray, bounds: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """The index tuple of every chunk, equal tuples built once and shared.

    ``local[bounds[i]:bounds[i + 1]]`` is chunk ``i``. A 64 x 32 plan has ~19k chunks but only
    ~3k distinct ones (small sets give the same few permutations), and every tuple made costs an
    allocation plus a garbage-collector visit. Each chunk is packed into one int64 code (its
    indices in fixed-width bit fields, plus its size) so numpy finds the distinct ones; where the
    code would not fit in 63 bits (huge micro-batches or sets) every chunk is built directly.
    Tuples are immutable, so sharing is invisible to callers.
    """
    total = local.size
    sizes = np.diff(np.append(bounds, total))
    flat = tuple(local.tolist())
    bits = max(1, int(local.max()).bit_length())
    size_bits = int(sizes.max()).bit_length()
    if int(sizes.max()) * bits + size_bits > 63:
        ends = bounds + sizes
        return tuple(map(flat.__getitem__, map(slice, bounds.tolist(), ends.tolist())))
    chunk_of = np.repeat(np.arange(bounds.size), sizes)
    shift = (np.arange(total) - bounds[chunk_of]) * bits + size_bits
    codes = np.add.reduceat(local << shift, bounds) | sizes
    # np.unique without its stable sort: any member of a group of equal codes will do.
    perm = codes.argsort()
    sorted_codes = codes[perm]
    is_new = np.empty(codes.size, dtype=bool)
    is_new[0] = True
    np.not_equal(sorted_codes[1:], sorted_codes[:-1], out=is_new[1:])
    inverse = np.empty(codes.size, dtype=np.int64)
    inverse[perm] = np.cumsum(is_new) - 1
    first = perm[is_new]
    starts = bounds[first]
    made = list(map(flat.__getitem__, map(slice, starts.tolist(), (starts + sizes[first]).tolist())))
    return tuple(map(made.__getitem__, inverse.tolist()))


def chunk_sets(
    sets: Sequence[Sequence],
    *,
    micro_batch_size: int,
    cost_model: CostModel,
    n_chunks: int | Sequence[int] | None = None,
) -> _Chunking:
    """Splits each set of examples into ``K`` length-sorted chunks (see the module docstring).

    Args:
        sets: one sequence of examples per task (support sets, or query sets).
        micro_batch_size: most sequences per chunk.
        cost_model: prices each real chunk.
        n_chunks: ``K``, one for all sets or one per set (the planner chunks support and query
            sets in one call); default ``max(1, max ceil(n / micro_batch_size))``.
    """
    flat, counts = set_lengths(sets)
    n_sets = len(sets)
    k_all = _chunk_counts(counts, micro_batch_size, n_chunks)
    k = np.minimum(k_all, counts)
    if int(counts.sum()):
        real_cost, every = _choose_chunks(flat, counts, k, micro_batch_size, cost_model)
    else:
        real_cost, every = np.zeros(n_sets), ()
    n_dummy = k_all - k
    ends = np.cumsum(k).tolist()
    begins = [0] + ends[:-1]
    pad_of = [((),) * d for d in range(int(n_dummy.max()) + 1 if n_sets else 1)]
    pads = map(pad_of.__getitem__, n_dummy.tolist())
    # C-level map chains, no bytecode loop; slicing a tuple yields a tuple (no list in between).
    chunks = list(map(operator.add, map(every.__getitem__, map(slice, begins, ends)), pads))
    return _Chunking(chunks, k_all, real_cost, n_dummy)


def _chunk_counts(counts: np.ndarray, micro_batch_size: int, n_chunks: int | Sequence[int] | None) -> np.ndarray:
    """``K`` of every set (see :func:`chunk_sets`), refused where a set needs more chunks."""
    n_sets = counts.size
    need = -(-counts // micro_batch_size)
    if n_chunks is None:
        k_all = np.full(n_sets, max(1, int(need.max()) if n_sets else 1), dtype=np.int64)
    else:
        k_all = np.broadcast_to(np.asarray(n_chunks, dtype=np.int64), (n_sets,))
    if n_sets and np.any(k_all < need):
        bad = int(np.argmax(k_all < need))
        raise ValueError(
            f"n_chunks={int(k_all[bad])} is too small for set {bad}: it needs {int(need[bad])} "
            f"chunks of {micro_batch_size}"
        )
    return k_all


def _choose_chunks(flat: np.ndarray, counts: np.ndarray, k: np.ndarray, micro_batch_size: int,
                   cost_model: CostModel) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """Cuts every set (``counts[i]`` lengths of ``flat``, at least one) into ``k[i]`` real chunks,
    by whichever of the two candidates the cost model prices lower for that set.

    Returns:
        ``(real_cost, every)``: each set's cost of its real chunks, and every real chunk's indices
        into its set, set after set.
    """
    n_sets = counts.size
    starts = np.cumsum(counts) - counts
    kk = np.maximum(k, 1)
    q = counts // kk
    rem = counts % kk
    seg = np.repeat(np.arange(n_sets), counts)
    top = int(flat.max()) + 1
    # One int64 key (set, then longest first); the stable sort keeps ties in episode order.
    order = np.argsort(seg * top + (top - 1 - flat), kind="stable")
    sorted_len = flat[order]
    a, b, c = cost_model.coefficients
    # Both candidates are described per chunk (its set, its index j in the set, its start in
    # the set and its size), in closed form: ~19k chunks instead of ~32k labelled positions.
    cset = np.repeat(np.arange(n_sets), k)
    j = np.arange(cset.size) - (np.cumsum(k) - k)[cset]
    n_c, k_c, q_c = counts[cset], k[cset], q[cset]
    off = starts[cset]
    # Candidate A: sizes as equal as possible, the larger groups at the short end.
    n_small = k_c - rem[cset]  # chunks of size q come first
    start_a = j * q_c + np.maximum(j - n_small, 0)
    size_a = q_c + (j >= n_small)
    # Candidate B: full groups at the short end, singletons at the long end, which isolates
    # the long right tail of a length distribution (a lone 400-token outlier pads no one).
    spare = max(micro_batch_size - 1, 1)
    full = (n_c - k_c) // spare  # groups of micro_batch_size
    part = 1 + (n_c - k_c) - full * spare  # size of the one partial group
    e = k_c - 1 - j  # chunk index counted from the short end
    past = e - full
    start_b = n_c - micro_batch_size * np.minimum(e + 1, full) - np.where(past >= 0, part + past, 0)
    size_b = np.where(past < 0, micro_batch_size, np.where(past == 0, part, 1))

    def priced(start: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Every set's cost for the chunks ``(start, size)``."""
        widths = sorted_len[off + start].astype(np.float64)
        chunk_cost = a + b * size * widths + c * size * widths * widths
        return np.bincount(cset, weights=chunk_cost, minlength=n_sets)

    cost_a, cost_b = priced(start_a, size_a), priced(start_b, size_b)
    use_b = cost_b < cost_a
    bounds = off + np.where(use_b[cset], start_b, start_a)
    return np.where(use_b, cost_b, cost_a), _chunk_tuples(order - starts[seg], bounds)


def assign_balanced(
    costs: np.ndarray, world_size: int, *, tol: float = 1e-3, max_swaps: int | None = None
) -> np.ndarray:
    """Splits items into ``world_size`` groups of equal count with a small maximum group cost.

    Args:
        costs: item costs; ``len(costs)`` must divide by ``world_size``.
        world_size: number of groups (ranks).
        tol: stop improving once the makespan is within ``(1 + tol) * LB``.
        max_swaps: cap on improving swaps (default ``4 * world_size``).

    Returns:
        ``[world_size, len(costs) // world_size]`` item indices.
    """
    costs = np.asarray(costs, dtype=np.float64)
    n = costs.size
    if n % world_size:
        raise ValueError(f"len(costs)={n} does not divide by world_size={world_size}")
    t = n // world_size
    order = np.argsort(-costs, kind="stable")
    loads = np.zeros(world_size)
    assign = np.empty((world_size, t), dtype=np.int64)
    for r in range(t):
        items = order[r * world_size : (r + 1) * world_size]
        least = np.argsort(loads, kind="stable")
        assign[least, r] = items
        loads[least] += costs[items]
    lb = max(costs.sum() / world_size, costs.max()) if n else 0.0
    mat = costs[assign]
    limit = 4 * world_size if max_swaps is None else max_swaps
    n_partners = min(world_size, 9)
    bound = lb * (1.0 + tol)
    # Loads are kept up to date by each swap's delta, and the loop uses array methods, not the
    # np.* wrappers: at 64 ranks the loop runs ~60 times, so per-iteration overhead is the cost.
    loads = mat.sum(axis=1)
    for _ in range(limit):
        m = int(loads.argmax())
        top = float(loads[m])
        if top <= bound:
            break
        # Partners: the least loaded ranks (where a swap can move the most cost).
        partners = loads.argsort(kind="stable")[:n_partners]
        partners = partners[partners != m]
        d = mat[m][:, None, None] - mat[partners][None, :, :]  # (i in m, partner p, j in p)
        new_max = np.maximum(top - d, loads[partners][None, :, None] + d)
        best = int(new_max.argmin())
        if new_max.flat[best] >= top * (1.0 - 1e-12):
            break
        i, rest = divmod(best, partners.size * t)
        p, j = divmod(rest, t)
        r = int(partners[p])
        delta = float(d.flat[best])
        loads[m] -= delta
        loads[r] += delta
        assign[m, i], assign[r, j] = assign[r, j], assign[m, i]
        mat[m, i], mat[r, j] = mat[r, j], mat[m, i]
    return assign


def plan_one_task_per_pass(
    episodes: Sequence[Episode],
    task_ids: Sequence[int],
    *,
    step: int,
    world_size: int,
    micro_batch_size: int,
    support_repeats: int,
    cost_model: CostModel,
    rng: np.random.Generator,
    tol: float = 1e-3,
) -> MetaBatchPlan:
    """The one-task-per-pass plan of ``episodes`` (see the module docstring).

    Ranks get equal task counts; a meta-batch that does not divide by ``world_size`` leaves some
    ranks a task short, and those ranks run dummy passes in its place.

    Example:
        >>> plan = plan_one_task_per_pass(eps, ids, step=0, world_size=2, micro_batch_size=4,
        ...                               support_repeats=1, cost_model=CostModel(),
        ...                               rng=np.random.default_rng(0))
    """
    n = len(episodes)
    if n == 0 or len(task_ids) != n:
        raise ValueError(f"got {n} episodes and {len(task_ids)} task_ids: need one id per episode, >= 1")
    with gc_paused():
        total = -(-n // world_size) * world_size
        sets = [ep.support for ep in episodes] + [ep.query for ep in episodes]
        counts = np.fromiter(map(len, sets), dtype=np.int64, count=2 * n)
        k_s = max(1, int(-(-counts[:n].max() // micro_batch_size)))
        k_q = max(1, int(-(-counts[n:].max() // micro_batch_size)))
        both = chunk_sets(sets, micro_batch_size=micro_batch_size, cost_model=cost_model,
                          n_chunks=[k_s] * n + [k_q] * n)
        dummy = cost_model.dummy_pass_cost
        set_cost = both.real_cost + both.n_dummy * dummy
        costs = np.empty(total)
        costs[:n] = support_repeats * set_cost[:n] + set_cost[n:]
        costs[n:] = (support_repeats * k_s + k_q) * dummy
        assign = assign_balanced(costs, world_size, tol=tol)
        assign = assign[rng.permutation(world_size)]
        assign = np.take_along_axis(assign, np.argsort(rng.random(assign.shape), axis=1), axis=1)
        ranks = []
        for row in assign.tolist():
            real = [i for i in row if i < n]
            slots = tuple(TaskSlot(episodes[i], int(task_ids[i]), float(costs[i])) for i in real)
            support: list[PackedPass] = []
            query: list[PackedPass] = []
            for local, i in enumerate(real):
                support.extend(_one_task_pass(local, c, episodes[i].support) for c in both.chunks[i])
                query.extend(_one_task_pass(local, c, episodes[i].query) for c in both.chunks[n + i])
            missing = len(row) - len(real)
            support.extend([DUMMY_PASS] * (missing * k_s))
            query.extend([DUMMY_PASS] * (missing * k_q))
            ranks.append(RankPlan(slots, tuple(support), tuple(query)))
        return MetaBatchPlan(step=step, ranks=tuple(ranks), n_real_tasks=n)


def _one_task_pass(local: int, chunk: tuple[int, ...], examples: Sequence) -> PackedPass:
    if not chunk:
        return DUMMY_PASS
    lens = [examples[i].n_tokens for i in chunk]
    return PackedPass((local,) * len(chunk), tuple(chunk), max(lens), sum(lens))


__all__ = ["assign_balanced", "chunk_sets", "plan_one_task_per_pass"]
