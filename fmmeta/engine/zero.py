"""The one place that gathers ZeRO-3 parameters.

Under ZeRO-3 a parameter's ``.data`` is an empty ``[0]`` tensor except while DeepSpeed has gathered
it for a forward or backward (docs/design.md, "LoRA tensors under ZeRO-3"). The meta-learning
inner loop needs the LoRA tensors full and resident on every rank: it updates them in place, snapshots and restores
them, and saves them. Two DeepSpeed facts decide how this module keeps them resident:

* ``stage3_param_persistence_threshold`` marks small tensors persistent (``ds_persist``), but
  until ZeRO-3 has recorded a complete trace of the module calls (the first step, and again after
  any change of call pattern), its release hooks free *every* parameter of a finished sub-module,
  persistent or not; and right after ``deepspeed.initialize`` nothing is gathered yet.
* The release hooks never free a parameter marked ``is_external_param``, and the optimizer step
  re-partitions every parameter and then all-gathers the persistent ones with their new values.

So :func:`pin_adapter` marks the adapter tensors persistent and external, gathers them once, and
checks their shapes; :func:`ensure_resident` re-gathers any that are not available (after a step)
and checks again. Nothing here depends on trace timing. Outside ZeRO-3 every function is a no-op
apart from the shape check, so engines call them unconditionally.
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger(__name__)


def is_zero3_param(p: torch.Tensor) -> bool:
    """Whether ``p`` is managed (partitioned) by DeepSpeed ZeRO-3."""
    return hasattr(p, "ds_id") and hasattr(p, "ds_status")


def full_shape(p: torch.Tensor) -> torch.Size:
    """The parameter's full shape, whether or not it is currently gathered."""
    return p.ds_shape if is_zero3_param(p) else p.shape  # type: ignore[attr-defined]


def pin_adapter(params: Sequence[nn.Parameter]) -> None:
    """Makes the adapter tensors full and resident on this rank, and keeps them so.

    Must be called on every rank (the gather is a collective), right after ``deepspeed.initialize``.

    Raises:
        RuntimeError: if a tensor is still not full after the gather.
    """
    z3 = [p for p in params if is_zero3_param(p)]
    for p in z3:
        p.ds_persist = True  # type: ignore[attr-defined]
        p.is_external_param = True  # type: ignore[attr-defined]
    ensure_resident(params)
    if z3:
        logger.info("ZeRO-3: pinned %d adapter tensors (%d elements) on every rank",
                    len(z3), sum(p.numel() for p in z3))


@torch.no_grad()
def ensure_resident(params: Sequence[nn.Parameter]) -> None:
    """Gathers any adapter tensor ZeRO-3 has partitioned and checks every shape is full.

    A collective under ZeRO-3 when something needs gathering; call it on every rank at the same
    point (the engine does, after each outer step).

    Raises:
        RuntimeError: naming the first tensor that is not full.
    """
    z3 = [p for p in params if is_zero3_param(p)]
    if z3:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        missing = [p for p in z3 if p.ds_status != ZeroParamStatus.AVAILABLE]  # type: ignore[attr-defined]
        # ZeRO-3 moves every rank through the same states in lockstep, so ranks agree on
        # ``missing`` and the gather stays a matched collective.
        if missing:
            missing[0].all_gather(param_list=missing)  # type: ignore[attr-defined]
    check_resident(params)


def check_resident(params: Iterable[nn.Parameter]) -> None:
    """Raises if any tensor's data is not its full shape (the ``[0]`` symptom of a partitioned tensor)."""
    for i, p in enumerate(params):
        if tuple(p.data.shape) != tuple(full_shape(p)):
            raise RuntimeError(
                f"adapter tensor {i} has data shape {tuple(p.data.shape)} but full shape "
                f"{tuple(full_shape(p))}: it was partitioned by ZeRO-3; the engine must call "
                "fmmeta.engine.zero.pin_adapter after deepspeed.initialize"
            )


@torch.no_grad()
def gather_adapter(model: nn.Module, params: Sequence[nn.Parameter]) -> dict[str, torch.Tensor]:
    """Returns the adapter as ``{parameter name: full CPU tensor}`` (peft's naming, before it strips
    the adapter name), on every rank.

    Collective under ZeRO-3 only if something needs gathering.
    """
    ensure_resident(params)
    ids = {id(p) for p in params}
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if id(p) in ids:
            out[name] = p.detach().to("cpu", copy=True).contiguous()
    if len(out) != len(params):
        raise RuntimeError(
            f"gather_adapter found {len(out)} of {len(params)} adapter tensors in the model's "
            "named_parameters: pass the model the adapter parameters belong to"
        )
    for name, t in out.items():
        if t.numel() == 0:
            raise RuntimeError(f"gathered adapter tensor {name!r} is empty: refusing to save it")
    return out


@torch.no_grad()
def scatter_adapter(params: Sequence[nn.Parameter], values: Sequence[torch.Tensor]) -> None:
    """Writes full ``values`` into the adapter tensors on this rank, including ZeRO-3's own
    partition (``ds_tensor``), so the next re-gather does not bring back old values.

    Every rank must call it with the same values. The outer optimizer's master copy is not
    touched: load the optimizer state (or rebuild the engine) after loading an adapter mid-run.
    """
    ensure_resident(params)
    for p, v in zip(params, values, strict=True):
        if tuple(v.shape) != tuple(full_shape(p)):
            raise ValueError(
                f"adapter value has shape {tuple(v.shape)} but the parameter's full shape is "
                f"{tuple(full_shape(p))}: the adapter was saved with a different LoRA config"
            )
        p.data.copy_(v.to(p.dtype))
        if is_zero3_param(p):
            write_partition(p, p.data)


@torch.no_grad()
def write_partition(p: nn.Parameter, value: torch.Tensor) -> None:
    """Copies this rank's share of the full ``value`` into ZeRO-3's partition of ``p``.

    No collective: every rank holds ``value`` (or can compute it) and keeps only its slice, which
    is how a parameter can be filled without ever gathering it. ``p.data`` is left alone (it is
    the ``[0]`` placeholder while ``p`` is partitioned).

    Raises:
        ValueError: if ``value`` does not have ``p``'s full number of elements.
    """
    if not is_zero3_param(p):
        raise TypeError("write_partition needs a ZeRO-3 parameter (built under deepspeed.zero.Init)")
    flat = value.reshape(-1)
    if flat.numel() != p.ds_numel:  # type: ignore[attr-defined]
        raise ValueError(
            f"write_partition got {flat.numel()} elements for a parameter of full shape "
            f"{tuple(full_shape(p))}"
        )
    # this rank's partition covers flat[rank * n : (rank + 1) * n] (the last one padded)
    part = p.ds_tensor  # type: ignore[attr-defined]
    rank = dist.get_rank(group=p.ds_process_group) if dist.is_initialized() else 0  # type: ignore[attr-defined]
    lo = rank * part.numel()
    hi = min(lo + part.numel(), flat.numel())
    if hi > lo:
        part.data[: hi - lo].copy_(flat[lo:hi].to(part.dtype))


def held_elements(params: Iterable[nn.Parameter]) -> tuple[int, int]:
    """``(elements this rank holds, full elements)`` over ``params``.

    Under ZeRO-3 a rank holds its partition (``ds_tensor``) plus the full tensor while a
    parameter is gathered (persistent ones stay gathered); elsewhere it holds the whole tensor.
    """
    held = full = 0
    for p in params:
        if is_zero3_param(p):
            held += p.ds_tensor.numel() + p.data.numel()  # type: ignore[attr-defined]
            full += p.ds_numel  # type: ignore[attr-defined]
        else:
            held += p.numel()
            full += p.numel()
    return held, full
