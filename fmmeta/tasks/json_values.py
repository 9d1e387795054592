"""JSON columns of mixed types, read back as the file wrote them.

Why this exists: when a JSON column mixes strings with numbers or booleans, ``datasets`` stores
it as a ``Json`` column, and its encoder keeps a string that happens to be valid JSON as raw JSON
text: the string ``"1"`` comes back as the int ``1``, ``"true"`` as ``True``, ``"null"`` as
``None``. Labels ``1`` and ``"1"`` then merge into one class without a word, and the check that
refuses mixed label types never sees the mix. So the values of such columns are read again from
the files (only then: a column of one type is stored faithfully) and each is stored as its own
JSON text, which decodes to the value the file holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa

__all__ = ["restore_mixed_columns"]


def _rows(path: str) -> Iterator[dict[str, Any]]:
    """The rows of a JSON array file or a JSON-lines file, in file order (already validated)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        yield from whole
        return
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def restore_mixed_columns(ds: datasets.Dataset, paths: Sequence[str]) -> datasets.Dataset:
    """``ds`` with every top-level ``Json`` column rebuilt from the raw values in ``paths``.

    ``paths`` must be the plain (uncompressed) JSON files ``ds`` was loaded from, in the same
    order; compressed files are left as ``datasets`` read them. The fingerprint is derived from
    the original one, so caches keyed on it stay deterministic.
    """
    columns = [name for name, feature in ds.features.items() if isinstance(feature, datasets.Json)]
    if not columns or any(Path(p).suffix.lower() not in (".json", ".jsonl") for p in paths):
        return ds
    raw: dict[str, list[str | None]] = {c: [] for c in columns}
    for path in paths:
        for row in _rows(path):
            for c in columns:
                value = row.get(c) if isinstance(row, dict) else None
                raw[c].append(None if value is None else json.dumps(value, ensure_ascii=False))
    if any(len(values) != len(ds) for values in raw.values()):
        return ds  # not the rows datasets read (cannot happen for validated files): keep its reading
    table = ds.data.table
    for c in columns:
        table = table.set_column(table.column_names.index(c), c,
                                 pa.array(raw[c], type=table.schema.field(c).type))
    return datasets.Dataset(table, info=ds.info, split=ds.split,
                            fingerprint=f"{ds._fingerprint}-typed")
