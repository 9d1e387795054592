"""Builders for the meta-algorithm tests: a tiny random Llama + peft LoRA, synthetic episodes, plans."""

from __future__ import annotations

import random
from typing import Callable

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from fmmeta.sampling.plan import MetaBatchPlan, TaskSlot
from fmmeta.tasks.episode import Episode, Example

PAD_ID = 0
VOCAB = 128


def build_tiny_peft(seed: int = 0) -> torch.nn.Module:
    """A 2-layer random Llama with LoRA on q/v; every weight drawn from a generator we own."""
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:  # non-zero LoRA B too, so every adapter tensor gets a gradient at theta
                p.copy_(torch.randn(p.shape, generator=gen) * (0.2 if "lora_" in name else 0.05))
    return peft_model.eval()  # no dropout anywhere: gradients are deterministic


def make_episode(rng: random.Random, name: str, n_support: int = 4, n_query: int = 3) -> Episode:
    """An episode of random token sequences of varying prompt/answer lengths."""

    def ex() -> Example:
        prompt = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 7)))
        answer = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 4)))
        return Example(prompt, answer)

    return Episode(
        task=name,
        support=tuple(ex() for _ in range(n_support)),
        query=tuple(ex() for _ in range(n_query)),
        shots=n_support,
    )


def chunks(n: int, size: int) -> tuple[tuple[int, ...], ...]:
    """Indices 0..n-1 cut into chunks of ``size``."""
    return tuple(tuple(range(i, min(i + size, n))) for i in range(0, n, size))


def make_slot(ep: Episode, support_size: int = 2, query_size: int = 2, task_id: int = 0) -> TaskSlot:
    return TaskSlot(
        episode=ep, weight=1.0,
        support_chunks=chunks(len(ep.support), support_size),
        query_chunks=chunks(len(ep.query), query_size),
        task_id=task_id,
    )


def make_plan(slots: list[TaskSlot], step: int = 0) -> MetaBatchPlan:
    return MetaBatchPlan(step=step, ranks=(tuple(slots),),
                         n_real_tasks=sum(not s.is_dummy for s in slots))


