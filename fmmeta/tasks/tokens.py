"""Text to token ids, once: the tokenizer helpers and input checks both task types share.

Everything here is about turning texts into ids that fit a token budget (``max_length``) and
refusing text that cannot become an example; nothing here knows about episodes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

logger = logging.getLogger(__name__)

OnTooLong = Literal["drop", "error"]
ON_TOO_LONG = ("drop", "error")


def ensure_pad_token(tokenizer: Any) -> int:
    """Gives ``tokenizer`` a pad token if it has none (EOS reused) and returns the pad id.

    Many causal-LM tokenizers (Llama, GPT-2) ship without a pad token. Padding is never labelled
    (see :func:`fmmeta.tasks.episode.collate`), so reusing EOS as pad is safe and keeps the
    vocabulary (and the model's embedding matrix) unchanged. A tokenizer with neither is refused:
    adding a new ``<pad>`` would need the model's embeddings resized, which nothing here does.

    Args:
        tokenizer: a Hugging Face tokenizer; modified in place.

    Returns:
        The pad token id.

    Raises:
        ValueError: if the tokenizer has neither a pad nor an EOS token.
    """
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token is None:
        raise ValueError(
            "the tokenizer has neither a pad nor an eos token; use a tokenizer that defines one"
        )
    tokenizer.pad_token = tokenizer.eos_token
    logger.info("tokenizer has no pad token: using its EOS token %r as pad", tokenizer.eos_token)
    # Setting pad_token sets pad_token_id; mypy still narrows it to the None tested above.
    return int(tokenizer.pad_token_id)  # type: ignore[call-overload]


def as_ids(seq: Sequence[int]) -> tuple[int, ...]:
    """Token ids as a tuple of Python ints (fast path for the lists tokenizers return)."""
    if isinstance(seq, tuple):
        return seq
    if isinstance(seq, list):
        return tuple(seq)
    return tuple(map(int, seq))  # numpy arrays, tensors: plain ints hash and compare cheaply


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """The EOS id appended to every answer, or nothing for a tokenizer without one."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return () if eos is None else (int(eos),)


def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Batch-encodes ``texts`` without special tokens (fast tokenizers run this in Rust).

    A fast tokenizer whose backend neither truncates nor pads is called directly: the same ids
    as ``tokenizer(texts)``, without building a ``BatchEncoding`` (a third of the time on a
    million short texts).
    """
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.truncation is None and backend.padding is None:
        return [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]
    return list(tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def check_texts(values: Sequence[Any], *, key: str, where: str) -> None:
    """Raises if any value is None, not a string, or empty after stripping whitespace.

    Args:
        values: the texts to check.
        key: what the values are (a column name, ``"prompt"``), named in the error.
        where: the task or dataset they belong to, named in the error.

    Raises:
        ValueError: naming the first bad row, its value and the fix.
    """
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is empty: every {key} must be non-empty text; "
                f"filter such rows first (e.g. dataset.filter(lambda r: r[{key!r}])) "
            )
        if not isinstance(v, str):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} has type {type(v).__name__}: {key} must be str; "
                "convert it (or name the right column)"
            )


def fit_prompt(prompt: Sequence[int], answer_len: int, max_length: int) -> Sequence[int] | None:
    """Left-truncates ``prompt`` so prompt + answer fit ``max_length``; None if the answer can't."""
    room = max_length - answer_len
    if room < 1:  # a causal LM needs at least one prompt token to predict the first answer token
        return None
    return prompt[-room:] if len(prompt) > room else prompt


def too_long_error(where: str, i: int, answer_len: int, max_length: int) -> ValueError:
    """The refusal of example ``i`` whose answer leaves no room for a prompt token."""
    return ValueError(
        f"{where}: example {i} has an answer of {answer_len} tokens (EOS included) but "
        f"max_length={max_length} leaves no room for it plus one prompt token: raise max_length "
        f"to at least {answer_len + 1}, shorten the answer, or pass on_too_long='drop'"
    )


def budget_problems(max_length: Any, on_too_long: Any) -> list[str]:
    """What is wrong with a token budget and its overflow rule (empty when both are valid)."""
    problems = []
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        problems.append(
            f"max_length={max_length!r} is invalid: it must be an int >= 2 (tokens per example: "
            "at least one prompt token plus the answer)"
        )
    if on_too_long not in ON_TOO_LONG:
        problems.append(
            f"on_too_long={on_too_long!r} is invalid: use 'drop' (skip and count such examples) "
            "or 'error'"
        )
    return problems


def check_budget(max_length: int, on_too_long: str) -> None:
    """Raises the first of :func:`budget_problems`, before any example is fitted."""
    problems = budget_problems(max_length, on_too_long)
    if problems:
        raise ValueError(problems[0])


def check_nonempty_ids(where: str, i: int, ids: Sequence[int], text: str | None) -> None:
    """Refuses prompt ``i`` when it tokenizes to nothing (quoting its text when known)."""
    if not len(ids):
        shown = f"={text!r}" if text is not None else ""
        raise ValueError(f"{where}: prompt[{i}]{shown} tokenizes to no tokens: give it visible text")


def check_rows(
    where: str, prompt_lengths: np.ndarray, fits: np.ndarray | None, answer_lengths: np.ndarray,
    max_length: int, prompt_texts: Sequence[str] | None = None,
) -> None:
    """Refuses the first row, in order, whose prompt is empty or (where ``fits`` is given, i.e.
    ``on_too_long="error"``) whose answer leaves no room for a prompt token.

    Raises:
        ValueError: :func:`check_nonempty_ids`'s or :func:`too_long_error`'s, for that row.
    """
    bad = prompt_lengths == 0
    if fits is not None:
        bad = bad | ~fits
    if not bad.any():
        return
    i = int(np.argmax(bad))
    if prompt_lengths[i] == 0:
        check_nonempty_ids(where, i, (), prompt_texts[i] if prompt_texts is not None else None)
    raise too_long_error(where, i, int(answer_lengths[i]), max_length)


def log_cut(where: str, cut: int, total: int, max_length: int, *, shortest: int = 0, tail_tokens: int = 0) -> None:
    """One warning per task for the prompts cut from the left to fit ``max_length``: their opening
    tokens (the template's start, often the instruction or the text itself) are gone, which the
    run must say rather than train on quietly.

    A cut prompt keeps its last ``shortest`` tokens or more; where that is no more than the
    template's fixed ending (``tail_tokens``, e.g. ``"\nSentiment:"``), none of the row's own
    text is left and every such row reads the same: that is refused, not warned.

    Raises:
        ValueError: naming the task, the lengths and the fix.
    """
    if cut and tail_tokens and shortest <= tail_tokens:
        raise ValueError(
            f"{where}: {cut} of {total} prompts are cut to {shortest} tokens to fit max_length={max_length}, "
            f"which is no more than the template's fixed ending ({tail_tokens} tokens): none of those rows' "
            f"own text is left. Raise max_length well above {max_length - shortest + tail_tokens}, or "
            "shorten the template's ending or the answers"
        )
    if cut:
        logger.warning(
            "%s: cut %d of %d prompts from the left to fit max_length=%d (their opening tokens are "
            "lost): raise tasks.max_length to keep them", where, cut, total, max_length,
        )


def log_dropped(where: str, dropped: int, total: int, max_length: int) -> None:
    """One warning per task for the examples ``on_too_long="drop"`` left out."""
    if dropped:
        logger.warning(
            "%s: dropped %d of %d examples whose answer does not fit max_length=%d",
            where, dropped, total, max_length,
        )  # fmt: skip


__all__ = [
    "ON_TOO_LONG",
    "OnTooLong",
    "as_ids",
    "budget_problems",
    "check_budget",
    "check_nonempty_ids",
    "check_rows",
    "check_texts",
    "encode",
    "ensure_pad_token",
    "eos_ids",
    "fit_prompt",
    "log_cut",
    "log_dropped",
    "too_long_error",
]
