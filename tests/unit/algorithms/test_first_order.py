"""FOMAML, Reptile and MultiTask against independently computed references (one task per rank;
several tasks sharing passes are in test_packed.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fmmeta.algorithms.baselines import MultiTask
from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig, MultiTaskConfig, ReptileConfig
from fmmeta.algorithms.first_order import FOMAML, Reptile
from fmmeta.algorithms.inner_loop import snapshot
from fmmeta.algorithms.protocol import RankResult
from fmmeta.config import ConfigError
from fmmeta.sampling.plan import RankPlan
from fmmeta.tasks.episode import collate

from ._tiny import PAD_ID, chunks, make_rank, with_dummies


def _run(algo, model: torch.nn.Module, rank: RankPlan) -> RankResult:
    return algo.rank_gradient(model, _params(model), algo.prepare(rank))


def _passes(res: RankResult, rank: RankPlan) -> int:
    return res.support_repeats * len(rank.support) + res.query_repeats * len(rank.query)


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
    cfg = AlgorithmConfig(inner_steps=3, inner_lr=0.1, inner_clip_norm=None)  # the reference: plain SGD
    model = peft_factory(0)
    rank = make_rank([ep], 1, 2)
    res = _run(FOMAML(cfg, PAD_ID), model, rank)
    ref = peft_factory(0)
    _manual_sgd(ref, ep.support, 0.1, 3)
    grads, q_loss = _hf_grad(ref, ep.query)
    _close(res.grads, grads)
    assert float(res.query_loss_after[0]) == pytest.approx(q_loss, rel=1e-5)
    # and it is not just the gradient at theta
    at_theta, _ = _hf_grad(peft_factory(0), ep.query)
    assert max(float((a - b).abs().max()) for a, b in zip(res.grads, at_theta)) > 1e-4
    assert _passes(res, rank) == 3 * 4 + 2  # 4 support chunks x 3 steps + 2 query chunks


def test_fomaml_zero_steps_is_query_gradient_at_theta(peft_factory, episodes) -> None:
    ep = episodes[1]
    model = peft_factory(0)
    res = _run(FOMAML(AlgorithmConfig(inner_steps=0), PAD_ID), model, make_rank([ep]))
    grads, _ = _hf_grad(peft_factory(0), ep.query)
    _close(res.grads, grads)


def test_reptile_gradient_is_theta_minus_phi(peft_factory, episodes) -> None:
    ep = episodes[2]
    model = peft_factory(0)
    res = _run(Reptile(AlgorithmConfig(inner_steps=2, inner_lr=0.1), PAD_ID), model,
               make_rank([ep], 3, 1))
    ref = peft_factory(0)
    theta = snapshot(_params(ref))
    _manual_sgd(ref, ep.support, 0.1, 2)
    _close(res.grads, [t - p.detach() for t, p in zip(theta, _params(ref))])
    _, q_loss = _hf_grad(ref, ep.query)
    assert res.query_loss_after == pytest.approx(q_loss, rel=1e-5)


def test_reptile_query_step_folds_one_query_step(peft_factory, episodes) -> None:
    ep = episodes[0]
    cfg = AlgorithmConfig(inner_steps=2, inner_lr=0.1, inner_clip_norm=None,
                          reptile=ReptileConfig(query_step=True))
    model = peft_factory(0)
    res = _run(Reptile(cfg, PAD_ID), model, make_rank([ep], 2, 2))
    ref = peft_factory(0)
    theta = snapshot(_params(ref))
    _manual_sgd(ref, ep.support, 0.1, 2)
    _, q_loss = _hf_grad(ref, ep.query)
    _manual_sgd(ref, ep.query, 0.1, 1)
    _close(res.grads, [t - p.detach() for t, p in zip(theta, _params(ref))])
    assert res.query_loss_after == pytest.approx(q_loss, rel=1e-5)


def test_multitask_is_pooled_gradient_at_theta_over_distinct_support_sets(peft_factory, episodes) -> None:
    ep = episodes[1]
    cfg = AlgorithmConfig(inner_steps=3)
    algo = MultiTask(cfg, PAD_ID)
    assert (algo.support_draws, algo.support_repeats) == (3, 1)
    # what the sampler hands it: the episode's own support set, then two more of the same size
    drawn = dataclasses.replace(ep, support=ep.support + episodes[0].support + episodes[2].support)
    res = _run(algo, peft_factory(0), make_rank([drawn], 2, 1))
    grads, _ = _hf_grad(peft_factory(0), drawn.support + drawn.query)
    _close(res.grads, grads)
    # as many support rows and passes as FOMAML's 3 inner steps over one support set
    fomaml = _run(FOMAML(cfg, PAD_ID), peft_factory(0), make_rank([ep], 2, 1))
    assert _passes(res, make_rank([drawn], 2, 1)) == _passes(fomaml, make_rank([ep], 2, 1)) == 3 * 2 + 3
    _, q_loss = _hf_grad(peft_factory(0), ep.query)
    assert float(res.query_loss_after[0]) == pytest.approx(q_loss, rel=1e-5)
    cheap = MultiTask(dataclasses.replace(cfg, multitask=MultiTaskConfig(match_passes=False)), PAD_ID)
    assert (cheap.support_draws, cheap.support_repeats) == (1, 1)
    res = _run(cheap, peft_factory(0), make_rank([ep], 2, 1))
    assert _passes(res, make_rank([ep], 2, 1)) == 2 + 3
    _close(res.grads, _hf_grad(peft_factory(0), ep.support + ep.query)[0])


def test_multitask_without_inner_steps_trains_on_the_query_only(peft_factory, episodes) -> None:
    ep = episodes[0]
    algo = MultiTask(AlgorithmConfig(inner_steps=0), PAD_ID)
    res = _run(algo, peft_factory(0), make_rank([ep], 2, 2))
    _close(res.grads, _hf_grad(peft_factory(0), ep.query)[0])
    assert res.support_repeats == 0


def test_metaicl_is_the_query_gradient_with_demonstrations_in_context(peft_factory, episodes) -> None:
    ep = dataclasses.replace(episodes[2], separator_ids=(5, 6))
    algo = build_algorithm("metaicl", AlgorithmConfig(icl_max_length=40), PAD_ID)
    rank = make_rank([ep], 2, 2)
    work = algo.prepare(rank)
    assert work.support == [] and len(work.query) == len(rank.query)
    model = peft_factory(0)
    res = algo.rank_gradient(model, _params(model), work)
    shown = ep.in_context_query(max_length=40)
    assert all(q.prompt_ids[-len(o.prompt_ids):] == o.prompt_ids for q, o in zip(shown, ep.query))
    grads, q_loss = _hf_grad(peft_factory(0), shown)
    _close(res.grads, grads)
    assert float(res.query_loss_after[0]) == pytest.approx(q_loss, rel=1e-5)
    assert _passes(res, rank) == len(rank.query)
    # the demonstrations matter: without them the gradient is another one
    plain, _ = _hf_grad(peft_factory(0), ep.query)
    assert max(float((a - b).abs().max()) for a, b in zip(res.grads, plain)) > 1e-4


@pytest.mark.parametrize("name", ["fomaml", "reptile", "multitask", "metaicl"])
def test_micro_batch_sizes_do_not_change_the_meta_gradient(peft_factory, episodes, name) -> None:
    ep = episodes[0]
    cfg = AlgorithmConfig(inner_steps=2, inner_lr=0.1)
    model = peft_factory(0)
    algo = build_algorithm(name, cfg, PAD_ID)
    a = _run(algo, model, make_rank([ep], 1, 1))
    b = _run(algo, model, make_rank([ep], 4, 3))
    c = _run(algo, model, make_rank([ep], 3, 2))
    _close(a.grads, b.grads)
    _close(a.grads, c.grads)
    assert float(a.query_loss_after[0]) == pytest.approx(float(b.query_loss_after[0]), rel=1e-5)


@pytest.mark.parametrize("name", ["fomaml", "reptile", "multitask"])
@pytest.mark.parametrize("inner_optimizer", ["sgd", "adam"])
def test_params_restored_exactly_and_before_loss_measured(peft_factory, episodes, name, inner_optimizer) -> None:
    model = peft_factory(0)
    params = _params(model)
    theta = snapshot(params)
    cfg = AlgorithmConfig(inner_steps=2, inner_lr=0.1, inner_optimizer=inner_optimizer,
                          measure_query_before=True)
    algo = build_algorithm(name, cfg, PAD_ID)
    for ep in episodes:
        res = _run(algo, model, make_rank([ep]))
        assert all(torch.equal(p, t) for p, t in zip(params, theta))
        _, q_theta = _hf_grad(peft_factory(0), ep.query)
        assert float(res.query_loss_before[0]) == pytest.approx(q_theta, rel=1e-5)
        if name != "multitask":
            assert float(res.query_loss_after[0]) != pytest.approx(float(res.query_loss_before[0]), rel=1e-6)


@pytest.mark.parametrize("name", ["fomaml", "reptile", "multitask", "metaicl"])
def test_dummy_passes_and_empty_ranks_contribute_nothing(peft_factory, episodes, name) -> None:
    ep = episodes[2]
    model = peft_factory(0)
    algo = build_algorithm(name, AlgorithmConfig(inner_steps=2, inner_lr=0.1), PAD_ID)
    base = make_rank([ep], 2, 2)
    padded = with_dummies(base, 1, 1)
    a = _run(algo, model, base)
    b = _run(algo, model, padded)
    _close(a.grads, b.grads, rtol=1e-6)
    assert _passes(b, padded) > _passes(a, base)
    # A rank without tasks runs the same passes (lockstep) and contributes exactly zero.
    empty = with_dummies(RankPlan((), (), ()), len(padded.support), len(padded.query))
    d = _run(algo, model, empty)
    assert all(torch.count_nonzero(g) == 0 for g in d.grads)
    assert _passes(d, empty) == _passes(b, padded)  # same passes: ranks stay in lockstep
    assert d.query_loss_after.numel() == 0


def test_algorithm_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="algorithm 'maml' is unknown"):
        build_algorithm("maml", AlgorithmConfig(), PAD_ID)
    assert AlgorithmConfig(pad_to_multiple_of=0).validate()[0].startswith("pad_to_multiple_of=0 ")
    assert AlgorithmConfig(inner_lr=-1.0).validate()[0].startswith("inner_lr=-1.0 ")
    with pytest.raises(ConfigError, match="inner_lr=-1.0 is invalid"):
        build_algorithm("fomaml", AlgorithmConfig(inner_lr=-1.0), PAD_ID)
    assert AlgorithmConfig(icl_max_length=1).validate()[0].startswith("icl_max_length=1 ")


def test_chunks_helper() -> None:
    assert chunks(5, 2) == ((0, 1), (2, 3), (4,))


def _leave_one_out(ep, max_length: int | None = None) -> list:
    """Reference in-context support rows, built by hand: every other support example's prompt,
    answer and separator, in order, before this example's prompt; cut from the left."""
    rows = []
    for i, ex in enumerate(ep.support):
        demos = [t for j, d in enumerate(ep.support) if j != i for t in (*d.prompt_ids, *d.answer_ids, *ep.separator_ids)]
        prompt = tuple(demos) + ex.prompt_ids
        if max_length is not None and len(prompt) + len(ex.answer_ids) > max_length:
            prompt = prompt[len(prompt) + len(ex.answer_ids) - max_length:]
        rows.append(dataclasses.replace(ex, prompt_ids=prompt))
    return rows


@pytest.mark.parametrize("max_length", [None, 30])
def test_in_context_inner_loop_is_fomaml_on_leave_one_out_demonstrations(peft_factory, episodes,
                                                                         max_length) -> None:
    """``algorithm.inner_format=in_context``: FOMAML adapts on each support example with the other
    support examples as demonstrations and takes the query gradient with all of them; equal to
    plain SGD on rows built by hand (and not to the plain-row gradient)."""
    ep = dataclasses.replace(episodes[1], separator_ids=(5, 6))
    in_context = ep.in_context(max_length)
    support = _leave_one_out(ep, max_length)
    assert list(in_context.support) == support
    assert in_context.query == ep.in_context_query(max_length)
    assert max_length is None or max(x.n_tokens for x in (*in_context.support, *in_context.query)) <= max_length
    assert all(x.answer_ids == o.answer_ids for x, o in zip(in_context.support, ep.support))
    cfg = AlgorithmConfig(inner_steps=2, inner_lr=0.1, inner_clip_norm=None, inner_format="in_context")
    model = peft_factory(0)
    res = _run(FOMAML(cfg, PAD_ID), model, make_rank([in_context], 2, 2))
    ref = peft_factory(0)
    _manual_sgd(ref, support, 0.1, 2)
    grads, q_loss = _hf_grad(ref, list(in_context.query))
    _close(res.grads, grads)
    assert float(res.query_loss_after[0]) == pytest.approx(q_loss, rel=1e-5)
    plain = _run(FOMAML(cfg, PAD_ID), peft_factory(0), make_rank([ep], 2, 2))
    assert max(float((a - b).abs().max()) for a, b in zip(res.grads, plain.grads)) > 1e-4
