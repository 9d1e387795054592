"""The ``chat`` builder (fmmeta/tasks/chat.py): conversations through the tokenizer's chat template,
answer-only loss on the assistant's turn, from a YAML collection and from adapt's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fmmeta.adaptation.task_files import TaskFiles, TaskFormat, build_task
from fmmeta.config import ConfigError, load_config
from fmmeta.errors import UserInputError
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.config import build_task_set
from fmmeta.tasks.generation import GenerationTask
from fmmeta.tasks.testing import tiny_tokenizer
from fmmeta.tasks.tokens import encode

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
"""A small Jinja chat template: each turn on its line after its role, then the assistant's opening."""


def _chat_tokenizer():  # type: ignore[no-untyped-def]
    tok = tiny_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _messages(n: int, k: int) -> list[dict]:
    return [{"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i}+{k}"},
                          {"role": "assistant", "content": str(i + k)}]} for i in range(n)]


def _data(tmp_path: Path) -> Path:
    folder = tmp_path / "chats"
    for k in (1, 2, 3, 4):
        _jsonl(folder / f"add{k}.jsonl", _messages(6, k))
    _jsonl(folder / "echo.jsonl", [{"prompt": f"say {i}", "completion": f"word{i}"} for i in range(6)])
    return folder


def _config(tmp_path: Path, **keys: object) -> RecipeConfig:
    raw = {"model": {"tiny": True, "tokenizer": "bytes"},
           "tasks": {"cache_dir": str(tmp_path / "cache"), "max_length": 64,
                     "collection": [{"path": str(_data(tmp_path)), "builder": "chat", "shots": 2, "query": 2, **keys}],
                     "split": {"held_out": ["add4"], "validation": ["echo"]}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(RecipeConfig, tmp_path / "c.yaml", [])


def test_a_chat_collection_renders_the_template_and_answers_with_the_assistant_turn(tmp_path: Path) -> None:
    tok = _chat_tokenizer()
    cfg = _config(tmp_path)
    for suite in (build_task_set(cfg.tasks, tok), build_task_set(cfg.tasks, tok)):  # fresh, then the cache
        assert suite.names() == {"meta_train": ["add1", "add2", "add3"], "validation": ["echo"], "held_out": ["add4"]}
        tasks = {t.name: t for t in (*suite.meta_train, *suite.validation, *suite.held_out)}
        assert all(isinstance(t, GenerationTask) for t in tasks.values())
        turns = [{"role": "system", "content": "Add."}, {"role": "user", "content": "3+2"}]
        rendered = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        assert rendered == "<|system|>Add.\n<|user|>3+2\n<|assistant|>"
        example = tasks["add2"].examples[3]
        assert list(example.prompt_ids) == encode(tok, [rendered])[0]
        assert list(example.answer_ids) == encode(tok, ["5"])[0] + [tok.eos_token_id]  # the answer alone is scored
        echo = tasks["echo"].examples[1]  # prompt / completion: a user turn and the assistant's answer
        assert tok.decode(echo.prompt_ids) == "<|user|>say 1\n<|assistant|>"
        assert tok.decode(echo.answer_ids) == "word1</s>"


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"chat template, but \w+ has none \(chat_template is unset\)"):
        build_task_set(_config(tmp_path).tasks, tiny_tokenizer())


@pytest.mark.parametrize("keys, match", [
    ({"text_column": "q"}, "text_column='q' does not apply to builder='chat' (only to classification)"),
    ({"template": "Q: {x}"}, "template='Q: {x}' does not apply to builder chat"),
    ({"output_column": "a"}, "output_column='a' does not apply to builder='chat' (only to task_column / dataset)"),
])  # fmt: skip
def test_a_chat_source_with_another_builders_key_is_refused(tmp_path: Path, keys: dict, match: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, **keys)
    assert match in str(err.value)


def test_a_row_that_does_not_end_with_the_assistant_is_refused(tmp_path: Path) -> None:
    _jsonl(_data(tmp_path) / "bad.jsonl", [{"messages": [{"role": "user", "content": "1+1"}]}] * 6)
    with pytest.raises(ConfigError, match="row 0 has 1 turn"):
        _config(tmp_path)


def test_adapt_reads_a_chat_file_as_the_collection_does(tmp_path: Path) -> None:
    tok = _chat_tokenizer()
    support = _jsonl(tmp_path / "s.jsonl", _messages(4, 2))
    query = _jsonl(tmp_path / "q.jsonl", [{"messages": [{"role": "user", "content": "7+2"}]},
                                          {"prompt": "8+2", "completion": "10"}])
    task = build_task(TaskFiles("add2", support, query, TaskFormat().replace(builder="chat")), tok, max_length=64)
    assert not task.is_classification and task.query_known == (False, True)
    rendered = tok.apply_chat_template([{"role": "system", "content": "Add."}, {"role": "user", "content": "3+2"}],
                                       add_generation_prompt=True, tokenize=False)
    assert list(task.episode.support[3].prompt_ids) == encode(tok, [rendered])[0]
    assert list(task.episode.support[3].answer_ids) == encode(tok, ["5"])[0] + [tok.eos_token_id]
    assert tok.decode(task.episode.query[0].prompt_ids) == "<|user|>7+2\n<|assistant|>"
    assert tok.decode(task.episode.query[1].answer_ids) == "10</s>"
    with pytest.raises(UserInputError, match="chat template"):
        build_task(TaskFiles("add2", support, query, TaskFormat(builder="chat")), tiny_tokenizer(), max_length=64)


def test_adapt_reads_chat_files_with_the_columns_its_format_names(tmp_path: Path) -> None:
    tok = _chat_tokenizer()
    turns = [{"turns": row["messages"]} for row in _messages(4, 2)]
    support = _jsonl(tmp_path / "s.jsonl", turns)
    query = _jsonl(tmp_path / "q.jsonl", [{"turns": [{"role": "user", "content": "7+2"}]}, {"q": "8+2", "a": "10"}])
    fmt = TaskFormat().replace(builder="chat", messages_column="turns", prompt_column="q", completion_column="a")
    task = build_task(TaskFiles("add2", support, query, fmt), tok, max_length=64)
    assert task.query_known == (False, True)
    assert tok.decode(task.episode.support[3].answer_ids) == "5</s>"
    assert tok.decode(task.episode.query[0].prompt_ids) == "<|user|>7+2\n<|assistant|>"
    assert tok.decode(task.episode.query[1].answer_ids) == "10</s>"
    with pytest.raises(UserInputError, match="row 0 has no 'messages' column and no 'prompt' column.*--messages-column"):
        build_task(TaskFiles("add2", support, query, TaskFormat(builder="chat")), tok, max_length=64)


def test_adapt_reads_a_chat_source_with_its_columns(tmp_path: Path) -> None:
    from fmmeta.tasks.collection_config import CollectionSource

    fmt = TaskFormat.from_source(CollectionSource(path=str(tmp_path), builder="chat", messages_column="turns",
                                                  task_name="adds"))
    assert (fmt.builder, fmt.keys.messages_column, fmt.keys.prompt_column) == ("chat", "turns", "prompt")
    assert fmt.keys.task_name is None  # the source's name, not the user's task's
    support = _jsonl(tmp_path / "s.jsonl", [{"turns": row["messages"]} for row in _messages(2, 1)])
    task = build_task(TaskFiles("add1", support, None, fmt), _chat_tokenizer(), max_length=64)
    assert len(task.episode.support) == 2


def test_adapt_refuses_a_template_for_chat(tmp_path: Path) -> None:
    support = _jsonl(tmp_path / "s.jsonl", _messages(2, 1))
    with pytest.raises(UserInputError, match="do not apply to builder chat"):
        build_task(TaskFiles("t", support, None, TaskFormat(builder="chat", template="Q: {x}")), _chat_tokenizer(),
                   max_length=64)
