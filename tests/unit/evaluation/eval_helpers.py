"""Tiny models for the evaluation tests: a random Llama with peft LoRA, and one that knows answers."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 128
HIDDEN = 32
PAD = 0


def tiny_lora_llama(seed: int = 0, lm_bias: torch.Tensor | None = None) -> nn.Module:
    """A 2-layer random Llama with LoRA on q/v; with ``lm_bias`` its logits are exactly that bias.

    ``lm_bias`` replaces the lm_head by a zero-weight linear layer with that bias, so every position
    predicts the same distribution ``softmax(lm_bias)``: a model built to "know" (or not know) an
    answer, whose losses are computable by hand.
    """
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        if lm_bias is not None:
            head = nn.Linear(HIDDEN, VOCAB, bias=True)
            with torch.no_grad():
                head.weight.zero_()
                head.bias.copy_(lm_bias)
            model.lm_head = head
        peft_model = get_peft_model(
            model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        )
    return peft_model


def lora_params(model: nn.Module) -> list[nn.Parameter]:
    """The trainable LoRA tensors in a fixed order."""
    return [p for n, p in model.named_parameters() if p.requires_grad]


def random_state(params: list[nn.Parameter], seed: int, scale: float = 0.1) -> list[torch.Tensor]:
    """An adapter state drawn from a generator this test owns."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) * scale for p in params]


def random_episode(
    g: torch.Generator,
    task: str,
    *,
    classification: bool,
    shots: int = 2,
    n_query: int = 2,
    prompt_len: int = 4,
    forbid: int | None = None,
    extra_prompt: tuple[int, ...] = (),
):
    """A hand-built episode of random tokens (ids 4..119), from a generator the test owns.

    ``forbid`` keeps one token id out of the random draws (a sentinel a test looks for);
    ``extra_prompt`` is appended to every prompt (e.g. that sentinel).
    """
    from fmmeta.tasks.episode import Episode, Example

    def toks(n: int) -> tuple[int, ...]:
        out = []
        while len(out) < n:
            t = int(torch.randint(4, 120, (1,), generator=g))
            if t != forbid:
                out.append(t)
        return tuple(out)

    choices = (toks(1), toks(2)) if classification else None

    def example() -> Example:
        prompt = toks(prompt_len) + extra_prompt
        if choices is not None:
            lab = int(torch.randint(0, 2, (1,), generator=g))
            return Example(prompt, choices[lab], lab)
        return Example(prompt, toks(2) + (2,))

    support = tuple(example() for _ in range(shots))
    query = tuple(example() for _ in range(n_query))
    return Episode(task, support, query, shots=shots, ways=2 if classification else None,
                   choices=choices, separator_ids=(3,))
