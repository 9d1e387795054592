"""The outer optimizer builder, its schedule and its clipping rule."""

from __future__ import annotations

import math

import pytest
import torch

from fmmeta.engine.optim import (
    OuterOptimConfig,
    build_outer_optimizer,
    clip_grad_norm,
    outer_lr_lambda,
)


def _lrs(cfg: OuterOptimConfig, n: int) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(2))
    opt, sched = build_outer_optimizer([p], cfg)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    return out


def test_constant_with_warmup() -> None:
    lrs = _lrs(OuterOptimConfig(outer_lr=1.0, warmup_steps=4), 6)
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_cosine_decays_to_zero() -> None:
    cfg = OuterOptimConfig(outer_lr=2.0, warmup_steps=2, schedule="cosine", total_steps=6)
    lrs = _lrs(cfg, 7)
    expected = [1.0, 2.0] + [2.0 * 0.5 * (1 + math.cos(math.pi * i / 4)) for i in range(5)]
    assert lrs == pytest.approx(expected)
    assert outer_lr_lambda(cfg)(100) == pytest.approx(0.0)


def test_optimizer_is_adamw_with_config_values() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    cfg = OuterOptimConfig(outer_lr=3e-3, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6)
    opt, _ = build_outer_optimizer([p], cfg)
    assert isinstance(opt, torch.optim.AdamW)
    g = opt.param_groups[0]
    assert (g["lr"], g["weight_decay"], tuple(g["betas"]), g["eps"]) == (3e-3, 0.1, (0.8, 0.99), 1e-6)


def test_clip_matches_torch() -> None:
    gen = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.zeros(5, 3)), torch.nn.Parameter(torch.zeros(7))]
    grads = [torch.randn(p.shape, generator=gen) for p in ps]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    ref = float(torch.nn.utils.clip_grad_norm_(ps, 0.3))
    ours = [g.clone() for g in grads]
    norm = clip_grad_norm(ours, 0.3)
    assert norm == pytest.approx(ref, rel=1e-6)
    for p, g in zip(ps, ours):
        torch.testing.assert_close(g, p.grad)
    untouched = [g.clone() for g in grads]
    clip_grad_norm(untouched, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(untouched, grads))


@pytest.mark.parametrize(
    "kwargs, key",
    [({"outer_lr": 0.0}, "outer_lr"), ({"schedule": "linear"}, "schedule"),
     ({"schedule": "cosine"}, "total_steps"), ({"grad_clip": -1.0}, "grad_clip"),
     ({"betas": (0.9, 1.0)}, "betas")],
)
def test_config_errors_name_the_key(kwargs, key) -> None:
    cfg = OuterOptimConfig(**kwargs)
    assert [p.split("=")[0] for p in cfg.validate()] == [key]
    with pytest.raises(ValueError, match=key):  # the one builder refuses it
        build_outer_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)


def test_no_params_is_an_error() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        build_outer_optimizer([], OuterOptimConfig())
