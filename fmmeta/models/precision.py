"""Compute precision: which dtype the hardware computes fast, and attention that stays fast in it.

``model.dtype="auto"`` (the default) means bf16 where the hardware has native bf16 arithmetic (a
CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX-BF16) and fp32 elsewhere, where bf16
is emulated and slower than fp32. Only the forward and backward compute in it: the adapter's
masters, every fast weight, optimizer moments and loss sums stay fp32 (see
:func:`fmmeta.algorithms.task_lora.stack_adapters`).

On CPU, PyTorch's bf16 ``scaled_dot_product_attention`` backward is far slower than its fp32 one
(measured with SmolLM2-135M on 64 rows x 12 tokens: 20x, 41% of a forward + backward), which
cancels most of what bf16 buys. A bf16 model therefore runs attention through
:data:`FP32_ATTENTION`: the same SDPA kernel with queries, keys and values cast to fp32 on CPU
(attention is a small share of the FLOPs at few-shot lengths) and untouched on other devices.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

FP32_ATTENTION = "sdpa_fp32_on_cpu"
"""Name of the attention implementation a bf16 model runs (registered with transformers)."""

_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.float32, "fp32"),
    "bfloat16": (torch.bfloat16, "bf16"),
}
"""The one table of precisions: a ``model.dtype`` name (besides ``"auto"``) -> its torch dtype and
the engine's name for it (DeepSpeed's ``"fp32"``/``"bf16"``). Models, engines and the recipe's
config all read it."""


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (Linux); empty where they cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _computes_on_gpu(device: str | torch.device | None) -> bool:
    """Whether ``device`` is a GPU; ``None``: the device a run computes on (a GPU when torch sees
    one, unless ``DS_ACCELERATOR=cpu`` keeps the run on the CPU)."""
    if device is not None:
        return torch.device(device).type == "cuda"
    return torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"


def native_bf16(flags: frozenset[str] | None = None, device: str | torch.device | None = None
                ) -> tuple[bool, str]:
    """Whether ``device`` (default: the one this process computes on) has native bf16, and why
    (for the log). A benchmark names its ``--device``: on a GPU machine its CPU runs ask the CPU."""
    if _computes_on_gpu(device):
        if torch.cuda.is_bf16_supported():
            return True, f"GPU {torch.cuda.get_device_name()} supports bf16"
        return False, f"GPU {torch.cuda.get_device_name()} has no bf16"
    flags = cpu_flags() if flags is None else flags
    found = [f for f in _CPU_BF16_FLAGS if f in flags]
    if found:
        return True, f"the CPU has {', '.join(found)}"
    return False, f"the CPU has none of {', '.join(_CPU_BF16_FLAGS)} (bf16 would be emulated)"


def auto_dtype(flags: frozenset[str] | None = None, device: str | torch.device | None = None) -> tuple[str, str]:
    """What ``model.dtype="auto"`` means here: ``"bfloat16"`` or ``"float32"``, and why (for the log)."""
    native, why = native_bf16(flags, device)
    return ("bfloat16" if native else "float32"), why


def resolve_dtype(name: str, flags: frozenset[str] | None = None, device: str | torch.device | None = None) -> str:
    """``"auto"`` -> ``"bfloat16"`` or ``"float32"`` for ``device`` (:func:`auto_dtype`);
    other names are returned as they are."""
    return auto_dtype(flags, device)[0] if name == "auto" else name


def engine_precision(name: str) -> str:
    """The engine's precision (``"bf16"`` or ``"fp32"``) for a ``model.dtype`` name."""
    return DTYPES[resolve_dtype(name)][1]


def precision_dtype(precision: str) -> torch.dtype:
    """The torch dtype of an engine precision (``"bf16"`` -> ``torch.bfloat16``)."""
    for dtype, engine_name in DTYPES.values():
        if engine_name == precision:
            return dtype
    raise ValueError(f"precision={precision!r} is invalid: allowed "
                     f"{[engine_name for _, engine_name in DTYPES.values()]}")


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any
                  ) -> tuple[torch.Tensor, Any]:
        if query.device.type != "cpu" or query.dtype == torch.float32:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                              attention_mask, **kwargs)
        return out.to(query.dtype), weights

    AttentionInterface.register(FP32_ATTENTION, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FP32_ATTENTION, sdpa_mask)  # the masks SDPA gets


def use_fp32_attention(model: torch.nn.Module) -> bool:
    """Switches a bf16 transformers model that uses SDPA to :data:`FP32_ATTENTION`; returns
    whether it did (other dtypes and attention implementations are left as they are)."""
    config = getattr(model, "config", None)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if config is None or dtype != torch.bfloat16 or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    config._attn_implementation = FP32_ATTENTION
    return True


__all__ = ["FP32_ATTENTION", "auto_dtype", "cpu_flags", "native_bf16", "resolve_dtype", "use_fp32_attention"]
