"""Base model, tokenizer and LoRA adapter construction from config."""

from fmmeta.models.build import (
    EMBEDDED_GGUF_FILE,
    EMBEDDED_PACKAGE,
    ModelBuildError,
    ModelOrigin,
    PartitionedInit,
    adapter_names,
    add_lora,
    build_model_and_tokenizer,
    count_parameters,
    initial_adapter,
    lora_shapes,
    model_id,
    resolve_origin,
    torch_dtype,
)

__all__ = [
    "adapter_names",
    "EMBEDDED_GGUF_FILE",
    "EMBEDDED_PACKAGE",
    "ModelOrigin",
    "ModelBuildError",
    "PartitionedInit",
    "add_lora",
    "build_model_and_tokenizer",
    "count_parameters",
    "initial_adapter",
    "lora_shapes",
    "model_id",
    "resolve_origin",
    "torch_dtype",
]
