"""Which collection tasks are meta-train, validation and held-out (``tasks.split``).

Tasks are named (lists, files, families) or drawn by seeded shares; every task ends in exactly
one split, and each problem (an unknown name or family, a task asked for twice, an empty split)
is reported with the key to change.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import numpy as np

from fmmeta.tasks.collection_config import CollectionSplit, read_task_list

SPLITS = ("meta_train", "validation", "held_out")
AUTO_FRACTION = 0.1
"""Share drawn for a split that nothing names (held_out_fraction / validation_fraction null)."""


def _closest(name: str, options: Sequence[str]) -> list[str]:
    """The option closest to ``name``, ignoring case (a family "QA" meant as "qa")."""
    lower = {o.lower(): o for o in options}
    return [lower[m] for m in difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=0.5)]


def assign_splits(
    tasks: Sequence[tuple[str, str]], split: CollectionSplit, *, seed: int
) -> tuple[dict[str, str], list[str]]:
    """Puts every task in exactly one of meta_train / validation / held_out.

    Args:
        tasks: (name, family) of every task, in collection order.
        split: the split section.
        seed: seeds the draw of the fractions.

    Returns:
        (task name -> split, problems); problems are prefixed ``split.`` (the section's keys).
    """
    names = [n for n, _ in tasks]
    wanted, problems = _wanted(tasks, split)
    where: dict[str, str] = {}
    for n, asks in wanted.items():
        if len(asks) > 1:
            detail = " and ".join(s if why == s else f"{s} via {why}" for s, why in sorted(asks.items()))
            problems.append(
                f"split: task {n!r} is put in two splits ({detail}): a task belongs to one "
                "split; remove it from one list"
            )
        where[n] = next(iter(sorted(asks)))
    rest = [n for n in names if n not in where]
    order = np.random.default_rng(seed).permutation(len(rest))
    shuffled = [rest[i] for i in order]
    for key, to in (("held_out_fraction", "held_out"), ("validation_fraction", "validation")):
        share = getattr(split, key)
        if share is None:
            share = 0.0 if to in where.values() else AUTO_FRACTION
        k = max(1, round(share * len(rest))) if share > 0 and rest else 0
        for n in shuffled[:k]:
            where[n] = to
        shuffled = shuffled[k:]
    for n in shuffled:
        where[n] = "meta_train"
    counts = {s: sum(1 for v in where.values() if v == s) for s in SPLITS}
    fixes = {
        "meta_train": "hold out fewer tasks or add sources",
        "validation": "name tasks in split.validation / validation_families or set split.validation_fraction",
        "held_out": "name tasks in split.held_out / held_out_families or set split.held_out_fraction",
    }
    if names and not problems:
        for s in SPLITS:
            if counts[s] == 0:
                problems.append(
                    f"split leaves {s} empty ({len(names)} tasks: {counts}): {fixes[s]}"
                )
    return where, problems


def _wanted(
    tasks: Sequence[tuple[str, str]], split: CollectionSplit
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """(task -> {split: the key that asked for it}, problems) for every task named by a list, a
    file or a family; unknown names and families are problems with the closest match."""
    problems: list[str] = []
    names = [n for n, _ in tasks]
    family = dict(tasks)
    families = sorted(set(family.values()))
    wanted: dict[str, dict[str, str]] = {}  # task -> {split: where it was asked for}

    def want(task: str, to: str, why: str) -> None:
        wanted.setdefault(task, {})[to] = why

    named = {
        "held_out": [("held_out", split.held_out)],
        "validation": [("validation", split.validation)],
    }
    for key, to in (("held_out_file", "held_out"), ("validation_file", "validation")):
        path = getattr(split, key)
        if path is not None:
            try:
                named[to].append((key, read_task_list(path)))
            except ValueError:
                pass  # reported by CollectionSplit.validate
    for to, lists in named.items():
        for key, listed in lists:
            for n in listed:
                if n in family:
                    want(n, to, f"{key}")
                else:
                    close = _closest(n, names)
                    problems.append(
                        f"split.{key} names task {n!r}, which no source builds"
                        + (f"; did you mean {close[0]!r}?" if close else "")
                        + f" ({len(names)} tasks, e.g. {names[:5]}): fix the name or remove it"
                    )
    for key, to in (("held_out_families", "held_out"), ("validation_families", "validation")):
        for fam in getattr(split, key):
            members = [n for n in names if family[n] == fam]
            if not members:
                close = _closest(fam, families)
                problems.append(
                    f"split.{key} has family {fam!r} with no tasks"
                    + (f"; did you mean {close[0]!r}?" if close else "")
                    + f" (families: {families[:10]}): set family: {fam} on a source or fix the name"
                )
            for n in members:
                want(n, to, f"{key} ({fam})")
    return wanted, problems


__all__ = ["AUTO_FRACTION", "SPLITS", "assign_splits"]
