"""Resolving a plain DeepSpeed JSON against the values our own config owns.

``ds_configs/*.json`` stay plain DeepSpeed JSON, so a user can bring their own. Every value our
recipe config owns (micro-batch size, accumulation steps, clipping, precision) is written ``"auto"``
there, or omitted, and filled in here; an explicit value that disagrees with ours is an error that
lists every mismatch at once (accelerate's DeepSpeed plugin does the same). Options we cannot
honour are rejected by name instead of being silently ignored:

* an ``"optimizer"`` or ``"scheduler"`` block: the outer optimizer and its schedule are ours
  (:func:`fmmeta.engine.optim.build_outer_optimizer`), passed to DeepSpeed as a client optimizer, so
  the local and DeepSpeed engines run the very same update;
* ``gradient_accumulation_steps`` other than 1: the engine is touched once per meta-step and the
  meta-gradient is accumulated before it (docs/design.md, "Gradient accumulation boundaries");
* under ZeRO-3, a ``stage3_param_persistence_threshold`` smaller than the largest adapter tensor:
  it is raised to fit (with a log line), because the inner loop needs the LoRA tensors full and
  resident on every rank (docs/design.md, "LoRA tensors under ZeRO-3").
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

AUTO = "auto"

OWNED_KEYS = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "gradient_clipping",
    "bf16.enabled",
    "fp16.enabled",
)
"""Dotted keys our config owns; ``owned`` passed to :func:`resolve_ds_config` may set any of them."""

_REJECTED_BLOCKS = {
    "optimizer": "the outer optimizer is built by fmmeta (optim.* in the recipe config) and passed "
    "to DeepSpeed as a client optimizer; delete the 'optimizer' block",
    "scheduler": "the LR schedule is built by fmmeta (optim.warmup_steps / optim.schedule); "
    "delete the 'scheduler' block",
}

# zero_optimization values that accelerate's templates write as "auto" and that we leave to
# DeepSpeed's defaults (they tune communication, not the result).
_ZERO_AUTO_TO_DEFAULT = (
    "reduce_bucket_size",
    "stage3_prefetch_bucket_size",
    "allgather_bucket_size",
)

ZERO3_LEAN_GATHER = {"stage3_max_live_parameters": 30_000_000, "stage3_max_reuse_distance": 0}
"""What ``"auto"`` means for ZeRO-3's gather limits (in elements). DeepSpeed's defaults (1e9 each)
keep every gathered parameter of a model below a billion parameters alive between passes, so each
rank ends up holding the whole model again during a meta-step; these release a layer's weights as
soon as its pass is done (more all-gathers, and memory per rank of about its partition plus a few
layers). Give explicit values in the JSON to trade memory back for communication."""


class DSConfigError(ValueError):
    """A DeepSpeed config that disagrees with ours, or asks for something we cannot honour.

    Attributes:
        problems: one line per mismatch or rejected option, each naming the key and the fix.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            f"the DeepSpeed config does not match the recipe ({len(problems)} problem(s)):\n  - "
            + "\n  - ".join(problems)
        )


def load_ds_config(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """Returns a deep copy of ``source`` (a dict, or a path to a JSON file)."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(
            f"ds_config={str(path)!r} does not exist: pass a DeepSpeed JSON file "
            "(see ds_configs/zero2.json, zero3.json, zero3_offload.json) or a dict"
        )
    with path.open() as f:
        return json.load(f)


def zero_stage(cfg: Mapping[str, Any]) -> int:
    """The ZeRO stage a (resolved or raw) DeepSpeed config asks for (0 when absent)."""
    return int(cfg.get("zero_optimization", {}).get("stage", 0) or 0)


def owned_values(*, world_size: int, grad_clip: float, precision: str) -> dict[str, Any]:
    """The DeepSpeed values fmmeta owns, as dotted keys for :func:`resolve_ds_config`.

    One micro-batch and no accumulation per engine step: the meta-gradient is accumulated by
    ``meta_step`` before the single ``engine.step()`` of a meta-step. The recipe checks a JSON
    against these before loading a model; the engine fills them in.
    """
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": float(grad_clip),
        "bf16.enabled": precision == "bf16",
        "fp16.enabled": False,
    }


def resolve_ds_config(
    source: str | Path | Mapping[str, Any],
    *,
    owned: Mapping[str, Any],
    max_adapter_numel: int | None = None,
) -> dict[str, Any]:
    """Fills every value our config owns into a DeepSpeed config and checks the rest.

    Args:
        source: a DeepSpeed JSON file or an already-loaded dict (not modified).
        owned: our values, by dotted key (see :data:`OWNED_KEYS`), e.g.
            ``{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "train_batch_size": world_size, "gradient_clipping": 1.0, "bf16.enabled": False,
            "fp16.enabled": False}``. A key missing from ``owned`` is left as the JSON has it.
        max_adapter_numel: number of elements of the largest adapter tensor; under ZeRO-3 the
            persistence threshold is raised to at least this, so LoRA stays resident.

    Returns:
        A new dict DeepSpeed can take, with no ``"auto"`` left in the keys we own.

    Raises:
        DSConfigError: listing every conflicting value (key, JSON value, our value, fix) and every
            rejected option, in one message.

    Example:
        >>> cfg = resolve_ds_config({"train_micro_batch_size_per_gpu": "auto",
        ...                          "zero_optimization": {"stage": 2}},
        ...                         owned={"train_micro_batch_size_per_gpu": 1})
        >>> cfg["train_micro_batch_size_per_gpu"]
        1
    """
    cfg = load_ds_config(source)
    if not isinstance(cfg, dict):
        raise DSConfigError([
            f"the JSON holds a {type(cfg).__name__}, not an object: a DeepSpeed config is one JSON "
            'object such as {"zero_optimization": {"stage": 3}}; see ds_configs/zero3.json'
        ])
    for key in owned:
        if key not in OWNED_KEYS:
            raise ValueError(
                f"owned key {key!r} is unknown: allowed are {OWNED_KEYS} "
                "(other DeepSpeed settings belong in the JSON file)"
            )
    problems: list[str] = _zero_problems(cfg.get("zero_optimization", {}))
    problems.extend(
        f"{block}: present in the DeepSpeed JSON but not supported: {why}"
        for block, why in _REJECTED_BLOCKS.items() if block in cfg
    )
    problems.extend(_fill_owned(cfg, owned))
    problems.extend(_accumulation_and_precision_problems(cfg, owned))
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        _resolve_zero_autos(zero, zero_stage(cfg), max_adapter_numel)
    problems.extend(
        f"{key}: is \"auto\" but fmmeta does not own it; fix: give it an explicit value "
        "or remove it to take DeepSpeed's default"
        for key in sorted(_find_auto(cfg))
    )
    if problems:
        raise DSConfigError(problems)
    return cfg


def _fill_owned(cfg: dict[str, Any], owned: Mapping[str, Any]) -> list[str]:
    """Writes our value into every owned key that is ``"auto"`` or absent (creating the blocks it
    needs); every explicit value that disagrees with ours is a problem naming its fix."""
    problems: list[str] = []
    for key, ours in owned.items():
        parts = key.split(".")
        node: dict[str, Any] = cfg
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                problems.append(f"{key}: {part!r} in the DeepSpeed JSON must be an object, got {child!r}")
                break
            node = child
        else:
            leaf = parts[-1]
            theirs = node.get(leaf, AUTO)
            if theirs == AUTO or theirs is None:
                node[leaf] = ours
            elif key == "fp16.enabled" and theirs is True:
                problems.append(
                    "fp16.enabled: DeepSpeed JSON has true but fmmeta does not support fp16 (its "
                    "loss scaler owns the backward, which the meta-gradient bypasses); fix: set "
                    "\"fp16.enabled\" to \"auto\" and use model.dtype=bfloat16 (or float32)"
                )
            elif not _same(theirs, ours):
                problems.append(
                    f"{key}: DeepSpeed JSON has {theirs!r} but the recipe config has {ours!r}; "
                    f"fix: set \"{key}\" to \"auto\" in the JSON (the recipe value then wins) "
                    "or change the recipe config to match"
                )
    return problems


def _accumulation_and_precision_problems(cfg: dict[str, Any], owned: Mapping[str, Any]) -> list[str]:
    """Accumulation other than 1 (when not owned) and two precisions at once; an ``"auto"``
    accumulation becomes 1."""
    problems: list[str] = []
    gas = cfg.get("gradient_accumulation_steps", 1)
    if gas not in (1, AUTO) and "gradient_accumulation_steps" not in owned:
        problems.append(
            f"gradient_accumulation_steps: DeepSpeed JSON has {gas!r} but fmmeta needs 1 "
            "(the meta-gradient is accumulated before one engine step per meta-step); fix: set it to 1 or \"auto\""
        )
    if cfg.get("gradient_accumulation_steps") == AUTO:
        cfg["gradient_accumulation_steps"] = 1
    if cfg.get("bf16", {}).get("enabled") is True and cfg.get("fp16", {}).get("enabled") is True:
        problems.append("bf16.enabled and fp16.enabled are both true: enable at most one precision")
    return problems


def _resolve_zero_autos(zero: dict[str, Any], stage: int, max_adapter_numel: int | None) -> None:
    """What ``"auto"`` means in ``zero_optimization``: DeepSpeed's default for bucket sizes, lean
    gather limits, and under ZeRO-3 a persistence threshold that keeps every adapter tensor
    resident (raised, with a warning, if the JSON's is smaller)."""
    for key in _ZERO_AUTO_TO_DEFAULT:
        if zero.get(key) == AUTO:
            del zero[key]
    for key, value in ZERO3_LEAN_GATHER.items():
        if zero.get(key) == AUTO:
            zero[key] = value
    if stage == 3 and max_adapter_numel is not None:
        threshold = zero.get("stage3_param_persistence_threshold", AUTO)
        if threshold == AUTO or int(threshold) < max_adapter_numel:
            new = max(int(max_adapter_numel), 1)
            if threshold != AUTO:
                logger.warning(
                    "zero_optimization.stage3_param_persistence_threshold=%s is below the largest "
                    "adapter tensor (%d elements): raised to %d so LoRA stays resident on every rank",
                    threshold, max_adapter_numel, new,
                )
            else:
                logger.info("zero_optimization.stage3_param_persistence_threshold=auto -> %d", new)
            zero["stage3_param_persistence_threshold"] = new
    elif zero.get("stage3_param_persistence_threshold") == AUTO:
        del zero["stage3_param_persistence_threshold"]


def _zero_problems(zero: Any) -> list[str]:
    """What is wrong with the ``zero_optimization`` block's shape and stage (DeepSpeed itself
    would fail on it only after the model is loaded, with a traceback)."""
    if not isinstance(zero, dict):
        return [f"zero_optimization: must be an object such as {{\"stage\": 3}}, got {zero!r}"]
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        return [f"zero_optimization.stage: DeepSpeed JSON has {stage!r} but ZeRO stages are 0, 1, 2 "
                "and 3; fix: set one of them (ds_configs/zero3.json uses 3)"]
    return []


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def _find_auto(node: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_find_auto(v, f"{prefix}.{k}" if prefix else str(k)))
    elif node == AUTO:
        out.append(prefix)
    return out
