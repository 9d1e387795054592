"""``sampler.length_buckets``: passes padded up to a few fixed widths compute what unbucketed
passes compute, and the plan (its widths, padded tokens, cost features) says the widths that run."""

from __future__ import annotations

import random

import pytest
import torch

from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.sampling.plan import bucketed
from fmmeta.sampling.sampler import CostAwareSampler, SamplerConfig
from fmmeta.sampling.synthetic import lognormal_pool
from fmmeta.tasks.episode import Example, collate, padded_length
from fmmeta.tasks.lines import collate_lines

from ._tiny import PAD_ID, build_tiny_peft, make_episode, make_mixed_rank, make_plan
from .reference import trainable

BUCKETS = (8, 16, 32)


def test_a_width_goes_up_to_the_smallest_bucket_that_holds_it() -> None:
    assert [padded_length(n, None, BUCKETS) for n in (1, 8, 9, 17, 32, 33)] == [8, 8, 16, 32, 32, 33]
    assert padded_length(33, 8, BUCKETS) == 40  # past the last bucket: pad_to_multiple_of still rounds
    assert padded_length(5, None) == 5  # no buckets: unchanged


def test_padded_rows_and_padding_free_lines_take_bucket_widths() -> None:
    examples = [Example((1, 2, 3), (4,)), Example((5, 6, 7, 8, 9), (10, 11)), Example((1, 2), (3,))]
    assert collate(examples, PAD_ID, buckets=BUCKETS).input_ids.shape == (3, 8)
    assert collate_lines(examples, PAD_ID, buckets=BUCKETS).input_ids.shape[1] in BUCKETS


@pytest.mark.parametrize("method", ["fomaml", "metaicl"])
@pytest.mark.parametrize("padding_free", [False, True])
def test_bucketed_passes_give_the_same_meta_gradient_in_fp32(padding_free: bool, method: str) -> None:
    """Padding is never attended to nor scored, so wider passes change nothing but rounding.
    MetaICL's passes are collated from its own in-context rows, longer than the plan's: they take
    the bucket that holds them, or past the last one their own width."""
    buckets = (*BUCKETS, 64, 128)  # MetaICL's rows, with their demonstrations, are 45-48 tokens
    rng = random.Random(3)
    episodes = [make_episode(rng, f"t{i}", n_support=rng.randint(2, 5)) for i in range(3)]
    plan = make_plan([make_mixed_rank(episodes, 3)])
    model = build_tiny_peft(dtype=torch.float32)
    algo = build_algorithm(method, AlgorithmConfig(inner_steps=2, padding_free=padding_free), PAD_ID)
    plain = algo.rank_gradient(model, trainable(model), algo.prepare(plan.for_rank(0)))
    work = algo.prepare(bucketed(plan, buckets).for_rank(0))
    passes = [p for p in work.support + work.query if p is not None]
    widths = [p.batch.input_ids.shape[1] for p in passes]
    assert all(w in buckets or w > buckets[-1] for w in widths), widths
    assert any(w in buckets for w in widths), widths
    wide = algo.rank_gradient(model, trainable(model), work)
    for a, b in zip([*wide.grads, wide.query_loss_after], [*plain.grads, plain.query_loss_after], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("placement", ["tasks", "rows"])
def test_the_sampler_packs_at_bucket_widths_within_the_budget(placement: str) -> None:
    """The planners pack and price every row at its bucket width, so a pass of several rows stays
    within tokens_per_pass at the widths that run, and each pass still counts its real tokens."""
    buckets = (64, 128, 256, 1024)

    def plan(length_buckets: tuple[int, ...]):
        cfg = SamplerConfig(meta_batch_size=4, tokens_per_pass=400, placement=placement,
                            length_buckets=length_buckets)
        sampler = CostAwareSampler(lognormal_pool(20, seed=2), cfg, world_size=2, seed=0, support_repeats=2)
        return sampler.sample(0)

    wide, plain = plan(buckets), plan(())
    passes = [p for r in wide.ranks for p in r.support + r.query if not p.is_dummy]
    assert passes and all(p.width in buckets for p in passes)
    assert all(p.n_rows * p.width <= 400 for p in passes if p.n_rows > 1)  # packed at own widths: up to 640
    assert all(r.length_buckets == buckets for r in wide.ranks)

    def real(p) -> tuple[int, int]:
        return sum(q.n_tokens for r in p.ranks for q in r.support + r.query), \
            sum(ex.n_tokens for r in p.ranks for q in r.support for ex in q.rows(r.slots, query=False))

    assert real(wide)[0] == real(wide)[1] + sum(
        ex.n_tokens for r in wide.ranks for q in r.query for ex in q.rows(r.slots, query=True))
    assert real(wide)[0] == real(plain)[0]  # the same tasks' tokens, counted as real ones


def test_buckets_out_of_order_are_refused() -> None:
    assert SamplerConfig(length_buckets=(128, 64)).validate() == [
        "length_buckets=(128, 64) is invalid: need ascending distinct integer widths >= 1; "
        "e.g. [64, 128, 256, 512], or [] for none"]
    assert SamplerConfig(length_buckets=(0,)).validate() and not SamplerConfig().validate()
