"""Meta-SGD: per-tensor inner lrs, the first-order step-size gradient against finite differences,
the step sizes' outer update, and the step_sizes.json round trip.

What the finite-difference tests compare. A float64 reference that shares no code with
``fmmeta.algorithms`` runs each task's inner loop at the current lrs ``a`` and records every step's
direction ``d_t`` (torch's own SGD / Adam with lr 1 on a scratch tensor, so the scratch tensor ends
at ``-sum_t d_t``). Its query loss along those fixed directions, ``L(a') = sum over tasks of
L_q(theta - a' * sum_t d_t)``, is differentiated by central differences in ``log a'``. With one SGD
step the direction is the support gradient at theta, which does not depend on ``a``, so this is
the exact derivative of the query loss; with more steps it is the first-order derivative, the
convention of FOMAML (the directions' own dependence on ``a`` is dropped).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F

from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig, InnerLoopConfig, MetaSGDConfig
from fmmeta.algorithms.inner_loop import InnerOptimizer, adapt, restore, snapshot
from fmmeta.algorithms.meta_sgd import MetaSGD, StepSizes, load_step_sizes, save_step_sizes
from fmmeta.algorithms.meta_step import meta_step
from fmmeta.algorithms.protocol import RankResult
from fmmeta.config import ConfigError
from fmmeta.engine.guard import NonFiniteGuard
from fmmeta.engine.local import LocalEngine
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.tasks.episode import Episode, Example, collate

from ._tiny import PAD_ID, build_tiny_peft, make_mixed_rank, make_plan, make_rank


def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _loss64(model: torch.nn.Module, examples: Sequence[Example]) -> torch.Tensor:
    """Mean NLL per answer token in float64 (HF's own loss casts logits to fp32)."""
    b = collate(list(examples), PAD_ID)
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.double()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), b.labels[:, 1:].reshape(-1),
                           ignore_index=-100, reduction="sum") / b.n_answer_tokens


def _grad64(model: torch.nn.Module, examples: Sequence[Example]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(_loss64(model, examples), _params(model)))


def _set(model: torch.nn.Module, tensors: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, t in zip(_params(model), tensors, strict=True):
            p.copy_(t)


def _directions(model: torch.nn.Module, ep: Episode, lrs: list[float], steps: int, optimizer: str,
                clip: float | None) -> list[torch.Tensor]:
    """``-sum_t d_t`` of one task's inner loop at ``lrs`` (leaves the model at theta)."""
    theta = [p.detach().clone() for p in _params(model)]
    scratch = [torch.zeros_like(t, requires_grad=True) for t in theta]
    opt = (torch.optim.SGD(scratch, lr=1.0) if optimizer == "sgd"
           else torch.optim.Adam(scratch, lr=1.0, betas=(0.9, 0.999), eps=1e-8))
    for _ in range(steps):
        _set(model, [t + a * s.detach() for t, a, s in zip(theta, lrs, scratch)])
        grads = _grad64(model, ep.support)
        if clip:
            norm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
            grads = [g * min(1.0, clip / (norm + 1e-6)) for g in grads]
        for s, g in zip(scratch, grads):
            s.grad = g
        opt.step()
    _set(model, theta)
    return [s.detach() for s in scratch]


def _fd(total: Callable[[list[float]], float], lrs: list[float], h: float = 0.1) -> torch.Tensor:
    """d total / d log lr_i by the 4-point central stencil (error O(h^4)). A larger h than usual:
    Llama's RMSNorm and rotary embeddings run in fp32 even in a float64 model, so the loss is
    only fp32-accurate and a small h measures rounding noise (h=1e-4, 2 points: 1e-3 relative
    error; h=0.1, 4 points: 6e-6 of the largest entry, measured)."""
    out = []
    for i in range(len(lrs)):
        def at(k: int) -> float:
            return total([lr * math.exp(k * h) if j == i else lr for j, lr in enumerate(lrs)])
        out.append((-at(2) + 8 * at(1) - 8 * at(-1) + at(-2)) / (12 * h))
    return torch.tensor(out, dtype=torch.float64)


def _fd_step_size_grad(model: torch.nn.Module, episodes: list[Episode], lrs: list[float], steps: int,
                       optimizer: str, clip: float | None) -> torch.Tensor:
    """Finite differences in log lr of the summed query loss along fixed inner directions."""
    theta = [p.detach().clone() for p in _params(model)]
    moves = [_directions(model, ep, lrs, steps, optimizer, clip) for ep in episodes]

    def total(a: list[float]) -> float:
        out = 0.0
        with torch.no_grad():
            for ep, move in zip(episodes, moves):
                _set(model, [t + lr * m for t, lr, m in zip(theta, a, move)])
                out += float(_loss64(model, ep.query))
        _set(model, theta)
        return out

    return _fd(total, lrs)


def _lrs(n: int, base: float) -> list[float]:
    """Distinct lrs per tensor, so a mix-up between tensors would show."""
    return [base * (0.5 + 0.1 * i) for i in range(n)]


@pytest.mark.parametrize(("steps", "optimizer", "clip", "base"), [
    (1, "sgd", 1.0, 0.2),    # exact: the one direction does not depend on the lrs
    (3, "sgd", 1.0, 0.2),    # first order, with clipping active
    (2, "adam", None, 0.01),
])
def test_step_size_gradient_matches_finite_differences(episodes, steps, optimizer, clip, base) -> None:
    model = build_tiny_peft(0, torch.float64)
    params = _params(model)
    lrs = _lrs(len(params), base)
    cfg = AlgorithmConfig(inner_steps=steps, inner_lr=base, inner_optimizer=optimizer,
                          inner_clip_norm=clip)
    algo = build_algorithm("metasgd", cfg, PAD_ID)
    assert isinstance(algo, MetaSGD)
    work = algo.prepare(make_mixed_rank(episodes[:2], 3))  # two tasks sharing passes
    res = algo.fomaml.rank_gradient(model, params, work, step_sizes=lrs)
    assert res.step_size_grad is not None and res.step_size_grad.shape == (len(params),)
    fd = _fd_step_size_grad(model, episodes[:2], lrs, steps, optimizer, clip)
    got = res.step_size_grad.double()
    assert float(fd.abs().max()) > 1e-3  # the lrs matter: the comparison below can fail
    torch.testing.assert_close(got, fd, rtol=1e-3, atol=1e-4 * float(fd.abs().max()))
    # the inner loop really ran at the per-tensor lrs: same query loss as the reference at a
    q = _fd_query_losses(model, episodes[:2], lrs, steps, optimizer, clip)
    torch.testing.assert_close(res.query_loss_after.double(), q, rtol=1e-5, atol=0)


def _fd_query_losses(model, episodes, lrs, steps, optimizer, clip) -> torch.Tensor:
    theta = [p.detach().clone() for p in _params(model)]
    out = []
    for ep in episodes:
        move = _directions(model, ep, lrs, steps, optimizer, clip)
        _set(model, [t + lr * m for t, lr, m in zip(theta, lrs, move)])
        with torch.no_grad():
            out.append(float(_loss64(model, ep.query)))
        _set(model, theta)
    return torch.tensor(out, dtype=torch.float64)


def test_first_order_rule_is_not_the_exact_derivative_for_several_steps(episodes) -> None:
    """The FD reference can tell the conventions apart: re-running 3 inner steps at perturbed lrs
    (directions re-computed) gives a different derivative than the fixed-direction one."""
    model = build_tiny_peft(0, torch.float64)
    lrs = _lrs(len(_params(model)), 0.2)
    fixed = _fd_step_size_grad(model, episodes[:1], lrs, 3, "sgd", None)
    exact = _fd(lambda a: float(_fd_query_losses(model, episodes[:1], a, 3, "sgd", None)[0]), lrs)
    rel = float((fixed - exact).norm() / exact.norm())
    assert rel > 1e-2


def test_fixed_lrs_are_bitwise_the_default_and_per_tensor_lrs_apply(episodes) -> None:
    ep = episodes[0]
    support = [collate(list(ep.support[:2]), PAD_ID), collate(list(ep.support[2:]), PAD_ID)]
    for optimizer in ("sgd", "adam"):
        cfg = InnerLoopConfig(inner_steps=2, inner_lr=0.05, inner_optimizer=optimizer, inner_clip_norm=1.0)
        a, b = build_tiny_peft(0), build_tiny_peft(0)
        adapt(a, _params(a), support, cfg)
        adapt(b, _params(b), support, cfg, step_sizes=[0.05] * len(_params(b)))
        assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b)))
    # one SGD step with per-tensor lrs moves each tensor by its own lr times the gradient
    model = build_tiny_peft(0)
    params = _params(model)
    theta = snapshot(params)
    lrs = _lrs(len(params), 0.1)
    grads = [g.float() for g in _grad64(build_tiny_peft(0, torch.float64), ep.support)]
    adapt(model, params, [collate(list(ep.support), PAD_ID)], InnerLoopConfig(inner_steps=1, inner_clip_norm=None), step_sizes=lrs)
    for p, t, g, lr in zip(params, theta, grads, lrs):
        torch.testing.assert_close(p.detach(), t - lr * g, rtol=1e-5, atol=1e-7)
    restore(params, theta)


def test_step_sizes_are_checked() -> None:
    params = _params(build_tiny_peft(0))
    cfg = InnerLoopConfig()
    with pytest.raises(ValueError, match="3 step sizes for 8 adapter tensors"):
        InnerOptimizer(cfg, params, step_sizes=[0.1] * 3)
    with pytest.raises(ValueError, match="finite and > 0"):
        InnerOptimizer(cfg, params, step_sizes=[0.1] * 7 + [-1.0])
    with pytest.raises(ValueError, match="not both"):
        adapt(build_tiny_peft(0), params, [], cfg, optimizer=InnerOptimizer(cfg, params), step_sizes=[0.1] * 8)


def test_step_sizes_adam_matches_torch_adam() -> None:
    sizes = StepSizes(initial=0.03, step_size_lr=0.05)
    assert sizes.values(4) == pytest.approx([0.03] * 4, rel=1e-6)
    ref = torch.full((4,), math.log(0.03), dtype=torch.float32, requires_grad=True)
    opt = torch.optim.Adam([ref], lr=0.05, betas=(0.9, 0.999), eps=1e-8)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        g = torch.randn(4, generator=gen)
        sizes.step(g)
        ref.grad = g.clone()
        opt.step()
    assert sizes.log_lr is not None
    torch.testing.assert_close(sizes.log_lr, ref.detach(), rtol=1e-6, atol=1e-7)
    # a JSON round trip restores every bit, and the restored copy continues identically
    clone = StepSizes(initial=0.03, step_size_lr=0.05)
    clone.load_state_dict(json.loads(json.dumps(sizes.state_dict())))
    g = torch.randn(4, generator=gen)
    sizes.step(g)
    clone.step(g)
    assert torch.equal(clone.log_lr, sizes.log_lr) and clone.t == sizes.t == 6
    with pytest.raises(ValueError, match="for 4 adapter tensors, the adapter has 5"):
        sizes.values(5)
    with pytest.raises(ValueError, match="log_lr, adam_m, adam_v and t"):
        clone.load_state_dict({"log_lr": [0.0]})


def test_meta_step_updates_step_sizes_with_the_task_mean(episodes) -> None:
    """First meta-step: the adapter moves as FOMAML's (same lrs), and the step sizes take
    one Adam step on sum(task step-size gradients) / n_real_tasks."""
    cfg = AlgorithmConfig(inner_steps=2, inner_lr=0.1, metasgd=MetaSGDConfig(step_size_lr=0.02))
    optim = OuterOptimConfig(outer_lr=1e-2)
    meta = build_algorithm("metasgd", cfg, PAD_ID)
    fomaml = build_algorithm("fomaml", AlgorithmConfig(inner_steps=2, inner_lr=0.1), PAD_ID)
    assert isinstance(meta, MetaSGD)
    assert (meta.support_draws, meta.support_repeats) == (fomaml.support_draws, fomaml.support_repeats) == (1, 2)
    e_meta, e_fo = LocalEngine(build_tiny_peft(0), optim), LocalEngine(build_tiny_peft(0), optim)
    plan = make_plan([make_mixed_rank(episodes, 4)])
    expected = torch.zeros(len(e_meta.adapter_parameters()))
    for ep in episodes:  # one task at a time, independently of the packed meta-step
        r = meta.rank_gradient(e_fo.model, e_fo.adapter_parameters(), meta.prepare(make_rank([ep])))
        assert r.step_size_grad is not None
        expected += r.step_size_grad
    stats = meta_step(e_meta, meta, plan)
    meta_step(e_fo, fomaml, plan)
    for a, b in zip(e_meta.adapter_parameters(), e_fo.adapter_parameters()):
        # not bitwise: the initial step sizes are exp(fp32(log 0.1)), 0.1 to fp32 precision
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    ref = StepSizes(0.1, 0.02)
    ref.values(len(expected))
    ref.step(expected / 3)
    assert meta.step_sizes.log_lr is not None and ref.log_lr is not None
    torch.testing.assert_close(meta.step_sizes.log_lr, ref.log_lr, rtol=1e-6, atol=1e-6)
    assert float((meta.step_sizes.log_lr - math.log(0.1)).abs().min()) > 0.01  # Adam: ~lr per entry
    lrs = meta.step_sizes.log_lr.exp()
    assert stats.outer["inner_lr_mean"] == pytest.approx(float(lrs.mean()))
    assert stats.outer["inner_lr_min"] == pytest.approx(float(lrs.min()))
    assert stats.outer["inner_lr_max"] == pytest.approx(float(lrs.max()))
    # the second step adapts at the learned lrs, so the adapters part ways
    meta_step(e_meta, meta, make_plan([make_mixed_rank(episodes, 4)], 1))
    meta_step(e_fo, fomaml, make_plan([make_mixed_rank(episodes, 4)], 1))
    diff = max(float((a - b).abs().max() / b.abs().max())
               for a, b in zip(e_meta.adapter_parameters(), e_fo.adapter_parameters()))
    assert diff > 1e-4


def test_skipped_meta_step_leaves_step_sizes(episodes) -> None:
    cfg = AlgorithmConfig(inner_steps=1, inner_lr=1e30)  # overflows the inner step
    meta = build_algorithm("metasgd", cfg, PAD_ID)
    assert isinstance(meta, MetaSGD)
    engine = NonFiniteGuard(LocalEngine(build_tiny_peft(0), OuterOptimConfig()), "skip")
    stats = meta_step(engine, meta, make_plan([make_rank(episodes[:1])]))
    assert stats.outer["skipped"] == 1.0 and stats.outer["step_sizes_skipped"] == 1.0
    assert meta.step_sizes.log_lr is not None
    assert torch.equal(meta.step_sizes.log_lr, torch.full_like(meta.step_sizes.log_lr, math.log(1e30)))
    with pytest.raises(ValueError, match="no step_size_grad"):
        meta.outer_update(engine, RankResult(grads=[], query_loss_before=torch.zeros(0), query_loss_after=torch.zeros(0), support_seconds=[], query_seconds=None, support_repeats=1, query_repeats=1), 1,
                          skipped=False)


def test_step_sizes_file_round_trip_and_errors(tmp_path: Path) -> None:
    model = build_tiny_peft(0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    lrs = _lrs(len(names), 0.03)
    path = save_step_sizes(tmp_path, names, lrs)
    assert path.name == "step_sizes.json"
    data = json.loads(path.read_text())
    assert data["order"] == names and data["step_sizes"][names[1]] == lrs[1]
    assert load_step_sizes(tmp_path) == lrs
    assert load_step_sizes(tmp_path, names) == lrs
    assert load_step_sizes(tmp_path / "none") is None
    with pytest.raises(ValueError, match="do not match the model's"):
        load_step_sizes(tmp_path, names[::-1])
    data["step_sizes"][names[0]] = 0.0
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a valid step-size file"):
        load_step_sizes(tmp_path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not a valid step-size file"):
        load_step_sizes(tmp_path)
    with pytest.raises(ValueError, match="2 step sizes for 8"):
        save_step_sizes(tmp_path, names, [0.1, 0.1])


def test_adapters_saved_before_the_rename_still_load_their_step_sizes(tmp_path: Path) -> None:
    """An adapter folder of an earlier run holds inner_lrs.json with key inner_lrs: evaluating it
    must give the same step sizes, not silently adapt at algorithm.inner_lr."""
    names = [n for n, p in build_tiny_peft(0).named_parameters() if p.requires_grad]
    lrs = _lrs(len(names), 0.03)
    (tmp_path / "inner_lrs.json").write_text(json.dumps({"order": names, "inner_lrs": dict(zip(names, lrs))}))
    assert load_step_sizes(tmp_path, names) == lrs
    (tmp_path / "inner_lrs.json").write_text(json.dumps({"order": names, "step_sizes": dict(zip(names, lrs))}))
    with pytest.raises(ValueError, match="inner_lrs.json is not a valid step-size file"):
        load_step_sizes(tmp_path, names)  # the old file must carry the old key


def test_config_accepts_metasgd_and_refuses_bad_step_size_lr() -> None:
    assert AlgorithmConfig(metasgd=MetaSGDConfig(step_size_lr=0.05)).metasgd.step_size_lr == 0.05
    for bad in (0.0, -0.1, math.inf):
        assert any("step_size_lr=" in p for p in MetaSGDConfig(step_size_lr=bad).validate())
        with pytest.raises(ConfigError, match="step_size_lr="):
            build_algorithm("metasgd", AlgorithmConfig(metasgd=MetaSGDConfig(step_size_lr=bad)), PAD_ID)
