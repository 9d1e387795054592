"""The ``chat`` task builder: conversations rendered with the tokenizer's chat template.

A row is a conversation, either a ``messages`` column of ``{role, content}`` turns whose last turn
is the assistant's answer, or ``prompt`` / ``completion`` columns, read as one user turn and the
assistant's answer. The prompt is the tokenizer's chat template over the turns before the answer,
with the generation prompt (``apply_chat_template(turns, add_generation_prompt=True)``); the
answer is the assistant's content with EOS, so the loss is on the answer alone, as for every other
task. The tasks are generation tasks (one per file, like the ``dataset`` builder's): every method,
the evaluation and the token cache handle them as they handle those.

Example (YAML)::

    tasks:
      collection:
        - {path: data/chats/, builder: chat}     # one task per .jsonl file of {"messages": [...]}
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fmmeta.adaptation.task_files import (
    ADAPT_FORMATS,
    AdaptFormat,
    TaskFiles,
    TaskFormat,
    TaskTexts,
    UserTask,
    register_adapt_format,
)
from fmmeta.errors import UserInputError
from fmmeta.tasks.columns import column
from fmmeta.tasks.registry import SourceRows, TaskBuilder, register
from fmmeta.tasks.rows import GenerationRows, TaskRows

if TYPE_CHECKING:  # types only: a run on a built-in suite never imports datasets (fmmeta.tasks.data says why)
    import datasets


@dataclass(kw_only=True)
class ChatKeys:
    """chat: conversations rendered with the tokenizer's chat template, the last assistant turn the answer."""

    task_name: str | None = None
    """The task's name; null = the file's stem (or the hub id)."""
    messages_column: str = "messages"
    """The column of each row's turns, a list of {role, content}; the last one (the assistant's) is the answer."""
    prompt_column: str = "prompt"
    """Without a messages column: the user turn's column."""
    completion_column: str = "completion"
    """Without a messages column: the assistant's answer column."""


@dataclass(frozen=True, kw_only=True)
class ChatRows(GenerationRows):
    """Generation rows whose prompts are conversations (JSON lists of turns), rendered to text
    with the tokenizer's chat template when they are tokenized."""

    def prompt_texts(self, tokenizer: Any, a: int = 0, b: int | None = None) -> list[str]:
        """Rows ``a:b``'s turns through the chat template, ending in the assistant's turn opening.

        Raises:
            ValueError: the tokenizer has no chat template.
        """
        return render(tokenizer, self.prompts[a:b], where=f"task {self.name!r}")


def render(tokenizer: Any, prompts: list[str], *, where: str) -> list[str]:
    """Each prompt's turns (JSON) through the tokenizer's chat template, with the generation prompt.

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{where}: builder chat renders prompts with the tokenizer's chat template, but "
            f"{type(tokenizer).__name__} has none (chat_template is unset): use a chat model's tokenizer, "
            "or builder dataset with a template"
        )
    return [str(tokenizer.apply_chat_template(json.loads(p), add_generation_prompt=True, tokenize=False))
            for p in prompts]


def _turns(value: Any, i: int, where: str) -> tuple[list[dict[str, str]], str]:
    """A row's turns before the answer, and the answer (the last turn, the assistant's)."""
    fix = "each row's messages must be a list of {role, content} turns ending in the assistant's answer"
    if not isinstance(value, list) or len(value) < 2:
        raise ValueError(f"{where}: row {i} has {len(value) if isinstance(value, list) else value!r} "
                         f"turn(s): {fix} after at least one turn")
    turns = []
    for turn in value:
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not isinstance(turn.get("content"), str):
            raise ValueError(f"{where}: row {i} has the turn {turn!r}: {fix}")
        turns.append({"role": turn["role"], "content": turn["content"]})
    if turns[-1]["role"] != "assistant" or not turns[-1]["content"].strip():
        raise ValueError(f"{where}: row {i} ends with a {turns[-1]['role']!r} turn of content "
                         f"{turns[-1]['content']!r}: {fix}")
    return turns[:-1], turns[-1]["content"]


def _chat(ds: datasets.Dataset, keys: ChatKeys, common: SourceRows) -> list[TaskRows]:
    where = f"chat task {common.name!r}"
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so the task has no examples")
    if keys.messages_column in ds.column_names:
        pairs = [_turns(v, i, where) for i, v in enumerate(column(ds, keys.messages_column))]
    elif keys.prompt_column in ds.column_names and keys.completion_column in ds.column_names:
        pairs = []
        for i, (p, c) in enumerate(zip(column(ds, keys.prompt_column), column(ds, keys.completion_column))):
            pairs.append(_turns([{"role": "user", "content": p}, {"role": "assistant", "content": c}], i, where))
    else:
        raise ValueError(f"{where}: no {keys.messages_column!r} column and no {keys.prompt_column!r} + "
                         f"{keys.completion_column!r} columns; the rows have {list(ds.column_names)}: name "
                         "them with messages_column, or prompt_column and completion_column")
    return [ChatRows(name=common.name, family=common.family, spec=common.spec,
                     prompts=[json.dumps(t, ensure_ascii=False) for t, _ in pairs], answers=[a for _, a in pairs])]


def _chat_problems(source: Any, keys: ChatKeys) -> list[str]:
    """Keys the chat template makes moot: the prompt template, the answer template, class episodes."""
    problems = []
    if source.template is not None:
        problems.append(f"template={source.template!r} does not apply to builder chat (the tokenizer's chat "
                        "template renders the turns): remove it")
    if source.answer_template != " {answer}":
        problems.append(f"answer_template={source.answer_template!r} does not apply to builder chat (the "
                        "answer is the assistant's content): remove it")
    if source.ways is not None or source.remap_labels:
        problems.append("ways and remap_labels do not apply to builder chat (its tasks generate): remove them")
    return problems


# ------------------------------------------------------------------------------------------- adapt


def _user_turns(row: dict[str, Any], keys: ChatKeys, i: int, where: str) -> tuple[list[dict[str, str]], str | None]:
    """A user's row as turns and its answer (None: a query row without one), read with the format's
    columns: messages (ending in the assistant's answer, or in the user's turn to answer), or
    prompt and completion."""
    if row.get(keys.messages_column) is not None:  # a file of both layouts has None in the other's columns
        value = row[keys.messages_column]
        if isinstance(value, list) and value and isinstance(value[-1], dict) and value[-1].get("role") != "assistant":
            return _turns([*value, {"role": "assistant", "content": "?"}], i, where)[0], None
        return _turns(value, i, where)
    if row.get(keys.prompt_column) is not None:
        answer = row.get(keys.completion_column)
        turns = [{"role": "user", "content": row[keys.prompt_column]}, {"role": "assistant", "content": answer or "?"}]
        return _turns(turns, i, where)[0], answer if answer else None
    raise ValueError(f"{where}: row {i} has no {keys.messages_column!r} column and no {keys.prompt_column!r} column; "
                     f"it has {sorted(row)}: name them with --messages-column, or --prompt-column and "
                     "--completion-column")


def _adapt_answers(fmt: TaskFormat, rows: list[dict[str, Any]], required: bool, where: str) -> list[str | None]:
    if fmt.template is not None or fmt.answer_template not in (" {answer}", "{answer}"):  # "{answer}": as built
        raise UserInputError(f"{where}: template={fmt.template!r} and answer_template={fmt.answer_template!r} do "
                             "not apply to builder chat (the tokenizer's chat template renders the turns, and the "
                             "answer is the assistant's content): remove them")
    try:
        answers = [_user_turns(r, fmt.keys, i, where)[1] for i, r in enumerate(rows)]
    except ValueError as err:
        raise UserInputError(str(err)) from None
    missing = [i for i, a in enumerate(answers) if a is None]
    if required and missing:
        raise UserInputError(f"{where}: row {missing[0]} has no answer: every support row needs the assistant's "
                             f"answer (the last {fmt.keys.messages_column!r} turn, or the "
                             f"{fmt.keys.completion_column!r} column)")
    return answers


def _adapt_read(files: TaskFiles, support: list[dict[str, Any]], query: list[dict[str, Any]],
                answers: tuple[list[str | None], list[str | None]]) -> TaskTexts:
    where = f"task {files.name!r}"
    keys = files.format.keys
    prompts = tuple([json.dumps(_user_turns(r, keys, i, where)[0], ensure_ascii=False) for i, r in enumerate(rows)]
                    for rows in (support, query))
    return TaskTexts(files, support, (prompts[0], prompts[1]), answers, ())


def _adapt_prompts(texts: TaskTexts, tokenizer: Any) -> tuple[list[str], list[str]]:
    try:
        where = f"task {texts.files.name!r}"
        return render(tokenizer, texts.prompts[0], where=where), render(tokenizer, texts.prompts[1], where=where)
    except ValueError as err:
        raise UserInputError(str(err)) from None


def _adapt_build(texts: TaskTexts, s_ids: list[list[int]], q_ids: list[list[int]], tokenizer: Any,
                 max_length: int, sep: tuple[int, ...]) -> UserTask:
    """A generation task whose answers are the assistant's content as written (no answer template)."""
    plain = dataclasses.replace(texts.files.format, answer_template="{answer}")
    texts = dataclasses.replace(texts, files=dataclasses.replace(texts.files, format=plain))
    return ADAPT_FORMATS["generation"].build(texts, s_ids, q_ids, tokenizer, max_length, sep)


CHAT_FILES = register_adapt_format(AdaptFormat(
    name="chat", answers=_adapt_answers, read=_adapt_read, build=_adapt_build, prompt_texts=_adapt_prompts,
))
CHAT = register(TaskBuilder(
    name="chat", summary="conversations through the tokenizer's chat template, one task per file",
    section=ChatKeys, rows=_chat, check=_chat_problems, one_task_per_file=True, adapt="chat",
))

__all__ = ["CHAT", "CHAT_FILES", "ChatKeys", "ChatRows", "render"]
