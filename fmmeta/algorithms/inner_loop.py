"""The one inner loop: adapt adapters on support sets, used by training and by evaluation.

A loop runs over *passes*: :class:`PackedBatch` micro-batches whose rows may belong to several
tasks (``rows`` names each row's task). The weights it differentiates are either

* stacked fast weights ``[T, *shape]`` of ``T`` tasks, routed per row by
  :class:`~fmmeta.algorithms.task_lora.TaskLoRA` (training: many tasks per pass), or
* the adapter parameters themselves with one task (evaluation: :func:`adapt` updates them in
  place, the caller snapshots and restores theta).

Gradients come from ``torch.autograd.grad`` over those weights only, never from ``.backward()``:
under DeepSpeed ZeRO-2/3 every ``engine.backward()`` reduce-scatters across ranks, and inner
loops are rank-local. Losses are *sums* of token NLL over answer tokens, weighted per row by its
task's scale (``1 / the task's answer tokens``), so each task's gradient is its own mean loss's
gradient whatever the split into passes or the other tasks sharing them. A ``None`` pass is a
dummy: one forward+backward on a 2-token sequence with weight 0, which keeps ZeRO-3's per-pass
collectives in lockstep across ranks without changing any result.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from fmmeta.algorithms.task_lora import TaskLoRA
from fmmeta.config import raise_if_invalid
from fmmeta.engine.optim import clip_grad_norm
from fmmeta.sampling.plan import PackedPass, TaskSlot
from fmmeta.tasks.episode import IGNORE_INDEX, Batch, collate

logger = logging.getLogger(__name__)

_INNER_OPTIMIZERS = ("sgd", "adam")
DUMMY_PASS_TOKENS = 2
"""Sequence length of a dummy pass (what it adds to padded-token counts)."""


@dataclass(frozen=True, kw_only=True)
class InnerLoopConfig:
    """Settings of the inner (per-task) adaptation."""

    inner_steps: int = 3
    """Optimizer steps on the support set per task (>= 0; 0 = no adaptation)."""
    inner_lr: float = 0.03
    """Inner learning rate (> 0). SGD on LoRA is fragile: on SmolLM2 lr 0.3 made every init worse
    after 3 steps, so choose it on meta-validation tasks."""
    inner_optimizer: str = "sgd"
    """"sgd" (plain, stateless) or "adam" (fresh moments for every task)."""
    inner_clip_norm: float | None = None
    """Clip each inner step's gradient to this global L2 norm (> 0); None = off."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """(beta1, beta2) of the inner Adam, each in [0, 1); unused for SGD."""
    adam_eps: float = 1e-8
    """Epsilon of the inner Adam (> 0); unused for SGD."""

    def validate(self) -> list[str]:
        """Range and choice checks, one problem per field."""
        problems: list[str] = []
        if self.inner_steps < 0:
            problems.append(f"inner_steps={self.inner_steps} is invalid: must be >= 0")
        if not self.inner_lr > 0:
            problems.append(f"inner_lr={self.inner_lr} is invalid: must be > 0 (e.g. 0.03)")
        if self.inner_optimizer not in _INNER_OPTIMIZERS:
            problems.append(
                f"inner_optimizer={self.inner_optimizer!r} is invalid: allowed {list(_INNER_OPTIMIZERS)}"
            )
        if self.inner_clip_norm is not None and not self.inner_clip_norm > 0:
            problems.append(
                f"inner_clip_norm={self.inner_clip_norm} is invalid: must be > 0, or None to turn "
                "clipping off"
            )
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            problems.append(f"adam_betas={self.adam_betas} is invalid: need two values in [0, 1)")
        if not self.adam_eps > 0:
            problems.append(f"adam_eps={self.adam_eps} is invalid: must be > 0")
        return problems


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------

_LOGITS_TO_KEEP: dict[type, str] = {}


def _unwrap(model: nn.Module) -> nn.Module:
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
    cls = type(_unwrap(model))
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


def answer_logits(model: nn.Module, batch: Batch, **model_kwargs: object
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits at exactly the positions that predict answer tokens, flattened.

    The LM head is as wide as the vocabulary and prompts are long, so it runs only where it is
    needed. Models whose forward slices hidden states with transformers' ``slice_logits_to_keep``
    get a boolean ``[B, T]`` mask: one head row per answer token, whatever the rows' lengths (a
    packed pass mixes tasks whose answers sit at different positions). Other models that take
    ``logits_to_keep`` get the index tensor of positions some row needs (an indexed copy is
    contiguous, so the head runs as one matmul; an int made HF slice a strided view that matmul
    expanded into a batched matmul reading the whole head once per row); the rest get full logits.

    Returns:
        ``(logits [M, V], targets [M], rows [M])``: one entry per answer token, its target token
        and its row, in row-major order.
    """
    labels = batch.labels
    need = torch.zeros_like(labels, dtype=torch.bool)
    need[:, :-1] = labels[:, 1:] != IGNORE_INDEX  # position p predicts token p + 1
    kind = _logits_to_keep_kind(model)
    keep = torch.nonzero(need.any(dim=0)).flatten()
    if kind == "mask" and bool(need.any()):
        model_kwargs["logits_to_keep"] = need
    elif kind and keep.numel():
        model_kwargs["logits_to_keep"] = keep
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **model_kwargs)
    logits = out.logits if hasattr(out, "logits") else out[0]
    rows, cols = torch.nonzero(need, as_tuple=True)
    targets = labels[rows, cols + 1]
    if logits.dim() == 2 and logits.shape[0] == rows.numel():  # the mask was honoured
        return logits, targets, rows
    if logits.shape[1] == keep.numel() and kind:  # indexed positions: map columns into ``keep``
        cols = torch.searchsorted(keep, cols)
    return logits[rows, cols], targets, rows


def answer_loss_rows(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Per-row sum of next-token NLL over the batch's answer tokens, in fp32 (``[B]``).

    Sums (not HF's mean) so that passes can be added and each task divided once by its own
    answer-token count: the result does not depend on how a set was split or packed.

    Args:
        model: a causal LM (peft-wrapped or not) returning ``.logits``.
        batch: a collated micro-batch on the model's device.

    Returns:
        ``[B]`` fp32 tensor connected to the graph (zeros, still connected, where no answer tokens).
    """
    logits, targets, rows = answer_logits(model, batch)
    n_rows = batch.labels.shape[0]
    zero = logits.float().sum() * 0.0  # keeps the result connected to the graph
    if rows.numel() == 0:
        return zero.expand(n_rows)
    nll = F.cross_entropy(logits.float(), targets, reduction="none")
    return torch.zeros(n_rows, device=nll.device).index_add(0, rows, nll) + zero


def answer_loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of next-token NLL over all of the batch's answer tokens, in fp32 (0-dim)."""
    return answer_loss_rows(model, batch).sum()


def dummy_batch(device: torch.device | str) -> Batch:
    """A 2-token sequence with one labelled token: the input of a zero-weight dummy pass."""
    ids = torch.zeros((1, DUMMY_PASS_TOKENS), dtype=torch.long, device=device)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 1] = 0
    return Batch(ids, torch.ones_like(ids), labels, 1, DUMMY_PASS_TOKENS)


# --------------------------------------------------------------------------------------------
# Snapshots
# --------------------------------------------------------------------------------------------


def snapshot(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of ``params`` (theta), to restore after a task's adaptation."""
    return [p.detach().clone() for p in params]


def restore(params: Sequence[torch.Tensor], saved: Sequence[torch.Tensor]) -> None:
    """Copies ``saved`` back into ``params`` in place (bit-exact)."""
    if len(params) != len(saved):
        raise ValueError(
            f"restore() got {len(saved)} saved tensors for {len(params)} parameters: pass the "
            "list returned by snapshot() of the same parameters"
        )
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)


# --------------------------------------------------------------------------------------------
# Passes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackedBatch:
    """One pass: a collated micro-batch and the task (index into the rank's tasks) of each row."""

    batch: Batch
    rows: torch.Tensor

    @classmethod
    def one_task(cls, batch: Batch) -> PackedBatch:
        """Every row belongs to task 0."""
        return cls(batch, torch.zeros(batch.input_ids.shape[0], dtype=torch.long))

    def to(self, device: torch.device | str) -> PackedBatch:
        """The pass on ``device``."""
        return PackedBatch(self.batch.to(device), self.rows.to(device))


Pass = PackedBatch | None
"""A pass of a loop; ``None`` is a dummy pass."""


def pack_pass(p: PackedPass, slots: Sequence[TaskSlot], pad_id: int, *, query: bool,
              pad_to_multiple_of: int | None = None) -> Pass:
    """Collates a plan's :class:`~fmmeta.sampling.plan.PackedPass` (``None`` for a dummy pass)."""
    if p.is_dummy:
        return None
    examples = p.rows(tuple(slots), query=query)
    return PackedBatch(collate(examples, pad_id, pad_to_multiple_of), torch.tensor(p.slots, dtype=torch.long))


def answer_tokens_per_task(passes: Sequence[Pass], n_tasks: int) -> torch.Tensor:
    """``[n_tasks]`` answer tokens of each task over ``passes`` (a task's loss normaliser)."""
    out = torch.zeros(n_tasks, dtype=torch.float64)
    for p in passes:
        if p is not None:
            per_row = (p.batch.labels != IGNORE_INDEX).sum(dim=1).to(torch.float64)
            out.index_add_(0, p.rows, per_row)
    return out


def answer_tokens(batches: Sequence[Batch | None]) -> int:
    """Total answer tokens of the real micro-batches (a set's loss normaliser)."""
    return sum(b.n_answer_tokens for b in batches if b is not None)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


def _device_of(weights: Sequence[torch.Tensor]) -> torch.device:
    if not weights:
        raise ValueError(
            "got no adapter parameters: pass engine.adapter_parameters() (the trainable LoRA tensors)"
        )
    return weights[0].device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class PassResult:
    """What a sweep over passes produced.

    Attributes:
        grads: one gradient per weight (``None`` for a forward-only sweep).
        task_sums: ``[T]`` unscaled answer-loss sum of each task's rows.
        seconds: wall seconds of every pass, in order.
    """

    grads: list[torch.Tensor] | None
    task_sums: torch.Tensor
    seconds: list[float]


def run_passes(
    model: nn.Module,
    weights: Sequence[torch.Tensor],
    passes: Sequence[Pass],
    task_scale: torch.Tensor,
    *,
    lora: TaskLoRA | None = None,
    pass_scales: Sequence[float] | None = None,
    grad: bool = True,
) -> PassResult:
    """One sweep: ``grad of sum_p pass_scales[p] * sum_rows task_scale[row task] * row loss``.

    One forward (and one ``torch.autograd.grad``) per pass, so the graph of only one pass is alive
    at a time.

    Args:
        model: the causal LM.
        weights: tensors to differentiate: stacked fast weights (with ``lora``) or the adapter
            parameters (one task).
        passes: the passes; ``None`` runs a zero-weight dummy pass.
        task_scale: ``[T]`` weight of a row's loss by its task (e.g. ``1 / answer tokens``).
        lora: routes rows to their task's slice of ``weights`` (already :meth:`TaskLoRA.active`).
        pass_scales: per-pass weight (default 1.0 each).
        grad: ``False`` runs forward only (no gradient, ``grads`` is ``None``).
    """
    device = _device_of(weights)
    scale = task_scale.to(device=device, dtype=torch.float32)
    sums = torch.zeros(task_scale.shape[0], dtype=torch.float64)
    grads: list[torch.Tensor] | None = None
    seconds: list[float] = []
    for i, p in enumerate(passes):
        t0 = time.perf_counter()
        if p is None:
            batch, rows, weight = dummy_batch(device), torch.zeros(1, dtype=torch.long, device=device), 0.0
        else:
            p = p.to(device)
            batch, rows, weight = p.batch, p.rows, 1.0 if pass_scales is None else pass_scales[i]
        if lora is not None:
            lora.rows = rows
        with torch.set_grad_enabled(grad):
            per_row = answer_loss_rows(model, batch)
            if grad:
                loss = (per_row * scale.index_select(0, rows)).sum() * weight
                g = torch.autograd.grad(loss, list(weights), allow_unused=True)
        if p is not None:
            sums.index_add_(0, rows.cpu(), per_row.detach().to("cpu", torch.float64))
        if grad:
            if grads is None:
                grads = [torch.zeros_like(w) if gi is None else gi.detach() for w, gi in zip(weights, g)]
            elif p is not None:
                for acc, gi in zip(grads, g):
                    if gi is not None:
                        acc.add_(gi)
        _sync(device)
        seconds.append(time.perf_counter() - t0)
    if grad and grads is None:  # no passes at all
        grads = [torch.zeros_like(w) for w in weights]
    return PassResult(grads, sums, seconds)


def _at_least_fp32(g: torch.Tensor) -> torch.Tensor:
    return g.detach().to(torch.promote_types(g.dtype, torch.float32))


def clip_per_task(grads: Sequence[torch.Tensor], max_norm: float, *, stacked: bool) -> None:
    """Clips each task's gradient to global L2 norm ``max_norm`` in place (``<= 0``: off).

    Same coefficient as :func:`~fmmeta.engine.optim.clip_grad_norm` (``max_norm / (norm +
    1e-6)``, capped at 1), computed per task over the leading dimension of stacked gradients.
    """
    if max_norm <= 0 or not grads:
        return
    if not stacked:
        clip_grad_norm(grads, max_norm)
        return
    sq = cast(torch.Tensor, sum(_at_least_fp32(g).flatten(1).pow(2).sum(dim=1) for g in grads))
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))


def check_lrs(lrs: Sequence[float], n_params: int) -> list[float]:
    """Per-tensor step sizes as floats, refused unless there is one finite, positive lr per tensor."""
    values = [float(lr) for lr in lrs]
    if len(values) != n_params:
        raise ValueError(
            f"got {len(values)} inner lrs for {n_params} adapter tensors: pass one step size per "
            "adapter tensor, in the order of the adapter parameters (e.g. load_inner_lrs(folder))"
        )
    bad = [(i, lr) for i, lr in enumerate(values) if not (math.isfinite(lr) and lr > 0)]
    if bad:
        raise ValueError(f"inner lrs must be finite and > 0; got (index, lr) {bad[:5]}")
    return values


class InnerOptimizer:
    """The inner update rule (SGD or Adam) on plain tensors, updated in place under ``no_grad``.

    Every operation is elementwise, so the same rule serves stacked ``[T, ...]`` fast weights (each
    task its own moments) and single adapters. Adam keeps its moments here, fresh per task; create
    one per adaptation or pass the same one to successive calls to continue a trajectory.

    Args:
        cfg: the inner-loop settings.
        params: the tensors it will update (shapes for Adam's moments).
        lrs: one step size per tensor of ``params`` (Meta-SGD's learned step sizes, see
            :mod:`fmmeta.algorithms.meta_sgd`); ``None`` uses ``cfg.inner_lr`` for every tensor.
            Both rules are linear in the step size, which is what makes the first-order gradient
            of the query loss with respect to it exact (see that module).
    """

    def __init__(self, cfg: InnerLoopConfig, params: Sequence[torch.Tensor],
                 lrs: Sequence[float] | None = None) -> None:
        raise_if_invalid(cfg)  # every adaptation builds one: the check no caller can skip
        self.cfg = cfg
        self.lrs = check_lrs(lrs, len(params)) if lrs is not None else [cfg.inner_lr] * len(params)
        self.t = 0
        self._m: list[torch.Tensor] | None = None
        self._v: list[torch.Tensor] | None = None
        if cfg.inner_optimizer == "adam":
            self._m = [torch.zeros_like(p) for p in params]
            self._v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
        """Applies one update ``params[i] <- params[i] - lrs[i] * direction(grads[i])``."""
        self.t += 1
        if self._m is None or self._v is None:
            for p, g, lr in zip(params, grads, self.lrs, strict=True):
                p.add_(g.to(p.dtype), alpha=-lr)
            return
        b1, b2 = self.cfg.adam_betas
        c1 = 1.0 - b1**self.t
        c2 = 1.0 - b2**self.t
        for p, g, m, v, lr in zip(params, grads, self._m, self._v, self.lrs, strict=True):
            g = g.to(m.dtype)
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            denom = (v / c2).sqrt_().add_(self.cfg.adam_eps)
            p.addcdiv_(m, denom, value=-lr / c1)


@dataclass
class Adaptation:
    """What an inner loop did.

    Attributes:
        losses: per step, ``[T]`` support loss per answer token before that step's update
            (``nan`` for a task without support tokens).
        seconds: per step, the wall seconds of each support pass.
    """

    losses: list[torch.Tensor]
    seconds: list[list[float]]


def adapt_tasks(
    model: nn.Module,
    weights: Sequence[torch.Tensor],
    support: Sequence[Pass],
    n_answer: torch.Tensor,
    cfg: InnerLoopConfig,
    *,
    lora: TaskLoRA | None = None,
    steps: int | None = None,
    optimizer: InnerOptimizer | None = None,
    lrs: Sequence[float] | None = None,
) -> Adaptation:
    """Adapts every task's weights in place on its support rows: theta -> phi. The one inner loop.

    Each step runs every support pass, giving each task the gradient of its own ``sum answer
    loss / its support answer tokens``, clips each task's gradient to ``cfg.inner_clip_norm``
    and applies one inner-optimizer update to all tasks at once. A task without support tokens
    gets a zero gradient and keeps its weights (SGD and Adam both leave it unchanged).

    Args:
        model: the causal LM.
        weights: stacked ``[T, ...]`` fast weights (with ``lora`` active) or the adapter itself.
        support: the support passes; ``None`` entries are dummy passes.
        n_answer: ``[T]`` support answer tokens of each task.
        cfg: inner-loop settings.
        lora: the active :class:`TaskLoRA` for stacked weights; ``None`` for a single adapter.
        steps: number of inner steps (default ``cfg.inner_steps``).
        optimizer: continue with this inner optimizer's state (default: a fresh one).
        lrs: one step size per weight tensor for a fresh optimizer (default ``cfg.inner_lr`` for
            all); an ``optimizer`` passed in brings its own.
    """
    n_steps = cfg.inner_steps if steps is None else steps
    if n_steps < 0:
        raise ValueError(f"adapt(steps={n_steps}) is invalid: steps must be >= 0")
    if optimizer is not None and lrs is not None:
        raise ValueError("pass lrs or optimizer, not both: an InnerOptimizer carries its own lrs")
    opt = optimizer if optimizer is not None else InnerOptimizer(cfg, weights, lrs)
    n = n_answer.to(torch.float64)
    scale = torch.where(n > 0, 1.0 / n.clamp(min=1.0), torch.zeros_like(n))
    out = Adaptation([], [])
    for _ in range(n_steps):
        res = run_passes(model, weights, support, scale, lora=lora)
        out.losses.append(torch.where(n > 0, res.task_sums / n.clamp(min=1.0), torch.full_like(n, math.nan)))
        out.seconds.append(res.seconds)
        if not bool((n > 0).any()):
            continue  # dummy passes only: they ran for lockstep, weights untouched
        assert res.grads is not None
        clip_per_task(res.grads, cfg.inner_clip_norm or 0.0, stacked=lora is not None)
        opt.step(weights, res.grads)
        del res  # free this step's gradient before the next step allocates its own
    return out


def adapt(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    support_batches: Sequence[Batch | None],
    cfg: InnerLoopConfig,
    *,
    steps: int | None = None,
    optimizer: InnerOptimizer | None = None,
    lrs: Sequence[float] | None = None,
) -> list[float]:
    """Adapts one task's adapter ``params`` in place on its support set (evaluation's entry point).

    :func:`adapt_tasks` with one task and the model's own LoRA forward. The caller owns theta:
    take a :func:`snapshot` before and :func:`restore` after. ``lrs`` gives every adapter tensor
    its own step size (Meta-SGD's learned ones: ``load_inner_lrs(adapter_folder)``); ``None`` uses
    ``cfg.inner_lr`` for all.

    Returns:
        The support loss per answer token before each step's update (``nan`` for a dummy set).

    Example:
        >>> theta = snapshot(params)
        >>> losses = adapt(model, params, support, InnerLoopConfig(inner_steps=3, inner_lr=0.03))
        >>> ...  # evaluate phi on the query set
        >>> restore(params, theta)
    """
    passes = [None if b is None else PackedBatch.one_task(b) for b in support_batches]
    n_answer = torch.tensor([float(answer_tokens(support_batches))], dtype=torch.float64)
    result = adapt_tasks(model, params, passes, n_answer, cfg, steps=steps, optimizer=optimizer, lrs=lrs)
    return [float(x[0]) for x in result.losses]


@torch.no_grad()
def evaluate_loss(model: nn.Module, params: Sequence[torch.Tensor], batches: Sequence[Batch | None]) -> float:
    """Mean loss per answer token over ``batches`` (forward only; ``nan`` if all are dummies).

    ``params`` only tells the device; dummies still run a forward so ranks stay in lockstep.
    """
    passes = [None if b is None else PackedBatch.one_task(b) for b in batches]
    res = run_passes(model, params, passes, torch.ones(1), grad=False)
    n = answer_tokens(batches)
    return float(res.task_sums[0]) / n if n else math.nan
