"""Fast checks of the launcher and DeepSpeed-config plumbing (no process launched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fmmeta.engine.distributed import local_rank_from_env_or_argv, strip_local_rank
from fmmeta.engine.ds_config import DSConfigError, resolve_ds_config

REPO = Path(__file__).resolve().parents[2]
OWNED = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 2,
         "gradient_clipping": 1.0, "bf16.enabled": True, "fp16.enabled": False}


@pytest.mark.parametrize("argv,env,want", [
    (["--local_rank=1"], None, 1),
    (["--x", "1", "--local-rank", "3"], None, 3),
    (["--local_rank", "2"], "5", 2),
    ([], "4", 4),
    ([], None, 0),
])
def test_local_rank_from_either_launcher(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                         env: str | None, want: int) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if env is not None:
        monkeypatch.setenv("LOCAL_RANK", env)
    assert local_rank_from_env_or_argv(argv) == want


def test_bad_local_rank_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match="--local_rank='x'"):
        local_rank_from_env_or_argv(["--local_rank=x"])


def test_strip_local_rank() -> None:
    assert strip_local_rank(["a", "--local_rank=1", "b", "--local-rank", "2", "c"]) == ["a", "b", "c"]


@pytest.mark.parametrize("name", ["zero2.json", "zero3.json", "zero3_offload.json"])
def test_shipped_configs_resolve_without_auto(name: str) -> None:
    cfg = resolve_ds_config(REPO / "ds_configs" / name, owned=OWNED, max_adapter_numel=4096)
    assert "auto" not in json.dumps(cfg)
    assert cfg["train_micro_batch_size_per_gpu"] == 1 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["bf16"]["enabled"] is True and cfg["gradient_clipping"] == 1.0
    if cfg["zero_optimization"]["stage"] == 3:
        assert cfg["zero_optimization"]["stage3_param_persistence_threshold"] >= 4096


def test_every_mismatch_listed_at_once() -> None:
    raw = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.5, "bf16": {"enabled": False},
           "optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR"}}
    with pytest.raises(DSConfigError) as err:
        resolve_ds_config(raw, owned=OWNED)
    msg = str(err.value)
    for piece in ("train_micro_batch_size_per_gpu: DeepSpeed JSON has 4 but the recipe config has 1",
                  "gradient_clipping: DeepSpeed JSON has 0.5", "bf16.enabled: DeepSpeed JSON has False",
                  "optimizer:", "scheduler:", "5 problem(s)"):
        assert piece in msg, msg


def test_small_persistence_threshold_is_raised(caplog: pytest.LogCaptureFixture) -> None:
    raw = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 10}}
    with caplog.at_level("WARNING"):
        cfg = resolve_ds_config(raw, owned=OWNED, max_adapter_numel=5000)
    assert cfg["zero_optimization"]["stage3_param_persistence_threshold"] == 5000
    assert "raised to 5000" in caplog.text


def test_unowned_auto_and_accumulation_rejected() -> None:
    with pytest.raises(DSConfigError, match="gradient_accumulation_steps.*needs 1"):
        resolve_ds_config({"gradient_accumulation_steps": 8}, owned={})
    with pytest.raises(DSConfigError, match="zero_optimization.sub_group_size"):
        resolve_ds_config({"zero_optimization": {"stage": 3, "sub_group_size": "auto"}}, owned=OWNED)


def test_explicit_equal_values_accepted_and_input_untouched() -> None:
    raw = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1, "bf16": {"enabled": True}}
    cfg = resolve_ds_config(raw, owned=OWNED)
    assert cfg["train_batch_size"] == 2 and raw == {"train_micro_batch_size_per_gpu": 1,
                                                    "gradient_clipping": 1, "bf16": {"enabled": True}}


@pytest.mark.parametrize("name", ["zero3.json", "zero3_offload.json"])
def test_zero3_auto_gather_limits_release_layers_after_their_pass(name: str) -> None:
    from fmmeta.engine.ds_config import ZERO3_LEAN_GATHER

    zero = resolve_ds_config(REPO / "ds_configs" / name, owned=OWNED)["zero_optimization"]
    assert {k: zero[k] for k in ZERO3_LEAN_GATHER} == ZERO3_LEAN_GATHER
    explicit = {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 5,
                                      "stage3_max_reuse_distance": 7}}
    zero = resolve_ds_config(explicit, owned=OWNED)["zero_optimization"]
    assert (zero["stage3_max_live_parameters"], zero["stage3_max_reuse_distance"]) == (5, 7)
