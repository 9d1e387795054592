"""NonFiniteGuard on the local engine: "skip" leaves adapter and optimizer untouched and counts,
"stop" raises NonFiniteError naming the fix, and a finite step passes through unchanged."""

from __future__ import annotations

import copy
import math
from typing import Callable

import pytest
import torch

from fmmeta.engine.guard import NonFiniteError, NonFiniteGuard
from fmmeta.engine.local import LocalEngine
from fmmeta.engine.optim import OuterOptimConfig

CFG = OuterOptimConfig(outer_lr=1e-2, grad_clip=0.0)


def _grads(engine: LocalEngine, seed: int, poison: float | None = None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(p.shape, generator=gen) for p in engine.adapter_parameters()]
    if poison is not None:
        grads[-1].view(-1)[0] = poison
    return grads


def _params(engine: LocalEngine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.adapter_parameters()]


def _opt_state(engine: LocalEngine) -> dict:
    return copy.deepcopy(engine.optimizer.state_dict())


def _same_state(a: dict, b: dict) -> bool:
    if a["state"].keys() != b["state"].keys():
        return False
    for k in a["state"]:
        for name, v in a["state"][k].items():
            w = b["state"][k][name]
            if isinstance(v, torch.Tensor):
                if not torch.equal(v, w):
                    return False
            elif v != w:
                return False
    return True


def test_invalid_policy_is_refused(peft_factory: Callable[..., torch.nn.Module]) -> None:
    with pytest.raises(ValueError, match=r"policy='maybe' is invalid: allowed are 'skip' and 'stop'"):
        NonFiniteGuard(LocalEngine(peft_factory(), CFG), "maybe")  # type: ignore[arg-type]


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
def test_skip_leaves_params_and_optimizer_untouched(
    peft_factory: Callable[..., torch.nn.Module], poison: float
) -> None:
    guard = NonFiniteGuard(LocalEngine(peft_factory(), CFG), "skip")
    guard.outer_step(_grads(guard.inner, 0), 1)  # a real step first, so Adam has state
    before, state = _params(guard.inner), _opt_state(guard.inner)
    lr_before = guard.inner.scheduler.get_last_lr()
    stats = guard.outer_step(_grads(guard.inner, 1, poison), 1)
    assert stats == {"skipped": 1.0}
    assert guard.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _params(guard.inner)))
    assert _same_state(state, _opt_state(guard.inner))
    assert guard.inner.scheduler.get_last_lr() == lr_before
    guard.outer_step(_grads(guard.inner, 2, poison), 1)
    assert guard.skipped_steps == 2


def test_skip_equals_a_run_without_that_step(peft_factory: Callable[..., torch.nn.Module]) -> None:
    guarded = NonFiniteGuard(LocalEngine(peft_factory(), CFG), "skip")
    reference = LocalEngine(peft_factory(), CFG)
    for step in range(4):
        bad = step == 2
        stats = guarded.outer_step(_grads(guarded.inner, step, math.nan if bad else None), 2)
        assert stats["skipped"] == float(bad)
        if not bad:
            reference.outer_step(_grads(reference, step), 2)
    assert all(torch.equal(a, b) for a, b in zip(_params(guarded.inner), _params(reference)))
    assert _same_state(_opt_state(guarded.inner), _opt_state(reference))
    assert any(not torch.equal(a, b) for a, b in zip(_params(reference), _params(
        LocalEngine(peft_factory(), CFG))))  # the reference really moved


def test_finite_step_passes_through(peft_factory: Callable[..., torch.nn.Module]) -> None:
    guarded = NonFiniteGuard(LocalEngine(peft_factory(), CFG), "stop")
    plain = LocalEngine(peft_factory(), CFG)
    stats = guarded.outer_step(_grads(plain, 5), 1)
    ref = plain.outer_step(_grads(plain, 5), 1)
    assert stats["skipped"] == 0.0 and stats["grad_norm"] == pytest.approx(ref["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(_params(guarded.inner), _params(plain)))
    assert guarded.skipped_steps == 0


def test_stop_raises_naming_the_fix(peft_factory: Callable[..., torch.nn.Module]) -> None:
    guard = NonFiniteGuard(LocalEngine(peft_factory(), CFG), "stop")
    before, state = _params(guard.inner), _opt_state(guard.inner)
    with pytest.raises(NonFiniteError) as err:
        guard.outer_step(_grads(guard.inner, 1, math.nan), 1)
    msg = str(err.value)
    assert "non-finite meta-gradient on 1 of 1 ranks (this rank: yes)" in msg
    for fix in ("algorithm.inner_lr", "algorithm.inner_clip_norm", "train.nonfinite=skip"):
        assert fix in msg
    assert all(torch.equal(a, b) for a, b in zip(before, _params(guard.inner)))
    assert _same_state(state, _opt_state(guard.inner))


def test_guard_passes_other_calls_through(peft_factory: Callable[..., torch.nn.Module]) -> None:
    inner = LocalEngine(peft_factory(), CFG)
    guard = NonFiniteGuard(inner, "skip")
    assert guard.world_size == 1 and guard.rank == 0
    assert guard.adapter_parameters() == inner.adapter_parameters()
