"""How a GGUF file is loaded: de-quantized into a plain model, its metadata read once, not four times.

Loading the embedded SmolLM2-135M GGUF through transformers (5.x) took about 15 s on the
project's 2-core CPU, of which de-quantizing the weights was 1.5 s. The rest was repeated
parsing: the tokenizer, the config and the weights each construct a ``gguf.GGUFReader`` of the
same file (every parse walks the ~49k vocabulary strings of its metadata, about 3.5 s), and the
weight-name mapping rebuilds ``gguf.get_tensor_name_map(arch, n_layers)``, a table of every
tensor name of the architecture, once per module of the model (about 400 times, 5 s).

:func:`gguf_parsed_once` makes both happen once while it is entered: readers are kept per
``(path, mode)`` and the name map per argument tuple. Both are read-only in transformers' loader
(it reads ``fields`` and ``tensors``, and looks names up), so the loaded tokenizer and weights are
the same (a test compares them with an ordinary load). The two ``gguf`` attributes are restored
on exit, so nothing outside the block sees the change. :func:`gguf_loading` gives
``from_pretrained`` the arguments that de-quantize.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While entered, ``gguf.GGUFReader(path)`` returns one reader per file and mode, and
    ``gguf.get_tensor_name_map`` one map per argument tuple (see the module docstring).

    transformers imports both from ``gguf`` inside its loading functions, at call time, so it
    gets the cached ones. Without the ``gguf`` package this does nothing (the load then fails
    with transformers' own message).
    """
    try:
        import gguf
    except ImportError:
        yield
        return
    module: Any = gguf  # its attributes are swapped for the block's duration
    real_reader, real_map = module.GGUFReader, module.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    module.GGUFReader = reader
    module.get_tensor_name_map = functools.cache(real_map)
    try:
        yield
    finally:
        module.GGUFReader, module.get_tensor_name_map = real_reader, real_map


def gguf_loading(gguf_file: str) -> dict[str, Any]:
    """``from_pretrained``'s keyword arguments for a GGUF file: the file, and where transformers
    has a GGUF quantization config (5.25 and later), that config with ``dequantize=True``.

    Why: from 5.25 transformers keeps a GGUF file's weights in their quantized blocks for the
    architectures it has kernels for (a layer type of its own, which LoRA and fmmeta's fp32 masters
    over bf16 compute do not expect), and for every other architecture, Llama among them, it
    de-quantizes them but still marks the dense model quantized (``is_quantized``, which changes
    how peft prepares it) and warns, in a bf16 run, that float32 would be faster for "packed"
    weights there are none of. De-quantizing on request gives every architecture the same plain
    model, with the same weights as before (tests/unit/models/test_gguf_once.py)."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:  # transformers before 5.25 always de-quantizes
        return {"gguf_file": gguf_file}
    return {"gguf_file": gguf_file, "quantization_config": GgufConfig(dequantize=True)}


__all__ = ["gguf_loading", "gguf_parsed_once"]
