"""Turns a meta-batch of episodes into a :class:`MetaBatchPlan`: balanced ranks, little padding.

Two problems, both solved with numpy over the whole meta-batch at once. A 64 ranks x 32 tasks
plan (2048 episodes, ~32k sequences, ~19k chunks) takes under 20 ms of CPU: sequence lengths come
from a cache keyed by example identity (:class:`_LengthCache`), both chunking candidates are
priced per chunk in closed form, equal chunk tuples are built once and shared, and the garbage
collector waits until the plan's small tuples are built.

1. **Chunking (padding).** Every slot of a plan must run the same number of support chunks ``K_s``
   and query chunks ``K_q`` (ZeRO-3 lockstep), where ``K = max over tasks of ceil(n / micro_batch)``.
   A task with fewer sequences would pad its list with dummy passes, which cost a pass's overhead
   anyway, so instead it spreads its sequences over ``min(K, n)`` chunks: sorted by length
   (longest first) and cut into contiguous groups, either of as-equal-as-possible size (larger
   groups at the short end) or full groups at the short end and singletons at the long end
   (isolates a long outlier), whichever the cost model prices lower for that set. Similar lengths
   share a chunk, so little of each batch is padding; only tasks with fewer than ``K`` sequences
   keep ``()`` dummy chunks.
2. **Assignment (balance).** Every rank gets exactly ``tasks_per_rank`` slots (dummy slots with
   weight 0 fill a meta-batch that does not divide by the ranks, or an error is raised). Slots
   are dealt by LPT in rounds (the round's largest slot to the least loaded rank, one slot per
   rank per round, so counts stay equal), then pairwise swaps between the most loaded rank and
   any other rank lower the makespan until it is within ``tol`` of
   ``LB = max(total / ranks, largest slot)`` or no swap helps.

Rank order and the order of slots within a rank are shuffled with the caller's generator, so
which rank gets the heavy work is not predictable from the step.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import threading
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import numpy as np

from fmmeta.sampling.cost import CostModel, slot_features
from fmmeta.sampling.plan import MetaBatchPlan, TaskSlot
from fmmeta.tasks.episode import Episode

OnUneven = Literal["pad", "error"]
_PROMPT = operator.attrgetter("prompt_ids")
_ANSWER = operator.attrgetter("answer_ids")


class _LengthCache:
    """Token counts of examples seen before, keyed by object identity.

    Reading ``len(prompt_ids) + len(answer_ids)`` touches three scattered objects per example;
    over the ~32k examples of a 64 x 32 meta-batch that memory latency was the largest single
    cost of planning. The task layer caches its tokenized examples, so the same
    :class:`~fmmeta.tasks.episode.Example` objects come back step after step: the cache finds a
    whole meta-batch's ids with numpy alone, in a direct-mapped table (multiplicative hash of the
    id) and, for the few ids that lost a table slot to a collision, a ``searchsorted`` over all
    stored ids. (A python dict keyed by ``id`` is no faster: addresses share their low bits.)

    Safety: the cache holds a reference to every example it stores, so a stored id can never be
    reused by another object, and examples are frozen, so a stored length stays right. It is
    bounded (cleared when full) and locked (the prefetcher plans in a background thread).
    """

    _MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the high bits mix every id bit

    def __init__(self, max_entries: int = 1 << 16) -> None:
        self.max_entries = max_entries
        self._keys = np.empty(0, dtype=np.int64)  # sorted ids
        self._values = np.empty(0, dtype=np.int64)  # token counts, aligned with _keys
        self._keep: list[list] = []  # the stored examples, so no stored id can be reused
        self._lock = threading.Lock()
        self._index(self._keys, self._values)

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        return ((ids.view(np.uint64) * self._MULT) >> self._shift).astype(np.intp)

    def _index(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Stores sorted ``keys``/``values`` and rebuilds the table (about 4 slots per key)."""
        self._keys, self._values = keys, values
        bits = max(4, (4 * keys.size).bit_length())
        self._shift = np.uint64(64 - bits)
        self._table_keys = np.full(1 << bits, -1, dtype=np.int64)  # -1 is no object's id
        self._table_values = np.zeros(1 << bits, dtype=np.int64)
        slot = self._slots(keys)
        self._table_keys[slot] = keys  # on a collision the last key wins the slot
        self._table_values[slot] = values

    def _lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stored lengths of ``ids`` (0 where absent) and whether each was found."""
        slot = self._slots(ids)
        hit = self._table_keys[slot] == ids
        out = self._table_values[slot]
        rest = np.flatnonzero(~hit)
        if rest.size and self._keys.size:
            pos = np.searchsorted(self._keys, ids[rest])
            np.minimum(pos, self._keys.size - 1, out=pos)
            found = self._keys[pos] == ids[rest]
            out[rest[found]] = self._values[pos[found]]
            hit[rest[found]] = True
        return out, hit

    def lengths(self, flat: list) -> np.ndarray:
        """Token count of every example in ``flat`` (a list of ``Example``)."""
        n = len(flat)
        ids = np.fromiter(map(id, flat), dtype=np.int64, count=n)
        with self._lock:
            out, hit = self._lookup(ids)
            if hit.all():
                return out
            miss = np.flatnonzero(~hit)
            new_ex = list(flat) if miss.size == n else list(map(flat.__getitem__, miss.tolist()))
            # One pass that reads both tuples of an example while it is in cache.
            new_len = np.fromiter(
                map(operator.add, map(len, map(_PROMPT, new_ex)), map(len, map(_ANSWER, new_ex))),
                dtype=np.int64,
                count=len(new_ex),
            )
            out[miss] = new_len
            # Repeated ids are stored twice (searchsorted finds either): cheaper than deduping.
            if miss.size <= self.max_entries:
                keys, values = self._keys, self._values
                if keys.size + miss.size > self.max_entries:
                    keys, values = keys[:0], values[:0]
                    self._keep.clear()
                self._keep.append(new_ex)
                keys = np.concatenate([keys, ids[miss]])
                values = np.concatenate([values, new_len])
                order = np.argsort(keys, kind="stable")
                self._index(keys[order], values[order])
            return out

    def clear(self) -> None:
        """Drops every entry (and the references it held)."""
        with self._lock:
            self._keep.clear()
            self._index(self._keys[:0], self._values[:0])


_LENGTHS = _LengthCache()


def _lengths(sets: Sequence[Sequence]) -> tuple[np.ndarray, np.ndarray]:
    """Flat sequence lengths of every set and the per-set counts (C-level loops: this is hot)."""
    counts = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
    flat = list(itertools.chain.from_iterable(sets))
    return _LENGTHS.lengths(flat), counts


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
    flat, counts = _lengths(sets)
    n_sets = len(sets)
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
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    k = np.minimum(k_all, counts)
    kk = np.maximum(k, 1)
    q = counts // kk
    rem = counts % kk
    if total:
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
        real_cost = np.where(use_b, cost_b, cost_a)
        bounds = off + np.where(use_b[cset], start_b, start_a)
        every = _chunk_tuples(order - starts[seg], bounds)
    else:
        real_cost = np.zeros(n_sets)
        every = ()
    n_dummy = k_all - k
    ends = np.cumsum(k).tolist()
    begins = [0] + ends[:-1]
    pad_of = [((),) * d for d in range(int(n_dummy.max()) + 1 if n_sets else 1)]
    pads = map(pad_of.__getitem__, n_dummy.tolist())
    # C-level map chains, no bytecode loop; slicing a tuple yields a tuple (no list in between).
    chunks = list(map(operator.add, map(every.__getitem__, map(slice, begins, ends)), pads))
    return _Chunking(chunks, k_all, real_cost, n_dummy)


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
    on_uneven: OnUneven = "pad",
    tol: float = 1e-3,
) -> MetaBatchPlan:
    """Builds the plan for one meta-step from the chosen episodes.

    Args:
        episodes: the meta-batch, one episode per chosen task.
        task_ids: pool index of each episode's task (stored in the slots).
        step: the meta-step.
        world_size: number of data-parallel ranks.
        micro_batch_size: most sequences per forward/backward pass.
        inner_steps: inner steps per task (weights the support cost).
        cost_model: prices chunks and slots.
        rng: shuffles rank order and slot order (pass a generator derived from seed and step).
        on_uneven: ``"pad"`` adds zero-weight dummy slots when ``len(episodes)`` does not divide
            by ``world_size``; ``"error"`` raises instead.
        tol: balance tolerance relative to the lower bound.

    Raises:
        ValueError: for an empty meta-batch, mismatched lengths, or uneven counts with
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
    if n % world_size and on_uneven == "error":
        raise ValueError(
            f"meta_batch_size={n} does not divide by world_size={world_size} and "
            f"on_uneven='error'; use a multiple of {world_size} or on_uneven='pad' "
            "(zero-weight dummy slots)"
        )
    if on_uneven not in ("pad", "error"):
        raise ValueError(f"on_uneven={on_uneven!r} is invalid: allowed 'pad' or 'error'")
    with _gc_paused():
        return _plan(episodes, task_ids, step, world_size, micro_batch_size, inner_steps, cost_model, rng, tol)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Holds off the cyclic garbage collector while a plan's ~25k small tuples are built.

    Every 700 new container objects trigger a young-generation collection; a 64 x 32 plan made
    dozens of them (about 10% of planning time) although index tuples of ints can never form a
    cycle. The collector is re-enabled afterwards (only if it was on), so the deferred objects are
    scanned once. Another thread toggling the collector meanwhile only shifts when it runs.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _plan(
    episodes: Sequence[Episode],
    task_ids: Sequence[int],
    step: int,
    world_size: int,
    micro_batch_size: int,
    inner_steps: int,
    cost_model: CostModel,
    rng: np.random.Generator,
    tol: float,
) -> MetaBatchPlan:
    """:func:`plan_meta_batch` after its arguments are checked."""
    n = len(episodes)
    total = -(-n // world_size) * world_size
    sets = [ep.support for ep in episodes] + [ep.query for ep in episodes]
    counts = np.fromiter(map(len, sets), dtype=np.int64, count=2 * n)
    k_s = max(1, int(-(-counts[:n].max() // micro_batch_size)))
    k_q = max(1, int(-(-counts[n:].max() // micro_batch_size)))
    both = chunk_sets(
        sets, micro_batch_size=micro_batch_size, cost_model=cost_model, n_chunks=np.repeat([k_s, k_q], n)
    )
    dummy = cost_model.dummy_pass_cost
    set_cost = both.real_cost + both.n_dummy * dummy
    costs = np.empty(total)
    costs[:n] = inner_steps * set_cost[:n] + set_cost[n:]
    costs[n:] = (inner_steps * k_s + k_q) * dummy
    assign = assign_balanced(costs, world_size, tol=tol)
    assign = assign[rng.permutation(world_size)]
    assign = np.take_along_axis(assign, np.argsort(rng.random(assign.shape), axis=1), axis=1)
    cost_list = costs.tolist()
    ids = list(task_ids)
    empty_s = ((),) * k_s
    empty_q = ((),) * k_q
    ch = both.chunks
    slots = [
        TaskSlot(episodes[i], 1.0, ch[i], ch[n + i], cost_list[i], int(ids[i])) for i in range(n)
    ]
    slots.extend(TaskSlot(None, 0.0, empty_s, empty_q, cost_list[i], -1) for i in range(n, total))
    ranks = tuple(tuple(map(slots.__getitem__, row)) for row in assign.tolist())
    return MetaBatchPlan(step=step, ranks=ranks, n_real_tasks=n)


@dataclass(frozen=True)
class PlanStats:
    """How good a plan is.

    Attributes:
        padding_efficiency: real tokens / processed tokens (padding and dummy passes included),
            over every pass of every slot.
        makespan: the most loaded rank's cost.
        lower_bound: ``max(total / ranks, largest slot)``.
        rank_costs: every rank's cost.
    """

    padding_efficiency: float
    makespan: float
    lower_bound: float
    rank_costs: tuple[float, ...]

    @property
    def makespan_over_lb(self) -> float:
        """Balance: 1.0 is perfect."""
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0


def plan_stats(plan: MetaBatchPlan, *, inner_steps: int, cost_model: CostModel) -> PlanStats:
    """Measures a plan's padding efficiency and balance under ``cost_model`` (for metrics)."""
    real = padded = 0
    slot_costs: list[float] = []
    rank_costs = []
    a, b, c = cost_model.coefficients
    for slots in plan.ranks:
        rc = 0.0
        for s in slots:
            passes, pad, attn, rl = slot_features(s, inner_steps=inner_steps)
            cost = a * passes + b * pad + c * attn
            slot_costs.append(cost)
            rc += cost
            real += rl
            padded += pad
        rank_costs.append(rc)
    total = sum(rank_costs)
    lb = max(total / len(plan.ranks), max(slot_costs)) if slot_costs else 0.0
    return PlanStats(
        padding_efficiency=real / padded if padded else 1.0,
        makespan=max(rank_costs),
        lower_bound=lb,
        rank_costs=tuple(rank_costs),
    )


__all__ = ["OnUneven", "PlanStats", "assign_balanced", "chunk_sets", "plan_meta_batch", "plan_stats"]
