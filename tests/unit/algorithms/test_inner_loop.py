"""The one inner loop: loss normalisation, micro-batch invariance, dummy passes, step composition."""

from __future__ import annotations

import math

import pytest
import torch

from fmmeta.algorithms.answer_loss import answer_logits, answer_loss_rows, answer_loss_sum
from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.inner_loop import InnerOptimizer, adapt, evaluate_loss, restore, snapshot
from fmmeta.algorithms.passes import PackedBatch, run_passes
from fmmeta.tasks.episode import Batch, Example, collate

from ._tiny import PAD_ID, chunks


def chunk_batches(examples: tuple[Example, ...], cut: tuple[tuple[int, ...], ...], pad_id: int) -> list[Batch]:
    return [collate([examples[i] for i in c], pad_id) for c in cut]


def loss_and_grad(model, params, batches) -> tuple[list[torch.Tensor], list[float]]:
    """One task's summed gradient over ``batches`` (None = dummy) and each real pass's loss sum."""
    passes = [None if b is None else PackedBatch.one_task(b) for b in batches]
    n = sum(b.n_answer_tokens for b in batches if b is not None)
    res = run_passes(model, params, passes, torch.tensor([1.0 / max(n, 1)]))
    sums = [math.nan if b is None else float(answer_loss_sum(model, b)) for b in batches]
    return res.grads, sums


def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def test_answer_loss_sum_equals_hf_mean_times_tokens(tiny_peft, episodes) -> None:
    batch = collate(episodes[0].support, PAD_ID)
    ours = answer_loss_sum(tiny_peft, batch)
    hf = tiny_peft(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours / batch.n_answer_tokens, hf, rtol=1e-6, atol=1e-6)


def test_micro_batch_split_gives_same_gradient(tiny_peft, episodes) -> None:
    params = _params(tiny_peft)
    ex = episodes[0].support
    whole, _ = loss_and_grad(tiny_peft, params, chunk_batches(ex, chunks(len(ex), len(ex)), PAD_ID))
    split, _ = loss_and_grad(tiny_peft, params, chunk_batches(ex, chunks(len(ex), 1), PAD_ID))
    assert any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_dummy_entries_add_nothing(tiny_peft, episodes) -> None:
    params = _params(tiny_peft)
    ex = episodes[0].support
    real = chunk_batches(ex, chunks(len(ex), 2), PAD_ID)
    g1, s1 = loss_and_grad(tiny_peft, params, real)
    g2, s2 = loss_and_grad(tiny_peft, params, [None] + real + [None])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert math.isnan(s2[0]) and math.isnan(s2[-1]) and s2[1:-1] == s1
    g3, _ = loss_and_grad(tiny_peft, params, [None, None])
    assert all(torch.count_nonzero(g) == 0 for g in g3)


def test_adapt_k_steps_equals_k_single_steps_sgd(peft_factory, episodes) -> None:
    cfg = InnerLoopConfig(inner_steps=3, inner_lr=0.1, inner_clip_norm=None)  # the reference: plain SGD
    ex = episodes[1].support
    m1, m2 = peft_factory(0), peft_factory(0)
    p1, p2 = _params(m1), _params(m2)
    b = chunk_batches(ex, chunks(len(ex), 3), PAD_ID)
    losses = adapt(m1, p1, b, cfg)
    single = [adapt(m2, p2, b, cfg, steps=1)[0] for _ in range(3)]
    assert losses == pytest.approx(single, rel=1e-6)
    assert losses[-1] < losses[0]  # the steps actually optimise the support loss
    for a, c in zip(p1, p2):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_adapt_equals_manual_sgd_with_backward(peft_factory, episodes) -> None:
    """Independent reference: HF's mean loss on the whole support set, .backward(), p -= lr*grad."""
    cfg = InnerLoopConfig(inner_steps=2, inner_lr=0.05, inner_clip_norm=None)
    ex = episodes[0].support
    m1, ref = peft_factory(0), peft_factory(0)
    adapt(m1, _params(m1), chunk_batches(ex, chunks(len(ex), 1), PAD_ID), cfg)
    whole = collate(ex, PAD_ID)
    for _ in range(2):
        ref.zero_grad()
        ref(input_ids=whole.input_ids, attention_mask=whole.attention_mask, labels=whole.labels).loss.backward()
        with torch.no_grad():
            for p in _params(ref):
                p -= 0.05 * p.grad
    for a, c in zip(_params(m1), _params(ref)):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


def test_adam_continues_its_state_across_calls(peft_factory, episodes) -> None:
    cfg = InnerLoopConfig(inner_steps=3, inner_lr=0.01, inner_optimizer="adam")
    ex = episodes[2].support
    m1, m2 = peft_factory(0), peft_factory(0)
    b = chunk_batches(ex, chunks(len(ex), 2), PAD_ID)
    adapt(m1, _params(m1), b, cfg)
    opt = InnerOptimizer(cfg, _params(m2))
    for _ in range(3):
        adapt(m2, _params(m2), b, cfg, steps=1, optimizer=opt)
    for a, c in zip(_params(m1), _params(m2)):
        torch.testing.assert_close(a, c, rtol=0, atol=0)
    # First Adam step moves every non-zero-gradient entry by ~lr (bias-corrected sign step).
    m3 = peft_factory(0)
    theta = snapshot(_params(m3))
    adapt(m3, _params(m3), b, cfg, steps=1)
    step = torch.cat([(p.detach() - t).abs().flatten() for p, t in zip(_params(m3), theta)])
    assert float(step.max()) == pytest.approx(0.01, rel=1e-3)


def test_inner_clip_bounds_each_step(peft_factory, episodes) -> None:
    ex = episodes[0].support
    b = chunk_batches(ex, chunks(len(ex), 4), PAD_ID)
    m = peft_factory(0)
    params = _params(m)
    grads, _ = loss_and_grad(m, params, b)
    norm = float(torch.sqrt(sum((g.float() ** 2).sum() for g in grads)))
    clip = norm / 10
    theta = snapshot(params)
    adapt(m, params, b, InnerLoopConfig(inner_steps=1, inner_lr=0.5, inner_clip_norm=clip), steps=1)
    moved = float(torch.sqrt(sum(((p.detach() - t) ** 2).sum() for p, t in zip(params, theta))))
    assert moved == pytest.approx(0.5 * clip, rel=1e-4)


def test_snapshot_restore_is_exact(tiny_peft, episodes) -> None:
    params = _params(tiny_peft)
    theta = snapshot(params)
    ex = episodes[0].support
    adapt(tiny_peft, params, chunk_batches(ex, chunks(len(ex), 2), PAD_ID), InnerLoopConfig(inner_lr=0.1))
    assert any(not torch.equal(p, t) for p, t in zip(params, theta))
    restore(params, theta)
    assert all(torch.equal(p, t) for p, t in zip(params, theta))


def test_dummy_support_set_leaves_params_and_reports_nan(tiny_peft) -> None:
    params = _params(tiny_peft)
    theta = snapshot(params)
    losses = adapt(tiny_peft, params, [None, None], InnerLoopConfig(inner_steps=2, inner_lr=0.1))
    assert len(losses) == 2 and all(math.isnan(x) for x in losses)
    assert all(torch.equal(p, t) for p, t in zip(params, theta))
    assert math.isnan(evaluate_loss(tiny_peft, params, [None]))


def test_answer_loss_rows_sum_to_the_batch_loss_and_match_single_rows(tiny_peft, episodes) -> None:
    batch = collate(episodes[0].support, PAD_ID)
    rows = answer_loss_rows(tiny_peft, batch)
    assert rows.shape == (len(episodes[0].support),)
    torch.testing.assert_close(rows.sum(), answer_loss_sum(tiny_peft, batch))
    for i, ex in enumerate(episodes[0].support):
        torch.testing.assert_close(rows[i], answer_loss_sum(tiny_peft, collate([ex], PAD_ID)),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("padding_free", [False, True])
def test_answer_loss_builds_no_kv_cache(tiny_peft, episodes, padding_free: bool) -> None:
    """A model whose config asks for a cache (as SmolLM2's does) would copy every layer's keys
    and values into one on every training pass; the loss asks for none, padded or in lines."""
    from fmmeta.tasks.lines import collate_lines

    hf = tiny_peft.base_model.model
    hf.config.use_cache = True
    seen: list[object] = []
    hook = hf.model.register_forward_hook(lambda _m, _a, out: seen.append(out.past_key_values))
    batch = (collate_lines if padding_free else collate)(list(episodes[0].support), PAD_ID)
    assert (batch.lines is not None) == padding_free
    try:
        answer_loss_rows(tiny_peft, batch)
        answer_logits(tiny_peft, batch, use_cache=False)  # a caller may say so too
    finally:
        hook.remove()
    assert seen == [None, None]


@pytest.mark.parametrize(
    "kwargs, key",
    [({"inner_steps": -1}, "inner_steps"), ({"inner_lr": 0.0}, "inner_lr"),
     ({"inner_optimizer": "lion"}, "inner_optimizer"), ({"inner_clip_norm": 0.0}, "inner_clip_norm")],
)
def test_config_errors_name_the_key(kwargs, key) -> None:
    cfg = InnerLoopConfig(**kwargs)
    assert [p.split("=")[0] for p in cfg.validate()] == [key]
    with pytest.raises(ValueError, match=key):  # every adaptation refuses it before a step
        InnerOptimizer(cfg, [torch.zeros(2)])


@pytest.mark.parametrize("kind", ["index", ""])
def test_answer_logits_paths_agree(tiny_peft, episodes, monkeypatch, kind: str) -> None:
    """The boolean-mask head (one row per answer token), the index-tensor head and full logits give
    the same per-row losses on a batch whose answers sit at different positions."""
    from fmmeta.algorithms import answer_loss

    batch = collate(list(episodes[0].support) + list(episodes[1].query), PAD_ID)
    cls = type(answer_loss.unwrap_causal_lm(tiny_peft))
    assert answer_loss._logits_to_keep_kind(tiny_peft) == "mask"
    with torch.no_grad():
        masked = answer_loss_rows(tiny_peft, batch)
        monkeypatch.setitem(answer_loss._LOGITS_TO_KEEP, cls, kind)
        other = answer_loss_rows(tiny_peft, batch)
    torch.testing.assert_close(masked, other, rtol=1e-5, atol=1e-6)
    hf = tiny_peft(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
    torch.testing.assert_close(masked.sum() / batch.n_answer_tokens, hf.detach(), rtol=1e-5, atol=1e-6)
