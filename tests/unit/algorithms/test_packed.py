"""Packed, task-batched meta-steps equal the one-task-at-a-time reference.

The reference (``reference.py``) runs each task alone through peft's own LoRA forward with HF's
mean loss and ``.backward()``; the packed path runs several tasks per pass through stacked fast
weights. Both in float64, so agreement to 1e-9 is a statement about the arithmetic, not about
rounding luck.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fmmeta.algorithms.answer_loss import check_lines
from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.inner_loop import snapshot
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.algorithms.task_lora import TaskLoRA, stack_adapters
from fmmeta.sampling import CostModel, plan_meta_batch
from fmmeta.tasks import lines

from ._tiny import (
    PAD_ID,
    build_tiny_peft,
    make_episode,
    make_mixed_rank,
    make_plan,
    make_rank,
)
from .reference import summed_meta_gradient, task_meta_gradient, trainable
from .test_meta_step import SGDEngine


@pytest.fixture
def uneven_episodes() -> list:
    rng = random.Random(7)
    return [make_episode(rng, f"t{i}", n_support=rng.randint(1, 7), n_query=rng.randint(1, 4))
            for i in range(5)]


def _close(a, b, rtol: float = 1e-9) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=rtol, atol=1e-12)


def _rank_from_planner(episodes, tokens_per_pass: int):
    plan = plan_meta_batch(episodes, list(range(len(episodes))), step=0, world_size=1,
                           micro_batch_size=4, support_repeats=2, cost_model=CostModel(),
                           rng=np.random.default_rng(0), tokens_per_pass=tokens_per_pass)
    return plan.for_rank(0)


LAYOUTS = {
    "one_task_per_pass": lambda eps: make_rank(eps, 2, 2),
    "all_tasks_in_one_pass": lambda eps: make_mixed_rank(eps, 100),
    "round_robin_3_rows": lambda eps: make_mixed_rank(eps, 3),
    "planner_packed": lambda eps: _rank_from_planner(eps, 24),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("method", ["fomaml", "reptile", "multitask"])
@pytest.mark.parametrize(("clip", "padding_free"), [(None, False), (0.05, False), (0.05, True)])
def test_packed_equals_reference(uneven_episodes, layout, method, clip, padding_free, monkeypatch) -> None:
    monkeypatch.setattr(lines, "MIN_SAVING", 0.0)  # lines wherever they save a token
    rank = LAYOUTS[layout](uneven_episodes)
    if layout == "planner_packed":  # the planner mixes tasks in a pass and spreads tasks over passes
        assert any(len(set(p.slots)) > 1 for p in rank.support)
        assert any(sum(s == 0 for s in p.slots) < len(rank.slots[0].episode.support)
                   for p in rank.support if 0 in p.slots)
    model = build_tiny_peft(dtype=torch.float64)
    episodes = [s.episode for s in rank.slots]
    ref = summed_meta_gradient(model, episodes, method, lr=0.1, steps=2, clip=clip)
    engine = SGDEngine(model, 0.0)
    algo = build_algorithm(method, AlgorithmConfig(inner_steps=2, inner_lr=0.1, inner_clip_norm=clip,
                                                   padding_free=padding_free), PAD_ID)
    if padding_free and method != "multitask":  # lines hold several examples, of several tasks
        passes = [p for p in algo.prepare(rank).support if p is not None]
        assert any(p.batch.n_rows > p.batch.input_ids.shape[0] for p in passes)
        if layout != "one_task_per_pass":
            assert any(len(set(line.tolist())) > 1 for p in passes for line in p.routes())
    theta = snapshot(trainable(model))
    stats = meta_step(engine, algo, make_plan([rank]))
    _close(engine.handed, ref)
    assert all(torch.equal(p, t) for p, t in zip(trainable(model), theta))  # theta never written
    assert len(stats.tasks) == len(episodes)
    # each task's query loss after adaptation is its own, not a pooled number
    losses = [t.query_loss for t in stats.tasks]
    assert len(set(round(x, 9) for x in losses)) == len(losses)


def test_adam_inner_loop_keeps_per_task_moments(uneven_episodes) -> None:
    """Adam moments are per task: packing tasks must not mix them (checked against Adam run per task)."""
    cfg = AlgorithmConfig(inner_steps=3, inner_lr=0.01, inner_optimizer="adam")
    algo = build_algorithm("reptile", cfg, PAD_ID)
    model = build_tiny_peft(dtype=torch.float64)
    packed = algo.rank_gradient(model, trainable(model), algo.prepare(make_mixed_rank(uneven_episodes, 4)))
    alone = [algo.rank_gradient(model, trainable(model), algo.prepare(make_rank([ep], 2, 2)))
             for ep in uneven_episodes]
    _close(packed.grads, [sum(g) for g in zip(*(r.grads for r in alone))])
    assert float(packed.grads[0].abs().max()) > 0


def test_single_task_pass_takes_the_same_route_as_mixed(uneven_episodes) -> None:
    """A one-task pass and a mixed one give a row the same logits (one gathered route for both)."""
    model = build_tiny_peft(dtype=torch.float64)
    params = trainable(model)
    lora = TaskLoRA(model, params)
    fast = stack_adapters(params, 3)
    with torch.no_grad():
        for f in fast:
            f[1].add_(0.3)  # task 1 differs from theta
    ids = torch.randint(1, 100, (2, 5))
    with torch.no_grad(), lora.active(fast):
        lora.rows = torch.tensor([1, 1])
        single = model(input_ids=ids).logits
        lora.rows = torch.tensor([1, 2])
        mixed = model(input_ids=ids).logits
        lora.rows = torch.tensor([0, 0])
        at_theta = model(input_ids=ids).logits
    plain = model(input_ids=ids).logits.detach()  # routing removed on exit: peft's own forward
    torch.testing.assert_close(single[0], mixed[0])
    torch.testing.assert_close(at_theta, plain)
    assert not torch.allclose(single[1], plain[1])


@pytest.mark.parametrize("padding_free", [False, True])
def test_gathered_route_equals_a_plain_matmul_with_the_tasks_slice_in_fp32(padding_free: bool) -> None:
    """The row -> task gather every pass now takes (no Python branch on the task index, so a
    compiled layer keeps one graph) computes what the former one-task fast path did: peft's own
    forward with that task's weights in the adapter, in fp32 to 1e-6."""
    model = build_tiny_peft(dtype=torch.float32)
    params = trainable(model)
    lora = TaskLoRA(model, params)
    fast = stack_adapters(params, 3)
    with torch.no_grad():
        for i, f in enumerate(fast):
            f[2].add_(torch.randn(f[2].shape, generator=torch.Generator().manual_seed(i)) * 0.1)
    ids = torch.randint(1, 100, (3, 6), generator=torch.Generator().manual_seed(0))
    rows = torch.full((3, 6) if padding_free else (3,), 2)
    with torch.no_grad(), lora.active(fast):
        lora.rows = rows
        routed = model(input_ids=ids).logits
    with torch.no_grad():
        for p, f in zip(params, fast):
            p.copy_(f[2])
        plain = model(input_ids=ids).logits  # peft's own matmul with task 2's weights
    torch.testing.assert_close(routed, plain, rtol=1e-6, atol=1e-6)


def test_task_gradient_slices_are_independent(uneven_episodes) -> None:
    """Task t's slice of the stacked gradient is exactly its own FOMAML gradient (0 steps)."""
    model = build_tiny_peft(dtype=torch.float64)
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=0), PAD_ID)
    for i, ep in enumerate(uneven_episodes[:3]):
        alone = algo.rank_gradient(model, trainable(model), algo.prepare(make_rank([ep], 1, 1)))
        _close(alone.grads, task_meta_gradient(model, ep, "fomaml", lr=0.1, steps=0))


def test_dora_is_refused() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(ValueError, match="DoRA"):
        TaskLoRA(model, trainable(model))


class _NoPositions(torch.nn.Module):
    """A model that drops ``position_ids``: examples packed in a line would see each other."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, position_ids=None, use_cache=None):  # noqa: ANN001, ANN201
        return self.inner(input_ids=input_ids, use_cache=False)


def test_check_lines_accepts_llama_and_refuses_a_model_that_mixes_examples() -> None:
    model = build_tiny_peft()
    check_lines(model)
    with pytest.raises(ValueError, match="padding_free: false"):
        check_lines(_NoPositions(model))
