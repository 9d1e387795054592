"""meta_step: accumulation over a rank's tasks, one outer step, stats; checked against references."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.inner_loop import snapshot
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.engine.local import LocalEngine
from fmmeta.engine.optim import OuterOptimConfig, build_outer_optimizer, clip_grad_norm
from fmmeta.engine.protocol import Engine
from fmmeta.sampling.plan import RankPlan
from fmmeta.tasks.episode import collate

from ._tiny import PAD_ID, make_mixed_rank, make_plan, make_rank, with_dummies


def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class SGDEngine:
    """A one-rank engine whose outer step is plain SGD; records the gradient it was handed."""

    rank = 0
    world_size = 1
    device = torch.device("cpu")
    lockstep = False
    sharding = "no ZeRO (one process)"

    def __init__(self, model: torch.nn.Module, lr: float) -> None:
        self._model = model
        self.lr = lr
        self.handed: list[torch.Tensor] = []
        self.n_real = 0

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def adapter_parameters(self) -> list[torch.nn.Parameter]:
        return _params(self._model)

    def outer_step(self, grad_sum: Sequence[torch.Tensor], n_real_tasks: int) -> dict[str, float]:
        self.handed = [g.clone() for g in grad_sum]
        self.n_real = n_real_tasks
        with torch.no_grad():
            for p, g in zip(self.adapter_parameters(), grad_sum):
                p -= self.lr * g / n_real_tasks
        return {"lr": self.lr}

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    def barrier(self) -> None: ...
    def save_adapter(self, path) -> None: ...
    def save_optimizer(self, directory) -> list: return []
    def load_optimizer(self, directory) -> None: ...
    def load_adapter(self, path) -> None: ...
    def close(self) -> None: ...


def _manual_phi(model, examples, lr: float, steps: int) -> list[torch.Tensor]:
    b = collate(examples, PAD_ID)
    for _ in range(steps):
        model.zero_grad()
        model(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=b.labels).loss.backward()
        with torch.no_grad():
            for p in _params(model):
                p -= lr * p.grad
    return [p.detach().clone() for p in _params(model)]


def test_engines_satisfy_the_protocol(tiny_peft) -> None:
    assert isinstance(SGDEngine(tiny_peft, 1.0), Engine)
    assert isinstance(LocalEngine(tiny_peft, OuterOptimConfig()), Engine)


def test_reptile_sgd_outer_step_moves_theta_by_lr_times_mean_delta(peft_factory, episodes) -> None:
    outer_lr, inner_lr, k = 0.5, 0.1, 2
    engine = SGDEngine(peft_factory(0), outer_lr)
    theta = snapshot(engine.adapter_parameters())
    algo = build_algorithm("reptile", AlgorithmConfig(inner_steps=k, inner_lr=inner_lr, inner_clip_norm=None),
                           PAD_ID)
    meta_step(engine, algo, make_plan([make_mixed_rank(episodes, 5)]))
    phis = [_manual_phi(peft_factory(0), ep.support, inner_lr, k) for ep in episodes]
    for i, (p, t) in enumerate(zip(engine.adapter_parameters(), theta)):
        mean_delta = sum(phi[i] - t for phi in phis) / len(phis)
        torch.testing.assert_close(p.detach() - t, outer_lr * mean_delta, rtol=1e-4, atol=1e-7)
        assert float(mean_delta.abs().max()) > 1e-4


def test_fomaml_zero_steps_equals_plain_training_on_query(peft_factory, episodes) -> None:
    cfg = OuterOptimConfig(outer_lr=1e-2, grad_clip=0.5, warmup_steps=1)
    engine = LocalEngine(peft_factory(0), cfg)
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=0), PAD_ID)
    ref = peft_factory(0)
    opt, sched = build_outer_optimizer(_params(ref), cfg)
    for step in range(2):
        plan = make_plan([make_mixed_rank(episodes, 4)], step=step)
        stats = meta_step(engine, algo, plan)
        ref.zero_grad()
        losses = []
        for ep in episodes:
            b = collate(ep.query, PAD_ID)
            losses.append(ref(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=b.labels).loss)
        loss = torch.stack(losses).mean()
        loss.backward()
        norm = clip_grad_norm([p.grad for p in _params(ref)], cfg.grad_clip)
        opt.step()
        sched.step()
        assert stats.outer_loss == pytest.approx(float(loss), rel=1e-5)
        assert stats.outer["grad_norm"] == pytest.approx(norm, rel=1e-4)
    for a, b in zip(engine.adapter_parameters(), _params(ref)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["fomaml", "reptile", "multitask"])
def test_one_task_per_pass_vs_packed_same_weights_after_steps(peft_factory, episodes, name) -> None:
    cfg = OuterOptimConfig(outer_lr=1e-2)
    algo = build_algorithm(name, AlgorithmConfig(inner_steps=2, inner_lr=0.1), PAD_ID)
    e1, e2 = LocalEngine(peft_factory(0), cfg), LocalEngine(peft_factory(0), cfg)
    for step in range(2):
        meta_step(e1, algo, make_plan([make_rank(episodes, 1, 1)], step))
        meta_step(e2, algo, make_plan([make_mixed_rank(episodes, 7)], step))
    moved = 0.0
    for a, b, t in zip(e1.adapter_parameters(), e2.adapter_parameters(), snapshot(_params(peft_factory(0)))):
        # fp32, and the gradients add up over 1-row passes in one layout, 7-row ones in the
        # other: an element near 0 may move by a few ulps of the tensor's scale (4e-7 at 0.02)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        moved = max(moved, float((a - t).abs().max()))
    assert moved > 1e-3


def test_meta_step_sums_task_gradients_and_reports_observations(peft_factory, episodes) -> None:
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=1, inner_lr=0.1), PAD_ID)
    model = peft_factory(0)
    expected = [torch.zeros_like(p) for p in _params(model)]
    for ep in episodes:
        res = algo.rank_gradient(model, _params(model), algo.prepare(make_rank([ep])))
        for acc, g in zip(expected, res.grads):
            acc += g
    rank = with_dummies(make_mixed_rank(episodes, 3), 1, 1)
    engine = SGDEngine(peft_factory(0), 0.0)
    stats = meta_step(engine, algo, make_plan([rank]))
    assert engine.n_real == 3
    for a, b in zip(engine.handed, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert stats.n_real_tasks == 3 and [t.task_id for t in stats.tasks] == [0, 1, 2]
    assert stats.n_passes == len(rank.support) * 1 + len(rank.query)
    assert stats.n_tokens == sum(p.n_tokens for p in rank.support + rank.query)
    assert stats.n_padded_tokens > stats.n_tokens
    # one cost observation per pass, carrying a measured time and the features of what ran:
    # padded to each pass's longest row, as planned
    assert [(o.phase, o.index) for o in stats.passes] == (
        [("support", i) for i in range(len(rank.support))] + [("query", i) for i in range(len(rank.query))])
    assert [o.features for o in stats.passes] == [p.features for p in rank.support + rank.query]
    assert all(o.seconds > 0 for o in stats.passes)
    assert stats.query_loss_after == pytest.approx(sum(t.query_loss for t in stats.tasks) / 3, rel=1e-9)
    assert math.isnan(stats.query_loss_before)


@pytest.mark.parametrize("method", ["fomaml", "metaicl"])
@pytest.mark.parametrize("layout", [{"padding_free": True}, {"pad_to_multiple_of": 8}])
def test_pass_observations_carry_the_shape_that_ran_not_the_plans(peft_factory, episodes, method: str,
                                                                   layout: dict[str, Any]) -> None:
    """The cost model is fitted on (features, seconds): features from the plan would price padding
    that padding-free lines never ran, rounding that ``pad_to_multiple_of`` added, or MetaICL's
    plain rows for its passes with demonstrations."""
    algo = build_algorithm(method, AlgorithmConfig(inner_steps=1, inner_lr=0.1, **layout), PAD_ID)
    rank = with_dummies(make_mixed_rank(episodes, 3), 1, 1)
    work = algo.prepare(rank)
    stats = meta_step(SGDEngine(peft_factory(0), 0.0), algo, make_plan([rank]), work)
    assert [(o.phase, o.index) for o in stats.passes] == (
        [("support", i) for i in range(len(work.support))] + [("query", i) for i in range(len(work.query))])
    expected = [(1.0, 1.0, 1.0) if p is None else
                (1.0, float(p.batch.input_ids.numel()), float(p.batch.input_ids.numel() * p.batch.input_ids.shape[1]))
                for p in work.support + work.query]
    assert [o.features for o in stats.passes] == expected
    planned = [p.features for p in (rank.support if method != "metaicl" else ()) + rank.query]
    assert [o.features for o in stats.passes] != planned  # the layout changed what ran
    assert all(o.seconds > 0 for o in stats.passes)


def test_meta_step_rejects_plan_without_real_tasks(tiny_peft, episodes) -> None:
    algo = build_algorithm("fomaml", AlgorithmConfig(), PAD_ID)
    with pytest.raises(ValueError, match="n_real_tasks=0"):
        meta_step(SGDEngine(tiny_peft, 1.0), algo, make_plan([with_dummies(RankPlan((), (), ()), 1, 1)]))
