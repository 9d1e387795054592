"""Per-rank telemetry over a method's meta-steps: the rank that makes the others wait, and a summary.

The step line shows the slowest rank's time only; when one node of a run is slow (a throttled GPU,
a busy host, a slow disk) the others wait for it at every outer step, and nothing said which one
it was. :class:`RankWatch` follows each gathered meta-step's per-rank compute time and warns once
(rank 0) when the same rank was the slowest in every one of the last ``window`` meta-steps and its
mean compute time over them exceeds the other ranks' mean by more than ``margin``; the message
names the rank, its host and its share of the tokens (a rank given more work is slower for a
reason). Requiring the *same* rank every time keeps load noise, which moves from rank to rank,
from triggering it.

At the end of a method, :meth:`RankWatch.summary` gives each rank's mean compute, collective-wait
and data-wait seconds per meta-step, its tokens and peak memory, for the console and
``telemetry.json``.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fmmeta.algorithms.gather import GatheredStep
from fmmeta.atomic import locked, replace_text
from fmmeta.engine.compiled import compile_summary
from fmmeta.strict_json import dumps_strict

__all__ = ["RankWatch", "SlowRank", "merge_summaries", "save_telemetry"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlowRank:
    """A rank that was the slowest in every meta-step of a window.

    Attributes:
        rank: the slow rank.
        host: its host name.
        first_step: the window's first meta-step.
        last_step: the window's last meta-step (when the warning was given).
        compute_s: its mean compute seconds per meta-step over the window.
        others_compute_s: the other ranks' mean compute seconds per meta-step over the window.
        token_share: its share of the window's real tokens (``1 / world_size`` is an even split).
    """

    rank: int
    host: str
    first_step: int
    last_step: int
    compute_s: float
    others_compute_s: float
    token_share: float

    def message(self, method: str, world_size: int) -> str:
        """The warning, with what to look at."""
        excess = self.compute_s / self.others_compute_s - 1
        return (
            f"{method}: rank {self.rank} (host {self.host}) was the slowest of {world_size} ranks in "
            f"each of meta-steps {self.first_step}-{self.last_step}: compute {self.compute_s:.3f}s "
            f"per meta-step vs {self.others_compute_s:.3f}s on the others (+{excess:.0%}), with "
            f"{self.token_share:.0%} of the tokens; the other ranks wait for it at every outer step. "
            "Check that host (GPU clocks and temperature, other processes, its disk or data loading)"
        )


class RankWatch:
    """Follows a method's gathered meta-steps; names a persistently slow rank once; sums up.

    Args:
        method: the method's name (for messages).
        hosts: every rank's host name, in rank order (gathered once at start-up).
        window: meta-steps in a row one rank must be the slowest (>= 2).
        margin: how much its mean compute time must exceed the others' (0.25 = 25% more).
        rank: this process's rank; only rank 0 logs.

    Example:
        >>> watch = RankWatch("fomaml", hosts, window=10, margin=0.25, rank=engine.rank)
        >>> watch.observe(gather_step(engine, stats))   # every meta-step, on every rank
        >>> watch.summary()                              # at the end
    """

    def __init__(self, method: str, hosts: Sequence[str], *, window: int, margin: float, rank: int = 0) -> None:
        if window < 2 or not margin > 0:
            raise ValueError(f"window={window}, margin={margin} are invalid: window must be >= 2 and margin > 0")
        self.method, self.hosts, self.rank = method, list(hosts), rank
        self.window, self.margin = window, margin
        self.slow_rank: SlowRank | None = None
        self._recent: deque[GatheredStep] = deque(maxlen=window)
        self._steps = 0
        self._sums: dict[str, list[float]] = {}
        self._peak: list[float] = []
        self._peak_kind = ""

    def observe(self, step: GatheredStep) -> SlowRank | None:
        """Adds one meta-step; returns the slow rank the first time one is found, else ``None``."""
        self._accumulate(step)
        if self.slow_rank is not None or len(step.ranks) < 2:
            return None
        self._recent.append(step)
        found = self._find()
        if found is not None:
            self.slow_rank = found
            if self.rank == 0:
                logger.warning("%s", found.message(self.method, len(step.ranks)))
        return found

    def _accumulate(self, step: GatheredStep) -> None:
        n = len(step.ranks)
        if not self._sums:
            self._sums = {k: [0.0] * n for k in ("compute_s", "collective_s", "data_wait_s", "tokens")}
            self._peak = [math.nan] * n
        for i, s in enumerate(step.ranks):
            for key, value in (("compute_s", s.compute_seconds), ("collective_s", s.collective_seconds),
                               ("data_wait_s", s.data_wait_seconds), ("tokens", s.n_tokens)):
                self._sums[key][i] += value
            peak = self._peak[i]
            self._peak[i] = s.peak_memory_mb if math.isnan(peak) else max(peak, s.peak_memory_mb)
        self._peak_kind = step.peak_memory_kind
        self._steps += 1

    def _find(self) -> SlowRank | None:
        if len(self._recent) < self.window:
            return None
        computes = [[s.compute_seconds for s in step.ranks] for step in self._recent]
        slowest = {max(range(len(c)), key=c.__getitem__) for c in computes}
        if len(slowest) != 1:
            return None
        r = slowest.pop()
        mine = sum(c[r] for c in computes) / len(computes)
        others = sum(sum(c) - c[r] for c in computes) / (len(computes) * (len(computes[0]) - 1))
        if not (others > 0 and mine > (1 + self.margin) * others):
            return None
        tokens = [sum(s.n_tokens for s in step.ranks) for step in self._recent]
        share = sum(step.ranks[r].n_tokens for step in self._recent) / max(sum(tokens), 1)
        return SlowRank(rank=r, host=self._host(r), first_step=self._recent[0].step,
                        last_step=self._recent[-1].step, compute_s=mine, others_compute_s=others,
                        token_share=share)

    def _host(self, rank: int) -> str:
        return self.hosts[rank] if rank < len(self.hosts) else "?"

    def summary(self) -> dict[str, Any]:
        """Per rank, means per meta-step over the meta-steps observed (after a resume: those since
        it), total tokens and peak memory; plus the slow rank, if one was found, and the rule."""
        n = max(self._steps, 1)
        ranks = [
            {"rank": i, "host": self._host(i),
             **{k: v[i] / n for k, v in self._sums.items() if k != "tokens"},
             "tokens": int(self._sums["tokens"][i]), "peak_memory_mb": self._peak[i]}
            for i in range(len(self._peak))
        ]
        return {
            "meta_steps": self._steps, "peak_memory": self._peak_kind, "ranks": ranks,
            "slow_rank": asdict(self.slow_rank) if self.slow_rank else None,
            "slow_rank_rule": {"window": self.window, "margin": self.margin},
            **compile_summary(),  # engine.compile: graphs and seconds compiling, this process
        }

    def log_summary(self) -> None:
        """One console line per rank (rank 0 only)."""
        if self.rank != 0:
            return
        s = self.summary()
        logger.info("%s per-rank telemetry, mean per meta-step over %d meta-steps (peak memory: %s):",
                    self.method, s["meta_steps"], s["peak_memory"])
        for r in s["ranks"]:
            logger.info("  rank %d (%s): compute %.3fs | collective wait %.3fs | data wait %.3fs | "
                        "%d tokens | peak memory %.0f MB", r["rank"], r["host"], r["compute_s"],
                        r["collective_s"], r["data_wait_s"], r["tokens"], r["peak_memory_mb"])
        if s["slow_rank"] is None and len(s["ranks"]) > 1:
            logger.info("  no rank was persistently slower than the others")
        if "compile_graphs" in s:
            logger.info("  engine.compile: %d graphs over %d decoder layers, %.1fs compiling in this process",
                        s["compile_graphs"], s["compile_layers"], s["compile_seconds"])


def merge_summaries(before: dict[str, Any] | None, now: dict[str, Any]) -> dict[str, Any]:
    """One method's telemetry over the meta-steps of both: ``before`` (its entry from an earlier
    process of the run) and ``now`` (this process's, since its resume).

    A rerun of a finished method trains no meta-step: ``before`` stands as it was. A resumed or
    extended method adds its meta-steps: means are weighted by meta-steps, tokens summed, peaks
    the larger; the slow rank and the compile figures are this process's where it has them.
    """
    if not before or not now.get("meta_steps"):
        return before if before and not now.get("meta_steps") else now
    n0, n1 = int(before.get("meta_steps", 0)), int(now["meta_steps"])
    if not n0 or len(before.get("ranks", ())) != len(now["ranks"]):
        return now  # nothing to add, or another world size: the earlier figures describe other ranks
    ranks = []
    for old, new in zip(before["ranks"], now["ranks"]):
        merged = dict(new)
        for key, value in new.items():
            if key == "tokens":
                merged[key] = int(old.get(key, 0)) + int(value)
            elif key == "peak_memory_mb":
                merged[key] = max(old.get(key) or 0, value or 0)
            elif isinstance(value, float) and isinstance(old.get(key), (int, float)):
                merged[key] = (old[key] * n0 + value * n1) / (n0 + n1)
        ranks.append(merged)
    return {**before, **now, "meta_steps": n0 + n1, "ranks": ranks,
            "slow_rank": now.get("slow_rank") or before.get("slow_rank")}


def save_telemetry(path: Path, method: str, summary: dict[str, Any]) -> None:
    """Adds ``summary`` to ``method``'s entry of the JSON file ``path`` (:func:`merge_summaries`:
    a rerun or a resume keeps what earlier processes of the run measured; other methods' entries
    kept). Call it on rank 0 only."""
    with locked(path):  # methods training side by side each add their entry
        current = json.loads(path.read_text()) if path.exists() else {}
        current[method] = merge_summaries(current.get(method), summary)
        replace_text(path, dumps_strict(current, indent=2) + "\n")
