"""Builders for the meta-algorithm tests: a tiny random Llama + peft LoRA, synthetic episodes, plans."""

from __future__ import annotations

import random

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from fmmeta.sampling.plan import DUMMY_PASS, MetaBatchPlan, PackedPass, RankPlan, TaskSlot
from fmmeta.tasks.episode import Episode, Example

PAD_ID = 0
VOCAB = 128


def build_tiny_peft(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
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
    return peft_model.to(dtype).eval()  # no dropout anywhere: gradients are deterministic


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


def _pass(slots: tuple[TaskSlot, ...], rows: list[tuple[int, int]], query: bool) -> PackedPass:
    if not rows:
        return DUMMY_PASS
    sets = [s.episode.query if query else s.episode.support for s in slots]
    lens = [sets[t][e].n_tokens for t, e in rows]
    return PackedPass(tuple(t for t, _ in rows), tuple(e for _, e in rows), max(lens), sum(lens))


def make_rank(episodes: list[Episode], support_size: int = 2, query_size: int = 2) -> RankPlan:
    """One task per pass: each task's sets cut into chunks of the given sizes, task after task."""
    slots = tuple(TaskSlot(ep, i) for i, ep in enumerate(episodes))
    support = tuple(_pass(slots, [(t, e) for e in c], False)
                    for t, ep in enumerate(episodes) for c in chunks(len(ep.support), support_size))
    query = tuple(_pass(slots, [(t, e) for e in c], True)
                  for t, ep in enumerate(episodes) for c in chunks(len(ep.query), query_size))
    return RankPlan(slots, support, query)


def make_mixed_rank(episodes: list[Episode], rows_per_pass: int) -> RankPlan:
    """Several tasks per pass: every task's rows dealt round-robin, then cut into passes."""
    slots = tuple(TaskSlot(ep, i) for i, ep in enumerate(episodes))

    def deal(query: bool) -> tuple[PackedPass, ...]:
        sizes = [len(ep.query if query else ep.support) for ep in episodes]
        rows = [(t, e) for e in range(max(sizes)) for t in range(len(episodes)) if e < sizes[t]]
        return tuple(_pass(slots, rows[i : i + rows_per_pass], query)
                     for i in range(0, len(rows), rows_per_pass))

    return RankPlan(slots, deal(False), deal(True))


def with_dummies(rank: RankPlan, support: int, query: int) -> RankPlan:
    """The same rank with dummy passes added (front of support, end of query)."""
    return RankPlan(rank.slots, (DUMMY_PASS,) * support + rank.support, rank.query + (DUMMY_PASS,) * query)


def make_plan(ranks: list[RankPlan], step: int = 0) -> MetaBatchPlan:
    return MetaBatchPlan(step=step, ranks=tuple(ranks), n_real_tasks=sum(len(r.slots) for r in ranks))
