"""Each strategy does what it claims, on a pool built to show it."""

from __future__ import annotations

import numpy as np
import pytest

from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig
from fmmeta.sampling.source import TaskObservation
from fmmeta.sampling.strategies import Curriculum

from .conftest import FixedSource


def _sampler(sources, **kw) -> CostAwareSampler:
    cfg = SamplerConfig(**{"meta_batch_size": 4, **kw})
    return CostAwareSampler(sources, cfg, world_size=2, seed=11)


def _counts(sampler: CostAwareSampler, steps: int, start: int = 0) -> np.ndarray:
    counts = np.zeros(len(sampler.sources), dtype=np.int64)
    for step in range(start, start + steps):
        ids = sampler.select(step)
        assert len(set(ids.tolist())) == len(ids)  # no repeats within a meta-batch
        np.add.at(counts, ids, 1)
    return counts


def _shots_pool() -> list[FixedSource]:
    # task i has 8 >> (i % 4) shots: 8, 4, 2, 1 -> difficulty (ways / shots) 1/8 ... 1
    return [FixedSource(f"t{i}", (10,) * 2, (10,), shots=8 >> (i % 4)) for i in range(40)]


def test_uniform_frequencies_pass_a_chi_square_test() -> None:
    sampler = _sampler([FixedSource(f"t{i}", (10,), (10,)) for i in range(20)])
    counts = _counts(sampler, 1000)
    expected = counts.sum() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # chi-square quantile, 19 degrees of freedom, p = 0.001 (tables): a fair sampler stays below
    assert chi2 < 43.82, chi2
    # control: the same statistic flags a sampler that favours one task
    biased = counts.copy()
    biased[0] += 190  # one task drawn about twice as often as the others
    biased[1:] -= 10
    assert float(((biased - expected) ** 2 / expected).sum()) > 43.82


def test_curriculum_admits_easy_tasks_first_and_widens() -> None:
    pool = _shots_pool()
    sampler = _sampler(pool, strategy="curriculum", difficulty="shots", pacing_start=0.25, pacing_steps=100)
    shots = np.array([s.shots for s in pool])
    easy = set(np.flatnonzero(shots == 8).tolist())
    assert set(sampler.strategy.admitted(sampler.pool_view(), 0).tolist()) == easy  # easiest quarter
    assert set(sampler.select(0).tolist()) <= easy and set(sampler.select(1).tolist()) <= easy
    assert len(sampler.strategy.admitted(sampler.pool_view(), 50)) == 25  # 0.25 + 0.75 * 0.5
    late = _counts(sampler, 200, start=100)
    assert set(np.flatnonzero(late)) == set(range(40))  # the whole pool after pacing_steps
    mid = Curriculum(pacing_start=0.25, pacing_steps=100)
    fractions = [mid.admitted_fraction(s) for s in (0, 25, 50, 100, 1000)]
    assert fractions == sorted(fractions) and fractions[0] == 0.25 and fractions[-1] == 1.0
    assert Curriculum(pacing="root", pacing_start=0.25, pacing_steps=100).admitted_fraction(25) > fractions[1]


def test_curriculum_by_length_and_by_loss() -> None:
    pool = [FixedSource(f"t{i}", (10 + 10 * i,), (10 + 10 * i,)) for i in range(20)]
    by_len = _sampler(pool, strategy="curriculum", difficulty="lengths", pacing_start=0.2, pacing_steps=10**6)
    assert set(np.flatnonzero(_counts(by_len, 1))) == {0, 1, 2, 3}
    by_loss = _sampler(pool, strategy="curriculum", difficulty="loss", pacing_start=0.2, pacing_steps=10**6)
    by_loss.observe([TaskObservation(task_id=i, query_loss=float(20 - i)) for i in range(20)])
    assert set(np.flatnonzero(_counts(by_loss, 1))) == {16, 17, 18, 19}  # lowest loss = easiest


def test_diversity_spreads_a_meta_batch_over_families() -> None:
    pool = [FixedSource(f"a{i}", (10,), (10,), family="big") for i in range(30)]
    pool += [FixedSource(f"b{i}", (10,), (10,), family="small1") for i in range(3)]
    pool += [FixedSource(f"c{i}", (10,), (10,), family="small2") for i in range(3)]
    sampler = _sampler(pool, strategy="diversity", meta_batch_size=6)
    families = np.array([s.family for s in pool])
    for step in range(30):
        picked = families[sampler.select(step)]
        assert sorted(picked.tolist()) == ["big", "big", "small1", "small1", "small2", "small2"]
    # uniform would give the big family 5 of 6 slots on average
    uni = _sampler(pool, meta_batch_size=6)
    share = np.mean([np.mean(families[uni.select(s)] == "big") for s in range(30)])
    assert share > 0.7


def test_diversity_gives_leftover_slots_to_families_with_tasks_left() -> None:
    pool = [FixedSource(f"a{i}", (10,), (10,), family="big") for i in range(10)]
    pool += [FixedSource("b0", (10,), (10,), family="tiny")]
    sampler = _sampler(pool, strategy="diversity", meta_batch_size=6)
    for step in range(10):
        ids = sampler.select(step).tolist()
        assert len(set(ids)) == 6 and 10 in ids


def test_hard_prefers_high_loss_but_never_starves_a_task() -> None:
    pool = [FixedSource(f"t{i}", (10,), (10,)) for i in range(20)]
    sampler = _sampler(pool, strategy="hard", hard_floor=0.2, hard_temperature=0.5)
    sampler.observe([TaskObservation(task_id=i, query_loss=5.0 if i < 4 else 0.1) for i in range(20)])
    probs = sampler.strategy.probabilities(sampler.pool_view())
    assert probs.min() >= 0.2 / 20 - 1e-12
    counts = _counts(sampler, 500)
    hard_share = counts[:4].sum() / counts.sum()
    assert hard_share > 0.5  # uniform would give 4 / 20 = 0.2
    assert counts.min() > 0  # the floor keeps every task in play


def test_hard_explores_unobserved_tasks() -> None:
    pool = [FixedSource(f"t{i}", (10,), (10,)) for i in range(10)]
    sampler = _sampler(pool, strategy="hard", hard_floor=0.1, hard_temperature=0.5)
    sampler.observe([TaskObservation(task_id=i, query_loss=0.5) for i in range(5)] + [TaskObservation(task_id=5, query_loss=3.0)])
    probs = sampler.strategy.probabilities(sampler.pool_view())
    assert probs[6:].min() == pytest.approx(probs[5])  # unseen count as the hardest seen
    assert probs[6] > probs[0]


def test_uniform_difficulty_gives_rare_hard_tasks_a_bin_share() -> None:
    pool = [FixedSource(f"e{i}", (10,), (10,), shots=8) for i in range(36)]
    pool += [FixedSource(f"h{i}", (10,), (10,), shots=1) for i in range(4)]
    sampler = _sampler(pool, strategy="uniform_difficulty", difficulty="shots", difficulty_bins=2, meta_batch_size=2)
    counts = _counts_with_repeats(sampler, 2000)
    hard_share = counts[36:].sum() / counts.sum()
    assert 0.45 < hard_share < 0.55  # uniform over 2 bins; uniform over tasks would give 0.1
    uni = _counts_with_repeats(_sampler(pool, meta_batch_size=2), 2000)
    assert uni[36:].sum() / uni.sum() < 0.15


def _counts_with_repeats(sampler: CostAwareSampler, steps: int) -> np.ndarray:
    counts = np.zeros(len(sampler.sources), dtype=np.int64)
    for step in range(steps):
        np.add.at(counts, sampler.select(step), 1)
    return counts
