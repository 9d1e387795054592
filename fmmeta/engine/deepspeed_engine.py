"""The DeepSpeed engine: ZeRO stages 0-3, fp32 or bf16, touched once per meta-step.

How it meets the :class:`~fmmeta.engine.protocol.Engine` contract under DeepSpeed's behaviour:

* The inner loop runs on :attr:`DeepSpeedEngine.model`, the bare peft module (with ZeRO-3's
  gather hooks installed on it), and takes ``torch.autograd.grad`` over the adapter tensors. It
  never goes through DeepSpeed's ``forward``/``backward``, so no gradient is reduced per inner step
  and no ``no_sync`` is needed (docs/design.md, "No `no_sync`").
* The adapter tensors are pinned full and resident on every rank (:mod:`fmmeta.engine.zero`, the
  one place that gathers ZeRO-3 parameters), so inner-loop updates, snapshots and saves are plain
  tensor ops (docs/design.md, "LoRA tensors under ZeRO-3").
* :meth:`DeepSpeedEngine.outer_step` turns this rank's ``grad_sum`` into DeepSpeed gradients with a
  surrogate loss ``sum((p * g).sum())`` whose gradient is exactly ``g``. With
  ``g = grad_sum * world_size / n_real_tasks`` DeepSpeed's data-parallel mean yields
  ``sum over ranks of grad_sum / n_real_tasks``, the same averaged meta-gradient the local engine
  computes; DeepSpeed then clips (same ``max_norm / (norm + 1e-6)`` rule as
  :func:`fmmeta.engine.optim.clip_grad_norm`) and steps the very AdamW that
  :func:`~fmmeta.engine.optim.build_outer_optimizer` built, passed in as a client optimizer.
  ``gradient_accumulation_steps`` is 1: one backward, one step (docs/design.md, "Gradient
  accumulation boundaries").
* Activation checkpointing, when asked for, is non-reentrant (docs/design.md, "Activation
  checkpointing"); bf16 casts the base and the adapter alike, so ZeRO-3 never all-gathers mixed
  dtypes (docs/design.md, "Mixed dtypes").
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fmmeta.engine.distributed import default_backend, init_distributed, release_shm_buffers
from fmmeta.engine.ds_config import owned_values, resolve_ds_config, zero_stage
from fmmeta.engine.optim import (
    OuterOptimConfig,
    build_outer_optimizer,
    check_outer_step,
    optimizer_file,
    read_optimizer_state,
)
from fmmeta.engine.zero import (
    check_resident,
    ensure_resident,
    gather_adapter,
    pin_adapter,
    scatter_adapter,
)

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16")
"""File name (per rank) that :meth:`DeepSpeedEngine.save_optimizer` writes."""

_SAFE_SCALARS = (int, float, bool, str, type(None))


class DeepSpeedEngine:
    """Engine backed by ``deepspeed.initialize``; one instance per process.

    Args:
        model: a peft-wrapped causal LM on CPU or its device (only the adapter requires grad).
        optim_cfg: outer optimizer settings; its ``grad_clip`` becomes DeepSpeed's
            ``gradient_clipping``.
        ds_config: a DeepSpeed JSON file or dict with ``"auto"`` for the values fmmeta owns
            (see :func:`fmmeta.engine.ds_config.resolve_ds_config`).
        precision: ``"fp32"`` or ``"bf16"`` (base and adapter both cast, DeepSpeed keeps fp32
            master weights).
        dist_backend: process-group backend when the group is not up yet (``None``: ``nccl`` on
            CUDA, else ``gloo``).
        dist_timeout_s: collective timeout for a group this engine creates.

    Example:
        >>> engine = DeepSpeedEngine(peft_model, OuterOptimConfig(outer_lr=3e-3),
        ...                          "ds_configs/zero3.json", precision="bf16")
        >>> stats = meta_step(engine, algorithm, plan)
    """

    def __init__(
        self,
        model: nn.Module,
        optim_cfg: OuterOptimConfig,
        ds_config: str | Path | Mapping[str, Any],
        *,
        precision: str = "fp32",
        dist_backend: str | None = None,
        dist_timeout_s: float = 300.0,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(
                f"precision={precision!r} is invalid: allowed are {PRECISIONS} "
                "(fp16 is not supported: its loss scaling breaks the inner loop's autograd.grad)"
            )
        import deepspeed

        if not dist.is_initialized():
            backend = dist_backend or default_backend()
            init_distributed(backend, dist_timeout_s)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        self.cfg = optim_cfg
        self.precision = precision
        if precision == "bf16":
            _cast_bf16(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(
                "DeepSpeedEngine got a model with no trainable parameters: wrap it with "
                "peft.get_peft_model(model, LoraConfig(...)) first"
            )
        owned = owned_values(
            world_size=self.world_size, grad_clip=optim_cfg.grad_clip, precision=precision
        )
        self.ds_config = resolve_ds_config(
            ds_config, owned=owned, max_adapter_numel=max(p.numel() for _, p in named)
        )
        self.zero_stage = zero_stage(self.ds_config)
        optimizer, self.scheduler = build_outer_optimizer([p for _, p in named], optim_cfg)
        self._ds, self._optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.ds_config
        )
        release_shm_buffers()
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        pin_adapter(self._params)
        n_adapter = sum(p.numel() for p in self._params)
        logger.info(
            "DeepSpeedEngine: world_size=%d zero_stage=%d precision=%s adapter tensors=%d (%d elements)",
            self.world_size, self.zero_stage, precision, len(self._params), n_adapter,
        )

    def close(self) -> None:
        """Removes DeepSpeed's hooks from the model so another engine can wrap the same model.

        The model keeps its ZeRO-3 partitions and the adapter stays resident; the outer
        optimizer's state is dropped. Every rank must call it.
        """
        self._ds.destroy()

    @property
    def model(self) -> nn.Module:
        """The peft module itself (ZeRO-3's gather hooks live on it); never DeepSpeed's wrapper,
        whose forward would register backward hooks meant for ``engine.backward``."""
        return self._ds.module

    @property
    def lockstep(self) -> bool:
        """ZeRO-3 gathers every layer's parameters from every rank in each pass."""
        return self.zero_stage == 3

    @property
    def sharding(self) -> str:
        """``"ZeRO stage N"``, for the run's banner."""
        return f"ZeRO stage {self.zero_stage}"

    @property
    def ds_engine(self) -> Any:
        """The underlying ``deepspeed.DeepSpeedEngine`` (for inspection)."""
        return self._ds

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The trainable LoRA tensors in ``named_parameters`` order, full on this rank."""
        return list(self._params)

    def outer_step(self, grad_sum: Sequence[torch.Tensor], n_real_tasks: int) -> dict[str, float]:
        """Averages ``grad_sum`` over all ranks' ``n_real_tasks``, clips, steps AdamW and the schedule.

        Every rank must call it once per meta-step (it is a collective).
        """
        check_resident(self._params)  # first: a partitioned tensor's shape is not its real one
        check_outer_step(grad_sum, self._params, n_real_tasks)
        scale = self.world_size / n_real_tasks
        surrogate = torch.zeros((), device=self._params[0].device, dtype=torch.float32)
        for p, g in zip(self._params, grad_sum):
            g_scaled = (g.detach().to(device=p.device, dtype=torch.float32) * scale).to(p.dtype)
            surrogate = surrogate + (p * g_scaled).sum().float()
        lr = float(self._optimizer.param_groups[0]["lr"])
        self._ds.backward(surrogate)
        own_norm = None
        if self.zero_stage == 0:
            # ZeRO-0 does not record the global norm; its gradients are plain, averaged .grad
            grads = [p.grad for p in self._params if p.grad is not None]
            own_norm = float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))) if grads else 0.0
        self._ds.step()
        self.scheduler.step()
        ensure_resident(self._params)
        norm = own_norm if own_norm is not None else self._ds.get_global_grad_norm()
        return {"grad_norm": float(norm) if norm is not None else float("nan"), "lr": lr}

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of ``tensor`` over ranks (a new tensor, on every rank)."""
        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def barrier(self) -> None:
        """Blocks until every rank arrives."""
        dist.barrier()

    def save_adapter(self, path: str | Path) -> None:
        """Writes ``adapter_config.json`` + ``adapter_model.safetensors`` (peft's format) from any
        ZeRO stage; every rank must call it, rank 0 writes.

        Raises:
            RuntimeError: if a gathered adapter tensor is empty (never writes an empty adapter).
        """
        state = gather_adapter(self.model, self._params)
        if self.rank == 0:
            save = getattr(self.model, "save_pretrained", None)
            if save is None:
                raise TypeError(
                    f"save_adapter needs a peft model with save_pretrained(); got {type(self.model).__name__}"
                )
            save(str(path), state_dict=state, safe_serialization=True)
        self.barrier()

    def load_adapter(self, path: str | Path) -> None:
        """Loads what :meth:`save_adapter` wrote into the adapter tensors, on every rank, and
        refreshes DeepSpeed's fp32 master copy so the next outer step starts from it."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import load_file

        file = Path(path) / "adapter_model.safetensors"
        if not file.is_file():
            raise FileNotFoundError(
                f"load_adapter: {file} does not exist; pass the directory save_adapter() wrote"
            )
        saved = load_file(str(file))
        if not saved:
            raise ValueError(f"load_adapter: {file} holds no tensors (an empty adapter save)")
        # peft's own renaming (adapter name stripped) applied to index markers gives the map
        # from saved key to our parameter order.
        markers = {n: torch.tensor([i]) for i, n in enumerate(self._names)}
        index = {k: int(v[0]) for k, v in get_peft_model_state_dict(self.model, state_dict=markers).items()}
        missing = sorted(set(index) - set(saved))
        unexpected = sorted(set(saved) - set(index))
        if missing or unexpected:
            raise ValueError(
                f"load_adapter: {file} does not match this model's adapter: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}; was it saved from a model with another LoRA config?"
            )
        values: list[torch.Tensor] = [torch.empty(0)] * len(self._params)
        for key, i in index.items():
            values[i] = saved[key]
        scatter_adapter(self._params, values)
        refresh = getattr(self._optimizer, "refresh_fp32_params", None)
        if refresh is not None:
            refresh()
        ensure_resident(self._params)

    def save_optimizer(self, directory: str | Path) -> list[Path]:
        """Writes this rank's outer-optimizer state (its ZeRO partition) and the LR schedule.

        The file holds only tensors and plain Python values, so it loads with
        ``torch.load(weights_only=True)``; every rank must call it.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        file = optimizer_file(directory, self.rank)
        state = {
            "optimizer": _plain(self._optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
            "zero_stage": self.zero_stage,
            "world_size": self.world_size,
        }
        torch.save(state, file)
        self.barrier()
        return [file]

    def load_optimizer(self, directory: str | Path) -> None:
        """Restores what :meth:`save_optimizer` wrote (same world size, ZeRO stage and adapter)."""
        file = optimizer_file(directory, self.rank)
        state = read_optimizer_state(directory, self.rank, self.device)
        for key, ours in (("world_size", self.world_size), ("zero_stage", self.zero_stage)):
            if state.get(key) != ours:
                raise ValueError(
                    f"load_optimizer: {file} was written with {key}={state.get(key)} but this engine "
                    f"has {key}={ours}; resume with the same {key}"
                )
        current = self._optimizer.state_dict()
        merged = _merge_plain(current, state["optimizer"])
        if self.zero_stage in (1, 2, 3):
            # ZeRO reads entry [dp_rank] of a per-rank list; each rank holds only its own file,
            # which is all a rigid (same world size) reload uses.
            self._optimizer.load_state_dict([merged] * self.world_size, load_from_fp32_weights=True)
        else:
            self._optimizer.load_state_dict(merged)
        self.scheduler.load_state_dict(state["scheduler"])
        ensure_resident(self._params)


def _cast_bf16(model: nn.Module) -> None:
    """Casts the model to bf16 in place; a model already partitioned by ZeRO-3 must be built in it.

    ``Module.to`` would only cast the ``[0]`` placeholders of partitioned parameters, not their
    partitions, so a partitioned model in another dtype is refused instead.
    """
    wrong = [n for n, p in model.named_parameters() if p.dtype != torch.bfloat16]
    if not wrong:
        return
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        raise ValueError(
            f"precision='bf16' but the ZeRO-3 partitioned model holds {wrong[0]!r} in another dtype: "
            "build it with model.dtype=bfloat16"
        )
    model.to(torch.bfloat16)


def _plain(obj: Any) -> Any:
    """``obj`` with every value torch's ``weights_only`` loader refuses dropped (DeepSpeed puts
    loss scalers and enums in its state dicts); :func:`_merge_plain` puts them back on load."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if _keep(v)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj if _keep(v)) if isinstance(obj, list) else tuple(
            _plain(v) for v in obj if _keep(v)
        )
    return obj


def _keep(v: Any) -> bool:
    if isinstance(v, enum.Enum):  # ZeroStageEnum is an int subclass the loader still refuses
        return False
    if isinstance(v, (torch.Tensor, dict, list, tuple)) or isinstance(v, _SAFE_SCALARS):
        return True
    return False


def _merge_plain(current: Any, saved: Any) -> Any:
    """``saved`` with the values :func:`_plain` dropped taken from ``current``."""
    if isinstance(current, dict) and isinstance(saved, dict):
        out = dict(current)
        for k, v in saved.items():
            out[k] = _merge_plain(current.get(k), v) if k in current else v
        return out
    return saved
