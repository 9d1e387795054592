"""Strict JSON for the files a run writes (``metrics.jsonl``, ``eval.json``).

Python's ``json`` writes ``NaN`` and ``Infinity``, which are not JSON: jq, browsers and most other
readers refuse the whole file. A diverged learning rate or an unmeasured loss is a normal value
in our records, so every writer converts non-finite floats to ``null`` here, in one place.
"""

from __future__ import annotations

import json
import math
from typing import Any


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
