"""Labels to classes: raw label values -> class indices, verbalizer words and class names.

The classification builders share these: a label column may hold ``ClassLabel`` ints, strings,
or ints with a verbalizer; every class must be able to supply an episode (or be dropped, when the
user asks for it, with a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fmmeta.tasks.spec import EpisodeSpec

logger = logging.getLogger(__name__)


def label_type(v: Any) -> str:
    """A label's type name, ``bool`` kept apart from ``int`` (True is an int to Python)."""
    return "bool" if isinstance(v, bool) else type(v).__name__


def labels_to_classes(
    values: Sequence[Any],
    *,
    verbalizer: Sequence[str] | Mapping[Any, str] | None,
    feature_names: Sequence[str] | None,
    key: str,
    where: str,
) -> tuple[list[int], list[str], list[str]]:
    """Maps raw label values to class indices, verbalizer words and class names.

    Returns:
        (class index per row, verbalizer word per class, class name per class); classes are the
        distinct values present, in sorted order.
    """
    _check_label_values(values, key=key, where=where)
    distinct = sorted(set(values))
    if feature_names is not None:
        names = [feature_names[v] for v in distinct]
    else:
        names = [str(v) for v in distinct]
    words = _words(distinct, names, verbalizer=verbalizer, feature_names=feature_names, key=key, where=where)
    _check_distinct_words([str(w) for w in words], names, where=where)
    index = {v: i for i, v in enumerate(distinct)}
    return [index[v] for v in values], [str(w) for w in words], names


def _check_distinct_words(words: list[str], names: list[str], *, where: str) -> None:
    """Refuses two classes whose answer words are the same once spaces around them are ignored.

    Why: scoring ranks the classes' answer words, and a tie counts as wrong, so two classes with
    one word can never be told apart (neither is ever correct); words that differ only in a
    trailing space (``'yes'`` and ``'yes '``, a typo in the data) ask the model to tell apart what
    no reader of the prompt could.
    """
    seen: dict[str, int] = {}
    for c, word in enumerate(words):
        first = seen.setdefault(word.strip(), c)
        if first != c:
            same = "the same answer word" if words[first] == word else "answer words that differ only in spaces"
            raise ValueError(
                f"{where}: classes {names[first]!r} and {names[c]!r} have {same} "
                f"({words[first]!r}, {word!r}), so no answer could tell them apart: give each "
                "class its own word in the verbalizer (or fix the labels in the data)"
            )


def _check_label_values(values: Sequence[Any], *, key: str, where: str) -> None:
    """Refuses empty labels, labels that are lists or objects, labels of mixed types, and no
    labels at all."""
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is an empty label: every row needs a label; "
                "filter unlabeled rows first"
            )
        if isinstance(v, (list, tuple, dict)):
            raise ValueError(
                f"{where}: {key}[{i}]={str(v)[:60]} is a {type(v).__name__}, not one label: every row needs a "
                f"single label (a string or an integer); keep one value per row, or point {key} at the right column"
            )
    types: dict[str, Any] = {}
    for v in values:
        types.setdefault(label_type(v), v)
    if len(types) > 1:
        raise ValueError(
            f"{where}: {key} mixes label types {sorted(types)} (e.g. "
            f"{', '.join(repr(v) for v in types.values())}): use one type for every label, "
            "e.g. cast them all to str"
        )
    if not types:
        raise ValueError(f"{where}: no labels: the task has no examples")


def _words(
    distinct: list[Any],
    names: list[str],
    *,
    verbalizer: Sequence[str] | Mapping[Any, str] | None,
    feature_names: Sequence[str] | None,
    key: str,
    where: str,
) -> list[Any]:
    """The answer word of each distinct label: from the verbalizer, else the class names."""
    if verbalizer is None:
        if feature_names is None and not isinstance(distinct[0], str):
            raise ValueError(
                f"{where}: {key} holds {label_type(distinct[0])} labels {distinct[:6]} without "
                "class names: pass verbalizer=[word per class index] or {label: word}"
            )
        words = names
    elif isinstance(verbalizer, Mapping):
        words = []
        missing = []
        for v, n in zip(distinct, names):
            if v in verbalizer:
                words.append(verbalizer[v])
            elif n in verbalizer:  # a ClassLabel's class name works as key too
                words.append(verbalizer[n])
            else:
                missing.append(v)
        if missing:
            raise ValueError(
                f"{where}: verbalizer has no word for label(s) {missing}; its keys are "
                f"{list(verbalizer)[:10]}: add them"
            )
    elif isinstance(verbalizer, Sequence) and not isinstance(verbalizer, str):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in distinct):
            raise ValueError(
                f"{where}: a list verbalizer needs integer labels but {key} holds "
                f"{label_type(distinct[0])} values: pass a mapping {{label: word}} instead"
            )
        out_of_range = [v for v in distinct if not 0 <= v < len(verbalizer)]
        if out_of_range:
            raise ValueError(
                f"{where}: labels {out_of_range} have no entry in the {len(verbalizer)}-word "
                "verbalizer list: give one word per class index"
            )
        words = [verbalizer[v] for v in distinct]
    else:
        raise ValueError(
            f"{where}: verbalizer={verbalizer!r} must be a list of words or a mapping "
            "{label: word}"
        )
    return words


def check_class_sizes(
    class_of_row: list[int],
    names: list[str],
    spec: EpisodeSpec,
    *,
    drop_small_classes: bool,
    where: str,
) -> set[int]:
    """Returns the classes to keep; raises (or warns and drops) on classes too small to sample."""
    counts = [0] * len(names)
    for c in class_of_row:
        counts[c] += 1
    small = {c for c, n in enumerate(counts) if n < spec.per_class}
    if small:
        detail = ", ".join(f"{names[c]!r} has {counts[c]}" for c in sorted(small))
        if not drop_small_classes:
            raise ValueError(
                f"{where}: class(es) with fewer than shots + query = {spec.shots} + {spec.query} "
                f"= {spec.per_class} examples: {detail}. Add examples, lower shots/query, or "
                "pass drop_small_classes=True to drop them"
            )
        logger.warning("%s: dropping class(es) too small for an episode: %s", where, detail)
    keep = set(range(len(names))) - small
    ways = spec.ways if spec.ways is not None else len(names)
    if len(keep) < ways:
        raise ValueError(
            f"{where}: {len(keep)} class(es) can supply an episode but ways={ways}: lower ways "
            f"to at most {len(keep)} or add classes/examples"
        )
    return keep


__all__ = ["check_class_sizes", "label_type", "labels_to_classes"]
