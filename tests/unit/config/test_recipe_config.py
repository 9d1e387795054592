"""The recipe's schema: derived values are not keys, and a saved config loads back."""

from __future__ import annotations

from pathlib import Path

import pytest

from fmmeta.config import ConfigError, load_config, save_resolved
from fmmeta.recipe_config import RecipeConfig


def test_saved_config_reloads_with_a_new_inner_step_count(tmp_path: Path) -> None:
    """``recipes/evaluate.py --run`` reloads a saved config; changing a key on top must work."""
    first = load_config(RecipeConfig, None, ["algorithm.inner_steps=2"])
    saved = save_resolved(first, tmp_path / "config.yaml")
    again = load_config(RecipeConfig, saved, ["algorithm.inner_steps=4"])
    assert again.algorithm.inner_steps == 4 and again.sampler == first.sampler


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [("sampler.inner_steps=7", "algorithm.inner_steps"), ("algorithm.name=reptile", "methods")],
)
def test_derived_values_are_not_keys(override: str, suggestion: str) -> None:
    """The sampler prices support passes with the algorithm's inner steps, and the recipe builds
    each of ``methods``: keys for either would be overwritten, so they do not exist."""
    with pytest.raises(ConfigError) as err:
        load_config(RecipeConfig, None, [override])
    (problem,) = err.value.problems
    assert problem.startswith(f"unknown key {override.split('=')[0]!r}")
    if suggestion != "methods":
        assert f"did you mean {suggestion!r}" in problem
