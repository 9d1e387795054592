"""Strict JSON for the files a run writes (``metrics.jsonl``, ``eval.json``), and reading them back.

Python's ``json`` writes ``NaN`` and ``Infinity``, which are not JSON: jq, browsers and most other
readers refuse the whole file. A diverged learning rate or an unmeasured loss is a normal value
in our records, so every writer converts non-finite floats to ``null`` here, in one place.

An append-only JSON-lines file whose writer was killed mid-line (a SIGKILL, a full disk) ends in a
torn line: :func:`read_json_lines` drops that one line with a warning, because the run that
resumes rewrites it, and refuses any other bad line, naming it.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (nested in dicts, lists, tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def dumps_strict(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict_json` (``obj``); raises rather than write a NaN.

    Example:
        >>> dumps_strict({"loss": float("nan"), "step": 3})
        '{"loss": null, "step": 3}'
    """
    return json.dumps(strict_json(obj), allow_nan=False, **kwargs)


def read_json_lines(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file the run appends to, a torn last line dropped (warned).

    Raises:
        ValueError: a line before the last is not a JSON object; the message names the line.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                logger.warning("%s: dropped its torn last line %d (%r...): a write cut short by a kill or a "
                               "full disk; the run rewrites that step when it resumes", path, number, line[:40])
                continue
            raise ValueError(f"{path}:{number} is not JSON ({err}): expected one object per line; the file "
                             "was edited or damaged, so remove or fix that line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number} is not a JSON object: expected one object per line")
        records.append(record)
    return records
