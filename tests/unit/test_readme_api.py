"""The README's "Meta-train on them" snippet runs as written (with a tiny model swapped in)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Meta-train on them", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_meta_training_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    code = _snippet()
    # The only substitutions: a tiny model instead of SmolLM2, fewer steps, and the task set the
    # previous README snippet builds (here the synthetic suite, tokenized with the same tokenizer).
    code = code.replace("ModelConfig()", 'ModelConfig(tiny=True, tokenizer="bytes")')
    code = code.replace("range(20)", "range(3)")
    code = code.replace(
        "model = add_lora(",
        "from fmmeta.tasks.suites import build_suite\n"
        "split = build_suite('synthetic', tokenizer)\n"
        "model = add_lora(",
    )
    monkeypatch.chdir(tmp_path)
    scope: dict = {"print": lambda *a: None}
    exec(compile(code, "README.md", "exec"), scope)
    saved = tmp_path / "my_adapter" / "adapter_model.safetensors"
    assert saved.stat().st_size > 0
    losses = [scope["stats"].query_loss_after]
    assert all(torch.isfinite(torch.tensor(losses)))
