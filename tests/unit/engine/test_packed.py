"""Frozen weights packed for oneDNN (fmmeta.engine.packed): the same numbers as plain matmuls, no
stale copy after a write or a free, no graph break when compiled, and packed only where the engine
config and the run's precision say so."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fmmeta.config import EngineConfig
from fmmeta.engine.build import build_engine
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.engine.packed import _PACKED, pack_frozen_linears, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="this CPU or torch build has no oneDNN bf16 matmul")


def _frozen_linear(n_in: int = 48, n_out: int = 80, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(n_in, n_out, bias=bias).to(torch.bfloat16)
    layer.requires_grad_(False)
    return layer


def _is_packed(module: nn.Module) -> bool:
    return "forward" in module.__dict__ and module.weight.data_ptr() in _PACKED


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_computes_the_plain_linear_and_its_input_gradient(bias: bool) -> None:
    layer = _frozen_linear(bias=bias)
    x = torch.randn(3, 7, 48, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(3, 7, 80, dtype=torch.bfloat16)
    plain = F.linear(x, layer.weight, layer.bias)
    (plain_grad,) = torch.autograd.grad(plain, x, grad)
    assert pack_frozen_linears(layer) == 1 and _is_packed(layer)
    out = layer(x)
    (out_grad,) = torch.autograd.grad(out, x, grad)
    torch.testing.assert_close(out, plain, rtol=1.6e-2, atol=1e-2)  # bf16 rounding at most
    torch.testing.assert_close(out_grad, plain_grad, rtol=1.6e-2, atol=1e-2)
    assert out_grad.dtype == torch.bfloat16 and out_grad.shape == x.shape


def test_packing_leaves_trainable_and_fp32_layers_plain() -> None:
    model = nn.Sequential(_frozen_linear(), nn.Linear(80, 8).to(torch.bfloat16), nn.Linear(8, 8))
    model[2].requires_grad_(False)  # frozen, but fp32
    assert pack_frozen_linears(model) == 1
    assert _is_packed(model[0]) and "forward" not in model[1].__dict__ and "forward" not in model[2].__dict__
    assert pack_frozen_linears(model) == 0  # idempotent


def test_a_weight_written_in_place_is_packed_again() -> None:
    layer = _frozen_linear(seed=1)
    pack_frozen_linears(layer)
    x = torch.randn(5, 48, dtype=torch.bfloat16)
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # as load_state_dict would copy into it
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(layer(x), -2.0 * before, rtol=1.6e-2, atol=1e-2)


def test_a_view_at_the_packed_address_and_an_fp32_input_take_the_plain_matmul() -> None:
    layer = _frozen_linear(seed=7)
    pack_frozen_linears(layer)
    x = torch.randn(5, 48, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight = nn.Parameter(layer.weight[:40], requires_grad=False)  # same address, 40 rows
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=0, atol=0)
    with pytest.raises(RuntimeError):  # torch's own dtype error, not oneDNN's
        layer(x.float())


def test_a_freed_weight_leaves_no_packed_copy_behind() -> None:
    layer = _frozen_linear(seed=2)
    pack_frozen_linears(layer)
    key = layer.weight.data_ptr()
    assert key in _PACKED
    del layer
    gc.collect()
    assert key not in _PACKED  # a new tensor at this address must not meet the old copy


def test_a_weight_made_trainable_after_packing_gets_its_gradient() -> None:
    layer = _frozen_linear(bias=True, seed=3)
    pack_frozen_linears(layer)
    layer.requires_grad_(True)
    x = torch.randn(4, 6, 48, dtype=torch.bfloat16)
    grad = torch.randn(4, 6, 80, dtype=torch.bfloat16)
    got = torch.autograd.grad(layer(x), [layer.weight, layer.bias], grad)
    want = torch.autograd.grad(F.linear(x, layer.weight, layer.bias), [layer.weight, layer.bias], grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1.6e-2, atol=5e-2)


def test_a_packed_layer_compiles_without_a_graph_break() -> None:
    layer = _frozen_linear(seed=4)
    pack_frozen_linears(layer)
    x = torch.randn(2, 9, 48, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(2, 9, 80, dtype=torch.bfloat16)

    def block(t: torch.Tensor) -> torch.Tensor:
        return F.silu(layer(t))

    want = block(x)
    (want_grad,) = torch.autograd.grad(want, x, grad)
    torch._dynamo.reset()
    out = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)(x)  # a break raises
    (out_grad,) = torch.autograd.grad(out, x, grad)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out_grad, want_grad)
    torch._dynamo.reset()


@pytest.mark.parametrize(("precision", "pack", "expected"),
                         [("bf16", True, True), ("bf16", False, False), ("fp32", True, False)])
def test_the_local_engine_packs_the_base_in_bf16_unless_told_not_to(
        peft_factory, caplog, precision: str, pack: bool, expected: bool) -> None:
    model = peft_factory()
    with caplog.at_level("WARNING", logger="fmmeta.engine.build"):
        build_engine(EngineConfig(kind="local", pack_weights=pack), model, OuterOptimConfig(), precision=precision)
    base = [m for n, m in model.named_modules() if n.endswith("q_proj.base_layer")]
    assert base and all(_is_packed(m) == expected for m in base)
    # asked for where it cannot apply: the run says so rather than ignoring the key in silence
    assert ("keeps plain matmuls" in caplog.text) == (pack and not expected)
    lora = [m for n, m in model.named_modules() if n.endswith("lora_A.default")]
    assert lora and not any("forward" in m.__dict__ for m in lora)  # the adapter trains: never packed
