"""``sampler.meta_batch_size: auto``: B from the measured noise scale, one step late, resumed exactly."""

from __future__ import annotations

import json

import pytest

from fmmeta.config import ConfigError, raise_if_invalid
from fmmeta.sampling.auto_batch import AutoBatch
from fmmeta.sampling.noise_scale import GradientNoise, NoiseScale
from fmmeta.sampling.prefetch import Prefetcher
from fmmeta.sampling.sampler import CostAwareSampler, PoolTooSmallError, SamplerConfig
from fmmeta.sampling.source import NoiseObservation, observation_from_dict
from fmmeta.sampling.synthetic import lognormal_pool

from .helpers import fake_observations


def _noise(step: int, trace: float, signal: float, tasks: int = 4) -> NoiseObservation:
    """Statistics whose unbiased estimates are exactly ``trace`` and ``signal`` (the inverse of
    :class:`GradientNoise`'s formulas)."""
    return NoiseObservation(step=step, tasks=tasks, task_sq_mean=signal + trace, mean_sq=signal + trace / tasks)


def test_the_choice_is_b_noise_rounded_within_the_bounds() -> None:
    sizer = AutoBatch(low=4, high=16, warmup=1, every=0)
    assert [sizer.choose(b) for b in (2.2, 6.4, 6.6, 40.0)] == [4, 6, 7, 16]
    assert sizer.choose(float("nan")) == sizer.size == 4  # nothing measured: keep the warm-up's B
    even = AutoBatch(low=4, high=16, warmup=1, every=0, multiple=4)  # ranks must hold equal counts
    assert [even.choose(b) for b in (6.9, 9.0, 15.9)] == [4, 8, 16]


def _choice_steps(sizer: AutoBatch, steps: list[int]) -> list[int]:
    for step in steps:
        sizer.observe(_noise(step, 10.0, 1.0))
    return [c["step"] for c in sizer.choices]


def test_choices_end_the_warmup_and_every_period_after_it() -> None:
    assert _choice_steps(AutoBatch(low=2, high=64, warmup=3, every=4), list(range(16))) == [2, 6, 10, 14]
    assert _choice_steps(AutoBatch(low=2, high=8, warmup=3, every=0), list(range(16))) == [2]
    # a step without statistics (rows across ranks) moves the choice to the next step that has them
    assert _choice_steps(AutoBatch(low=2, high=64, warmup=3, every=4), [0, 1, 3, 4, 5, 8, 9]) == [3, 8]


def test_it_chooses_the_noise_scale_of_the_steps_so_far() -> None:
    """The chosen B is the ratio of the moving averages (NoiseScale's B_noise), not one step's."""
    steps = [(30.0, 2.0), (10.0, 1.0), (12.0, 0.5)]
    sizer = AutoBatch(low=2, high=64, warmup=3, every=0)
    for step, (trace, signal) in enumerate(steps):
        sizer.observe(_noise(step, trace, signal))
    scale = NoiseScale()
    for trace, signal in steps:
        b_noise = scale.observe(GradientNoise(4, signal + trace, signal + trace / 4))
    # decay 0.9: weights 0.081, 0.09, 0.1 on the three steps (bias corrections cancel in the ratio)
    assert b_noise == pytest.approx((0.081 * 30 + 0.09 * 10 + 0.1 * 12) / (0.081 * 2 + 0.09 * 1 + 0.1 * 0.5))
    assert sizer.size == round(b_noise) == 15 and sizer.choices[0]["step"] == 2


def _auto_sampler(**keys: int) -> CostAwareSampler:
    cfg = SamplerConfig(meta_batch_size="auto", micro_batch_size=4, strategy="hard", **keys)
    return CostAwareSampler(lognormal_pool(20, seed=2), cfg, world_size=2, seed=4, support_repeats=2)


def _run(pf: Prefetcher, steps: int, b_noise: float) -> list[tuple[int, str]]:
    """Each step's task count and plan digest; every step reports a noise scale of ``b_noise``."""
    out = []
    for _ in range(steps):
        item = pf.get()
        out.append((item.plan.n_real_tasks, item.plan.digest()))
        pf.observe([*fake_observations(item.plan, support_repeats=2), _noise(item.step, b_noise, 1.0)])
    return out


def test_the_sampler_plans_the_chosen_b_one_step_late_and_resumes_exactly() -> None:
    with Prefetcher(_auto_sampler(auto_batch_min=2, auto_batch_max=12, auto_batch_warmup=3,
                                  auto_batch_every=0)) as pf:
        first = _run(pf, 6, b_noise=9.0)
        state = json.loads(json.dumps(pf.state_dict()))
        rest = _run(pf, 4, b_noise=9.0)
    # the choice after step 2 takes effect at step 4 (step 3 was sampled while step 2 trained)
    assert [n for n, _ in first] == [2, 2, 2, 2, 9, 9] and all(n == 9 for n, _ in rest)
    assert state["sampler"]["auto_batch"]["choices"] == [{"step": 2, "b_noise": pytest.approx(9.0), "size": 9}]
    with Prefetcher(_auto_sampler(auto_batch_min=2, auto_batch_max=12, auto_batch_warmup=3,
                                  auto_batch_every=0)) as resumed:
        resumed.load_state_dict(state)
        assert _run(resumed, 4, b_noise=9.0) == rest


def test_the_bound_and_the_pool_cap_the_choice() -> None:
    with Prefetcher(_auto_sampler(auto_batch_min=2, auto_batch_max=6, auto_batch_warmup=1)) as pf:
        assert [n for n, _ in _run(pf, 4, b_noise=500.0)] == [2, 2, 6, 6]
    with Prefetcher(_auto_sampler(auto_batch_min=2, auto_batch_max=100, auto_batch_warmup=1)) as pf:
        assert [n for n, _ in _run(pf, 3, b_noise=500.0)][-1] == 20  # the pool holds 20 tasks


def test_the_first_and_the_largest_batch_sizes_are_the_bounds_auto_can_take() -> None:
    auto = SamplerConfig(meta_batch_size="auto", auto_batch_min=2, auto_batch_max=6)
    assert (auto.first_batch_size, auto.largest_batch_size) == (2, 6)
    fixed = SamplerConfig(meta_batch_size=4)
    assert (fixed.first_batch_size, fixed.largest_batch_size) == (4, 4)


def test_a_fixed_b_ignores_noise_observations() -> None:
    cfg = SamplerConfig(meta_batch_size=4, micro_batch_size=4)
    with Prefetcher(CostAwareSampler(lognormal_pool(20, seed=2), cfg, world_size=2, seed=4)) as pf:
        assert {n for n, _ in _run(pf, 4, b_noise=12.0)} == {4}


def test_noise_observations_round_trip() -> None:
    noise = _noise(3, 10.0, 1.0)
    assert observation_from_dict(json.loads(json.dumps(noise.to_dict()))) == noise


@pytest.mark.parametrize("keys, match", [
    ({"meta_batch_size": "big"}, "meta_batch_size='big' is invalid: must be an integer >= 1 or auto"),
    ({"meta_batch_size": "auto", "auto_batch_min": 1}, "auto_batch_min=1 is invalid: must be an integer >= 2"),
    ({"meta_batch_size": "auto", "auto_batch_max": 3}, r"auto_batch_max=3 is invalid: must be an integer >= auto_batch_min \(4\)"),
    ({"meta_batch_size": "auto", "auto_batch_warmup": 0}, "auto_batch_warmup=0 is invalid"),
    ({"meta_batch_size": "auto", "auto_batch_every": -1}, "auto_batch_every=-1 is invalid"),
])
def test_bad_auto_keys_are_refused_with_the_rule(keys: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        raise_if_invalid(SamplerConfig(**keys))


def test_a_warmup_larger_than_the_pool_names_its_key() -> None:
    cfg = SamplerConfig(meta_batch_size="auto", auto_batch_min=30, auto_batch_max=40)
    with pytest.raises(PoolTooSmallError, match="sampler.auto_batch_min=30 is larger than the meta-training pool"):
        CostAwareSampler(lognormal_pool(20, seed=2), cfg, world_size=1, seed=0)
