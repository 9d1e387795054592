"""fmmeta/flops.py's count of a pass against a hand count and against torch's FLOP counter.

``torch.utils.flop_counter.FlopCounterMode`` counts the matmuls a real forward and backward of a
tiny LoRA model over a frozen base runs: ``aten.mm`` (every linear layer, the LM head, their input
and weight gradients) and ``aten.bmm`` (attention, with the model's eager attention, whose matmuls
torch counts; the CPU's fused SDPA kernel it does not count). The linear layers and the head agree
exactly: the count leaves out exactly what autograd skips (the frozen weights' gradients, the first
layer's projections of the frozen embedding). Attention differs in two known ways, each checked to
the FLOP: the eager kernel computes the full square of scores (``B x T^2`` keys, where the count
takes the causal ``B x T (T + 1) / 2`` a causal kernel needs), and its backward skips the gradient
to the keys in the lowest layer the backward reaches, where the keys need none (a fused kernel
computes it; the count follows the fused kernels). What neither counts: norms, rotary embeddings,
activations, softmax and the loss (elementwise). So the totals agree within 1% (0.4% here).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from fmmeta.config import LoraConfig, ModelConfig
from fmmeta.flops import PassSize, attended_keys, head_positions, model_shape, pass_flops, pass_size
from fmmeta.models import add_lora, build_model_and_tokenizer

ROWS, WIDTH, KEEP = 3, 10, (7, 8, 9)


def _tiny_lora(targets: tuple[str, ...] = ("q_proj", "v_proj")) -> torch.nn.Module:
    """The tiny random Llama (hidden 64, MLP 128, 2 layers, 4 heads, 2 KV heads, 260-token byte
    vocabulary) with a rank-4 LoRA, eager attention (so torch counts its matmuls), in train mode."""
    base, _ = build_model_and_tokenizer(ModelConfig(tiny=True, tokenizer="bytes"))
    base.set_attn_implementation("eager")
    return add_lora(base, LoraConfig(r=4, target_modules=targets), seed=0).train()


def _measured(model: torch.nn.Module, backward: bool, **kwargs: object) -> dict[str, int]:
    """torch's matmul FLOPs of one forward (and backward) of ``model``, by operator."""
    ids = torch.randint(0, 200, (ROWS, WIDTH), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(backward):
        out = model(input_ids=ids, use_cache=False, **kwargs)
        if backward:
            (out.loss if "labels" in kwargs else out.logits.float().sum()).backward()
    return {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}


def test_the_shape_is_the_hand_count_of_the_tiny_model() -> None:
    shape = model_shape(_tiny_lora())
    h, mlp, kv, r, layers = 64, 128, 32, 4, 2  # kv: 2 KV heads of 16
    per_layer = h * h + h * kv + h * kv + h * h + 3 * h * mlp  # q, k, v, o, gate, up, down
    assert (shape.layers, shape.hidden, shape.attention_width, shape.vocab) == (2, 64, 64, 260)
    assert shape.body == layers * per_layer
    # the first layer's q, k, v read the frozen embedding: no gradient to their input
    assert shape.body_backward == layers * per_layer - (h * h + 2 * h * kv)
    adapter_a, adapter_b = 2 * r * h, r * h + r * kv  # q's and v's A, then B
    assert shape.adapter == layers * (adapter_a + adapter_b)
    assert shape.adapter_backward == shape.adapter - adapter_a  # the first layer's A, likewise
    assert shape.backward_layers == 2 and shape.head_backward


def test_a_lora_pass_agrees_with_torch_flop_counter() -> None:
    model = _tiny_lora()
    shape = model_shape(model)
    keep = torch.tensor(KEEP)
    measured = _measured(model, backward=True, logits_to_keep=keep)
    size = pass_size(torch.zeros(ROWS, WIDTH), logits_to_keep=keep, backward=True)
    assert size == PassSize(tokens=30, keys=ROWS * WIDTH * (WIDTH + 1) // 2, head=9, backward=True)
    linear = pass_flops(shape, PassSize(size.tokens, 0, size.head, True))
    assert measured["mm"] == linear  # exact: linear layers, adapters, LM head, both directions
    square = ROWS * WIDTH * WIDTH
    attention = pass_flops(shape, PassSize(size.tokens, square, size.head, True)) - linear
    lowest_layer_key_gradient = 2 * shape.attention_width * square
    assert measured["bmm"] == attention - lowest_layer_key_gradient
    total = pass_flops(shape, PassSize(size.tokens, square, size.head, True))
    assert sum(measured.values()) == pytest.approx(total, rel=0.01)


def test_a_forward_only_pass_agrees_exactly() -> None:
    model = _tiny_lora()
    shape = model_shape(model)
    measured = _measured(model, backward=False, logits_to_keep=torch.tensor(KEEP))
    assert sum(measured.values()) == pass_flops(shape, PassSize(30, ROWS * WIDTH * WIDTH, 9, False))


def test_the_trainer_baseline_computes_the_head_at_every_position() -> None:
    model = _tiny_lora()
    shape = model_shape(model)
    ids = torch.zeros(ROWS, WIDTH, dtype=torch.long)
    measured = _measured(model, backward=True, labels=ids)  # transformers' labels= loss
    size = pass_size(ids, backward=True)  # no logits_to_keep: every position
    assert size.head == ROWS * WIDTH
    assert measured["mm"] == pass_flops(shape, PassSize(size.tokens, 0, size.head, True))


def test_the_backward_stops_below_the_lowest_trainable_adapter() -> None:
    model = _tiny_lora()
    for name, p in model.named_parameters():
        if ".layers.0." in name:
            p.requires_grad_(False)  # as ANIL's inner loop leaves the lower layers
    shape = model_shape(model)
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert shape.adapter == 2 * 4 * 64 + 4 * 64 + 4 * 32  # layer 1's; layer 0's run frozen, as body
    assert shape.body == 2 * per_layer + 2 * 4 * 64 + 4 * 64 + 4 * 32
    # the gradient reaches layer 1's input, and there its q, k, v take none
    assert shape.backward_layers == 1 and shape.body_backward == per_layer - (64 * 64 + 2 * 64 * 32)
    measured = _measured(model, backward=True, logits_to_keep=torch.tensor(KEEP))
    assert measured["mm"] == pass_flops(shape, PassSize(30, 0, 9, True))


def test_pass_size_reads_what_a_forward_is_given() -> None:
    ids = torch.zeros(2, 6, dtype=torch.long)
    lines = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])  # two examples and a pad, one example
    assert int(attended_keys(ids, lines)) == (1 + 2 + 3 + 1 + 2 + 1) + 21
    assert attended_keys(ids) == 2 * 21  # causal rows of 6
    assert int(attended_keys(ids, torch.arange(6)[None])) == 2 * 21  # one row of positions for all
    assert head_positions(ids) == head_positions(ids, 0) == 12
    assert head_positions(ids, 2) == 4
    assert head_positions(ids, torch.tensor([3, 5])) == 4
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, 2], mask[1, 4:] = True, True
    assert int(head_positions(ids, mask)) == 3
    size = pass_size(ids, position_ids=lines, logits_to_keep=mask, backward=False)
    assert size == PassSize(tokens=12, keys=31, head=3, backward=False)
