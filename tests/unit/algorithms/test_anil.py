"""ANIL against FOMAML (every layer adapted: bit for bit) and against a plain single-task reference
that adapts only the top layer by hand; its inner loop records no graph below the adapted layers;
evaluation adapts the same tensors."""

from __future__ import annotations

import pytest
import torch

from fmmeta.algorithms.anil import ANIL, top_layer_tensors
from fmmeta.algorithms.build import METHODS, build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig, ANILConfig
from fmmeta.algorithms.first_order import FOMAML
from fmmeta.algorithms.passes import answer_tokens_per_task
from fmmeta.algorithms.task_lora import TaskLoRA
from fmmeta.config import ConfigError
from fmmeta.evaluation.adaptation import adapting, support_passes
from fmmeta.models import adapter_names

from ._tiny import PAD_ID, make_mixed_rank, make_rank
from .test_first_order import _close, _hf_grad, _params, _run


def _anil(layers: int, **kw: object) -> ANIL:
    return ANIL(AlgorithmConfig(anil=ANILConfig(layers=layers), **kw), PAD_ID)  # type: ignore[arg-type]


def _top_sgd(model: torch.nn.Module, examples, lr: float, steps: int, layer: str) -> None:
    """Plain SGD on the support's mean loss, moving only the adapter tensors of ``layer``."""
    for _ in range(steps):
        grads, _ = _hf_grad(model, examples)
        with torch.no_grad():
            for (name, p), g in zip([(n, p) for n, p in model.named_parameters() if p.requires_grad], grads):
                if f".layers.{layer}." in name:
                    p -= lr * g


@pytest.mark.parametrize("layers", [2])  # the tiny model has 2 layers: both adapt every tensor (5 is refused)
def test_anil_over_every_layer_is_fomaml_bit_for_bit(peft_factory, episodes, layers: int) -> None:
    cfg = dict(inner_steps=3, inner_lr=0.1, measure_query_before=True)
    rank = make_mixed_rank(episodes, 3)  # several tasks sharing passes, clipping on
    anil = _run(_anil(layers, **cfg), peft_factory(0), rank)
    fomaml = _run(FOMAML(AlgorithmConfig(**cfg), PAD_ID), peft_factory(0), rank)  # type: ignore[arg-type]
    for a, b in zip(anil.grads, fomaml.grads, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(anil.query_loss_after, fomaml.query_loss_after)
    assert torch.equal(anil.query_loss_before, fomaml.query_loss_before)


def test_anil_gradient_is_every_tensors_query_gradient_after_adapting_the_top_layer(peft_factory, episodes) -> None:
    cfg = dict(inner_steps=3, inner_lr=0.1, inner_clip_norm=None)  # the reference: plain SGD
    res = _run(_anil(1, **cfg), peft_factory(0), make_mixed_rank(episodes, 3))
    expected = None
    for ep in episodes:  # one task at a time, by hand
        ref = peft_factory(0)
        _top_sgd(ref, ep.support, 0.1, 3, layer="1")
        grads, _ = _hf_grad(ref, ep.query)
        expected = grads if expected is None else [e + g for e, g in zip(expected, grads)]
    assert expected is not None
    _close(res.grads, expected)
    fomaml = _run(FOMAML(AlgorithmConfig(**cfg), PAD_ID), peft_factory(0), make_mixed_rank(episodes, 3))  # type: ignore[arg-type]
    assert max(float((a - b).abs().max()) for a, b in zip(res.grads, fomaml.grads)) > 1e-4  # not FOMAML's


def test_the_inner_loop_records_no_graph_below_the_adapted_layers(peft_factory, episodes) -> None:
    model = peft_factory(0)
    seen: dict[str, list[bool]] = {"0": [], "1": []}
    for name, module in model.named_modules():
        if name.endswith("q_proj.lora_A.default"):
            layer = name.split(".layers.")[1].split(".")[0]
            module.register_forward_hook(lambda m, args, out, layer=layer: seen[layer].append(out.requires_grad))
    rank = make_rank([episodes[0]], 2, 3)  # 2 support passes x 2 steps, 1 query pass
    _run(_anil(1, inner_steps=2), model, rank)
    assert seen["1"] == [True] * 5
    assert seen["0"] == [False] * 4 + [True]  # support passes: no graph; the query pass: every tensor


def test_evaluation_adapts_the_same_top_tensors(peft_factory, episodes) -> None:
    model = peft_factory(0)
    params = _params(model)
    names = adapter_names(model)
    adapted = METHODS["anil"].adapted_tensors(AlgorithmConfig(anil=ANILConfig(layers=1)), names)
    assert adapted == [i for i, n in enumerate(names) if ".layers.1." in n] and len(adapted) == len(names) // 2
    ep = episodes[0]
    support = support_passes([ep], PAD_ID, micro_batch_size=8)
    cfg = AlgorithmConfig(inner_lr=0.1, inner_clip_norm=None).inner_loop
    theta = [p.detach().clone() for p in params]
    with adapting(model, TaskLoRA(model, params), params, theta, support,
                  answer_tokens_per_task(support, 1), cfg, adapted=adapted) as step:
        step()
        step()
        phi = [f[0].detach().clone() for f in step.fast]
    ref = peft_factory(0)
    _top_sgd(ref, ep.support, 0.1, 2, layer="1")
    _close(phi, [p.detach() for p in _params(ref)])
    for i, (f, t) in enumerate(zip(phi, theta)):
        assert torch.equal(f, t) == (i not in adapted)


def test_top_layer_tensors_finds_the_layers_and_refuses_a_tensor_outside_them() -> None:
    names = ["m.layers.0.q.A", "m.layers.0.q.B", "m.layers.10.q.A", "m.layers.2.q.A", "m.layers.10.v.B"]
    assert top_layer_tensors(names, 1) == [2, 4]
    assert top_layer_tensors(names, 2) == [2, 3, 4]
    assert top_layer_tensors(names, 3) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="'m.lm_head.A' is in no numbered decoder layer"):
        top_layer_tensors(["m.layers.0.q.A", "m.lm_head.A"], 1)


def test_anil_is_registered_with_its_own_section() -> None:
    assert isinstance(build_algorithm("anil", AlgorithmConfig(), PAD_ID), ANIL)
    assert METHODS["anil"].settings is ANILConfig and METHODS["anil"].fast_weights
    assert "top 3 layers" in METHODS["anil"].budget_rule(AlgorithmConfig(anil=ANILConfig(layers=3)))
    with pytest.raises(ConfigError, match=r"anil.layers=0 is invalid: must be >= 1"):
        build_algorithm("anil", AlgorithmConfig(anil=ANILConfig(layers=0)), PAD_ID)


def test_more_layers_than_the_model_has_is_refused_not_fomaml_in_disguise() -> None:
    from fmmeta.algorithms.anil import top_layer_tensors
    from fmmeta.errors import UserInputError

    names = [f"model.layers.{i}.self_attn.q_proj.lora_{ab}.weight" for i in range(2) for ab in "AB"]
    assert top_layer_tensors(names, 2) == [0, 1, 2, 3]  # all of them: allowed, as asked
    with pytest.raises(UserInputError, match=r"anil.layers=5 is invalid: the model has 2 decoder layers.*is fomaml"):
        top_layer_tensors(names, 5)
