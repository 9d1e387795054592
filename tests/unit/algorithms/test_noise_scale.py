"""The meta-gradient's noise per step: the estimators against their closed form, each task's
gradient against the task meta-trained alone, and the meta-step's record against both."""

from __future__ import annotations

import math

import pytest
import torch

from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.engine.local import LocalEngine
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.sampling.noise_scale import GradientNoise, NoiseScale
from fmmeta.sampling.plan import MetaBatchPlan

from ._tiny import PAD_ID, make_rank


def test_the_estimates_are_the_sample_variance_and_the_mean_corrected_for_it() -> None:
    """With per-task gradients g_t: tr(Sigma) is the unbiased sample variance summed over
    coordinates, |G|^2 the squared mean less its expected excess tr(Sigma) / B."""
    g = torch.randn(6, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.3
    mean = g.mean(dim=0)
    noise = GradientNoise(tasks=6, task_sq_mean=float(g.square().sum(dim=1).mean()), mean_sq=float(mean.square().sum()))
    variance = float(((g - mean) ** 2).sum() / 5)
    assert noise.trace == pytest.approx(variance, rel=1e-12)
    assert noise.signal == pytest.approx(float(mean.square().sum()) - variance / 6, rel=1e-12)
    assert math.isnan(GradientNoise(1, 2.0, 2.0).trace) and math.isnan(GradientNoise(1, 2.0, 2.0).signal)


def test_the_noise_scale_recovers_a_known_ratio_from_noisy_steps() -> None:
    """Per-task gradients drawn around a known G with a known covariance: the moving averages'
    ratio comes out near tr(Sigma) / |G|^2, where single steps scatter widely."""
    gen = torch.Generator().manual_seed(1)
    d, tasks, sigma = 200, 4, 0.5
    true_g = torch.full((d,), 0.1, dtype=torch.float64)
    want = d * sigma**2 / float(true_g.square().sum())  # 25
    scale, single = NoiseScale(decay=0.99), []
    for _ in range(3000):
        g = true_g + sigma * torch.randn(tasks, d, generator=gen, dtype=torch.float64)
        step = GradientNoise(tasks, float(g.square().sum(dim=1).mean()), float(g.mean(dim=0).square().sum()))
        single.append(step.trace / step.signal)
        scale.observe(step)
    assert scale.value == pytest.approx(want, rel=0.15)
    assert max(single) > 2 * want or min(single) < 0  # one step alone says little
    assert math.isnan(NoiseScale().value)


@pytest.mark.parametrize("name", ["fomaml", "reptile", "metasgd", "anil"])
def test_each_tasks_gradient_norm_is_the_task_meta_trained_alone(peft_factory, episodes, name: str) -> None:
    cfg = AlgorithmConfig(inner_steps=2, inner_lr=0.1)
    algo = build_algorithm(name, cfg, pad_id=PAD_ID)
    model = peft_factory(0)
    params = [p for p in model.parameters() if p.requires_grad]
    together = algo.rank_gradient(model, params, algo.prepare(make_rank(episodes, 2, 2)))
    assert together.task_grad_sq is not None and together.task_grad_sq.shape == (len(episodes),)
    for i, ep in enumerate(episodes):
        alone = algo.rank_gradient(model, params, algo.prepare(make_rank([ep], 2, 2)))
        by_hand = sum(float(g.double().square().sum()) for g in alone.grads)
        assert float(together.task_grad_sq[i]) == pytest.approx(by_hand, rel=1e-5)


def test_a_method_without_per_task_gradients_records_none(peft_factory, episodes) -> None:
    for name in ("multitask", "metaicl"):
        algo = build_algorithm(name, AlgorithmConfig(inner_steps=1), pad_id=PAD_ID)
        model = peft_factory(0)
        params = [p for p in model.parameters() if p.requires_grad]
        assert algo.rank_gradient(model, params, algo.prepare(make_rank(episodes))).task_grad_sq is None


def test_the_meta_step_records_the_statistics_of_its_tasks(peft_factory, episodes) -> None:
    cfg = AlgorithmConfig(inner_steps=2, inner_lr=0.1)
    algo = build_algorithm("fomaml", cfg, pad_id=PAD_ID)
    model = peft_factory(0)
    params = [p for p in model.parameters() if p.requires_grad]
    per_task = [algo.rank_gradient(model, params, algo.prepare(make_rank([ep], 2, 2))).grads for ep in episodes]
    sq = [sum(float(g.double().square().sum()) for g in grads) for grads in per_task]
    mean = [sum(g[k].double() for g in per_task) / len(per_task) for k in range(len(params))]
    engine = LocalEngine(model, OuterOptimConfig(outer_lr=1e-3, grad_clip=0.0))
    plan = MetaBatchPlan(step=0, ranks=(make_rank(episodes, 2, 2),), n_real_tasks=len(episodes))
    stats = meta_step(engine, algo, plan)
    want = GradientNoise(len(episodes), sum(sq) / len(sq), sum(float(m.square().sum()) for m in mean))
    assert stats.outer["grad_task_sq"] == pytest.approx(want.task_sq_mean, rel=1e-5)
    assert stats.outer["grad_norm"] ** 2 == pytest.approx(want.mean_sq, rel=1e-5)
    assert stats.outer["grad_noise_trace"] == pytest.approx(want.trace, rel=1e-4)
    assert stats.outer["grad_signal_sq"] == pytest.approx(want.signal, rel=1e-3, abs=1e-9)


def test_a_skipped_step_read_back_from_json_is_left_out_of_the_average() -> None:
    scale = NoiseScale()
    assert GradientNoise.from_record({"tasks": 4, "grad_norm": 1.0}) is None  # a method that records none
    skipped = GradientNoise.from_record({"tasks": 4, "grad_task_sq": None, "grad_norm": None})  # NaN written as null
    assert skipped is not None and math.isnan(scale.observe(skipped))
    assert scale.observe(GradientNoise.from_record({"tasks": 4, "grad_task_sq": 5.0, "grad_norm": 2.0 ** 0.5})) == pytest.approx(4.0)
