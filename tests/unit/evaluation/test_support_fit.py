"""support_fit: support and query scores after k steps equal adapting directly and scoring, the
query side equals the held-out evaluation's record, and theta comes back exactly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from eval_helpers import PAD, lora_params, random_episode, random_state, tiny_lora_llama

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.inner_loop import adapt, restore, snapshot
from fmmeta.evaluation import EvalSettings, evaluate_methods, score_query, support_fit
from fmmeta.tasks.episode import collate

torch.set_num_threads(1)
SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "support_fit.py"


def test_fit_curve_equals_direct_adaptation_and_the_evaluation() -> None:
    model = tiny_lora_llama(seed=0)
    params = lora_params(model)
    restore(params, random_state(params, seed=1))
    theta = snapshot(params)
    g = torch.Generator().manual_seed(5)
    eps = [random_episode(g, f"t{i}", classification=i % 2 == 0, shots=3) for i in range(4)]
    inner = InnerLoopConfig(inner_lr=0.3, inner_clip_norm=2.0)
    curve = support_fit(model, params, eps, inner, 3, PAD, score_steps=[1])
    assert [p.step for p in curve] == [1, 3]
    assert all(torch.equal(p, q) for p, q in zip(params, theta))
    model.eval()
    for point in curve:
        sup, qry = [], []
        for ep in eps:
            restore(params, theta)
            adapt(model, params, [collate(ep.support, PAD)], inner, steps=point.step)
            sup.append(score_query(model, ep.support, PAD, choices=ep.choices))
            qry.append(score_query(model, ep, PAD))
        assert point.support_loss == pytest.approx(sum(s.loss for s in sup) / 4, rel=1e-5)
        assert point.support_accuracy == pytest.approx(sum(s.accuracy for s in sup) / 4)
        assert point.query_loss == pytest.approx(sum(s.loss for s in qry) / 4, rel=1e-5)
    # fitting happens: the support loss falls from step 1 to step 3
    assert curve[1].support_loss < curve[0].support_loss
    restore(params, theta)
    res = evaluate_methods(model, params, {"m": None}, [eps] * 3, EvalSettings(inner=inner, max_steps=3, pad_id=PAD))
    final = [r for r in res.records if r.seed == 0 and r.step == 3]
    assert curve[1].query_loss == pytest.approx(sum(r.metrics["loss"] for r in final) / 4, rel=1e-5)


def test_bad_arguments_are_refused() -> None:
    model = tiny_lora_llama(seed=0)
    params = lora_params(model)
    ep = random_episode(torch.Generator().manual_seed(0), "t", classification=True)
    with pytest.raises(ValueError, match="got no episodes"):
        support_fit(model, params, [], InnerLoopConfig(), 2, PAD)
    with pytest.raises(ValueError, match="score_steps=\\[5\\] is invalid"):
        support_fit(model, params, [ep], InnerLoopConfig(), 2, PAD, score_steps=[5])
    spec = importlib.util.spec_from_file_location("support_fit_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.parse_setting("sgd:0.1:1.0").inner_clip_norm == 1.0
    assert script.parse_setting("adam:0.001").inner_clip_norm is None
    for bad, piece in (("sgd", "malformed"), ("sgd:x", "could not convert"), ("rmsprop:0.1", "inner_optimizer")):
        with pytest.raises(Exception, match=piece):
            script.parse_setting(bad)
