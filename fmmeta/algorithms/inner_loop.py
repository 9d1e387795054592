"""The one inner loop: adapt the adapter on a support set, used by training and by evaluation.

Everything here works on a list of adapter tensors (``params``) that are plain, resident
``nn.Parameter`` objects updated in place. Gradients come from ``torch.autograd.grad`` over
``params`` only, never from ``.backward()``: under DeepSpeed ZeRO-2/3 every ``engine.backward()``
reduce-scatters across ranks, and inner loops are rank-local (design notes, trap 1). The only
state an adaptation needs beyond the live weights is one snapshot of the adapter (a few MB for
LoRA), so peak memory does not grow with ``inner_steps`` and no model copy is ever made.

Micro-batches: a support or query set is a sequence of :class:`~fmmeta.tasks.episode.Batch`
(or ``None``). Losses are *sums* of token NLL over answer tokens, divided once by the set's total
answer-token count, so any split into micro-batches gives the same gradient up to float rounding.
``None`` is a dummy pass: one forward+backward on a 2-token sequence with weight 0, which keeps
ZeRO-3's per-pass collectives in lockstep across ranks without changing any result (trap 3).
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fmmeta.engine.optim import clip_grad_norm
from fmmeta.sampling.plan import TaskSlot
from fmmeta.tasks.episode import IGNORE_INDEX, Batch, Example, collate

logger = logging.getLogger(__name__)

_INNER_OPTIMIZERS = ("sgd", "adam")
DUMMY_PASS_TOKENS = 2
"""Sequence length of a dummy pass (what it adds to padded-token counts)."""


@dataclass(frozen=True, kw_only=True)
class InnerLoopConfig:
    """Settings of the inner (per-task) adaptation.

    Attributes:
        inner_steps: optimizer steps on the support set per task (>= 0; 0 = no adaptation).
        inner_lr: inner learning rate (> 0; SGD on LoRA is fragile above ~0.1, see design notes).
        inner_optimizer: "sgd" (plain, stateless) or "adam" (fresh moments for every task).
        inner_clip_norm: clip each inner step's gradient to this global L2 norm; ``None`` = off.
        adam_betas: (beta1, beta2) of the inner Adam, each in [0, 1); unused for SGD.
        adam_eps: epsilon of the inner Adam (> 0); unused for SGD.
    """

    inner_steps: int = 3
    inner_lr: float = 0.03
    inner_optimizer: str = "sgd"
    inner_clip_norm: float | None = None
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8

    def __post_init__(self) -> None:
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
        if problems:
            raise ValueError("InnerLoopConfig: " + "; ".join(problems))


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------

_LOGITS_TO_KEEP: dict[type, bool] = {}


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether the underlying causal LM takes ``logits_to_keep`` (cached per class).

    Unwraps framework wrappers and peft, so scoring code can skip the LM head over prompts too.
    """
    inner = model
    # Unwrap framework wrappers (DeepSpeedEngine/DDP: .module) and peft (get_base_model()).
    for _ in range(4):
        if hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
        elif isinstance(getattr(inner, "module", None), nn.Module):
            inner = inner.module
        else:
            break
    cls = type(inner)
    if cls not in _LOGITS_TO_KEEP:
        try:
            _LOGITS_TO_KEEP[cls] = "logits_to_keep" in inspect.signature(inner.forward).parameters
        except (TypeError, ValueError):
            _LOGITS_TO_KEEP[cls] = False
    return _LOGITS_TO_KEEP[cls]




def answer_loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of next-token NLL over the batch's answer tokens, in fp32.

    A sum (not HF's mean) so that micro-batches of one set can be added and divided once by the
    set's answer-token count: the result does not depend on how the set was split. The LM head
    only runs from the first answer position on (``logits_to_keep``), which saves the vocabulary
    projection over prompts when the model supports it.

    Args:
        model: a causal LM (peft-wrapped or not) returning ``.logits``.
        batch: a collated micro-batch on the model's device.

    Returns:
        A 0-dim fp32 tensor connected to the graph (zero, still connected, if no answer tokens).
    """
    labels = batch.labels
    width = labels.shape[1]
    has_label = (labels != IGNORE_INDEX).any(dim=0)
    kwargs: dict[str, object] = {}
    start = 0
    if bool(has_label.any()) and accepts_logits_to_keep(model):
        first = int(torch.nonzero(has_label)[0])
        # logits at position t predict token t+1; keep from the position before the first answer.
        start = max(first - 1, 0)
        kwargs["logits_to_keep"] = width - start
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kwargs)
    logits = out.logits
    if logits.shape[1] != width - start:  # a model that ignored logits_to_keep
        logits = logits[:, start:]
    targets = labels[:, start + 1 :]
    pred = logits[:, :-1]
    mask = targets != IGNORE_INDEX
    if not bool(mask.any()):
        return logits.float().sum() * 0.0
    return F.cross_entropy(pred[mask].float(), targets[mask], reduction="sum")


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
# Slot -> micro-batches
# --------------------------------------------------------------------------------------------


def chunk_batches(
    examples: Sequence[Example] | None,
    chunks: Sequence[Sequence[int]],
    pad_id: int,
    *,
    pad_to_multiple_of: int | None = None,
) -> list[Batch | None]:
    """Turns a plan's chunks (indices into ``examples``) into micro-batches.

    An empty chunk, or any chunk when ``examples`` is ``None`` (a dummy slot), becomes ``None``:
    a dummy pass. The number of returned items always equals ``len(chunks)``, which is what keeps
    pass counts equal across ranks.
    """
    out: list[Batch | None] = []
    for chunk in chunks:
        if examples is None or len(chunk) == 0:
            out.append(None)
            continue
        try:
            selected = [examples[i] for i in chunk]
        except IndexError:
            raise ValueError(
                f"chunk {tuple(chunk)} indexes past the {len(examples)} examples of the set: the "
                "plan does not match its episode; rebuild the plan from this episode"
            ) from None
        out.append(collate(selected, pad_id, pad_to_multiple_of))
    return out


def slot_batches(
    slot: TaskSlot, pad_id: int, *, pad_to_multiple_of: int | None = None
) -> tuple[list[Batch | None], list[Batch | None]]:
    """The slot's support and query micro-batches (``None`` entries are dummy passes)."""
    ep = slot.episode
    support = chunk_batches(
        None if ep is None else ep.support, slot.support_chunks, pad_id,
        pad_to_multiple_of=pad_to_multiple_of,
    )
    query = chunk_batches(
        None if ep is None else ep.query, slot.query_chunks, pad_id,
        pad_to_multiple_of=pad_to_multiple_of,
    )
    return support, query


def answer_tokens(batches: Sequence[Batch | None]) -> int:
    """Total answer tokens of the real micro-batches (the set's loss normaliser)."""
    return sum(b.n_answer_tokens for b in batches if b is not None)


def token_counts(batches: Sequence[Batch | None]) -> tuple[int, int]:
    """``(real tokens, padded tokens)`` one pass over ``batches`` processes (dummies count as padding)."""
    real = sum(b.n_tokens for b in batches if b is not None)
    padded = sum(DUMMY_PASS_TOKENS if b is None else b.n_padded_tokens for b in batches)
    return real, padded


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


def _device_of(params: Sequence[torch.Tensor]) -> torch.device:
    if not params:
        raise ValueError(
            "got no adapter parameters: pass engine.adapter_parameters() (the trainable LoRA tensors)"
        )
    return params[0].device


def loss_and_grad(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    batches: Sequence[Batch | None],
    *,
    scales: Sequence[float] | None = None,
    normaliser: int | None = None,
) -> tuple[list[torch.Tensor], list[float]]:
    """Gradient w.r.t. ``params`` of ``sum_b scales[b] * loss_sum(b) / normaliser``, accumulated over micro-batches.

    One forward and one ``torch.autograd.grad`` per entry, so the graph of only one micro-batch is
    alive at a time. ``None`` entries run a zero-weight dummy pass.

    Args:
        model: the causal LM.
        params: tensors to differentiate (the adapter), in the engine's order.
        batches: micro-batches of one set; ``None`` is a dummy pass.
        scales: per-entry weight (default 1.0 each).
        normaliser: divisor (default: the answer tokens of the real entries; 1 if none).

    Returns:
        ``(grads, loss_sums)``: one gradient per parameter (zeros if every entry is a dummy), and
        each entry's unscaled answer-loss sum (``nan`` for dummies).
    """
    device = _device_of(params)
    if scales is None:
        scales = [1.0] * len(batches)
    if normaliser is None:
        normaliser = answer_tokens(batches)
    denom = float(max(normaliser, 1))
    grads: list[torch.Tensor] | None = None
    sums: list[float] = []
    for batch, scale in zip(batches, scales, strict=True):
        dummy = batch is None
        b = dummy_batch(device) if batch is None else batch.to(device)
        loss_sum = answer_loss_sum(model, b)
        weight = 0.0 if dummy else scale / denom
        g = torch.autograd.grad(loss_sum * weight, params, allow_unused=True)
        sums.append(math.nan if dummy else float(loss_sum.detach()))
        if grads is None:
            grads = [torch.zeros_like(p) if gi is None else gi.detach() for p, gi in zip(params, g)]
        elif not dummy:
            for acc, gi in zip(grads, g):
                if gi is not None:
                    acc.add_(gi)
    if grads is None:  # no batches at all
        grads = [torch.zeros_like(p) for p in params]
    return grads, sums


@torch.no_grad()
def evaluate_loss(model: nn.Module, params: Sequence[torch.Tensor], batches: Sequence[Batch | None]) -> float:
    """Mean loss per answer token over ``batches`` (forward only; ``nan`` if all are dummies).

    ``params`` only tells the device; dummies still run a forward so ranks stay in lockstep.
    """
    device = _device_of(params)
    total = 0.0
    for batch in batches:
        b = dummy_batch(device) if batch is None else batch.to(device)
        loss_sum = answer_loss_sum(model, b)
        if batch is not None:
            total += float(loss_sum)
    n = answer_tokens(batches)
    return total / n if n else math.nan


class InnerOptimizer:
    """The inner update rule (SGD or Adam) on plain tensors, updated in place under ``no_grad``.

    Adam keeps its moments here, fresh per task; create one per adaptation (``adapt`` does) or
    pass the same one to successive ``adapt`` calls to continue a trajectory.
    """

    def __init__(self, cfg: InnerLoopConfig, params: Sequence[torch.Tensor]) -> None:
        self.cfg = cfg
        self.t = 0
        self._m: list[torch.Tensor] | None = None
        self._v: list[torch.Tensor] | None = None
        if cfg.inner_optimizer == "adam":
            self._m = [torch.zeros_like(p) for p in params]
            self._v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
        """Applies one update ``params <- params - lr * direction(grads)``."""
        lr = self.cfg.inner_lr
        self.t += 1
        if self._m is None or self._v is None:
            for p, g in zip(params, grads):
                p.add_(g.to(p.dtype), alpha=-lr)
            return
        b1, b2 = self.cfg.adam_betas
        c1 = 1.0 - b1**self.t
        c2 = 1.0 - b2**self.t
        for p, g, m, v in zip(params, grads, self._m, self._v):
            g = g.to(m.dtype)
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            denom = (v / c2).sqrt_().add_(self.cfg.adam_eps)
            p.addcdiv_(m, denom, value=-lr / c1)


def adapt(
    model: nn.Module,
    params: Sequence[torch.Tensor],
    support_batches: Sequence[Batch | None],
    cfg: InnerLoopConfig,
    *,
    steps: int | None = None,
    optimizer: InnerOptimizer | None = None,
) -> list[float]:
    """Adapts ``params`` in place on a support set: theta -> phi. The one inner loop.

    Each step runs every support micro-batch, accumulating the gradient of
    ``sum answer loss / support answer tokens``, clips it to ``cfg.inner_clip_norm`` and applies
    one inner-optimizer update. The caller owns theta: take a :func:`snapshot` before and
    :func:`restore` after.

    Args:
        model: the causal LM whose adapter is ``params``.
        params: adapter tensors, updated in place.
        support_batches: support micro-batches; ``None`` entries are zero-weight dummy passes.
        cfg: inner-loop settings.
        steps: number of inner steps (default ``cfg.inner_steps``).
        optimizer: continue with this inner optimizer's state (default: a fresh one).

    Returns:
        The support loss per answer token before each step's update (``nan`` for a dummy set).

    Example:
        >>> theta = snapshot(params)
        >>> losses = adapt(model, params, support, InnerLoopConfig(inner_steps=3, inner_lr=0.03))
        >>> ...  # evaluate phi on the query set
        >>> restore(params, theta)
    """
    n_steps = cfg.inner_steps if steps is None else steps
    if n_steps < 0:
        raise ValueError(f"adapt(steps={n_steps}) is invalid: steps must be >= 0")
    opt = optimizer if optimizer is not None else InnerOptimizer(cfg, params)
    n_answer = answer_tokens(support_batches)
    losses: list[float] = []
    for _ in range(n_steps):
        grads, sums = loss_and_grad(model, params, support_batches, normaliser=n_answer)
        if n_answer == 0:
            losses.append(math.nan)
            continue  # a dummy set: passes run for lockstep, weights untouched
        losses.append(sum(s for s in sums if not math.isnan(s)) / n_answer)
        clip_grad_norm(grads, cfg.inner_clip_norm or 0.0)
        opt.step(params, grads)
        del grads  # free before the next step allocates its own: peak memory independent of steps
    return losses
