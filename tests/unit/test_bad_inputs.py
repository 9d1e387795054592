"""The bad-input matrix (docs/bad_inputs.md): every case is refused before training starts with a
message that names the problem and the fix. Plus the recipe's non-finite "stop" path and the
security checks (safe loading only, safe YAML, no implicit trust_remote_code).

Config cases go through the entry point the recipe uses (``load_config(RecipeConfig, ...)`` or
the recipe's own ``main``); dataset cases through the public task builders; environment cases
through the config, the model builder and the checkpoint layer.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import datasets
import pytest
import torch

from fmmeta.checkpoint import CheckpointManager
from fmmeta.checkpoint.manager import CheckpointMismatchError
from fmmeta.config import ConfigError, ModelConfig, load_config
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.builders import (
    DatasetSpec,
    classification_tasks,
    tasks_from_column,
    tasks_from_datasets,
    tasks_from_examples,
)
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.task import EpisodeSpec
from fmmeta.tasks.testing import tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
TINY = ["model.tiny=true", "model.tokenizer=bytes"]
TOK = tiny_tokenizer()
SPEC = EpisodeSpec(shots=2, query=2, ways=2)
GEN = EpisodeSpec(shots=2, query=2)


@pytest.fixture(autouse=True)
def _one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def _problems(overrides: list[str], yaml_path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(RecipeConfig, yaml_path, TINY + overrides)
    return str(err.value)


def _ds_json(tmp_path: Path, **top: Any) -> str:
    cfg = json.loads((REPO / "ds_configs" / "zero3.json").read_text())
    cfg.update(top)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _rows() -> list[dict[str, Any]]:
    words = {"de": ["Frankreich", "Spanien", "Italien", "Polen"],
             "fr": ["Allemagne", "Espagne", "Italie", "Pologne"],
             "es": ["Alemania", "Francia", "Italia", "Polonia"]}  # fmt: skip
    return [{"text": w, "label": lang} for lang, ws in words.items() for w in ws]


def _mix() -> list[dict[str, Any]]:
    return [{"task": f"add{k}", "input": f"{a}+{k}=", "output": str(a + k)}
            for k in (1, 2) for a in range(5)]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Config problems: (overrides, message pieces). Each piece names the key, the value or the fix.
# ---------------------------------------------------------------------------------------------

CONFIG_CASES = {
    "unknown_key": (["train.meta_step=3"],
                    ["unknown key 'train.meta_step'", "did you mean 'train.meta_steps'?"]),
    "unknown_section": (["trian.meta_steps=3"], ["unknown key 'trian'", "did you mean 'train'?"]),
    "wrong_type": (["train.meta_steps=ten"],
                   ["train.meta_steps='ten' has the wrong type: expected int"]),
    "not_allowed_value": (["train.nonfinite=ignore"],
                          ["train.nonfinite='ignore' is invalid: allowed values are 'skip', 'stop'"]),
    "inner_steps_negative": (["algorithm.inner_steps=-1"],
                             ["algorithm.inner_steps=-1 is invalid: must be >= 0"]),
    "step_size_lr_zero": (["algorithm.metasgd.step_size_lr=0"],
                          ["algorithm.metasgd.step_size_lr=0.0 is invalid: must be > 0"]),
    "moved_method_key": (["algorithm.reptile_query_step=true"],
                         ["algorithm.reptile_query_step has moved to algorithm.reptile.query_step"]),
    "anil_layers_zero": (["algorithm.anil.layers=0"], ["algorithm.anil.layers=0 is invalid: must be >= 1"]),
    "lora_rank_zero": (["lora.r=0"], ["lora.r=0 is invalid: the LoRA rank must be >= 1"]),
    "misspelt_suite_option": (["tasks.suite=synthetic", "tasks.options={n_example: 30}"],
                             ["tasks.options.n_example is not an option of suite 'synthetic'",
                              "did you mean 'n_examples'?"]),
    "zero_json_with_local_engine": (["engine.kind=local", "engine.deepspeed_config=ds_configs/zero3.json"],
                                    ["engine.deepspeed_config='ds_configs/zero3.json' is set but kind='local' runs "
                                     "without DeepSpeed, so it would be ignored"]),
    "keep_last_one": (["train.keep_last=1"], ["train.keep_last=1 is invalid: must be >= 2"]),
    "slow_rank_rule": (["train.slow_rank_window=1", "train.slow_rank_margin=0"],
                       ["train.slow_rank_window=1 is invalid: must be >= 2",
                        "train.slow_rank_margin=0.0 is invalid: must be > 0"]),
    "unknown_method": (["methods=[maml2]"], ["methods=['maml2'] is invalid: choose one or more of fomaml, metasgd"]),
    "malformed_override": (["train.meta_steps"], ["override 'train.meta_steps' is malformed: write section.key=value"]),
    "infinite_number": (["optim.grad_clip=.inf"],
                        ["optim.grad_clip=inf is invalid: must be a finite number (not inf or nan)"]),
    "nan_number": (["algorithm.inner_lr=nan"],
                   ["algorithm.inner_lr='nan' is invalid: must be a finite number (not inf or nan)"]),
    "nan_in_a_list": (["eval.lr_grid=[0.1, .nan]"], ["eval.lr_grid[1]=nan is invalid: must be a finite number"]),
    "score_step_past_max": (["eval.max_steps=2", "eval.score_steps=[0, 3]"],
                            ["eval.score_steps=[0, 3] is invalid: [3] outside 0..max_steps=2"]),
    "eval_query_below_one": (["eval.query=0"], ["eval.query=0 is invalid: must be >= 1 (query examples per class)"]),
    "negative_seed": (["train.seed=-1"], ["train.seed=-1 is invalid: must be >= 0"]),
    "reptile_without_inner_steps": (
        ["methods=[reptile,multitask]", "algorithm.inner_steps=0"],
        ["algorithm.inner_steps=0 is invalid with reptile in methods", "with none it learns nothing"]),
    "no_replicate_and_negative_split_seed": (
        ["train.replicates=0", "tasks.seed=-2"],
        ["train.replicates=0 is invalid: must be >= 1", "tasks.seed=-2 is invalid: must be >= 0"]),
    "pass_budget_below_one_sequence": (
        ["sampler.tokens_per_pass=1"],
        ["sampler.tokens_per_pass=1 is below one sequence (tasks.max_length=48)",
         "use >= 48, or 0 for micro_batch_size x the longest sequence"]),
    "placement_unknown_and_negative_all_reduce_price": (
        ["sampler.placement=row", "sampler.cost_r=-1"],
        ["sampler.placement='row' is invalid: allowed: auto, tasks, rows",
         "sampler.cost_r=-1.0 is invalid: must be a finite number >= 0"]),
    "length_buckets_not_ascending": (
        ["sampler.length_buckets=[128, 64]"],
        ["sampler.length_buckets=(128, 64) is invalid: need ascending distinct integer widths >= 1",
         "e.g. [64, 128, 256, 512], or [] for none"]),
    "length_bucket_wider_than_any_pass": (
        ["sampler.length_buckets=[64, 1000000000]"],
        ["sampler.length_buckets=[64, 1000000000] is invalid: its widest bucket 1000000000 is wider than any pass "
         "can be (32768 tokens: sampler.tokens_per_pass", "use widths <= 32768"]),
    "output_dir_near_the_path_limit": (
        ["output_dir=" + "/".join(["d" * 200] * 20)],
        ["bytes long as an absolute path, leaving less than the 255 bytes the files written inside it need below "
         "this system's path limit (4096): give a shorter path"]),
    "output_dir_name_past_the_name_limit": (
        ["output_dir=runs/" + "d" * 300],
        ["holds a folder name of 300 bytes, longer than this file system's 255: give a shorter name"]),
    "meta_batch_size_neither_a_number_nor_auto": (
        ["sampler.meta_batch_size=big"],
        ["sampler.meta_batch_size='big' has the wrong type: expected int | one of 'auto'"]),
    "meta_batch_size_zero": (["sampler.meta_batch_size=0"],
                             ["sampler.meta_batch_size=0 is invalid: must be an integer >= 1 or auto"]),
    "auto_batch_bounds_out_of_range": (
        ["sampler.meta_batch_size=auto", "sampler.auto_batch_min=1", "sampler.auto_batch_max=0",
         "sampler.auto_batch_every=-1"],
        ["sampler.auto_batch_min=1 is invalid: must be an integer >= 2; the noise is measured from the spread",
         "sampler.auto_batch_max=0 is invalid: must be an integer >= auto_batch_min (1)",
         "sampler.auto_batch_every=-1 is invalid: must be an integer >= 0; 0 chooses once, after the warm-up"]),
    "format_shift_family_not_held_out": (
        ["tasks.split.format_shift_families=[words]"],
        ["tasks.split.format_shift_families=['words'] is invalid: each must be one of held_out_families []"]),
    "unknown_inner_format": (["algorithm.inner_format=icl"],
                             ["algorithm.inner_format='icl' is invalid: allowed ['plain', 'in_context']"]),
    "method_listed_twice": (["methods=[fomaml,fomaml]"],
                            ["methods=['fomaml', 'fomaml'] is invalid: a method is listed twice"]),
    "demonstrations_for_a_method_not_run": (
        ["methods=[fomaml]", "eval.with_demonstrations=[reptile]"],
        ["eval.with_demonstrations=['reptile'] is invalid: ['reptile'] not among base and the run's methods ['fomaml']"]),
    "zero_meta_steps": (["train.meta_steps=0"], ["train.meta_steps=0 is invalid: must be >= 1"]),
    "lora_dropout_above_one": (["lora.dropout=1.5"], ["lora.dropout=1.5 is invalid: must be in [0, 1)"]),
    "adam_betas_of_wrong_length": (["optim.betas=[0.9]"],
                                   ["optim.betas=[0.9] has the wrong length: expected 2 items"]),
    "adam_beta_above_one": (["optim.betas=[1.5,0.9]"],
                            ["optim.betas=(1.5, 0.9) is invalid: need two values in [0, 1)"]),
    "empty_lr_grid": (["eval.lr_grid=[]"], ["eval.lr_grid=[] is invalid: give one or more lrs > 0"]),
    "heads_that_do_not_divide_the_width": (
        ["model.tiny_num_heads=5"],
        ["model.tiny_hidden_size=64 is invalid: must be divisible by tiny_num_heads=5",
         "model.tiny_num_kv_heads=2 is invalid: must divide tiny_num_heads=5"]),
    "fp16_dtype": (["model.dtype=float16"],
                   ["model.dtype='float16' is invalid: allowed values are 'auto', 'float32', 'bfloat16'"]),
    "empty_output_dir": (["output_dir="], ["output_dir=None has the wrong type: expected str"]),
    "workers_zero": (["engine.workers=0"], ["engine.workers=0 is invalid: must be >= 1 or auto"]),
    "workers_under_a_distributed_engine": (
        ["engine.kind=deepspeed", "engine.workers=2"],
        ["engine.workers=2 splits a one-process run between CPU processes; under engine.kind=deepspeed",
         "set engine.workers=1 (or auto)"]),
    "unknown_tracker": (["train.report_to=tensorbord"],
                        ["train.report_to='tensorbord' is invalid", "did you mean 'tensorboard'?"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_problem_is_refused(case: str) -> None:
    overrides, pieces = CONFIG_CASES[case]
    msg = _problems(overrides)
    for piece in pieces:
        assert piece in msg, msg


def test_meta_batch_not_divisible_by_ranks_when_on_uneven_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    msg = _problems(["sampler.meta_batch_size=3", "sampler.on_uneven=error"])
    assert "sampler.meta_batch_size=3 does not divide by the 2 ranks" in msg
    assert "use a multiple of 2 or set sampler.on_uneven=pad" in msg
    load_config(RecipeConfig, None, TINY + ["sampler.meta_batch_size=3"])  # pad (default): fine
    load_config(RecipeConfig, None, TINY + ["sampler.meta_batch_size=4", "sampler.on_uneven=error"])


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    """PyYAML would keep the last of two equal keys silently (here: the second sampler block)."""
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  meta_steps: 3\n  meta_steps: 5\nsampler:\n  meta_batch_size: 2\n"
                    "sampler:\n  micro_batch_size: 2\n")
    msg = _problems([], path)
    assert "key 'meta_steps' on line 3 repeats line 2" in msg
    assert "key 'sampler' on line 6 repeats line 4" in msg
    assert "a key may appear once per section; delete one" in msg
    path.write_text("base: &b\n  meta_steps: 3\ntrain:\n  <<: *b\n  meta_steps: 4\n")  # merge key: fine
    assert "repeats" not in _problems([], path)


def test_meta_batch_larger_than_the_task_pool_is_refused() -> None:
    from fmmeta.sampling import CostAwareSampler, SamplerConfig
    from fmmeta.sampling.synthetic import lognormal_pool

    with pytest.raises(ValueError, match=r"sampler.meta_batch_size=6 is larger than the meta-training "
                                         r"pool \(5 tasks\).*set sampler.meta_batch_size to at most 5"):
        CostAwareSampler(lognormal_pool(5, seed=0), SamplerConfig(meta_batch_size=6), world_size=1, seed=0)


def test_zero3_with_optimizer_block_is_refused(tmp_path: Path) -> None:
    path = _ds_json(tmp_path, optimizer={"type": "AdamW", "params": {"lr": 1e-3}})
    msg = _problems([f"engine.deepspeed_config={path}"])
    assert "optimizer: present in the DeepSpeed JSON but not supported" in msg
    assert "delete the 'optimizer' block" in msg


def test_zero3_with_fp16_is_refused(tmp_path: Path) -> None:
    path = _ds_json(tmp_path, fp16={"enabled": True})
    msg = _problems([f"engine.deepspeed_config={path}"])
    assert "fp16.enabled: DeepSpeed JSON has true but fmmeta does not support fp16" in msg
    assert "use model.dtype=bfloat16" in msg


def test_ds_json_conflicting_with_recipe_is_refused(tmp_path: Path) -> None:
    path = _ds_json(tmp_path, gradient_clipping=0.5, bf16={"enabled": True})
    msg = _problems([f"engine.deepspeed_config={path}", "optim.grad_clip=1.0", "model.dtype=float32"])
    assert "gradient_clipping: DeepSpeed JSON has 0.5 but the recipe config has 1.0" in msg
    assert "bf16.enabled: DeepSpeed JSON has True but the recipe config has False" in msg
    assert 'set "gradient_clipping" to "auto"' in msg
    load_config(RecipeConfig, None, TINY + [f"engine.deepspeed_config={_ds_json(tmp_path)}"])


def test_ds_json_that_is_a_list_or_asks_for_stage_7_is_refused(tmp_path: Path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"zero_optimization": {"stage": 3}}]))
    msg = _problems([f"engine.deepspeed_config={listed}"])
    assert f"engine.deepspeed_config={str(listed)!r}: the JSON holds a list, not an object" in msg, msg
    assert "see ds_configs/zero3.json" in msg
    msg = _problems([f"engine.deepspeed_config={_ds_json(tmp_path, zero_optimization={'stage': 7})}"])
    assert "zero_optimization.stage: DeepSpeed JSON has 7 but ZeRO stages are 0, 1, 2 and 3" in msg, msg


def test_ds_json_missing_is_refused(tmp_path: Path) -> None:
    msg = _problems([f"engine.deepspeed_config={tmp_path / 'nope.json'}"])
    assert "does not exist: give a DeepSpeed JSON file such as ds_configs/zero3.json" in msg


def test_compiled_layers_under_zero3_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine.compile`` with ZeRO-3 (its graphs break at every sublayer: slower than eager,
    tests/distributed/test_compiled_zero.py), whichever way ZeRO-3 is asked for: the DeepSpeed
    engine's default, a JSON, accelerate's plugin; and again where an engine is built in code."""
    from torch import nn

    from fmmeta.config import EngineConfig
    from fmmeta.engine.build import build_engine
    from fmmeta.engine.optim import OuterOptimConfig

    msg = _problems(["engine.kind=deepspeed", "engine.compile=true"])
    assert ("engine.compile=true cannot run with ZeRO stage 3, which the DeepSpeed engine's default "
            "(engine.deepspeed_config unset) asks for") in msg, msg
    assert ("set engine.compile=false, or keep engine.compile=true with a ZeRO stage 0-2 JSON "
            "(engine.deepspeed_config=ds_configs/zero2.json)") in msg, msg
    zero3 = _ds_json(tmp_path)
    msg = _problems(["engine.kind=deepspeed", "engine.compile=true", f"engine.deepspeed_config={zero3}"])
    assert f"ZeRO stage 3, which engine.deepspeed_config={zero3!r} asks for" in msg, msg
    zero2 = REPO / "ds_configs" / "zero2.json"
    load_config(RecipeConfig, None, TINY + ["engine.compile=true", f"engine.deepspeed_config={zero2}"])
    load_config(RecipeConfig, None, TINY + ["engine.compile=true", "engine.kind=local"])
    load_config(RecipeConfig, None, TINY + ["engine.kind=deepspeed"])  # ZeRO-3 eager
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    msg = _problems(["engine.kind=accelerate", "engine.compile=true"])
    assert "which accelerate launch's DeepSpeed plugin asks for" in msg, msg
    assert "an accelerate config file with deepspeed_config.zero_stage 0, 1 or 2" in msg, msg
    with pytest.raises(ConfigError, match="engine.compile=true cannot run with ZeRO stage 3"):
        build_engine(EngineConfig(kind="accelerate", compile=True), nn.Linear(2, 2),
                     OuterOptimConfig(), precision="fp32")  # refused before it compiles or wraps


def test_compiled_layers_without_a_cxx_compiler_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU inductor builds every kernel with a C++ compiler: ``engine.compile=true`` without
    one is refused at config check, not after the model has loaded; "auto" stays eager instead."""
    from fmmeta.engine import build

    monkeypatch.setattr(build, "cxx_compiler", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    msg = _problems(["engine.compile=true"])
    assert ("engine.compile=true needs a C++ compiler on a CPU (inductor builds its kernels with "
            "g++, clang++ or the one CXX names) and none was found: install one") in msg, msg
    assert "or set engine.compile=false (or auto, which stays eager without one)" in msg, msg
    load_config(RecipeConfig, None, TINY + ["engine.compile=auto"])
    load_config(RecipeConfig, None, TINY + ["engine.compile=false"])


def _recipe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fmmeta_recipe_train", REPO / "recipes" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_reports_every_config_problem_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = _ds_json(tmp_path, optimizer={"type": "Adam"})
    yaml_path = tmp_path / "run.yaml"
    yaml_path.write_text("train:\n  meta_stepz: 3\nlora:\n  r: four\n")
    code = _recipe().main([
        "--config", str(yaml_path), *TINY, f"output_dir={tmp_path / 'out'}",
        "algorithm.inner_steps=-2", f"engine.deepspeed_config={ds}",
    ])
    err = capsys.readouterr().err
    assert code == 2
    assert "4 problems in the configuration" in err, err
    for piece in ("unknown key 'train.meta_stepz'", "lora.r='four' has the wrong type",
                  "algorithm.inner_steps=-2 is invalid: must be >= 0",
                  "optimizer: present in the DeepSpeed JSON"):
        assert piece in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


# ---------------------------------------------------------------------------------------------
# Environment problems
# ---------------------------------------------------------------------------------------------


def test_model_path_that_does_not_exist() -> None:
    msg = _problems(["model.tiny=false", "model.tokenizer=auto", "model.name_or_path=./missing/model"])
    assert "model.name_or_path='./missing/model' does not exist" in msg
    assert "give an existing local folder or .gguf file" in msg


def test_gguf_without_the_gguf_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real(name, *a))  # fmt: skip
    msg = _problems(["model.tiny=false", "model.tokenizer=auto", f"model.name_or_path={gguf}"])
    assert "is a GGUF model but the gguf package is not installed: run `pip install gguf`" in msg


def test_tracker_without_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))  # fmt: skip
    msg = _problems(["train.report_to=[tensorboard,wandb]"])
    assert "needs the 'wandb' package, which is not installed: run `pip install fmmeta[tracking]`" in msg


def test_resume_folder_that_does_not_exist(tmp_path: Path) -> None:
    msg = _problems([f"train.resume={tmp_path / 'step_00000009'}"])
    assert "use 'auto', 'never' or an existing checkpoint folder" in msg


def _checkpoint(tmp_path: Path, shapes: dict[str, list[int]]) -> CheckpointManager:
    mgr = CheckpointManager(tmp_path / "ckpts")
    mgr.save(0, lambda w: w.save_json("state.json", {"step": 0}),
             meta={"model_id": "tiny-a", "lora_shapes": shapes})  # fmt: skip
    return mgr


def test_checkpoint_from_a_different_model(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, {"a.lora_A": [4, 32]}).latest()
    assert ckpt is not None
    with pytest.raises(CheckpointMismatchError) as err:
        ckpt.check_compatible(model_id="tiny-b", lora_shapes={"a.lora_A": [4, 32]})
    msg = str(err.value)
    assert "it was written for model 'tiny-a', this run uses 'tiny-b'" in msg
    assert "train.resume=never" in msg


def test_checkpoint_with_a_different_lora_shape(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, {"a.lora_A": [4, 32]}).latest()
    assert ckpt is not None
    with pytest.raises(CheckpointMismatchError) as err:
        ckpt.check_compatible(model_id="tiny-a", lora_shapes={"a.lora_A": [8, 32]})
    msg = str(err.value)
    assert "adapter tensor 'a.lora_A' has shape [4, 32] there, [8, 32] here" in msg
    assert "Resume with the same model and lora settings" in msg
    ckpt.check_compatible(model_id="tiny-a", lora_shapes={"a.lora_A": [4, 32]})  # same: accepted


# ---------------------------------------------------------------------------------------------
# Dataset problems (the builders every suite uses; refused while tasks are built)
# ---------------------------------------------------------------------------------------------


def test_dataset_missing_column_lists_existing() -> None:
    with pytest.raises(ValueError, match=r"column\(s\) \['sentence'\] not found; the dataset has columns \['text', 'label'\]"):
        classification_tasks(datasets.Dataset.from_list(_rows()), TOK, TaskOptions(spec=SPEC), text_column="sentence")


def test_dataset_too_few_examples_per_class_for_the_shots() -> None:
    rows = _rows() + [{"text": "Tokio", "label": "ja"}]
    with pytest.raises(ValueError, match=r"'ja' has 1\. .*drop_small_classes=True"):
        classification_tasks(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=SPEC))


def test_dataset_empty_text() -> None:
    rows = _rows()
    rows[2]["text"] = "   "
    with pytest.raises(ValueError, match=r"text\[2\]='   ' is empty.*filter such rows first"):
        classification_tasks(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=SPEC))


def test_dataset_query_answer_fully_truncated() -> None:
    items = [(f"p{i}", " " + "x" * 40) for i in range(4)]
    with pytest.raises(ValueError, match=r"example 0 has an answer of \d+ tokens .*raise max_length to at least"):
        tasks_from_examples("long", items, TOK, TaskOptions(spec=GEN, max_length=16, on_too_long="error"))
    with pytest.raises(ValueError, match=r"task 'long' has no examples \(4 dropped as too long for max_length\)"):
        tasks_from_examples("long", items, TOK, TaskOptions(spec=GEN, max_length=16))  # default: drop


def test_dataset_mixed_label_types() -> None:
    items = [{"prompt": f"p{i}", "label": lab} for i, lab in enumerate([1, "one"] * 6)]
    with pytest.raises(ValueError, match=r"mixes label types \['int', 'str'\]"):
        tasks_from_examples("t", items, TOK, TaskOptions(spec=EpisodeSpec(shots=1, query=1, ways=2)))


def test_dataset_duplicate_task_names() -> None:
    ds = datasets.Dataset.from_list(_mix())
    with pytest.raises(ValueError, match=r"duplicate task names \{'x': 2\} \(name: count\): give each DatasetSpec a unique name"):
        tasks_from_datasets([DatasetSpec(name="x", data=ds), DatasetSpec(name="x", data=ds)], TOK, TaskOptions(spec=GEN))  # fmt: skip


def test_dataset_zero_tasks_after_filtering() -> None:
    rows = [r for r in _mix() if r["input"] != "0+1="][:7]  # add1: 4 rows, add2: 3 rows; need 5
    with pytest.raises(ValueError, match=r"every task was dropped as too small; no tasks remain: add examples"):
        tasks_from_column(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=EpisodeSpec(shots=3, query=2)), drop_small_tasks=True)  # fmt: skip


def test_dataset_fewer_classes_than_ways() -> None:
    with pytest.raises(ValueError, match=r"3 class\(es\) can supply an episode but ways=5"):
        classification_tasks(datasets.Dataset.from_list(_rows()), TOK, TaskOptions(spec=EpisodeSpec(shots=1, query=1, ways=5)))  # fmt: skip


def test_unknown_task_suite() -> None:
    msg = _problems(["tasks.suite=cldrr"])
    assert "tasks.suite='cldrr' is invalid: choose one of" in msg and "did you mean 'cldr'" in msg


# ---------------------------------------------------------------------------------------------
# Non-finite loss in the recipe: "stop" keeps the last good checkpoint and exits non-zero
# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_recipe_nonfinite_stop_keeps_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _recipe()
    real_guard = recipe.NonFiniteGuard

    class PoisonThirdStep(real_guard):  # type: ignore[misc, valid-type]
        """The real guard, fed a NaN meta-gradient at the third outer step (meta-step 2)."""

        def outer_step(self, grad_sum, n_real_tasks):  # type: ignore[no-untyped-def]
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 3:
                grad_sum = [torch.full_like(g, math.nan) for g in grad_sum]
            return super().outer_step(grad_sum, n_real_tasks)

    monkeypatch.setattr(recipe, "NonFiniteGuard", PoisonThirdStep)
    out = tmp_path / "run"
    args = ["--config", str(REPO / "recipes" / "configs" / "smoke.yaml"), f"output_dir={out}",
            "methods=[fomaml]", "eval.enabled=false", "train.meta_steps=4",
            "train.checkpoint_every=2", "train.nonfinite=stop"]
    assert recipe.main(args) == 3
    err = capsys.readouterr().err
    assert "stopped: fomaml, meta-step 2: non-finite meta-gradient on 1 of 1 ranks" in err, err
    assert "Last good checkpoint:" in err and "step_00000001" in err
    ckpts = CheckpointManager(out / "fomaml" / "checkpoints")
    assert ckpts.complete_steps() == [1]
    assert ckpts.latest() is not None  # complete and verified
    assert not (out / "fomaml" / "adapter").exists()  # no final adapter from a poisoned run
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]

    # The same output_dir with another LoRA shape: the kept checkpoint is refused before
    # anything is built or written (exit 2), naming the setting.
    assert _recipe().main(args + ["lora.r=8"]) == 2
    err = capsys.readouterr().err
    assert "lora.r: 4 in the checkpoint, 8 now" in err and "train.resume_changes=[lora.r]" in err, err


@pytest.mark.timeout(120)
def test_recipe_late_input_errors_exit_2_with_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    smoke = str(REPO / "recipes" / "configs" / "smoke.yaml")
    assert _recipe().main(["--config", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--config {str(tmp_path)!r} is a folder: give the YAML file" in err, err
    out = tmp_path / "run"
    assert _recipe().main(["--config", smoke, f"output_dir={out}", "lora.target_modules=[nope]"]) == 2
    err = capsys.readouterr().err
    assert "lora.target_modules=['nope'] is invalid" in err and "Traceback" not in err, err
    assert not (out / ".fmmeta.lock").exists()  # released on the way out
    short = tmp_path / "short"
    assert _recipe().main(["--config", smoke, f"output_dir={short}", "tasks.max_length=8"]) == 2
    err = capsys.readouterr().err
    assert "dropped as too long for max_length" in err and "Traceback" not in err, err
    assert "Raise tasks.max_length (now 8 tokens per example) so the examples fit" in err, err
    many = tmp_path / "many"  # refused before meta-training, not after it
    assert _recipe().main(["--config", smoke, f"output_dir={many}", "eval.query=500"]) == 2
    err = capsys.readouterr().err
    assert "eval.query=500 is too many for task" in err and "Traceback" not in err, err
    assert not (many / "metrics.jsonl").exists()


@pytest.mark.timeout(120)
def test_evaluate_recipe_input_errors_exit_2_with_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("fmmeta_recipe_evaluate", REPO / "recipes" / "evaluate.py")
    assert spec is not None and spec.loader is not None
    evaluate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate)
    smoke = str(REPO / "recipes" / "configs" / "smoke.yaml")
    assert evaluate.main(["--config", smoke, f"output_dir={tmp_path}", "tasks.max_length=8"]) == 2
    err = capsys.readouterr().err
    assert "Raise tasks.max_length (now 8 tokens per example)" in err and "Traceback" not in err, err
    assert not any(tmp_path.glob("eval-*"))  # the report folder claimed at the start is removed
    assert evaluate.main(["--config", smoke, "--adapter", f"mine={tmp_path}"]) == 2
    assert "--adapter 'mine=" in capsys.readouterr().err
    assert evaluate.main(["--config", smoke, "--import", "no_such_module_xyz"]) == 2
    assert "--import 'no_such_module_xyz' failed" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------------------------


def unsafe_calls(source: str, filename: str = "<src>") -> list[str]:
    """Unsafe deserialisation or implicit remote code in ``source``, one line per finding."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name.split(".")[0] in ("pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"):
                    found.append(f"{filename}:{node.lineno}: imports {name}")
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        kw = {k.arg: k.value for k in node.keywords}
        if func.endswith("torch.load"):
            wo = kw.get("weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                found.append(f"{filename}:{node.lineno}: torch.load without weights_only=True")
        if func in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "yaml.unsafe_load_all"):
            loader = ast.unparse(kw["Loader"]) if "Loader" in kw else ""
            if "Safe" not in loader:
                found.append(f"{filename}:{node.lineno}: {func} without a safe loader")
        if func.endswith(("pickle.load", "pickle.loads")):
            found.append(f"{filename}:{node.lineno}: {func}")
        trc = kw.get("trust_remote_code")
        if isinstance(trc, ast.Constant) and trc.value is True:
            found.append(f"{filename}:{node.lineno}: trust_remote_code=True hard-coded")
    return found


def test_scanner_catches_unsafe_code() -> None:
    bad = ("import pickle\nimport torch, yaml\ntorch.load('x')\ntorch.load('x', weights_only=False)\n"
           "yaml.load(s)\nyaml.load(s, Loader=yaml.FullLoader)\nf(trust_remote_code=True)\n")
    assert len(unsafe_calls(bad)) == 6
    good = "import torch, yaml\ntorch.load('x', weights_only=True)\nyaml.safe_load(s)\nyaml.load(s, Loader=yaml.SafeLoader)\n"
    assert unsafe_calls(good) == []


def test_library_and_recipes_load_only_safely() -> None:
    files = sorted((REPO / "fmmeta").rglob("*.py")) + sorted((REPO / "recipes").rglob("*.py"))
    assert len(files) > 20
    found = [f for path in files for f in unsafe_calls(path.read_text(), str(path.relative_to(REPO)))]
    assert found == []


def test_yaml_with_python_object_tag_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.yaml"
    evil.write_text(f"output_dir: !!python/object/apply:os.system ['touch {marker}']\n")
    msg = _problems([], evil)
    assert "is not valid YAML" in msg and "python/object/apply:os.system" in msg
    assert not marker.exists()


def test_trust_remote_code_is_never_implicit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert ModelConfig().trust_remote_code is False
    import transformers

    from fmmeta.models import build_model_and_tokenizer

    calls: dict[str, dict[str, Any]] = {}

    class _Stop(Exception):
        pass

    def tok(path: str, **kwargs: Any) -> Any:
        calls["tokenizer"] = kwargs
        return tiny_tokenizer()

    def model(path: str, **kwargs: Any) -> Any:
        calls["model"] = kwargs
        raise _Stop

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tok)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    cfg = load_config(RecipeConfig, None, [f"model.name_or_path={folder}", "model.dtype=float32"]).model
    with pytest.raises(_Stop):
        build_model_and_tokenizer(cfg)
    assert calls["tokenizer"] == {"trust_remote_code": False}
    assert calls["model"] == {"dtype": torch.float32, "trust_remote_code": False}


def test_a_chat_row_without_its_answer_and_a_tokenizer_without_a_chat_template_are_refused() -> None:
    from fmmeta.tasks.chat import CHAT, ChatKeys
    from fmmeta.tasks.registry import SourceRows
    from fmmeta.tasks.rows import tasks_from_rows

    common = SourceRows(name="bad", spec=GEN, template=None, answer_template=" {answer}", family="", drop_small=False)
    turns = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    with pytest.raises(ValueError, match=r"chat task 'bad': row 0 ends with a 'user' turn of content 'again': "
                                         r"each row's messages must be .* ending in the assistant's answer"):
        CHAT.rows(datasets.Dataset.from_list([{"messages": turns}]), ChatKeys(), common)
    rows = CHAT.rows(datasets.Dataset.from_list([{"prompt": f"q{i}", "completion": "a"} for i in range(4)]),
                     ChatKeys(), common)
    with pytest.raises(ValueError, match=r"task 'bad': builder chat renders prompts with the tokenizer's chat "
                                         r"template, but \w+ has none \(chat_template is unset\)"):
        tasks_from_rows(rows, TOK)
