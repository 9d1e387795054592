"""The local engine: one process, plain torch. The reference every distributed engine must match.

It implements the whole :class:`~fmmeta.engine.protocol.Engine` protocol with no framework: the
adapter parameters are the peft model's trainable tensors in ``named_parameters`` order, the outer
update is ``build_outer_optimizer``'s AdamW plus ``clip_grad_norm`` (the same code every engine
uses), and adapters are written in peft's own format.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file
from torch import nn

from fmmeta.engine.optim import (
    OuterOptimConfig,
    build_outer_optimizer,
    check_outer_step,
    clip_grad_norm,
    optimizer_file,
    read_optimizer_state,
)

logger = logging.getLogger(__name__)


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every trainable tensor, in ``named_parameters`` order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class LocalEngine:
    """Single-process engine on ``device`` (rank 0 of 1).

    Args:
        model: a peft-wrapped causal LM (only the adapter requires grad).
        cfg: outer optimizer settings.
        device: where the model and batches live.

    Example:
        >>> engine = LocalEngine(get_peft_model(base, lora_cfg), OuterOptimConfig(outer_lr=3e-3))
        >>> stats = meta_step(engine, algorithm, plan)
    """

    rank: int = 0
    world_size: int = 1
    lockstep: bool = False
    """One process: nothing to meet."""
    sharding: str = "no ZeRO (one process)"

    def __init__(self, model: nn.Module, cfg: OuterOptimConfig, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.cfg = cfg
        self._model = model.to(self.device)
        named = trainable_parameters(self._model)
        if not named:
            raise ValueError(
                "LocalEngine got a model with no trainable parameters: wrap it with "
                "peft.get_peft_model(model, LoraConfig(...)) first"
            )
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        # AdamW updates theta by ~outer_lr per step, often below bf16's resolution (8 significant
        # bits) at the weight's magnitude: it steps fp32 master copies of a bf16 adapter, as
        # DeepSpeed's bf16 optimizer does, and the live tensors get the rounded result.
        self._master = [p if p.dtype == torch.float32 else p.detach().float().clone()
                        for p in self._params]
        self.optimizer, self.scheduler = build_outer_optimizer(self._master, cfg)

    def close(self) -> None:
        """Nothing to release: the model has no framework hooks (the method exists for symmetry
        with the distributed engines, so a recipe can close any engine)."""

    @property
    def model(self) -> nn.Module:
        """The peft model."""
        return self._model

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The trainable LoRA tensors in ``named_parameters`` order."""
        return list(self._params)

    def outer_step(self, grad_sum: Sequence[torch.Tensor], n_real_tasks: int) -> dict[str, float]:
        """Averages ``grad_sum`` over ``n_real_tasks``, clips, and steps AdamW and the schedule."""
        check_outer_step(grad_sum, self._params, n_real_tasks)
        grads = []
        for p, g in zip(self._params, grad_sum):
            grads.append(g.detach().to(device=p.device, dtype=torch.float32) / n_real_tasks)
        norm = clip_grad_norm(grads, self.cfg.grad_clip)
        lr = float(self.optimizer.param_groups[0]["lr"])
        for m, g in zip(self._master, grads):
            m.grad = g
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._copy_master_to_live()
        return {"grad_norm": norm, "lr": lr}

    @torch.no_grad()
    def _copy_master_to_live(self) -> None:
        for p, m in zip(self._params, self._master):
            if m is not p:
                p.copy_(m)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """``[obj]``: one rank."""
        return [obj]

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``tensor``: one rank."""
        return tensor.clone()

    def barrier(self) -> None:
        """Nothing to wait for."""

    def save_adapter(self, path: str | Path) -> None:
        """Writes ``adapter_config.json`` + ``adapter_model.safetensors`` with peft's ``save_pretrained``."""
        save = getattr(self._model, "save_pretrained", None)
        if save is None:
            raise TypeError(
                f"save_adapter needs a peft model with save_pretrained(); got {type(self._model).__name__}"
            )
        save(str(path), safe_serialization=True)

    def load_adapter(self, path: str | Path) -> None:
        """Loads what :meth:`save_adapter` wrote into the live adapter tensors (in place)."""
        from peft import set_peft_model_state_dict

        file = Path(path) / "adapter_model.safetensors"
        if not file.is_file():
            raise FileNotFoundError(
                f"load_adapter: {file} does not exist; pass the directory save_adapter() wrote"
            )
        state = load_file(str(file), device=str(self.device))
        if not state:
            raise ValueError(f"load_adapter: {file} holds no tensors (an empty adapter save)")
        result = set_peft_model_state_dict(self._model, state)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(
                f"load_adapter: {file} has tensors this model does not: {unexpected[:5]}; "
                "was it saved from a model with another LoRA config?"
            )
        missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]
        if missing:
            raise ValueError(
                f"load_adapter: {file} lacks adapter tensors this model has: {missing[:5]}; "
                "was it saved from a model with another LoRA config?"
            )
        live = [p for _, p in trainable_parameters(self._model)]
        if len(live) != len(self._params) or any(a is not b for a, b in zip(live, self._params)):
            # The optimizer's state is keyed by these objects: a silent swap would detach it.
            raise RuntimeError(
                "load_adapter replaced the adapter's Parameter objects instead of copying into them"
            )
        with torch.no_grad():
            for p, m in zip(self._params, self._master):
                if m is not p:
                    m.copy_(p)  # load_optimizer then restores the master's own fp32 digits

    def save_optimizer(self, directory: str | Path) -> list[Path]:
        """Writes the outer AdamW and schedule state (loadable with ``torch.load(weights_only=True)``)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        file = optimizer_file(directory, self.rank)
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
             "master": [m.detach() for m, p in zip(self._master, self._params) if m is not p]},
            file,
        )
        return [file]

    def load_optimizer(self, directory: str | Path) -> None:
        """Restores what :meth:`save_optimizer` wrote."""
        state = read_optimizer_state(directory, self.rank, self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        separate = [m for m, p in zip(self._master, self._params) if m is not p]
        saved = state.get("master", [])
        if len(saved) != len(separate):
            raise ValueError(
                f"load_optimizer: {directory} holds {len(saved)} fp32 master tensors but this engine "
                f"has {len(separate)}: it was written with another model.dtype; resume with the same one"
            )
        with torch.no_grad():
            for m, s in zip(separate, saved):
                m.copy_(s)
        self._copy_master_to_live()
