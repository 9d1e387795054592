"""Typed config: defaults, YAML + overrides, and one test per kind of config error."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from fmmeta.config import (
    ConfigError,
    EngineConfig,
    LoraConfig,
    ModelConfig,
    TrainConfig,
    build_config,
    describe_config,
    field_docs,
    load_config,
    save_resolved,
    to_dict,
)


@dataclass(kw_only=True)
class Inner:
    """A section using the less common types the machinery must handle."""

    sizes: tuple[int, ...] = (1, 2)
    """A variable-length tuple."""
    pair: tuple[str, float] = ("a", 1.0)
    """A fixed-length tuple."""
    names: list[str] = field(default_factory=list)
    """A list."""
    weights: dict[str, float] = field(default_factory=dict)
    """A mapping."""
    mode: Literal["x", "y"] = "x"
    """A literal."""
    limit: int | None = None
    """An optional int."""
    positive: float = 1.0
    """Must be > 0 (checked in validate)."""

    def validate(self) -> list[str]:
        return [] if self.positive > 0 else [f"positive={self.positive} is invalid: must be > 0"]


@dataclass(kw_only=True)
class Run:
    output_dir: str = "runs/default"
    """Where a run writes everything."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(tiny=True, tokenizer="bytes"))
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    inner: Inner = field(default_factory=Inner)


def _problems(overrides: list[str], yaml_path: Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(Run, yaml_path, overrides)
    return info.value.problems


def test_defaults_come_from_dataclasses() -> None:
    cfg = load_config(Run, None, [])
    assert cfg == Run()
    assert cfg.lora.target_modules == ("q_proj", "v_proj")
    assert cfg.train.keep_last == 2


def test_yaml_then_overrides_then_output_dir(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {"train": {"meta_steps": 7, "seed": 3}, "lora": {"target_modules": ["q_proj"]}}
        )
    )
    cfg = load_config(
        Run,
        path,
        ["train.meta_steps=9", "output_dir=/some/where", "inner.sizes=[4,5,6]", "inner.limit=3"],
    )
    assert cfg.train.meta_steps == 9  # override beats YAML
    assert cfg.train.seed == 3  # YAML beats default
    assert cfg.train.log_every == 1  # default kept
    assert cfg.lora.target_modules == ("q_proj",)  # list -> tuple
    assert cfg.output_dir == "/some/where"
    assert cfg.inner.sizes == (4, 5, 6)
    assert cfg.inner.limit == 3


def test_yaml11_float_strings_and_null() -> None:
    cfg = load_config(Run, None, ["lora.alpha=1e-3", "inner.limit=null", "inner.weights={a: 2}"])
    assert cfg.lora.alpha == pytest.approx(1e-3)
    assert cfg.inner.limit is None
    assert cfg.inner.weights == {"a": 2.0}


def test_unknown_key_suggests_closest() -> None:
    problems = _problems(["train.keep_lats=3"])
    assert len(problems) == 1
    assert "unknown key 'train.keep_lats'" in problems[0]
    assert "did you mean 'train.keep_last'" in problems[0]


def test_unknown_section_suggests_closest(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("trian:\n  meta_steps: 3\n")
    problems = _problems([], path)
    assert len(problems) == 1 and "did you mean 'train'" in problems[0]


def test_key_in_wrong_section_suggests_other_section() -> None:
    problems = _problems(["model.r=4"])
    assert "did you mean 'lora.r'" in problems[0]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.meta_steps=ten", "train.meta_steps='ten' has the wrong type: expected int"),
        ("train.meta_steps=1.5", "train.meta_steps=1.5 has the wrong type: expected int"),
        ("model.tiny=yes please", "model.tiny='yes please' has the wrong type: expected bool"),
        ("lora.r=true", "lora.r=True has the wrong type: expected int"),
        ("lora.target_modules=q_proj", "expected a list"),
        ("inner.pair=[a]", "has the wrong length: expected 2 items"),
        ("model.dtype=fp16", "model.dtype='fp16' is invalid: allowed values are 'auto', 'float32', 'bfloat16'"),
        ("inner.limit=abc", "inner.limit='abc' has the wrong type: expected int | null"),
        ("train=3", "expected a mapping"),
    ],
)
def test_wrong_type_names_key_value_and_type(override: str, expected: str) -> None:
    problems = _problems([override])
    assert len(problems) == 1, problems
    assert expected in problems[0]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.keep_last=1", "train.keep_last=1 is invalid: must be >= 2"),
        ("train.meta_steps=0", "train.meta_steps=0 is invalid"),
        ("train.log_every=0", "train.log_every=0 is invalid"),
        ("train.checkpoint_every=-1", "train.checkpoint_every=-1 is invalid"),
        ("train.resume=/no/such/ckpt", "train.resume='/no/such/ckpt' is invalid"),
        ("lora.r=0", "lora.r=0 is invalid"),
        ("lora.alpha=0", "lora.alpha=0.0 is invalid"),
        ("lora.dropout=1.0", "lora.dropout=1.0 is invalid"),
        ("lora.target_modules=[]", "lora.target_modules=[] is invalid"),
        ("engine.collective_timeout_s=0", "engine.collective_timeout_s=0.0 is invalid"),
        ("engine.workers=0", "engine.workers=0 is invalid: must be >= 1 or auto"),
        ("engine.deepspeed_config=/no/such.json", "engine.deepspeed_config='/no/such.json' does not exist"),
        ("model.tiny_num_layers=0", "model.tiny_num_layers=0 is invalid"),
        ("model.tiny_hidden_size=30", "model.tiny_hidden_size=30 is invalid: must be divisible"),
        ("model.tiny_num_kv_heads=3", "model.tiny_num_kv_heads=3 is invalid: must divide"),
        ("inner.positive=-1", "inner.positive=-1.0 is invalid: must be > 0"),
    ],
)
def test_bad_value_ranges(override: str, expected: str) -> None:
    problems = _problems([override])
    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_model_path_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "no_model"
    problems = _problems([f"model.name_or_path={missing}", "model.tiny=false", "model.tokenizer=auto"])
    assert len(problems) == 1
    assert f"model.name_or_path={str(missing)!r} does not exist" in problems[0]


def test_bytes_tokenizer_needs_tiny() -> None:
    problems = _problems(["model.tiny=false"])
    assert any("model.tokenizer='bytes' is invalid with tiny=false" in p for p in problems)


def test_hub_id_is_not_checked_locally() -> None:
    cfg = ModelConfig(name_or_path="HuggingFaceTB/SmolLM2-135M")
    assert cfg.validate() == []


def test_multiple_problems_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  keep_last: 1\n  meta_stepz: 3\nlora:\n  r: big\n")
    problems = _problems(["model.dtype=fp8", "engine.kind=mpi", "bad_override"], path)
    assert len(problems) == 6, problems
    text = "\n".join(problems)
    for needle in (
        "train.keep_last=1",
        "'train.meta_stepz'",
        "lora.r='big'",
        "model.dtype='fp8'",
        "engine.kind='mpi'",
        "override 'bad_override' is malformed",
    ):
        assert needle in text
    # The exception text lists them all too.
    with pytest.raises(ConfigError, match="6 problems"):
        load_config(Run, path, ["model.dtype=fp8", "engine.kind=mpi", "bad_override"])


def test_bad_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("- just\n- a list\n")
    assert "must hold a mapping" in _problems([], path)[0]
    assert "does not exist" in _problems([], tmp_path / "missing.yaml")[0]


def test_save_resolved_round_trip(tmp_path: Path) -> None:
    cfg = load_config(Run, None, ["lora.target_modules=[k_proj]", "inner.pair=[b, 2.5]", "train.seed=11"])
    out = save_resolved(cfg, tmp_path / "resolved.yaml")
    raw = yaml.safe_load(out.read_text())
    assert raw["lora"]["target_modules"] == ["k_proj"]
    assert raw["train"]["seed"] == 11
    assert load_config(Run, out, []) == cfg
    assert build_config(Run, to_dict(cfg)) == cfg


def test_every_field_has_a_doc() -> None:
    for section in (ModelConfig, LoraConfig, TrainConfig, EngineConfig):
        docs = field_docs(section)
        missing = [f for f in section.__dataclass_fields__ if not docs.get(f)]
        assert not missing, f"{section.__name__} fields without a doc: {missing}"
    text = describe_config(Run())
    assert "train.keep_last (int, default 2): Complete checkpoints to keep" in text
