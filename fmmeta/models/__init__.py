"""Base model, tokenizer and LoRA adapter construction from config."""

from fmmeta.models.build import (
    EMBEDDED_GGUF_FILE,
    EMBEDDED_PACKAGE,
    ModelSource,
    ModelSourceError,
    PartitionedInit,
    add_lora,
    build_model_and_tokenizer,
    count_parameters,
    lora_shapes,
    model_id,
    resolve_source,
    torch_dtype,
)

__all__ = [
    "EMBEDDED_GGUF_FILE",
    "EMBEDDED_PACKAGE",
    "ModelSource",
    "ModelSourceError",
    "PartitionedInit",
    "add_lora",
    "build_model_and_tokenizer",
    "count_parameters",
    "lora_shapes",
    "model_id",
    "resolve_source",
    "torch_dtype",
]
