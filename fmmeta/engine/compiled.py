"""``engine.compile``: every decoder layer compiled on its own, for training and adaptation alike.

A meta-step of a small model spends more than half of its eager time in small memory-bound
operations (norms, rotary embeddings, SiLU, casts) that only fusing removes (issue 49:
``benchmarks/compiled.py``). The whole model is not compiled: its loss, the LM head at the
answer positions and peft's wrappers change with every pass and would split the graph. The
decoder layers are the model's repeated block (transformers' ``_no_split_modules``) and share one
code object, so one layer's graphs serve all of them ("regional" compiling) and a run compiles a
handful of graphs once.

Compiling is in place (``nn.Module.compile``), so whatever runs the model afterwards (the
meta-step's passes, evaluation's adaptation and scoring) runs the compiled layers. A graph is
compiled again wherever one of its guards fails; this module removes the guards a meta-step
would otherwise trip on every pass:

* whether the first layer's input requires grad (the frozen embeddings' output does not, every
  later layer's does): a hook makes the embeddings' output require grad under grad mode, which
  costs nothing, because ``torch.autograd.grad`` over the adapter never asks for its gradient;
* a pass's row count and length: dimensions are dynamic from the first graph (a one-row pass
  still has graphs of its own: the rotary embeddings broadcast over a batch of one, and dynamo
  specialises a size of 1; treating it as any size, ``backed_size_oblivious``, fails there);
* the task index of a one-task pass: :class:`~fmmeta.algorithms.task_lora.TaskLoRA` routes by
  tensors built outside the layer.

Grad mode stays a guard (a forward-only pass, e.g. the query loss before adapting, has its own
graph), and so does the attention mask's presence (a padded pass has one, padding-free lines do
not): a run compiles about four graph families, each once.

Inductor keeps what it compiled on disk (``TORCHINDUCTOR_CACHE_DIR``); :func:`compile_model`
points it into the venv, so a resume or a second run of the same model loads the graphs instead
of compiling them again (dynamo still traces each graph: that part is paid once per process).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_FOLDER",
    "RECOMPILE_LIMIT",
    "CompiledLayers",
    "compile_layers",
    "compile_model",
    "compile_summary",
    "compile_seconds",
    "cxx_compiler",
    "decoder_layers",
    "unique_graphs",
    "use_cache_dir",
    "venv_cache_dir",
]

RECOMPILE_LIMIT = 32
"""Dynamo's per-code-object graph limit while compiled (its default, 8, would send a layer to
eager without a word once exceeded, and the run would be slower than eager at no warning)."""

CACHE_FOLDER = "inductor_cache"
"""Subfolder (of the venv, see :func:`venv_cache_dir`) that holds inductor's compiled graphs."""


def use_cache_dir(folder: str | os.PathLike[str]) -> Path:
    """Points inductor's on-disk cache at ``folder / CACHE_FOLDER`` unless the environment already
    names one (a user's choice wins); returns the folder in use. Must run before the first
    compile: inductor reads the variable when it first writes.

    Torch's own default (a per-user folder in the temp dir, which a reboot or a fresh machine
    empties) is not a user's choice, though it may be in the environment: torch writes it there
    the first time anything asks inductor for its cache folder, and importing peft does."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        chosen = str(Path(folder) / CACHE_FOLDER)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = chosen
    Path(chosen).mkdir(parents=True, exist_ok=True)
    return Path(chosen)


@functools.cache
def cxx_compiler() -> str | None:
    """The C++ compiler inductor would build CPU kernels with (``g++``, ``clang++``, or what
    ``CXX`` names), or ``None`` when it finds none: on a CPU, a compiled layer's first pass would
    then fail with inductor's own error after the model had loaded. Looked up once per process:
    inductor's search runs ``<compiler> --version``, and every engine a run builds asks."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return str(get_cpp_compiler())
    except Exception:  # inductor raises its own InvalidCxxCompiler, or fails importing a toolchain
        return None


def unique_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (every recompile counts one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far: dynamo's frame compiles (tracing and the
    backend's compile, the backward graph included where AOT autograd compiles it at once, as it
    does for dynamic shapes), plus backward graphs compiled lazily on a first backward
    (``backward._backward_impl``). Not ``bw_compiler``: it runs inside the frame compile when
    eager and would count twice (a smoke run then reported more compile seconds than wall time)."""
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(sum(v) for k, v in compilation_time_metrics.items()
                     if k in ("_compile.compile_inner", "backward._backward_impl")))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Every module of the model's repeated block class (transformers' ``_no_split_modules``,
    e.g. ``LlamaDecoderLayer``), found under framework and peft wrappers.

    Raises:
        ValueError: if the model names no repeated block, or none is found.
    """
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"engine.compile=true compiles the model's repeated decoder layer, but "
            f"{type(model).__name__} names none (transformers' _no_split_modules): set "
            "engine.compile: false for this model"
        )
    return layers


def _input_embeddings(model: nn.Module) -> nn.Module | None:
    for m in model.modules():
        get = getattr(m, "get_input_embeddings", None)
        if callable(get):
            emb = get()
            if isinstance(emb, nn.Module):
                return emb
    return None


def _require_grad(_module: nn.Module, _args: object, output: torch.Tensor) -> torch.Tensor:
    """Makes the embeddings' output require grad under grad mode (see the module docstring)."""
    if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and not output.requires_grad:
        return output.requires_grad_(True)
    return output


@dataclass
class CompiledLayers:
    """What :func:`compile_layers` did, and the graph count and compile time since.

    Attributes:
        layers: decoder layers compiled.
        backend: the ``torch.compile`` backend ("inductor"; "aot_eager" in tests).
        graphs_before: dynamo's graph count when they were compiled.
        seconds_before: compile seconds spent in this process before.
    """

    layers: int
    backend: str
    graphs_before: int
    seconds_before: float

    @property
    def graphs(self) -> int:
        """Graphs compiled since (each recompile counts one)."""
        return unique_graphs() - self.graphs_before

    @property
    def seconds(self) -> float:
        """Seconds spent compiling since (a cached graph costs its load only)."""
        return compile_seconds() - self.seconds_before

    def summary(self) -> dict[str, float]:
        """The figures the telemetry records."""
        return {"compile_layers": float(self.layers), "compile_graphs": float(self.graphs),
                "compile_seconds": round(self.seconds, 3)}


def compile_layers(model: nn.Module, *, backend: str = "inductor") -> CompiledLayers:
    """Compiles every decoder layer of ``model`` in place (see the module docstring).

    Example:
        >>> compiled = compile_layers(peft_model)       # doctest: +SKIP
        >>> ...                                           # meta-steps, adaptation
        >>> compiled.graphs, compiled.seconds            # doctest: +SKIP
    """
    import torch._dynamo.config as dynamo_config

    layers = decoder_layers(model)
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    # The routing tensors and fast weights reach the layer through module attributes, whose
    # shapes dynamo otherwise keeps static: every row or task count would be a graph of its own.
    dynamo_config.force_nn_module_property_static_shapes = False
    embeddings = _input_embeddings(model)
    if embeddings is not None and not getattr(embeddings, "_fmmeta_requires_grad", False):
        embeddings.register_forward_hook(_require_grad)
        embeddings._fmmeta_requires_grad = True  # type: ignore[assignment]  # once per model
    state = CompiledLayers(len(layers), backend, unique_graphs(), compile_seconds())
    for layer in layers:
        layer.compile(backend=backend, dynamic=True)
    logger.info("engine.compile: %d decoder layers compiled (backend %s, inductor cache %s)",
                len(layers), backend, os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torch's default"))
    return state


_COMPILED: CompiledLayers | None = None
"""What this process compiled first (:func:`compile_summary` reports since then)."""


def venv_cache_dir() -> Path | None:
    """``<venv>/inductor_cache`` when Python runs in a virtual environment (``scripts/setup.sh``
    makes ``.venv``), else ``None`` (torch's default, a per-user folder under the temp dir)."""
    if sys.prefix == sys.base_prefix:
        return None
    return Path(sys.prefix) / CACHE_FOLDER


def compile_model(model: nn.Module, *, backend: str = "inductor") -> CompiledLayers:
    """``engine.compile``'s hook, run where the engine is built (so training, evaluation and a
    study's scoring all get it): inductor's cache into the venv (every run and resume of this
    checkout shares it; ``TORCHINDUCTOR_CACHE_DIR`` overrides), then every decoder layer not yet
    compiled is compiled. Idempotent: each method's engine wraps the same model."""
    global _COMPILED
    folder = venv_cache_dir()
    if folder is not None:
        use_cache_dir(folder.parent)
    if _COMPILED is None or not all(_is_compiled(m) for m in decoder_layers(model)):
        state = compile_layers(model, backend=backend)
        _COMPILED = _COMPILED or state
    return _COMPILED


def _is_compiled(layer: nn.Module) -> bool:
    return getattr(layer, "_compiled_call_impl", None) is not None


def compile_summary() -> dict[str, float]:
    """This process's compile figures for the telemetry (``{}`` when nothing was compiled):
    graphs and seconds since :func:`compile_model` first ran. Compiling is per process, so a
    method trained after another in one process reuses its graphs and adds few."""
    return {} if _COMPILED is None else _COMPILED.summary()
