"""Building the base model already partitioned under ZeRO-3, so no rank ever holds it whole.

DeepSpeed partitions a module that was built whole only when ``deepspeed.initialize`` wraps it,
and on a GPU it first moves the whole module onto the device: the full model must then fit in one
rank's host memory and on one GPU. Built under ``deepspeed.zero.Init`` instead, every parameter is
cut into per-rank partitions as soon as its module is constructed, and ``deepspeed.initialize``
leaves it where it is.

:func:`partitioned_build` returns a :class:`PartitionedBuild` when the run will use ZeRO-3 (``None``
otherwise). While it is alive, transformers' DeepSpeed integration (``HfDeepSpeedConfig``) sees
ZeRO-3 as enabled, which is what makes

* ``_from_config`` construct under ``zero.Init`` (the tiny random models), and
* ``from_pretrained`` construct under ``zero.Init`` and copy checkpoint tensors into the partitions
  one module at a time (rank 0 reads the checkpoint; the others only need names and shapes).
  GGUF files are the exception transformers allows: it builds the model whole and de-quantizes the
  whole file into it on every rank, so each rank holds the whole model in host memory while
  loading (never on a GPU); :meth:`PartitionedBuild.partition` then cuts it into partitions right
  away, before anything else is allocated.

The object must outlive the model (transformers and peft consult it after loading too), so the
recipe keeps it for the whole run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fmmeta.config import EngineConfig
from fmmeta.engine.distributed import release_shm_buffers
from fmmeta.engine.ds_config import (
    load_ds_config,
    owned_values,
    resolve_ds_config,
    zero_stage,
)
from fmmeta.engine.kinds import EngineKind, resolve_engine_kind
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.engine.zero import held_elements, is_zero3_param, write_partition

logger = logging.getLogger(__name__)


class PartitionedBuild:
    """ZeRO-3 construction settings for one run; keep it alive as long as the model.

    Args:
        ds_config: a resolved DeepSpeed config (no ``"auto"`` left) with ZeRO stage 3.

    Example:
        >>> build = partitioned_build(cfg.engine, cfg.optim, precision="fp32")   # doctest: +SKIP
        >>> base, tok = build_model_and_tokenizer(cfg.model, partitioned=build)  # doctest: +SKIP
    """

    def __init__(self, ds_config: Mapping[str, Any]) -> None:
        import deepspeed
        import torch.distributed as dist
        from transformers.integrations import HfDeepSpeedConfig

        if zero_stage(ds_config) != 3:
            raise ValueError(
                f"PartitionedBuild needs ZeRO stage 3; the DeepSpeed config has stage "
                f"{zero_stage(ds_config)}"
            )
        if not dist.is_initialized():
            raise RuntimeError(
                "PartitionedBuild needs the process group up: call "
                "fmmeta.engine.distributed.init_distributed first (partitioned_build does)"
            )
        # zero.Init reads the world size from DeepSpeed's own communication layer, which adopts
        # the process group that is already up.
        deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)
        release_shm_buffers()
        _return_large_frees_to_the_os()
        self.ds_config = dict(ds_config)
        # transformers holds only a weak reference to it: this attribute keeps ZeRO-3 enabled.
        self._hf_config = HfDeepSpeedConfig(self.ds_config)

    def write_full(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Fills ``param`` with the full ``value`` by writing only this rank's partition."""
        write_partition(param, value)

    def partition(self, model: nn.Module) -> None:
        """Partitions every parameter of ``model`` that was built whole, in place (every rank).

        For loaders that cannot construct under ``zero.Init`` (GGUF): rank 0's values are kept,
        and each rank's full copy is freed as its parameter is partitioned.
        """
        import deepspeed

        if all(is_zero3_param(p) for p in model.parameters()):
            return
        # mem_efficient_linear=False: with module= it would replace torch.nn.functional.linear
        # for the rest of the process.
        deepspeed.zero.Init(module=model, config_dict_or_path=self.ds_config, mem_efficient_linear=False)

    def check_partitioned(self, model: nn.Module) -> None:
        """Raises unless every parameter of ``model`` is a ZeRO-3 partition.

        Raises:
            RuntimeError: naming the first parameter that was built whole.
        """
        for name, p in model.named_parameters():
            if not is_zero3_param(p):
                raise RuntimeError(
                    f"parameter {name!r} was built whole, not partitioned: construct the model "
                    "while the PartitionedBuild is alive (transformers' _from_config or "
                    "from_pretrained)"
                )
        held, full = held_elements(model.parameters())
        logger.info("base built partitioned: this rank holds %d of %d parameter elements", held, full)


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
_MMAP_THRESHOLD_BYTES = 1 << 20


def _return_large_frees_to_the_os() -> None:
    """Makes glibc serve allocations of 1 MiB or more with mmap, which go back to the OS on free.

    Building partitioned creates and frees a full tensor per parameter (zero.Init, the seeded
    init, gathers while loading). glibc's default raises its mmap threshold up to 32 MiB after
    such frees and then serves those sizes from the heap, where freed memory mostly stays part
    of the process: measured on a 332M-parameter model with 2 ranks, about 0.6 GB per rank of
    resident memory that held nothing. A no-op where the C library is not glibc.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    if mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) != 1:
        logger.debug("mallopt(M_MMAP_THRESHOLD) refused; freed memory may stay resident")


def partitioned_build(
    cfg: EngineConfig, optim_cfg: OuterOptimConfig, *, precision: str, kind: EngineKind | None = None
) -> PartitionedBuild | None:
    """A :class:`PartitionedBuild` if ``kind`` (``None``: the kind ``cfg`` resolves to) runs
    under ZeRO-3, else ``None``.

    Call it on every rank, after the process group is up and before building the model.

    Raises:
        DSConfigError: the DeepSpeed config conflicts with the recipe (the same check the engine
            makes later, now before any weight is loaded).
    """
    from fmmeta.engine.distributed import default_backend, init_distributed

    ds = (kind or resolve_engine_kind(cfg)).deepspeed_source(cfg)
    if ds is None:
        return None
    source = load_ds_config(ds.config)
    if zero_stage(source) != 3:
        return None
    backend = default_backend()
    _, _, world_size = init_distributed(backend, cfg.collective_timeout_s)
    owned = owned_values(world_size=world_size, grad_clip=optim_cfg.grad_clip, precision=precision)
    # The adapter does not exist yet: the persistence threshold is left to DeepSpeed here (it only
    # matters once the engine wraps the model, and the engine raises it above the adapter size).
    return PartitionedBuild(resolve_ds_config(source, owned=owned))
