"""Task-batched LoRA: one forward and backward in which every row runs through its own task's adapter.

Several tasks' inner loops share each pass: the frozen base runs once for all of them (under
ZeRO-3 it is all-gathered once per pass, not once per task), and each row adds its own task's
low-rank update. The fast weights of a rank's ``T`` tasks are held *stacked*, one leaf tensor
``[T, *shape]`` per adapter parameter, so one ``torch.autograd.grad`` gives every task its own
inner gradient in its own slice; the adapter parameters themselves (theta) are never written
during a meta-step.

How it plugs into peft: a vanilla peft LoRA ``Linear`` computes ``lora_B(lora_A(dropout(x))) *
scaling``. While :meth:`TaskLoRA.active` is entered, the ``forward`` of every trainable
``lora_A``/``lora_B`` module is replaced on the instance by a row-wise matmul with the stacked
weight: ``x[i] @ W[rows[i]].T``. Dropout, scaling, the base layer and every framework hook
(DeepSpeed's ZeRO-3 gathers) run unchanged, because ``nn.Module.__call__`` still runs them.
Every pass takes the same route whatever tasks its rows hold: each row's task weight gathered by
the row -> task tensor, then one batched matmul (a pass of padding-free lines, whose rows hold
several tasks' examples, routes each token instead; :meth:`TaskLoRA._routed`). The routing
tensors are built when :attr:`TaskLoRA.rows` is set, outside the model's forward, so a compiled
decoder layer (``engine.compile``) sees only tensors: an earlier fast path for one-task passes
chose the task's slice by a Python int, and each int was a new graph.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn


def lora_pairs(model: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """Every active vanilla ``(lora_A, lora_B)`` module pair of a peft model.

    Raises:
        ValueError: for LoRA variants the row-wise forward does not implement (DoRA and other
            ``lora_variant`` entries, a trainable ``lora_B`` bias).
    """
    pairs = []
    for name, module in model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        lora_b = getattr(module, "lora_B", None)
        if not isinstance(lora_a, nn.ModuleDict) or not isinstance(lora_b, nn.ModuleDict):
            continue
        variants = getattr(module, "lora_variant", {}) or {}
        for adapter in getattr(module, "active_adapters", list(lora_a.keys())):
            if adapter not in lora_a:
                continue
            if adapter in variants:
                raise ValueError(
                    f"{name}: LoRA variant {type(variants[adapter]).__name__} (e.g. DoRA) is not "
                    "supported by task-batched passes; use plain LoRA (lora.use_dora off)"
                )
            b = lora_b[adapter]
            if getattr(b, "bias", None) is not None and b.bias.requires_grad:
                raise ValueError(f"{name}: a trainable lora_B bias is not supported; use lora_bias=False")
            pairs.append((lora_a[adapter], b))
    return pairs


class TaskLoRA:
    """Runs a peft model's LoRA layers with stacked per-task weights (see the module docstring).

    Args:
        model: the peft-wrapped causal LM (or a framework wrapper around it).
        params: the adapter parameters in the engine's order; every trainable LoRA weight must be
            among them.

    Example:
        >>> lora = TaskLoRA(model, params)
        >>> fast = stack_adapters(params, n_tasks=4)
        >>> with lora.active(fast):
        ...     lora.rows = torch.tensor([0, 0, 1, 3])    # task of each row of the next pass
        ...     loss = rows_loss(model(input_ids=...))
    """

    def __init__(self, model: nn.Module, params: Sequence[torch.Tensor]) -> None:
        index = {id(p): i for i, p in enumerate(params)}
        self._modules: list[tuple[nn.Module, int]] = []
        for a, b in lora_pairs(model):
            for module in (a, b):
                w = module.weight
                if id(w) in index:
                    self._modules.append((module, index[id(w)]))
                elif w.requires_grad:
                    raise ValueError(
                        "a trainable LoRA weight is missing from the adapter parameters: pass "
                        "engine.adapter_parameters() of this model"
                    )
        if not self._modules:
            raise ValueError("the model has no trainable LoRA layers: wrap it with fmmeta.models.add_lora")
        self._device: torch.device = params[0].device if params else torch.device("cpu")
        self._n_tasks: int | None = None  # of the fast weights while active
        self._rows: torch.Tensor | None = None
        self._route: torch.Tensor | None = None  # ``rows`` on the weights' device
        self._one_hot: torch.Tensor | None = None  # fp32 ``[B, L, T]`` of a task per token

    @property
    def rows(self) -> torch.Tensor | None:
        """Task index of each row of the next pass, ``[B]``, or of each token, ``[B, T]``
        (padding-free lines hold several tasks' examples in a row); ``None``: all are task 0."""
        return self._rows

    @rows.setter
    def rows(self, rows: torch.Tensor | None) -> None:
        self._rows = rows
        self._build_routes()

    def _build_routes(self) -> None:
        """The tensors the LoRA forward reads, made here, outside any compiled region: ``rows``
        on the weights' device and, for a task per token, its one-hot ``[tokens, T]`` (it needs
        the fast weights' task count, so it is rebuilt on :meth:`active`)."""
        rows = self._rows
        self._route = None if rows is None or rows.numel() == 0 else rows.to(self._device)
        self._one_hot = None
        if self._route is not None and self._route.dim() == 2 and self._n_tasks is not None:
            self._one_hot = torch.nn.functional.one_hot(self._route, self._n_tasks).float()

    @contextlib.contextmanager
    def active(self, fast: Sequence[torch.Tensor]) -> Iterator["TaskLoRA"]:
        """Routes every LoRA matmul through ``fast`` (one ``[T, *shape]`` tensor per parameter)."""
        if fast:
            self._n_tasks, self._device = int(fast[0].shape[0]), fast[0].device
        self._build_routes()
        try:
            for module, i in self._modules:
                module.forward = self._forward_with(fast[i])  # instance attribute: hooks still run
            yield self
        finally:
            for module, _ in self._modules:
                module.__dict__.pop("forward", None)
            self._n_tasks = None
            self.rows = None  # a route outlives no fast weights (the next may hold fewer tasks)

    def _forward_with(self, weight: torch.Tensor):  # noqa: ANN202 - a bound closure
        def forward(x: torch.Tensor) -> torch.Tensor:
            # Fast weights are fp32 (see stack_adapters); each pass casts them to the
            # activations' dtype, and autograd returns their gradient in fp32.
            w = weight if weight.dtype == x.dtype else weight.to(x.dtype)
            if self._route is None:  # every row is task 0 (dummy passes, one adapter)
                return torch.matmul(x, w[0].transpose(0, 1))
            return self._routed(x, w)

        return forward

    def _routed(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x[i, t] @ w[rows[i]].T`` (a task per row) or ``x[i, t] @ w[rows[i, t]].T`` (per
        token), with no branch on the tasks' values, so one compiled graph serves a pass of one
        task and one of many. A task per row gathers each row's weight and runs one batched
        matmul (in eager, 2-3x faster than the per-token form below at 8 tasks, rank 8, hidden
        576; equal to peft's own matmul to 1e-6 in fp32). A task per token takes two dense ops: a
        LoRA factor is thin (rank ``r``), so all ``T`` tasks' products cost ``T`` times a thin
        matmul, far less than the base layer's. A (``in -> r``) computes every task's output and
        keeps each token's own (a product with a one-hot, which is exact); B (``r -> out``)
        places each token's input in its task's block of a ``[T * r]`` vector and multiplies once."""
        rows = self._route
        assert rows is not None  # the caller routes None to task 0
        per_token = rows.dim() == 2
        if x.dim() != 3 or (x.shape[:-1] if per_token else x.shape[:1]) != rows.shape:
            raise ValueError(
                f"task-batched LoRA expects [rows, length, features] inputs routed by a task per "
                f"{'token' if per_token else 'row'} of shape {tuple(rows.shape)}, got {tuple(x.shape)}"
            )
        if not per_token:
            return torch.bmm(x, w.index_select(0, rows).transpose(1, 2))  # [B, out, in] gathered
        one_hot = self._one_hot
        if one_hot is None:
            raise ValueError("a per-token task route is set but its one-hot is not: set rows inside active()")
        n_tasks, n_out, n_in = w.shape
        pick = one_hot.to(x.dtype).unsqueeze(-1)  # [B, L, T, 1]
        if n_out <= n_in:
            every = (x @ w.reshape(n_tasks * n_out, n_in).transpose(0, 1)).unflatten(-1, (n_tasks, n_out))
            return (every * pick).sum(dim=-2)
        blocks = (x.unsqueeze(-2) * pick).flatten(-2)  # [B, L, T * in]
        return blocks @ w.transpose(1, 2).reshape(n_tasks * n_in, n_out)


def stack_adapters(params: Sequence[torch.Tensor], n_tasks: int) -> list[torch.Tensor]:
    """``n_tasks`` copies of theta as fp32 leaf tensors ``[n_tasks, *shape]`` that require grad.

    fp32 whatever theta's dtype: in bf16 (8 significant bits) an inner step of lr * grad is often
    below half a unit in the last place of the weight, so bf16 fast weights lose most inner
    updates and Reptile's theta - phi came out exactly zero in two thirds of its elements on a
    tiny model. Inner updates and theta - phi are therefore fp32; only the forward casts.
    """
    if n_tasks < 1:
        raise ValueError(f"n_tasks={n_tasks} is invalid: stack at least one task")
    return [
        p.detach().to(torch.promote_types(p.dtype, torch.float32))
        .unsqueeze(0).expand(n_tasks, *p.shape).clone().requires_grad_(True)
        for p in params
    ]


__all__ = ["TaskLoRA", "lora_pairs", "stack_adapters"]
