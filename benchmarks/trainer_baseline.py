"""The baseline a user would pick instead of fmmeta: Hugging Face ``Trainer`` over a peft LoRA model.

``benchmarks/throughput.py`` times it on the very rows its plain loop and meta-step run (the
meta-step's passes, one ``Trainer`` step per pass of ``rows`` sequences), so tokens/s compare like
for like. Its best honest configuration: the model as the other loops hold it (bf16 weights, SDPA
attention), fused AdamW on a GPU, no gradient checkpointing, no evaluation, logging or saving in
the loop, the rows already equal in length (nothing to pack or pad), labels on the answer tokens
only. What it cannot skip is computing logits at every position (transformers' ``labels=`` loss),
which the other loops do only at answer positions: that is part of what a user pays with it, and
its FLOPs are counted for its MFU (:func:`trainer_flops`).

A callback takes the wall time of every optimizer step (synchronising the device first); the
first ``warmup`` steps (kernel selection, allocator, optimizer state) are dropped.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from fmmeta.flops import ModelShape, pass_flops, pass_size
from fmmeta.tasks.episode import Batch


def trainer_flops(shape: ModelShape, batches: Sequence[Batch]) -> int:
    """FLOPs of one ``Trainer`` step per batch, by ``fmmeta/flops.py``'s count (the frozen body's
    forward and backward to its inputs, the adapters, causal attention) with the LM head at every
    position: transformers' ``labels=`` loss passes no ``logits_to_keep``, so it is left out here."""
    return sum(pass_flops(shape, pass_size(b.input_ids, logits_to_keep=None, backward=True)) for b in batches)


class _StepTimes(TrainerCallback):
    """Records each optimizer step's wall seconds."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: list[float] = []
        self._t0 = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._sync()
        self.seconds.append(time.perf_counter() - self._t0)


def trainer_step_seconds(model: torch.nn.Module, batches: Sequence[Batch], device: torch.device, *,
                         steps: int, warmup: int = 2, liger: bool = False) -> list[float]:
    """Wall seconds of each of ``steps`` ``Trainer`` steps (after ``warmup`` more), one step per
    pass of ``batches`` in turn (each step a batch of that pass's rows, in order). ``liger``: with
    the Trainer's ``use_liger_kernel`` (Liger's Triton kernels, patched into ``model`` in place)."""
    rows = [{"input_ids": b.input_ids[i].cpu(), "attention_mask": b.attention_mask[i].cpu(),
             "labels": b.labels[i].cpu()} for b in batches for i in range(b.n_rows)]
    per_step = batches[0].n_rows
    if any(b.n_rows != per_step for b in batches):
        raise ValueError("the Trainer baseline needs passes of equal row counts (one Trainer batch each)")
    timer = _StepTimes(device)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=per_step, max_steps=warmup + steps,
            learning_rate=1e-4, lr_scheduler_type="constant", weight_decay=0.0,
            optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch",
            logging_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True,
            remove_unused_columns=False, dataloader_pin_memory=False, use_cpu=device.type != "cuda",
            use_liger_kernel=liger, seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=_Rows(rows), callbacks=[timer])
        trainer.train()
    return timer.seconds[warmup:]


class _Rows(torch.utils.data.Dataset):
    """The passes' rows as a map-style dataset (``Trainer`` shuffles them; they share a length)."""

    def __init__(self, rows: list[dict[str, torch.Tensor]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]
