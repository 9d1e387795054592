"""FOMAML, Reptile and MultiTask against independently computed references."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fmmeta.algorithms.first_order import FOMAML, AlgorithmConfig, MultiTask, Reptile, build_algorithm
from fmmeta.algorithms.inner_loop import snapshot
from fmmeta.sampling.plan import TaskSlot
from fmmeta.tasks.episode import collate

from ._tiny import PAD_ID, chunks, make_slot


def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _hf_grad(model, examples) -> tuple[list[torch.Tensor], float]:
    """Reference gradient: HF's own mean loss on one batch of all examples, .backward()."""
    b = collate(examples, PAD_ID)
    model.zero_grad()
    loss = model(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=b.labels).loss
    loss.backward()
    return [p.grad.detach().clone() for p in _params(model)], float(loss)


def _manual_sgd(model, examples, lr: float, steps: int) -> None:
    for _ in range(steps):
        grads, _ = _hf_grad(model, examples)
        with torch.no_grad():
            for p, g in zip(_params(model), grads):
                p -= lr * g


def _close(a: list[torch.Tensor], b: list[torch.Tensor], rtol: float = 1e-5) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=rtol, atol=1e-7)


def test_fomaml_gradient_is_query_gradient_at_phi(peft_factory, episodes) -> None:
    ep = episodes[0]
    cfg = AlgorithmConfig(name="fomaml", inner_steps=3, inner_lr=0.1)
    model = peft_factory(0)
    res = FOMAML(cfg, PAD_ID).task_gradient(model, _params(model), make_slot(ep, 1, 2))
    ref = peft_factory(0)
    _manual_sgd(ref, ep.support, 0.1, 3)
    grads, q_loss = _hf_grad(ref, ep.query)
    _close(res.grads, grads)
    assert res.query_loss_after == pytest.approx(q_loss, rel=1e-5)
    # and it is not just the gradient at theta
    at_theta, _ = _hf_grad(peft_factory(0), ep.query)
    assert max(float((a - b).abs().max()) for a, b in zip(res.grads, at_theta)) > 1e-4
    assert res.n_passes == 3 * 4 + 2  # 4 support chunks x 3 steps + 2 query chunks


def test_fomaml_zero_steps_is_query_gradient_at_theta(peft_factory, episodes) -> None:
    ep = episodes[1]
    model = peft_factory(0)
    res = FOMAML(AlgorithmConfig(inner_steps=0), PAD_ID).task_gradient(model, _params(model), make_slot(ep))
    grads, _ = _hf_grad(peft_factory(0), ep.query)
    _close(res.grads, grads)


def test_reptile_gradient_is_theta_minus_phi(peft_factory, episodes) -> None:
    ep = episodes[2]
    model = peft_factory(0)
    res = Reptile(AlgorithmConfig(name="reptile", inner_steps=2, inner_lr=0.1), PAD_ID).task_gradient(
        model, _params(model), make_slot(ep, 3, 1)
    )
    ref = peft_factory(0)
    theta = snapshot(_params(ref))
    _manual_sgd(ref, ep.support, 0.1, 2)
    _close(res.grads, [t - p.detach() for t, p in zip(theta, _params(ref))])
    _, q_loss = _hf_grad(ref, ep.query)
    assert res.query_loss_after == pytest.approx(q_loss, rel=1e-5)


def test_reptile_query_step_folds_one_query_step(peft_factory, episodes) -> None:
    ep = episodes[0]
    cfg = AlgorithmConfig(name="reptile", inner_steps=2, inner_lr=0.1, reptile_query_step=True)
    model = peft_factory(0)
    res = Reptile(cfg, PAD_ID).task_gradient(model, _params(model), make_slot(ep, 2, 2))
    ref = peft_factory(0)
    theta = snapshot(_params(ref))
    _manual_sgd(ref, ep.support, 0.1, 2)
    _, q_loss = _hf_grad(ref, ep.query)
    _manual_sgd(ref, ep.query, 0.1, 1)
    _close(res.grads, [t - p.detach() for t, p in zip(theta, _params(ref))])
    assert res.query_loss_after == pytest.approx(q_loss, rel=1e-5)


def test_multitask_is_pooled_gradient_at_theta_with_fomaml_pass_count(peft_factory, episodes) -> None:
    ep = episodes[1]
    slot = make_slot(ep, 2, 1)
    model = peft_factory(0)
    cfg = AlgorithmConfig(name="multitask", inner_steps=3)
    res = MultiTask(cfg, PAD_ID).task_gradient(model, _params(model), slot)
    grads, _ = _hf_grad(peft_factory(0), ep.support + ep.query)
    _close(res.grads, grads)
    fomaml = FOMAML(dataclasses.replace(cfg, name="fomaml"), PAD_ID).task_gradient(model, _params(model), slot)
    assert res.n_passes == fomaml.n_passes == 3 * 2 + 3
    assert res.n_tokens == fomaml.n_tokens
    _, q_loss = _hf_grad(peft_factory(0), ep.query)
    assert res.query_loss_after == pytest.approx(q_loss, rel=1e-5)
    cheap = MultiTask(dataclasses.replace(cfg, multitask_match_passes=False), PAD_ID).task_gradient(
        model, _params(model), slot
    )
    assert cheap.n_passes == 2 + 3
    _close(cheap.grads, grads)


@pytest.mark.parametrize("name", ["fomaml", "reptile", "multitask"])
def test_micro_batch_sizes_do_not_change_the_meta_gradient(peft_factory, episodes, name) -> None:
    ep = episodes[0]
    cfg = AlgorithmConfig(name=name, inner_steps=2, inner_lr=0.1)
    model = peft_factory(0)
    algo = build_algorithm(cfg, PAD_ID)
    a = algo.task_gradient(model, _params(model), make_slot(ep, 1, 1))
    b = algo.task_gradient(model, _params(model), make_slot(ep, 4, 3))
    c = algo.task_gradient(model, _params(model), make_slot(ep, 3, 2))
    _close(a.grads, b.grads)
    _close(a.grads, c.grads)
    assert a.query_loss_after == pytest.approx(b.query_loss_after, rel=1e-5)


@pytest.mark.parametrize("name", ["fomaml", "reptile", "multitask"])
@pytest.mark.parametrize("inner_optimizer", ["sgd", "adam"])
def test_params_restored_exactly_and_before_loss_measured(peft_factory, episodes, name, inner_optimizer) -> None:
    model = peft_factory(0)
    params = _params(model)
    theta = snapshot(params)
    cfg = AlgorithmConfig(name=name, inner_steps=2, inner_lr=0.1, inner_optimizer=inner_optimizer,
                          measure_query_before=True)
    algo = build_algorithm(cfg, PAD_ID)
    for ep in episodes:
        res = algo.task_gradient(model, params, make_slot(ep))
        assert all(torch.equal(p, t) for p, t in zip(params, theta))
        _, q_theta = _hf_grad(peft_factory(0), ep.query)
        assert res.query_loss_before == pytest.approx(q_theta, rel=1e-5)
        if name != "multitask":
            assert res.query_loss_after != pytest.approx(res.query_loss_before, rel=1e-6)


@pytest.mark.parametrize("name", ["fomaml", "reptile", "multitask"])
def test_dummy_chunks_and_slots_contribute_nothing(peft_factory, episodes, name) -> None:
    ep = episodes[2]
    model = peft_factory(0)
    algo = build_algorithm(AlgorithmConfig(name=name, inner_steps=2, inner_lr=0.1), PAD_ID)
    base = make_slot(ep, 2, 2)
    padded = dataclasses.replace(
        base, support_chunks=base.support_chunks + ((),), query_chunks=((),) + base.query_chunks
    )
    a = algo.task_gradient(model, _params(model), base)
    b = algo.task_gradient(model, _params(model), padded)
    _close(a.grads, b.grads, rtol=1e-6)
    assert b.n_passes > a.n_passes
    dummy = TaskSlot(episode=None, weight=0.0, support_chunks=base.support_chunks,
                     query_chunks=base.query_chunks)
    d = algo.task_gradient(model, _params(model), dummy)
    assert all(torch.count_nonzero(g) == 0 for g in d.grads)
    assert d.n_passes == a.n_passes  # same passes: ranks stay in lockstep
    assert math.isnan(d.query_loss_after) and d.n_tokens == 0


def test_algorithm_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="name='maml'"):
        AlgorithmConfig(name="maml")
    with pytest.raises(ValueError, match="pad_to_multiple_of=0"):
        AlgorithmConfig(pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="inner_lr"):
        AlgorithmConfig(inner_lr=-1.0)


def test_chunks_helper() -> None:
    assert chunks(5, 2) == ((0, 1), (2, 3), (4,))
