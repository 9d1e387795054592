"""fmmeta: meta-tuning for foundation models.

``import fmmeta`` stays light (no torch, no model): :func:`adapt` imports what it needs when called,
and the registries are imported when first read:

* :data:`METHODS` (with :class:`Method` and :func:`register_method`): every meta-learning method
  ``methods`` accepts (:mod:`fmmeta.algorithms.build`);
* :data:`ENGINE_KINDS` (with :class:`EngineKind` and :func:`register_engine_kind`): every engine
  ``engine.kind`` names (:mod:`fmmeta.engine.kinds`).

Each is the registry's own dict, so it is read live: a method or kind registered later shows up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fmmeta.adaptation import Adapted
    from fmmeta.algorithms.build import METHODS, Method, register_method
    from fmmeta.engine.kinds import ENGINE_KINDS, EngineKind, register_engine_kind

__all__ = ["ENGINE_KINDS", "METHODS", "EngineKind", "Method", "adapt", "register_engine_kind", "register_method"]

_LAZY = {
    "METHODS": "fmmeta.algorithms.build", "Method": "fmmeta.algorithms.build",
    "register_method": "fmmeta.algorithms.build", "ENGINE_KINDS": "fmmeta.engine.kinds",
    "EngineKind": "fmmeta.engine.kinds", "register_engine_kind": "fmmeta.engine.kinds",
}
"""Name -> the module that owns it, imported on first access (both import torch)."""


def __getattr__(name: str) -> Any:
    """The registries of :data:`_LAZY`, from their own modules, when first asked for."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def adapt(run: Any, method: str, support: Any, query: Any = None, **kwargs: Any) -> Adapted:
    """Adapts a finished run's method to a new task from a few labelled rows: see
    :func:`fmmeta.adaptation.adapt` (the same arguments), which this calls."""
    from fmmeta.adaptation import adapt as adapt_task

    return adapt_task(run, method, support, query, **kwargs)
