"""LocalEngine: outer step arithmetic, adapter round trip through peft, optimizer resume."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from fmmeta.engine.local import LocalEngine
from fmmeta.engine.optim import OuterOptimConfig

CFG = OuterOptimConfig(outer_lr=1e-2, grad_clip=1.0, warmup_steps=2)


def _grads(engine: LocalEngine, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=gen) * scale for p in engine.adapter_parameters()]


def test_adapter_parameters_are_the_trainable_tensors_in_order(peft_factory) -> None:
    model = peft_factory()
    engine = LocalEngine(model, CFG)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(engine.adapter_parameters()) == len(names) == 8
    assert all("lora_" in n for n in names)
    assert engine.rank == 0 and engine.world_size == 1 and engine.device == torch.device("cpu")


def test_outer_step_is_mean_clip_adamw(peft_factory) -> None:
    engine = LocalEngine(peft_factory(), CFG)
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in engine.adapter_parameters()]
    ref_opt = torch.optim.AdamW(ref_params, lr=CFG.outer_lr, betas=CFG.betas, eps=CFG.eps, weight_decay=0.0)
    for step in range(3):
        gsum = _grads(engine, step, scale=3.0)  # large enough that clipping is active
        stats = engine.outer_step(gsum, n_real_tasks=3)
        for p, g in zip(ref_params, gsum):
            p.grad = g / 3
        norm = float(torch.nn.utils.clip_grad_norm_(ref_params, CFG.grad_clip))
        for group in ref_opt.param_groups:
            group["lr"] = CFG.outer_lr * min(1.0, (step + 1) / 2)
        ref_opt.step()
        assert stats["grad_norm"] == pytest.approx(norm, rel=1e-5) and norm > CFG.grad_clip
        assert stats["lr"] == pytest.approx(CFG.outer_lr * min(1.0, (step + 1) / 2))
    for a, b in zip(engine.adapter_parameters(), ref_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


def test_outer_step_rejects_mismatched_gradients(peft_factory) -> None:
    engine = LocalEngine(peft_factory(), CFG)
    g = _grads(engine, 0)
    with pytest.raises(ValueError, match="gradients for"):
        engine.outer_step(g[:-1], 1)
    with pytest.raises(ValueError, match="shape"):
        engine.outer_step([x.flatten() for x in g], 1)
    with pytest.raises(ValueError, match="n_real_tasks=0"):
        engine.outer_step(g, 0)


def test_adapter_round_trip_through_peft(peft_factory, base_factory, tmp_path) -> None:
    engine = LocalEngine(peft_factory(lora_seed=7), CFG)
    engine.save_adapter(tmp_path / "adapter")
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert len(saved) == 8 and all(t.numel() > 0 for t in saved.values())

    ids = torch.tensor([[5, 9, 17, 3, 44, 2]])
    with torch.no_grad():
        expected = engine.model(input_ids=ids).logits
        fresh = PeftModel.from_pretrained(base_factory(), str(tmp_path / "adapter")).eval()
        torch.testing.assert_close(fresh(input_ids=ids).logits, expected, rtol=0, atol=0)

    other = LocalEngine(peft_factory(lora_seed=99), CFG)
    with torch.no_grad():
        assert not torch.allclose(other.model(input_ids=ids).logits, expected)
    other.load_adapter(tmp_path / "adapter")
    for a, b in zip(other.adapter_parameters(), engine.adapter_parameters()):
        assert torch.equal(a, b)
    with torch.no_grad():
        torch.testing.assert_close(other.model(input_ids=ids).logits, expected, rtol=0, atol=0)


def test_load_adapter_missing_file_is_a_clear_error(peft_factory, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
        LocalEngine(peft_factory(), CFG).load_adapter(tmp_path)


def test_optimizer_resume_equals_continuous_run(peft_factory, tmp_path) -> None:
    cont = LocalEngine(peft_factory(), CFG)
    for s in range(4):
        cont.outer_step(_grads(cont, s), 2)

    first = LocalEngine(peft_factory(), CFG)
    for s in range(2):
        first.outer_step(_grads(first, s), 2)
    files = first.save_optimizer(tmp_path / "opt")
    first.save_adapter(tmp_path / "adapter")
    assert files and all(f.is_file() for f in files)
    state = torch.load(files[0], weights_only=True)  # safe loading must work
    assert state["optimizer"]["state"]

    resumed = LocalEngine(peft_factory(lora_seed=5), CFG)
    resumed.load_adapter(tmp_path / "adapter")
    resumed.load_optimizer(tmp_path / "opt")
    for s in range(2, 4):
        resumed.outer_step(_grads(resumed, s), 2)
    for a, b in zip(resumed.adapter_parameters(), cont.adapter_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert resumed.scheduler.last_epoch == cont.scheduler.last_epoch == 4


def test_bf16_adapter_steps_an_fp32_master_copy(peft_factory, tmp_path) -> None:
    """A bf16 adapter follows the fp32 run exactly, rounded: AdamW steps fp32 master copies.

    With AdamW on the bf16 tensors themselves, steps of ~outer_lr below the weights' bf16
    spacing were lost (the adapter did not move at all in this test).
    """
    cfg = OuterOptimConfig(outer_lr=1e-4, grad_clip=0.0)
    fp32 = LocalEngine(peft_factory(), cfg)
    with torch.no_grad():  # the same theta: representable in bf16
        for p in fp32.adapter_parameters():
            p.copy_(p.to(torch.bfloat16).float())
    bf16 = LocalEngine(peft_factory().to(torch.bfloat16), cfg)
    with torch.no_grad():
        for p, q in zip(bf16.adapter_parameters(), fp32.adapter_parameters()):
            p.copy_(q)
    start = [p.detach().clone() for p in bf16.adapter_parameters()]
    for step in range(40):
        grads = _grads(fp32, step)
        fp32.outer_step(grads, n_real_tasks=1)
        bf16.outer_step(grads, n_real_tasks=1)
        if step == 19:  # checkpoint and resume into a fresh bf16 engine halfway
            bf16.save_adapter(tmp_path / "adapter")
            bf16.save_optimizer(tmp_path)
            bf16 = LocalEngine(peft_factory().to(torch.bfloat16), cfg)
            bf16.load_adapter(tmp_path / "adapter")
            bf16.load_optimizer(tmp_path)
    for p, q, s in zip(bf16.adapter_parameters(), fp32.adapter_parameters(), start):
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, q.to(torch.bfloat16))
    assert sum(int((p != s).sum()) for p, s in zip(bf16.adapter_parameters(), start)) > 0
