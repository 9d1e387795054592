"""RNG states as JSON + safetensors, so a resumed run draws exactly what an uninterrupted one would.

No pickle anywhere: Python's ``random`` state and numpy bit-generator states are plain integers
(JSON), torch generator states are byte tensors (safetensors).

The run owns its generators (``random.Random``, ``numpy.random.Generator``, ``torch.Generator``)
and passes them by name; torch's global CPU and CUDA generators are saved too because library
code we do not control (LoRA dropout, DeepSpeed) draws from them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fmmeta.checkpoint.folder import Checkpoint
from fmmeta.checkpoint.format import CheckpointError
from fmmeta.checkpoint.writer import CheckpointWriter

__all__ = ["capture_rng_state", "load_rng_state", "restore_rng_state", "save_rng_state"]


def _to_json(value: Any) -> Any:
    """numpy arrays/ints inside a bit-generator state -> JSON-able values (tagged for the trip back)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        if "__ndarray__" in value:
            return np.asarray(value["__ndarray__"], dtype=value["dtype"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def capture_rng_state(
    *,
    python: Mapping[str, random.Random] | None = None,
    numpy: Mapping[str, np.random.Generator | np.random.BitGenerator] | None = None,
    torch_generators: Mapping[str, torch.Generator] | None = None,
    global_torch: bool = True,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Snapshots generator states.

    Args:
        python: named ``random.Random`` instances.
        numpy: named numpy Generators (or bit generators).
        torch_generators: named ``torch.Generator`` objects (any device).
        global_torch: also capture torch's global CPU generator and every CUDA device's.

    Returns:
        ``(json_state, tensors)``: the JSON part and the byte tensors (for safetensors).
    """
    state: dict[str, Any] = {"python": {}, "numpy": {}, "torch": {}}
    tensors: dict[str, torch.Tensor] = {}
    for name, py_gen in (python or {}).items():
        version, internal, gauss = py_gen.getstate()
        state["python"][name] = [version, list(internal), gauss]
    for name, np_gen in (numpy or {}).items():
        bit_gen = np_gen.bit_generator if isinstance(np_gen, np.random.Generator) else np_gen
        state["numpy"][name] = _to_json(bit_gen.state)
    for name, torch_gen in (torch_generators or {}).items():
        tensors[f"gen.{name}"] = torch_gen.get_state().clone()
        state["torch"][name] = {"device": str(torch_gen.device)}
    if global_torch:
        tensors["global.cpu"] = torch.get_rng_state().clone()
        n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for i, t in enumerate(torch.cuda.get_rng_state_all() if n_cuda else []):
            tensors[f"global.cuda.{i}"] = t.clone()
        state["global_torch"] = {"cuda_devices": n_cuda}
    return state, tensors


def restore_rng_state(
    state: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    *,
    python: Mapping[str, random.Random] | None = None,
    numpy: Mapping[str, np.random.Generator | np.random.BitGenerator] | None = None,
    torch_generators: Mapping[str, torch.Generator] | None = None,
    global_torch: bool = True,
) -> None:
    """Sets the given generators (in place, so references others hold stay valid) to a snapshot.

    Raises:
        CheckpointError: a named generator is absent from the snapshot (a different run layout).
    """

    def need(kind: str, name: str) -> Any:
        try:
            return state[kind][name]
        except KeyError as err:
            have = ", ".join(sorted(state.get(kind, {}))) or "none"
            raise CheckpointError(
                f"RNG state has no {kind} generator {name!r} (it holds: {have}); the checkpoint "
                "was written by a run with different generators"
            ) from err

    for name, py_gen in (python or {}).items():
        version, internal, gauss = need("python", name)
        py_gen.setstate((version, tuple(internal), gauss))
    for name, np_gen in (numpy or {}).items():
        bit_gen = np_gen.bit_generator if isinstance(np_gen, np.random.Generator) else np_gen
        bit_gen.state = _from_json(need("numpy", name))
    for name, torch_gen in (torch_generators or {}).items():
        need("torch", name)
        torch_gen.set_state(tensors[f"gen.{name}"].to(torch.uint8).cpu())
    if global_torch:
        if "global.cpu" not in tensors:
            raise CheckpointError("RNG state has no global torch state (saved with global_torch=False)")
        torch.set_rng_state(tensors["global.cpu"].to(torch.uint8).cpu())
        saved_cuda = int(state.get("global_torch", {}).get("cuda_devices", 0))
        if torch.cuda.is_available() and saved_cuda:
            n = min(saved_cuda, torch.cuda.device_count())
            torch.cuda.set_rng_state_all([tensors[f"global.cuda.{i}"] for i in range(n)])


def save_rng_state(writer: CheckpointWriter, name: str = "rng", **generators: Any) -> None:
    """Writes this rank's RNG snapshot as ``{name}_rank{r}.json`` + ``.safetensors``.

    ``generators`` are the keyword arguments of :func:`capture_rng_state`.
    """
    state, tensors = capture_rng_state(**generators)
    stem = f"{name}_rank{writer.rank:05d}"
    writer.save_json(f"{stem}.json", state)
    writer.save_tensors(f"{stem}.safetensors", tensors)


def load_rng_state(ckpt: Checkpoint, rank: int, name: str = "rng", **generators: Any) -> None:
    """Restores what :func:`save_rng_state` wrote for ``rank``."""
    stem = f"{name}_rank{rank:05d}"
    restore_rng_state(
        ckpt.load_json(f"{stem}.json"), ckpt.load_tensors(f"{stem}.safetensors"), **generators
    )
