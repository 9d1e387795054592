"""A ``builder: chat`` collection end to end: meta-trained and evaluated by the recipe on a tiny model
whose tokenizer has a chat template, then ``fmmeta adapt --builder chat`` on a chat file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.recipes import _recipe

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _model(folder: Path) -> None:
    """A tiny random Llama saved with the byte tokenizer, which is given the chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fmmeta.tasks.testing import TINY_VOCAB_SIZE, tiny_tokenizer

    tok = tiny_tokenizer()
    tok.chat_template = TEMPLATE
    config = LlamaConfig(vocab_size=TINY_VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _chats(k: int, n: int = 8) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"{i}+{k}"}, {"role": "assistant", "content": str(i + k)}]}
            for i in range(n)]


@pytest.mark.timeout(300)
def test_a_chat_collection_trains_evaluates_and_adapts(tmp_path: Path) -> None:
    model, data, out = tmp_path / "model", tmp_path / "chats", tmp_path / "run"
    _model(model)
    for k in range(1, 8):
        _jsonl(data / f"add{k}.jsonl", _chats(k))
    config = yaml.safe_load(_recipe.SMOKE.read_text())
    config["model"] = {"name_or_path": str(model), "dtype": "float32"}
    config["tasks"] = {"max_length": 48, "cache_dir": str(tmp_path / "cache"),
                       "collection": [{"path": str(data), "builder": "chat", "shots": 2, "query": 2}],
                       "split": {"held_out": ["add7"], "validation": ["add6"]}}
    (tmp_path / "chat.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    _recipe.run("python", ["--config", str(tmp_path / "chat.yaml"), f"output_dir={out}", "methods=[fomaml]",
                           "train.meta_steps=2", "train.checkpoint_every=0", "eval.seeds=1"], timeout_s=240)
    report = json.loads((out / "eval" / "eval.json").read_text())
    assert {r["task"] for r in report["records"]} == {"add7"}
    assert "## generation: query accuracy" in (out / "eval" / "eval.md").read_text()

    import recipes.adapt as recipe

    support = _jsonl(tmp_path / "s.jsonl", [{"turns": r["messages"]} for r in _chats(7, 4)])  # a column of its own
    query = _jsonl(tmp_path / "q.jsonl", [{"turns": [{"role": "user", "content": "9+7"}]},
                                          {"prompt": "8+7", "completion": "15"}])
    code = recipe.main(["--run", str(out), "--method", "fomaml", "--support", str(support), "--query", str(query),
                        "--builder", "chat", "--messages-column", "turns", "--out", str(tmp_path / "adapted")])
    assert code == 0
    predictions = [json.loads(x) for x in next((tmp_path / "adapted").rglob("predictions.jsonl")).read_text().splitlines()]
    assert len(predictions) == 2
