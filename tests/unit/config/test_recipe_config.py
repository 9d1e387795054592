"""The recipe's schema: defaults, derived values and a saved config that loads back."""

from __future__ import annotations

from pathlib import Path

from fmmeta.config import load_config, save_resolved
from fmmeta.recipe_config import RecipeConfig


def test_saved_config_reloads_with_a_new_inner_step_count(tmp_path: Path) -> None:
    """``recipes/evaluate.py --run`` and ``--config run/config.yaml`` reload a saved config, which
    holds the sampler's copy of the inner steps; changing the algorithm's must still work."""
    first = load_config(RecipeConfig, None, ["algorithm.inner_steps=2"])
    assert first.sampler.inner_steps == 2
    saved = save_resolved(first, tmp_path / "config.yaml")
    again = load_config(RecipeConfig, saved, ["algorithm.inner_steps=4"])
    assert again.algorithm.inner_steps == 4 and again.sampler.inner_steps == 4


def test_zero_inner_steps_still_gives_the_sampler_one_support_pass() -> None:
    cfg = load_config(RecipeConfig, None, ["algorithm.inner_steps=0"])
    assert cfg.sampler.inner_steps == 1
