"""fmmeta: meta-tuning for foundation models.

``import fmmeta`` stays light (no torch, no model): :func:`adapt` imports what it needs when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fmmeta.adaptation import Adapted

__all__ = ["adapt"]


def adapt(run: Any, method: str, support: Any, query: Any = None, **kwargs: Any) -> Adapted:
    """Adapts a finished run's method to a new task from a few labelled rows: see
    :func:`fmmeta.adaptation.adapt` (the same arguments), which this calls."""
    from fmmeta.adaptation import adapt as adapt_task

    return adapt_task(run, method, support, query, **kwargs)
