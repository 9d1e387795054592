"""An independent single-task reference: plain peft forward, HF's mean loss, ``.backward()``.

Nothing from ``fmmeta.algorithms`` is used here, so a packed meta-step that matches it is right
for a reason other than sharing code with it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from fmmeta.tasks.episode import Episode, Example, collate

PAD_ID = 0


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _grad(model: torch.nn.Module, examples: Sequence[Example]) -> list[torch.Tensor]:
    """Gradient of the mean NLL over the examples' answer tokens (one batch, HF's own loss)."""
    b = collate(list(examples), PAD_ID)
    model.zero_grad()
    model(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=b.labels).loss.backward()
    return [p.grad.detach().clone() for p in trainable(model)]


def _clip(grads: list[torch.Tensor], max_norm: float | None) -> None:
    if max_norm:
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
        coef = min(1.0, max_norm / (float(norm) + 1e-6))
        for g in grads:
            g.mul_(coef)


def _sgd(model: torch.nn.Module, examples: Sequence[Example], lr: float, steps: int,
         clip: float | None) -> None:
    for _ in range(steps):
        grads = _grad(model, examples)
        _clip(grads, clip)
        with torch.no_grad():
            for p, g in zip(trainable(model), grads):
                p -= lr * g


def task_meta_gradient(model: torch.nn.Module, ep: Episode, method: str, *, lr: float, steps: int,
                       clip: float | None = None) -> list[torch.Tensor]:
    """One task's meta-gradient, computed the textbook way; leaves the model at theta."""
    theta = [p.detach().clone() for p in trainable(model)]
    try:
        if method == "multitask":
            return _grad(model, list(ep.support) + list(ep.query)) if steps else _grad(model, ep.query)
        _sgd(model, ep.support, lr, steps, clip)
        if method == "fomaml":
            return _grad(model, ep.query)
        return [t - p.detach() for t, p in zip(theta, trainable(model))]  # reptile
    finally:
        with torch.no_grad():
            for p, t in zip(trainable(model), theta):
                p.copy_(t)


def summed_meta_gradient(model: torch.nn.Module, episodes: Sequence[Episode], method: str, **kw) -> list[torch.Tensor]:
    total = None
    for ep in episodes:
        g = task_meta_gradient(model, ep, method, **kw)
        total = g if total is None else [a + b for a, b in zip(total, g)]
    assert total is not None
    return total
