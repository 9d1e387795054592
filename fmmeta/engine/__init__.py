"""The engine layer's face: what recipes and the study import (never its submodules).

Everything that knows the distributed framework (DeepSpeed, accelerate, ZeRO-3's partitions)
lives in this package; a recipe sees only the names below:

* :class:`EngineFactory`: chosen from ``cfg.engine``; joins the ranks, builds the base model
  (partitioned under ZeRO-3), resets the adapter to a given initial one and makes engines.
* :data:`ENGINE_KINDS`, :class:`EngineKind`, :class:`EngineRequest` and
  :func:`register_engine_kind`: the kinds ``engine.kind`` names, read live, and how another is
  added (:mod:`fmmeta.engine.kinds`).
* :class:`Engine`: what a meta-algorithm and a recipe call during a run (its ``lockstep``,
  ``sharding`` and ``close``).
* :class:`NonFiniteGuard` and :class:`NonFiniteError`: the same verdict on a non-finite
  meta-gradient on every rank.
* :func:`all_gather_object`, :func:`broadcast_from_rank0`: the two collectives a recipe makes
  itself (a shared folder's check, the output folder's claim), and :func:`strip_local_rank`, the
  launcher's argument a recipe's parser drops.

Why a face: the submodules are free to move (an FSDP engine, say, adds a module and registers its
kind) without a recipe changing its imports, and a reader of a recipe sees the engine as one seam.
"""

from fmmeta.engine.distributed import all_gather_object, broadcast_from_rank0, strip_local_rank
from fmmeta.engine.factory import EngineFactory
from fmmeta.engine.guard import NonFiniteError, NonFiniteGuard
from fmmeta.engine.kinds import ENGINE_KINDS, EngineKind, EngineRequest, register_engine_kind
from fmmeta.engine.protocol import Engine

__all__ = [
    "ENGINE_KINDS",
    "Engine",
    "EngineFactory",
    "EngineKind",
    "EngineRequest",
    "NonFiniteError",
    "NonFiniteGuard",
    "all_gather_object",
    "broadcast_from_rank0",
    "register_engine_kind",
    "strip_local_rank",
]
