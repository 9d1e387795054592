"""``engine.pack_weights``: frozen base weights packed once for oneDNN's bf16 matmul on a CPU.

On a CPU with AMX, oneDNN multiplies bf16 matrices in a blocked layout of its own. Given a plain
weight it re-packs the weight into that layout on every matmul, reading and writing the whole
weight each time, and a meta-step's passes are short (90-250 tokens), so the packing costs about
as much as the multiply: one default-model MLP matmul of 240 tokens ran at 0.47 TFLOP/s plain and
1.0 packed (one thread, 30 distinct weights so none stays in cache). A LoRA run's base weights
never change, so :func:`pack_frozen_linears` packs each one once, in both orientations a pass
needs (``x @ W.T`` forward, ``grad @ W`` backward), and routes the layer through the
``fmmeta::frozen_linear`` op, which multiplies with the packed copy.

What it buys a run is less than the matmul alone (docs/benchmarks.md): a default-model meta-step
1.04x eager and 1.07x compiled (alternated in one process), the default run's training phase in
one process 1.06x compiled, and the whole default run (two worker processes, then evaluation,
whose passes of thousands of tokens gain nothing) no measurable time, for two packed copies of the
weights in memory (513 MB for the 135M default model). So it is opt-in.

The op is opaque to ``torch.compile`` (a registered op with a shape-only fake kernel), so a
compiled decoder layer calls it as it called the matmul before, with no graph break. It is
registered with ``torch.library.Library`` rather than ``torch.library.custom_op``, whose Python
wrapper cost about 20 us a call, against 12,000 calls in four meta-steps.

Correctness is kept by construction: the packed copies live in a table keyed by the weight's
storage address, checked against the weight's version counter on every call (a weight written in
place, e.g. by ``load_state_dict``, is packed again) and dropped when the weight is freed (so a new
tensor at the same address never meets a stale copy); a weight not in the table takes the plain
matmul. The results differ from plain matmuls by bf16 rounding (another accumulation order).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["PACK_HINT_TOKENS", "pack_frozen_linears", "packable", "packing_available"]

PACK_HINT_TOKENS = 256
"""Rows oneDNN is told to expect when packing (the layout suits any row count; the hint picks the
blocking of a typical pass)."""

_mkldnn = torch.ops.mkldnn


@dataclass
class _Packed:
    forward: torch.Tensor
    """``weight`` in oneDNN's layout, for ``x @ weight.T``."""
    backward: torch.Tensor
    """``weight.T`` in oneDNN's layout, for ``grad @ weight``."""
    version: int
    """The weight's version counter when packed (an in-place write bumps it)."""
    shape: torch.Size
    """The weight's shape (a view of another shape may start at the same address)."""


_PACKED: dict[int, _Packed] = {}
"""Packed copies by the weight's storage address (see the module docstring)."""


def packing_available() -> bool:
    """Whether this torch build and CPU have oneDNN's bf16 matmul with packed weights."""
    return (torch.backends.mkldnn.is_available()
            and bool(_mkldnn._is_mkldnn_bf16_supported())
            and hasattr(_mkldnn, "_reorder_linear_weight"))


def _pack(weight: torch.Tensor) -> _Packed:
    w = weight.detach()
    return _Packed(_mkldnn._reorder_linear_weight(w, PACK_HINT_TOKENS),
                   _mkldnn._reorder_linear_weight(w.t().contiguous(), PACK_HINT_TOKENS),
                   weight._version, weight.shape)


def _packed(x: torch.Tensor, weight: torch.Tensor) -> _Packed | None:
    """The packed copies of ``weight`` for a product with ``x``, or ``None`` (the plain matmul,
    which also raises torch's own error for mismatched dtypes)."""
    entry = _PACKED.get(weight.data_ptr())
    if entry is None or entry.shape != weight.shape or x.dtype != weight.dtype:
        return None
    if entry.version != weight._version:  # written in place since packing
        entry = _PACKED[weight.data_ptr()] = _pack(weight)
    return entry


def _frozen_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    entry = _packed(x, weight)
    if entry is None:
        return F.linear(x, weight, bias)
    return _mkldnn._linear_pointwise(x.contiguous(), entry.forward, bias, "none", [], "")


def _frozen_linear_input_grad(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    entry = _packed(grad, weight)
    if entry is None:
        return torch.matmul(grad, weight)
    return _mkldnn._linear_pointwise(grad.contiguous(), entry.backward, None, "none", [], "")


_LIB = torch.library.Library("fmmeta", "DEF")
_LIB.define("frozen_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_LIB.define("frozen_linear_input_grad(Tensor grad, Tensor weight) -> Tensor")
_LIB.impl("frozen_linear", _frozen_linear, "CPU")
_LIB.impl("frozen_linear_input_grad", _frozen_linear_input_grad, "CPU")


@torch.library.register_fake("fmmeta::frozen_linear")
def _frozen_linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("fmmeta::frozen_linear_input_grad")
def _input_grad_fake(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return grad.new_empty((*grad.shape[:-1], weight.shape[1]))


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x if weight.requires_grad else None, weight)  # type: ignore[attr-defined]
    ctx.bias_grad = bias is not None and bias.requires_grad  # type: ignore[attr-defined]


def _backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The input's gradient through the packed transpose; the weight's and bias's only where one
    was made trainable after packing (never in a LoRA run, but then still right)."""
    x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
    grad_x = torch.ops.fmmeta.frozen_linear_input_grad(grad, weight)
    flat = grad.reshape(-1, grad.shape[-1])
    grad_w = flat.t() @ x.reshape(-1, x.shape[-1]) if x is not None else None
    grad_b = flat.sum(0) if ctx.bias_grad else None  # type: ignore[attr-defined]
    return grad_x, grad_w, grad_b


torch.library.register_autograd("fmmeta::frozen_linear", _backward, setup_context=_setup_context)


def packable(module: nn.Module) -> TypeGuard[nn.Linear]:
    """A linear layer whose weight is a frozen 2-D bf16 CPU tensor (and so is its bias, if any)."""
    if not isinstance(module, nn.Linear):
        return False
    w, b = module.weight, module.bias
    return (w.dtype == torch.bfloat16 and w.device.type == "cpu" and not w.requires_grad
            and w.dim() == 2 and w.is_contiguous() and (b is None or not b.requires_grad))


def _forward_of(module: nn.Linear):  # noqa: ANN202 - a bound closure
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fmmeta.frozen_linear(x, module.weight, module.bias)

    return forward


def pack_frozen_linears(model: nn.Module) -> int:
    """Packs every :func:`packable` linear layer of ``model`` once and routes it through the
    packed op (an instance ``forward``, so hooks and wrappers such as peft's LoRA layer still run
    around it); returns how many layers it packed. Idempotent; a no-op where
    :func:`packing_available` is false."""
    if not packing_available():
        logger.warning("engine.pack_weights: this torch build or CPU has no oneDNN bf16 matmul to pack "
                       "weights for; the matmuls stay plain")
        return 0
    packed, size = 0, 0
    for module in model.modules():
        if not packable(module) or "forward" in module.__dict__:  # not packable, or packed already
            continue
        w = module.weight
        key = w.data_ptr()
        if key not in _PACKED:
            _PACKED[key] = _pack(w)
            weakref.finalize(w, _PACKED.pop, key, None)  # a freed weight's address may be reused
            size += 2 * w.numel() * w.element_size()
        module.forward = _forward_of(module)  # type: ignore[method-assign]  # instance attribute
        packed += 1
    if packed:
        logger.info("%d frozen linear layers packed for oneDNN (%.0f MB of packed copies)", packed, size / 2**20)
    return packed
