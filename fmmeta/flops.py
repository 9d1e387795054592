"""The FLOPs a forward (and backward) pass of a LoRA model over a frozen base performs.

One count for every figure of model FLOP/s or MFU the benchmarks report (``benchmarks/common.py``
``PassCounter``, ``benchmarks/throughput.py``, ``benchmarks/trainer_baseline.py``). Nothing in the
library itself reports FLOPs: its telemetry reports tokens per second.

The usual ``6 x N x tokens`` is the cost of training every weight: forward ``2N`` per token (a
multiply and an add per weight), backward ``4N`` (the gradient to the layer's input, ``2N``, and to
its weight, ``2N``). Under LoRA the base is frozen: no weight gradient is computed for it, so its
backward is ``2N``, and the adapters add their own terms. A pass of ``T`` positions (padding
included: the body computes them), ``K`` attended keys summed over its positions and the LM head at
``H`` positions counts, with the shape facts of :class:`ModelShape`:

forward
    * ``2 x T x (body + adapter)``: every linear layer of the decoder, frozen base and LoRA ``A``
      and ``B`` alike (``x @ W.T`` is ``2 x in x out`` per row);
    * ``4 x attention_width x layers x K``: per layer, ``Q @ K.T`` and ``P @ V``, each ``2 x
      head_dim`` per query head per (position, key) pair; ``K = sum over positions of p + 1``
      for the position ``p`` within its sequence (:func:`attended_keys`), the causal half of a
      row (``L (L + 1) / 2`` for a sequence of ``L``); in padding-free lines each example, and in a
      prefix tree (``fmmeta.evaluation.prefix_tree``) each node's ancestors, whose depth its
      position is;
    * ``2 x vocab x hidden x H``: the LM head where it is computed (:func:`head_positions`: the
      answer positions in fmmeta's loops, which pass ``logits_to_keep``; every position without
      it, as Hugging Face's ``Trainer`` computes it).

backward (a pass run with gradients enabled)
    * ``2 x T x body_backward``: the gradient to the input of each frozen linear layer whose input
      needs one (every layer above the lowest adapter; not the projections that read the frozen
      residual stream below it, e.g. the first layer's ``q``, ``k`` and ``v``);
    * ``2 x T x adapter`` (the adapters' weight gradients) ``+ 2 x T x adapter_backward`` (the
      gradient to their input, where it needs one);
    * ``8 x attention_width x backward_layers x K``: twice the forward's attention (the gradients
      to ``Q``, ``K`` and ``V`` and to the scores), in every layer the backward runs through;
    * ``2 x vocab x hidden x H`` where the head's input needs a gradient (its weight is frozen).

With adapters in every layer that is about ``T x (4 x body + 6 x adapter) + 12 x attention_width
x layers x K + 4 x vocab x hidden x H``. Not counted: norms, rotary embeddings, activations,
softmax and the loss (elementwise, a few FLOPs per value); a kernel that computes the full square
of scores and masks half of it away does up to twice the attention term; the count is what the
pass needs. ANIL's inner passes, whose backward stops at the lowest adapted layer, are counted as
if every adapter trained (the shape is read once, with the model's trainable tensors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fmmeta.algorithms.answer_loss import unwrap_causal_lm

__all__ = ["ModelShape", "PassSize", "attended_keys", "head_positions", "model_shape", "pass_flops",
           "pass_size"]

_LAYER = re.compile(r"\.(\d+)\.")
"""The first numbered module in a name is its decoder layer (``...layers.7.self_attn...``)."""


@dataclass(frozen=True)
class ModelShape:
    """What a pass's FLOPs depend on, read from the model by :func:`model_shape`.

    Attributes:
        layers: decoder layers.
        hidden: the residual stream's width (the LM head's input).
        attention_width: query heads x head dimension.
        vocab: the LM head's outputs.
        body: weights of the frozen linear layers in the decoder (not the LM head, not embeddings).
        adapter: weights of the trainable linear layers (LoRA ``A`` and ``B``).
        body_backward: of ``body``, those whose input needs a gradient in a backward.
        adapter_backward: of ``adapter``, those whose input needs a gradient in a backward.
        backward_layers: decoder layers a backward runs through.
        head_backward: whether the LM head's input needs a gradient in a backward.
    """

    layers: int
    hidden: int
    attention_width: int
    vocab: int
    body: int
    adapter: int
    body_backward: int
    adapter_backward: int
    backward_layers: int
    head_backward: bool


@dataclass(frozen=True)
class PassSize:
    """One pass: ``tokens`` positions through the body, ``keys`` attended keys summed over them,
    the LM head at ``head`` positions, and whether a backward follows."""

    tokens: int
    keys: int
    head: int
    backward: bool


def pass_flops(shape: ModelShape, size: PassSize) -> int:
    """The FLOPs of one pass (each term derived in the module docstring)."""
    t, k, h = size.tokens, size.keys, size.head
    head = 2 * shape.vocab * shape.hidden * h
    forward = (2 * t * (shape.body + shape.adapter)
               + 4 * shape.attention_width * shape.layers * k
               + head)
    if not size.backward:
        return forward
    backward = (2 * t * shape.body_backward
                + 2 * t * (shape.adapter + shape.adapter_backward)
                + 8 * shape.attention_width * shape.backward_layers * k
                + (head if shape.head_backward else 0))
    return forward + backward


def attended_keys(input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor | int:
    """Keys attended, summed over a pass's positions: ``p + 1`` for a position ``p`` within its
    sequence (``position_ids`` where the pass gives them, else ``0 .. T-1`` in every row). A tensor
    (on the ids' device, not synchronised) where it comes from ``position_ids``."""
    rows, width = input_ids.shape[0], input_ids.shape[-1]
    if position_ids is None:
        return rows * width * (width + 1) // 2
    return (position_ids + 1).sum() * (rows // position_ids.shape[0])


def head_positions(input_ids: torch.Tensor, logits_to_keep: Any = None) -> torch.Tensor | int:
    """Positions the LM head runs at, as transformers reads ``logits_to_keep``: absent or ``0``,
    every position; an int ``n``, the last ``n`` of each row; a 1D index tensor, those columns of
    each row; a 2D boolean mask (``fmmeta.algorithms.answer_loss.logits_at``), its ``True``
    entries. A tensor (not synchronised) for a mask."""
    rows, width = input_ids.shape[0], input_ids.shape[-1]
    if logits_to_keep is None or isinstance(logits_to_keep, int):
        return rows * (min(int(logits_to_keep), width) if logits_to_keep else width)
    if logits_to_keep.dtype == torch.bool:
        return logits_to_keep.sum() * (rows if logits_to_keep.dim() == 1 else 1)
    return rows * logits_to_keep.numel()


def pass_size(input_ids: torch.Tensor, *, position_ids: torch.Tensor | None = None,
              logits_to_keep: Any = None, backward: bool) -> PassSize:
    """The :class:`PassSize` of a forward given these arguments (no KV cache); ``backward``:
    whether one follows. Leave ``logits_to_keep`` out for a pass that computes the head at every
    position (Hugging Face's ``labels=`` loss)."""
    return PassSize(tokens=int(input_ids.numel()), keys=int(attended_keys(input_ids, position_ids)),
                    head=int(head_positions(input_ids, logits_to_keep)), backward=backward)


def _linears_seen(model: nn.Module) -> dict[str, tuple[nn.Linear, bool, bool]]:
    """Every linear layer a tiny forward with gradients enabled runs, with whether its input and
    its output needed a gradient (eval mode, so no dropout draws a random number; eager, so
    compiled layers compile nothing for it)."""
    seen: dict[str, tuple[nn.Linear, bool, bool]] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            def record(m: nn.Module, args: tuple, out: torch.Tensor, name: str = name) -> None:
                seen[name] = (m, bool(args[0].requires_grad), bool(out.requires_grad))  # type: ignore[assignment]
            hooks.append(module.register_forward_hook(record))
    was_training = model.training
    device = next(model.parameters()).device
    try:
        model.eval()
        with torch.enable_grad(), torch.compiler.set_stance("force_eager"):
            model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device), use_cache=False)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return seen


def model_shape(model: nn.Module) -> ModelShape:
    """The shape facts of a (peft-wrapped) causal LM with its trainable tensors as they are now:
    sizes from its config, weights and gradient flow from one tiny forward (:func:`_linears_seen`;
    weights unpartitioned, not under ZeRO-3)."""
    lm: Any = unwrap_causal_lm(model)  # its config and heads are read by name
    config = lm.config
    seen = _linears_seen(model)
    head = lm.get_output_embeddings()
    body = {n: v for n, v in seen.items() if v[0] is not head and not v[0].weight.requires_grad}
    adapter = {n: v for n, v in seen.items() if v[0].weight.requires_grad}
    heads, hidden = config.num_attention_heads, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    through = {n for n, (m, _, out) in seen.items() if out and m is not head}
    numbered = {int(found.group(1)) for n in through if (found := _LAYER.search(n))}
    head_seen = next((v for v in seen.values() if v[0] is head), None)
    return ModelShape(
        layers=config.num_hidden_layers, hidden=hidden, attention_width=heads * head_dim,
        vocab=head.out_features if head is not None else config.vocab_size,
        body=sum(m.weight.numel() for m, _, _ in body.values()),
        adapter=sum(m.weight.numel() for m, _, _ in adapter.values()),
        body_backward=sum(m.weight.numel() for m, grad_in, _ in body.values() if grad_in),
        adapter_backward=sum(m.weight.numel() for m, grad_in, _ in adapter.values() if grad_in),
        backward_layers=len(numbered) if numbered or not through else config.num_hidden_layers,
        head_backward=bool(head_seen and head_seen[1]),
    )
