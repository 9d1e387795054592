"""Fixtures for the engine tests: a tiny random Llama + peft LoRA built from a config."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def tiny_llama_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )


def build_base(seed: int = 0) -> LlamaForCausalLM:
    """A tiny Llama whose every weight comes from a generator we own (no global RNG)."""
    model = LlamaForCausalLM(tiny_llama_config())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def build_peft(seed: int = 0, lora_seed: int = 1) -> torch.nn.Module:
    model = get_peft_model(build_base(seed), LoraConfig(**LORA))
    gen = torch.Generator().manual_seed(lora_seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def peft_factory() -> Callable[..., torch.nn.Module]:
    return build_peft


@pytest.fixture
def base_factory() -> Callable[..., torch.nn.Module]:
    return build_base
