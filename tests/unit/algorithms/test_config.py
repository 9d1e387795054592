"""One inner-loop config: one set of defaults, every field settable from YAML, one lr grid."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from fmmeta.algorithms.config import DEFAULT_LR_GRID, AlgorithmConfig, InnerLoopConfig
from fmmeta.config import ConfigError, describe_config, load_config
from fmmeta.config.describe import field_docs
from fmmeta.evaluation.settings import EvalSettings
from fmmeta.recipe_config import EvalConfig, RecipeConfig


def test_every_inner_loop_field_is_an_algorithm_key_settable_from_yaml(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  adam_betas: [0.8, 0.99]\n  inner_optimizer: adam\n")
    cfg = load_config(RecipeConfig, str(path), ["algorithm.adam_eps=1e-6", "algorithm.inner_steps=2"])
    inner = cfg.algorithm.inner_loop
    assert type(inner) is InnerLoopConfig
    assert (inner.adam_betas, inner.adam_eps, inner.inner_optimizer, inner.inner_steps) == (
        (0.8, 0.99), 1e-6, "adam", 2)
    inner_fields = {f.name for f in dataclasses.fields(InnerLoopConfig)}
    assert inner_fields <= {f.name for f in dataclasses.fields(AlgorithmConfig)}
    help_text = describe_config(RecipeConfig())
    docs = field_docs(InnerLoopConfig)
    for name in inner_fields:  # each with its one doc, written once in the inner loop's class
        line = next(ln for ln in help_text.splitlines() if ln.strip().startswith(f"algorithm.{name} "))
        assert docs[name] and line.endswith("): " + docs[name]), line
    with pytest.raises(ConfigError, match=r"algorithm.adam_betas=\[0.9, 1.0\] is invalid"):
        load_config(RecipeConfig, None, ["algorithm.adam_betas=[0.9, 1.0]"])


def test_one_set_of_inner_loop_defaults_and_one_lr_grid() -> None:
    run = RecipeConfig()
    # the run's inner loop is the class default, laid out in padding-free passes
    assert run.algorithm.inner_loop == dataclasses.replace(InnerLoopConfig(), padding_free=True)
    assert (InnerLoopConfig().inner_steps, InnerLoopConfig().inner_lr, InnerLoopConfig().inner_clip_norm) == (
        4, 0.1, 1.0)
    assert run.eval.lr_grid == EvalConfig().lr_grid == DEFAULT_LR_GRID
    assert inspect.signature(EvalSettings).parameters["lr_grid"].default == DEFAULT_LR_GRID
