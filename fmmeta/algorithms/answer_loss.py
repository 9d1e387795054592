"""The loss on answer tokens: what every pass of every loop (inner, outer, evaluation) computes.

Losses are *sums* of next-token NLL over answer tokens (not transformers' mean), per row, in fp32:
passes can then be added and each task divided once by its own answer-token count, so a task's
loss does not depend on how its examples were split into passes or packed with other tasks'.
The LM head runs only at the positions that predict answer tokens (:func:`answer_logits`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fmmeta.tasks.episode import IGNORE_INDEX, Batch

DUMMY_PASS_TOKENS = 2
"""Sequence length of a dummy pass (what it adds to padded-token counts)."""


_LOGITS_TO_KEEP: dict[type, str] = {}


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The causal LM under framework wrappers (DeepSpeedEngine/DDP: ``.module``) and peft."""
    inner: Any = model  # wrappers expose the wrapped model under several names
    for _ in range(4):
        if hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
        elif isinstance(getattr(inner, "module", None), nn.Module):
            inner = inner.module
        else:
            break
    return inner


def _logits_to_keep_kind(model: nn.Module) -> str:
    """How the model takes ``logits_to_keep`` (cached per class): ``"mask"`` (a 2D boolean mask,
    through transformers' ``slice_logits_to_keep``), ``"index"`` (a 1D index tensor) or ``""``."""
    cls = type(unwrap_causal_lm(model))
    if cls not in _LOGITS_TO_KEEP:
        kind = ""
        try:
            if "logits_to_keep" in inspect.signature(cls.forward).parameters:
                kind = "mask" if "slice_logits_to_keep" in inspect.getsource(cls.forward) else "index"
        except (TypeError, ValueError, OSError):
            kind = ""
        _LOGITS_TO_KEEP[cls] = kind
    return _LOGITS_TO_KEEP[cls]


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether the underlying causal LM takes ``logits_to_keep`` (cached per class)."""
    return bool(_logits_to_keep_kind(model))


def logits_at(model: nn.Module, need: torch.Tensor, **model_kwargs: object) -> torch.Tensor:
    """The model's logits at the ``True`` positions of ``need`` (``[B, T]`` bool), flattened.

    The LM head is as wide as the vocabulary and prompts are long, so it runs only where it is
    needed. Models whose forward slices hidden states with transformers' ``slice_logits_to_keep``
    get the boolean mask: one head row per needed position, whatever the rows' lengths (a packed
    pass mixes tasks whose answers sit at different positions). Other models that take
    ``logits_to_keep`` get the index tensor of positions some row needs (an indexed copy is
    contiguous, so the head runs as one matmul; an int made HF slice a strided view that matmul
    expanded into a batched matmul reading the whole head once per row); the rest get full logits.

    Returns:
        ``[M, V]``: one row per needed position, in row-major order.
    """
    kind = _logits_to_keep_kind(model)
    keep = torch.nonzero(need.any(dim=0)).flatten()
    if kind == "mask" and bool(need.any()):
        model_kwargs["logits_to_keep"] = need
    elif kind and keep.numel():
        model_kwargs["logits_to_keep"] = keep
    out = model(**model_kwargs)
    logits = out.logits if hasattr(out, "logits") else out[0]
    rows, cols = torch.nonzero(need, as_tuple=True)
    if logits.dim() == 2 and logits.shape[0] == rows.numel():  # the mask was honoured
        return logits
    if logits.shape[1] == keep.numel() and kind:  # indexed positions: map columns into ``keep``
        cols = torch.searchsorted(keep, cols)
    return logits[rows, cols]


def answer_logits(model: nn.Module, batch: Batch, **model_kwargs: object
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits at exactly the positions that predict answer tokens, flattened (:func:`logits_at`).

    Returns:
        ``(logits [M, V], targets [M], rows [M])``: one entry per answer token, its target token
        and its example (the row of a padded batch; of padding-free lines, the example the token
        is in), in row-major order.
    """
    labels = batch.labels
    need = torch.zeros_like(labels, dtype=torch.bool)
    need[:, :-1] = labels[:, 1:] != IGNORE_INDEX  # position p predicts token p + 1
    lines = batch.lines
    # No KV cache unless the caller asks: a model whose config says use_cache (SmolLM2's does)
    # would otherwise copy every layer's keys and values into one on every pass, for nothing.
    if lines is None:
        logits = logits_at(model, need, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           **{"use_cache": False, **model_kwargs})
    else:  # an example's first token is not predicted by the one before it in its line
        need[:, :-1] &= lines.token_rows[:, 1:] == lines.token_rows[:, :-1]
        # never a cache here: with one, the lines' examples would attend to each other
        logits = logits_at(model, need, input_ids=batch.input_ids, position_ids=lines.position_ids,
                           **{**model_kwargs, "use_cache": False})
    rows, cols = torch.nonzero(need, as_tuple=True)
    targets = labels[rows, cols + 1]
    return logits, targets, rows if lines is None else lines.token_rows[rows, cols]


def answer_loss_rows(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Per-row sum of next-token NLL over the batch's answer tokens, in fp32 (``[B]``).

    Sums (not HF's mean) so that passes can be added and each task divided once by its own
    answer-token count: the result does not depend on how a set was split or packed.

    Args:
        model: a causal LM (peft-wrapped or not) returning ``.logits``.
        batch: a collated micro-batch on the model's device (padded or padding-free lines).

    Returns:
        ``[B]`` (one per example) fp32 tensor connected to the graph (zeros, still connected, where no answer tokens).
    """
    logits, targets, rows = answer_logits(model, batch)
    n_rows = batch.n_rows
    zero = logits.float().sum() * 0.0  # keeps the result connected to the graph
    if rows.numel() == 0:
        return zero.expand(n_rows)
    nll = F.cross_entropy(logits.float(), targets, reduction="none")
    return torch.zeros(n_rows, device=nll.device).index_add(0, rows, nll) + zero


def answer_loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of next-token NLL over all of the batch's answer tokens, in fp32 (0-dim)."""
    return answer_loss_rows(model, batch).sum()


def check_lines(model: nn.Module) -> None:
    """Refuses a model on which an example in a padding-free line sees the one before it.

    Lines rely on the model splitting a row where ``position_ids`` restart (transformers does it
    in ``create_causal_mask`` when there is no attention mask and no cache); a model that does
    not would silently let examples attend to each other. So one tiny forward checks it: the
    same example after two different ones must get the same logits. Run it on every rank (under
    ZeRO-3 a forward is a collective).

    Raises:
        ValueError: if the second example's logits depend on the first.
    """
    config = getattr(unwrap_causal_lm(model), "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or 8)
    device = next(model.parameters()).device
    positions = torch.tensor([[0, 1, 2, 0, 1]], device=device)
    was_training = model.training
    model.eval()
    try:
        # Eager even where the layers are compiled (engine.compile): one tiny eval-mode forward
        # would otherwise compile a graph family of its own that no pass of the run uses.
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            after = [model(input_ids=torch.tensor([[t % vocab for t in first + [4, 5]]], device=device),
                           position_ids=positions, use_cache=False).logits[0, 3:].float()
                     for first in ([1, 2, 3], [3, 1, 2])]
    finally:
        model.train(was_training)
    change = float((after[0] - after[1]).abs().max())
    if change > 1e-3 * (1.0 + float(after[0].abs().max())):
        raise ValueError(
            f"algorithm.padding_free=true needs a model that keeps packed examples apart, but "
            f"{type(unwrap_causal_lm(model)).__name__} lets an example attend to the one before it in its "
            f"line (its logits moved by {change:.3g} when that one changed); set "
            "algorithm.padding_free: false for this model"
        )


def dummy_batch(device: torch.device | str) -> Batch:
    """A 2-token sequence with one labelled token: the input of a zero-weight dummy pass."""
    ids = torch.zeros((1, DUMMY_PASS_TOKENS), dtype=torch.long, device=device)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 1] = 0
    return Batch(ids, torch.ones_like(ids), labels, 1, DUMMY_PASS_TOKENS)
