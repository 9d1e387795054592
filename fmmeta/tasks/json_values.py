"""JSON columns of mixed types, read back as the file wrote them.

Why this exists: when a JSON column mixes strings with numbers or booleans, ``datasets`` stores
it as a ``Json`` column, and its encoder keeps a string that happens to be valid JSON as raw JSON
text: the string ``"1"`` comes back as the int ``1``, ``"true"`` as ``True``, ``"null"`` as
``None``. Labels ``1`` and ``"1"`` then merge into one class without a word, and the check that
refuses mixed label types never sees the mix. So the values of such columns are read again from
the files (only then: a column of one type is stored faithfully) and each is stored as its own
JSON text, which decodes to the value the file holds.

A number column that mixes integers with floats (answers ``2.5``, ``4``, ``6``) is stored as
float64, so the integers come back as ``4.0`` and an answer written ``4`` would be trained and
scored as the text ``" 4.0"``. Such a column is read again from the files the same way (a
column of floats, or of integers only, keeps its type).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: a run on a built-in suite never imports datasets (fmmeta.tasks.data says why)
    import datasets

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
    import datasets
    import pyarrow as pa

    mixed = [name for name, feature in ds.features.items() if isinstance(feature, datasets.Json)]
    floats = [name for name, feature in ds.features.items()
              if isinstance(feature, datasets.Value) and feature.dtype.startswith("float")]
    if not mixed + floats or any(Path(p).suffix.lower() not in (".json", ".jsonl") for p in paths):
        return ds
    raw: dict[str, list[str | None]] = {c: [] for c in mixed + floats}
    integers = {c: False for c in floats}  # a float column the file wrote some integers in
    for path in paths:
        for row in _rows(path):
            for c in raw:
                value = row.get(c) if isinstance(row, dict) else None
                raw[c].append(None if value is None else json.dumps(value, ensure_ascii=False))
                if c in integers and type(value) is int:
                    integers[c] = True
    columns = mixed + [c for c in floats if integers[c]]
    if not columns or any(len(raw[c]) != len(ds) for c in columns):
        return ds  # nothing to restore, or not the rows datasets read (cannot happen for validated files)
    table, features = ds.data.table, dict(ds.features)
    json_type = datasets.Json().pa_type
    for c in columns:
        table = table.set_column(table.column_names.index(c), pa.field(c, json_type),
                                 pa.ExtensionArray.from_storage(json_type, pa.array(raw[c], pa.string())))
        features[c] = datasets.Json()
    info = ds.info.copy()
    info.features = datasets.Features(features)
    return datasets.Dataset(table, info=info, split=ds.split, fingerprint=f"{ds._fingerprint}-typed")
