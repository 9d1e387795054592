"""The README's Python API snippet (meta-train on a task set) runs as written (with a tiny model swapped in)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_meta_training_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    code = _snippet()
    # The only substitutions: a tiny model instead of SmolLM2, fewer steps, and the task set the
    # previous README snippet builds (here the synthetic suite, tokenized with the same tokenizer).
    # Each must find its target, or the test would silently run the real 135M model.
    substitutions = {
        "ModelConfig()": 'ModelConfig(tiny=True, tokenizer="bytes")',
        "range(20)": "range(3)",
        "model = add_lora(": "from fmmeta.tasks.suites import build_suite\n"
        "split = build_suite('synthetic', tokenizer)\nmodel = add_lora(",
    }
    for old, new in substitutions.items():
        assert code.count(old) == 1, f"README snippet changed: {old!r} not found exactly once"
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"print": lambda *a: None}
    exec(compile(code, "README.md", "exec"), scope)
    from safetensors.torch import load_file

    stats = scope["stats"]
    assert stats.n_real_tasks == 4 and math.isfinite(stats.query_loss_after)
    saved = load_file(str(tmp_path / "my_adapter" / "adapter_model.safetensors"))
    lora_b = [t for k, t in saved.items() if "lora_B" in k]
    assert lora_b and any(t.abs().max() > 0 for t in lora_b)  # trained away from the zero init


def test_readme_own_tasks_yaml_has_only_valid_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "Your own tasks" YAML uses real keys and values: loading it, the only problems are
    the data files it names, which do not exist here."""
    import yaml

    from fmmeta.config import ConfigError, load_config
    from fmmeta.recipe_config import RecipeConfig

    text = README.read_text(encoding="utf-8").split("## Your own tasks", 1)[1]
    snippet = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_tasks.yaml").write_text(snippet)
    with pytest.raises(ConfigError) as err:
        load_config(RecipeConfig, tmp_path / "my_tasks.yaml", ["model.tiny=true", "model.tokenizer=bytes"])
    problems = err.value.problems
    assert len(problems) == 3, problems
    for i, path in enumerate(("data/mixture.jsonl", "data/reviews.csv", "data/held_out/")):
        assert problems[i].startswith(f"tasks.collection[{i}] (path={path!r}"), problems[i]
        assert "does not exist" in problems[i], problems[i]
    assert yaml.safe_load(snippet)["tasks"]["split"]["held_out_families"] == ["arithmetic"]
