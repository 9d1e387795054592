"""Compute precision: model.dtype=auto by the hardware's bf16, and bf16 attention in fp32 on CPU."""

from __future__ import annotations

import pytest
import torch

from fmmeta.config import ModelConfig
from fmmeta.engine.build import build_engine
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.models import build_model_and_tokenizer, torch_dtype
from fmmeta.models.precision import (
    FP32_ATTENTION,
    cpu_flags,
    engine_precision,
    native_bf16,
    precision_dtype,
    resolve_dtype,
)
from fmmeta.recipe_config import RecipeConfig

torch.set_num_threads(1)

TINY = dict(tiny=True, tokenizer="bytes", tiny_hidden_size=64, tiny_intermediate_size=128)


def test_auto_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_dtype("auto", frozenset({"avx512f", "avx512_bf16"})) == "bfloat16"
    assert resolve_dtype("auto", frozenset({"amx_bf16"})) == "bfloat16"
    assert resolve_dtype("auto", frozenset({"avx2", "avx512f"})) == "float32"
    native, why = native_bf16(frozenset({"avx2"}))
    assert not native and "avx512_bf16" in why and "emulated" in why
    assert resolve_dtype("float32", frozenset({"avx512_bf16"})) == "float32"  # explicit wins
    assert resolve_dtype("bfloat16", frozenset()) == "bfloat16"


def test_a_named_cpu_device_asks_the_cpu_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark's ``--device cpu`` on a machine with a bf16 GPU: the CPU's flags decide."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a bf16 GPU")
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert resolve_dtype("auto", frozenset({"avx2"})) == "bfloat16"  # the run's device: the GPU
    assert resolve_dtype("auto", frozenset({"avx2"}), device="cpu") == "float32"
    assert resolve_dtype("auto", frozenset({"amx_bf16"}), device="cpu") == "bfloat16"
    assert native_bf16(frozenset(), device="cuda:0") == (True, "GPU a bf16 GPU supports bf16")


def test_one_table_maps_dtype_names_engine_precisions_and_torch_dtypes() -> None:
    """The model's dtype, the engine's precision and the local engine's cast agree for each name."""
    for name, dtype, precision in (("float32", torch.float32, "fp32"), ("bfloat16", torch.bfloat16, "bf16")):
        assert torch_dtype(name) is dtype and engine_precision(name) == precision
        assert precision_dtype(precision) is dtype
        cfg = RecipeConfig(model=ModelConfig(dtype=name))
        assert cfg.precision == precision
        engine = build_engine(cfg.engine, torch.nn.Linear(2, 2), OuterOptimConfig(), precision=cfg.precision)
        assert next(engine.model.parameters()).dtype is dtype
        engine.close()
    with pytest.raises(ValueError, match="precision='fp16' is invalid"):
        precision_dtype("fp16")


def test_cpu_flags_reads_the_flags_line(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512_bf16\nbugs\t: none\n")
    assert cpu_flags(str(info)) == frozenset({"fpu", "sse2", "avx512_bf16"})
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_the_recipe_records_the_dtype_it_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("fmmeta.models.precision.cpu_flags", lambda: frozenset({"avx2"}))
    cfg = RecipeConfig()
    assert cfg.model.dtype == "auto" and cfg.precision == "fp32"
    assert cfg.on_this_machine().model.dtype == "float32"
    monkeypatch.setattr("fmmeta.models.precision.cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert cfg.on_this_machine().model.dtype == "bfloat16" and cfg.precision == "bf16"
    assert torch_dtype("auto") == torch.bfloat16


def test_bf16_model_attends_in_fp32_with_padding_and_gradients() -> None:
    """A bf16 model runs SDPA on fp32 queries/keys/values: a padded batch gives each row its own
    unpadded logits, close to the fp32 model's, and gradients reach the inputs' embeddings."""
    m32, _ = build_model_and_tokenizer(ModelConfig(dtype="float32", **TINY))
    m16, _ = build_model_and_tokenizer(ModelConfig(dtype="bfloat16", **TINY))
    assert m32.config._attn_implementation == "sdpa"
    assert m16.config._attn_implementation == FP32_ATTENTION
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: visible to causal attention unless the mask is applied
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = m16(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.float()
        alone = m16(input_ids=ids[1:, 3:], use_cache=False).logits.float()
        ref = m32(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    assert torch.allclose(padded[1, 3:], alone[0], atol=0.05)
    rel = (padded[0] - ref[0]).norm() / ref[0].norm()
    assert rel < 0.05  # bf16 rounding, not a wrong mask
    emb = m16.get_input_embeddings()(ids).detach().requires_grad_(True)
    m16(inputs_embeds=emb, attention_mask=mask, use_cache=False).logits.float().sum().backward()
    assert emb.grad is not None and torch.isfinite(emb.grad).all() and emb.grad.abs().sum() > 0
