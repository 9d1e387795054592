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


@pytest.mark.parametrize("launch", [["engine.kind=deepspeed"], ["WORLD_SIZE=2"]])
def test_workers_are_for_one_process_runs(launch: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine.workers`` forks CPU processes of a one-process run; under a launcher the ranks
    split the work, so an explicit count there is refused before any model is built ("auto" and
    1 are fine)."""
    overrides = [o for o in launch if not o.startswith("WORLD_SIZE")]
    if "WORLD_SIZE=2" in launch:
        monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as err:
        load_config(RecipeConfig, None, [*overrides, "engine.workers=2"])
    assert any("engine.workers=2 splits a one-process run" in p and "set engine.workers=1" in p
               for p in err.value.problems), err.value.problems
    for ok in ("auto", "1"):
        assert load_config(RecipeConfig, None, [*overrides, f"engine.workers={ok}"]).engine.workers in ("auto", 1)


def test_each_replicate_is_a_one_replicate_run_of_its_training_seed() -> None:
    cfg = load_config(RecipeConfig, None, ["train.replicates=3", "train.seed=10", "output_dir=runs/x", "tasks.seed=4"])
    reps = cfg.replicate_configs()
    assert [(r.train.seed, r.train.replicates, r.output_dir) for r in reps] == [
        (10, 1, "runs/x/replicate_0"), (11, 1, "runs/x/replicate_1"), (12, 1, "runs/x/replicate_2")]
    assert {r.tasks.seed for r in reps} == {4}  # the split and evaluation episodes are shared
    one = load_config(RecipeConfig, None, ["output_dir=runs/y"])
    assert one.replicate_configs() == [one]  # one replicate: the run itself, in output_dir
    with pytest.raises(ConfigError, match="replicates=0 is invalid"):
        load_config(RecipeConfig, None, ["train.replicates=0"])
