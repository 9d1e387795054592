"""Multiple-choice rows: questions, their own options and the gold option, read from any layout.

Public multiple-choice datasets store the same thing in many shapes, and this module reads them
all without a preprocessing script:

* options in one **list** column (HellaSwag's ``endings``, MMLU's ``choices``), in one **dict**
  column of ``text`` and ``label`` lists (ARC, OpenBookQA, CommonsenseQA), or in **several
  columns** (PIQA's ``sol1``/``sol2``, WinoGrande's ``option1``/``option2``, SciQ's
  ``correct_answer`` and ``distractor1..3``);
* the answer as a 0-based **index** (``0`` or ``"0"``), a 1-based **number** (``"1"``), a
  **letter** (``"B"``), a **key** of the dict column's ``label`` list (ARC's ``answerKey``, which
  is a letter on some rows and a digit on others), or the option's **text** (SciQ).

``answer_format: auto`` reads what is unambiguous (a dict column's key, an int index, an option's
text, a capital letter) and refuses what reads two ways, naming both: a digit string, which
datasets use both 0-based (HellaSwag) and 1-based (WinoGrande, Social IQa); integer answers that
are never 0 (1, 2, 3 over four options is 1-based as likely as not); a letter that is also an
option's text at another place (``"A"`` among options ``["C", "A", "B"]``). Whatever the format,
a key two options share, or a text that matches two options once spaces are stripped, is refused. The prompt is a template over the
row's columns plus ``{options}``, the options as lettered lines, for prompts that show them
(lm-eval-harness scores MMLU both ways); an option's answer text is ``answer_template`` with
``{answer}`` (the option's text) and ``{letter}`` (its letter).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from fmmeta.tasks.columns import column, draw_rows, render, require_columns, template_fields, template_tail
from fmmeta.tasks.spec import EpisodeSpec

if TYPE_CHECKING:  # types only: a run on a built-in suite never imports datasets (fmmeta.tasks.data says why)
    import datasets


AnswerFormat = Literal["auto", "index", "number", "letter", "key", "text"]
ANSWER_FORMATS: tuple[str, ...] = ("auto", "index", "number", "letter", "key", "text")
LETTERS = string.ascii_uppercase
OPTIONS_FIELD = "options"
"""The template field that shows a question's options as lettered lines ("A. ...")."""


@dataclass(frozen=True, kw_only=True)
class MultipleChoiceRows:
    """One multiple-choice task's checked texts: everything a
    :class:`~fmmeta.tasks.multiple_choice.MultipleChoiceTask` needs but the tokenizer.

    Attributes:
        name: the task's unique name.
        family: task family; "" means ``name``.
        spec: episode shape (shots, query).
        prompts: rendered prompt of each question.
        options: each question's option answers (answer template applied).
        labels: each question's gold option index.
        template_tail: the prompt template's fixed ending (a cut may not keep only that).
    """

    name: str
    family: str
    spec: EpisodeSpec
    prompts: list[str]
    options: list[list[str]]
    labels: list[int]
    template_tail: str = ""
    KIND: ClassVar[str] = "multiple_choice"
    """The kind of task these rows make (what the token cache stores and restores)."""

    def prompt_texts(self, tokenizer: Any, a: int = 0, b: int | None = None) -> list[str]:
        """Rows ``a:b``'s prompts as the text to tokenize (a builder's rows may render them with
        the tokenizer, e.g. its chat template)."""
        return self.prompts[a:b]

    def subsample(self, max_examples: int | None, rng: np.random.Generator) -> MultipleChoiceRows:
        """At most ``max_examples`` questions, drawn by ``rng`` in their original order."""
        keep = draw_rows(len(self.prompts), max_examples, rng)
        if keep is None:
            return self
        return dataclasses.replace(
            self, prompts=[self.prompts[i] for i in keep], options=[self.options[i] for i in keep],
            labels=[self.labels[i] for i in keep],
        )  # fmt: skip


def multiple_choice_rows(
    ds: datasets.Dataset,
    *,
    name: str,
    spec: EpisodeSpec,
    template: str | None,
    options_column: str | None = None,
    option_columns: Sequence[str] | None = None,
    label_column: str = "label",
    answer_format: AnswerFormat = "auto",
    answer_template: str = " {answer}",
    family: str = "",
    where: str | None = None,
) -> MultipleChoiceRows:
    """Reads one multiple-choice task from ``ds`` (see the module docstring for the layouts).

    Raises:
        ValueError: naming the key or the row: no template, neither or both option keys, a missing
            column, a row with fewer than 2 options or an empty one, an answer that is not among
            its row's options, or a digit-string answer under ``answer_format: auto``.
    """
    where = where or f"multiple_choice task {name!r}"
    if template is None:
        raise ValueError(
            f"{where}: template is missing: a multiple-choice task needs a prompt template over its "
            "columns, e.g. 'Question: {question}\\nAnswer:' (add {options} to show the options)"
        )
    if (options_column is None) == (not option_columns):
        raise ValueError(
            f"{where}: give exactly one of options_column (one list or {{text, label}} column) and "
            "option_columns (a list of columns, one option each)"
        )
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"{where}: answer_format={answer_format!r} is invalid: choose one of {list(ANSWER_FORMATS)}")
    named = template_fields(template, key="template")
    fields = [f for f in named if f != OPTIONS_FIELD]
    option_cols = [options_column] if options_column is not None else list(option_columns or ())
    require_columns(ds, [*fields, *option_cols, label_column], where=where)
    if len(ds) == 0:
        raise ValueError(f"{where}: the dataset has no rows, so the task has no questions")
    texts, keys = _row_options(ds, options_column, option_cols, where=where)
    answers = column(ds, label_column)
    check_answer_column(answers, answer_format, where=f"{where}: {label_column}")
    labels = [gold_index(answers[i], texts[i], keys[i], answer_format, where=f"{where}: row {i} ({label_column})")
              for i in range(len(ds))]
    shown = {OPTIONS_FIELD: [lettered(t) for t in texts]} if OPTIONS_FIELD in named else {}
    prompts = render(template, {**{f: column(ds, f) for f in fields}, **shown}, len(ds), where=where)
    options = [option_answers(row, answer_template) for row in texts]
    return MultipleChoiceRows(name=name, family=family, spec=spec, prompts=prompts, options=options, labels=labels,
                              template_tail=template_tail(template))


def _row_options(ds: datasets.Dataset, options_column: str | None, option_cols: list[str], *, where: str
                 ) -> tuple[list[list[str]], list[list[str] | None]]:
    """(option texts, keys of a dict column or None) of every row, checked."""
    if options_column is None:
        cols = [column(ds, c) for c in option_cols]
        raw: list[Any] = [[col[i] for col in cols] for i in range(len(ds))]
    else:
        raw = column(ds, options_column)
    read = [question_options(value, where=f"{where}: row {i}") for i, value in enumerate(raw)]
    return [t for t, _ in read], [k for _, k in read]


def question_options(value: Any, *, where: str) -> tuple[list[str], list[str] | None]:
    """One question's (option texts, keys of a ``{text, label}`` value or None), checked: a list of
    options, or a dict of ``text`` and ``label`` lists like ARC's."""
    key_list: list[str] | None = None
    if isinstance(value, dict):
        if "text" not in value:
            raise ValueError(f"{where}: its options are a dict without 'text' (keys {sorted(value)}): point "
                             "options_column at a list, or a {text, label} column like ARC's")
        key_list = [str(k) for k in value.get("label") or []] or None
        value = value["text"]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: its options {value!r} are not a list")
    row = [o if isinstance(o, str) else ("" if o is None else str(o)) for o in value]
    if not 2 <= len(row) <= len(LETTERS) or any(not o.strip() for o in row):
        raise ValueError(f"{where} has options {row!r}: a question needs 2 to 26 non-empty options; filter such "
                         "rows first")
    if key_list is not None and len(key_list) != len(row):
        raise ValueError(f"{where} has {len(row)} options but {len(key_list)} labels {key_list}")
    if key_list is not None and len(set(key_list)) < len(key_list):
        twice = sorted({k for k in key_list if key_list.count(k) > 1})
        raise ValueError(f"{where} has option labels {key_list}: {twice} name more than one option, so an answer "
                         "naming one could mean either; give each option its own label")
    return row, key_list


def check_answer_column(values: Sequence[Any], answer_format: str, *, where: str) -> None:
    """Refuses an answer column ``auto`` would read one way where it reads two: integers that are
    never 0, which may as well be 1-based.

    Raises:
        ValueError: naming both readings and the setting that picks one.
    """
    given = [v for v in values if v is not None]
    ints = [v for v in given if isinstance(v, int) and not isinstance(v, bool)]
    if answer_format != "auto" or not ints or len(ints) != len(given) or min(ints) < 1:
        return
    raise ValueError(
        f"{where}: the answers are integers from {min(ints)} to {max(ints)} and never 0, which reads two ways: "
        f"0-based (answer {min(ints)} is option {LETTERS[min(ints)] if min(ints) < len(LETTERS) else min(ints)}) or "
        f"1-based (answer {min(ints)} is option {LETTERS[min(ints) - 1] if min(ints) <= len(LETTERS) else min(ints)}): "
        "set answer_format to index (0-based) or number (1-based)")


def gold_index(value: Any, texts: list[str], keys: list[str] | None, fmt: str, *, where: str) -> int:
    """The index of the gold option that ``value`` names under ``fmt`` (see the module docstring).

    Raises:
        ValueError: naming the row, where ``value`` is none of its options.
    """
    if fmt == "auto":
        fmt = _auto_format(value, texts, keys, where=where)
    index: int | None = None
    if fmt == "index" or fmt == "number":
        whole = value if isinstance(value, int) and not isinstance(value, bool) else (
            int(value.strip()) if isinstance(value, str) and value.strip().isdigit() else None)
        index = None if whole is None else whole - (fmt == "number")
    elif fmt == "letter" and isinstance(value, str) and len(value.strip()) == 1:
        index = LETTERS.find(value.strip().upper())
    elif fmt == "key" and keys is not None:
        index = keys.index(str(value)) if str(value) in keys else None
    elif fmt == "text":
        index = _text_index(str(value), texts, where=where)
    if index is None or not 0 <= index < len(texts):
        shown = texts if len(texts) <= 6 else [*texts[:6], "..."]
        raise ValueError(
            f"{where}: the answer {value!r} is not one of the row's {len(texts)} options {shown}"
            f" read as answer_format={fmt!r}" + (f" (keys {keys})" if keys else "")
            + ": fix the row, or set answer_format to index, number, letter, key or text"
        )
    return index


def _text_index(value: str, texts: list[str], *, where: str) -> int | None:
    """The option whose text is ``value``: the one equal to it, else the one equal once spaces are
    stripped; refused where that is several (``"yes"`` among ``["yes ", "no", " yes"]``)."""
    exact = [j for j, t in enumerate(texts) if t == value]
    if len(exact) == 1:
        return exact[0]
    stripped = [j for j, t in enumerate(texts) if t.strip() == value.strip()]
    if len(stripped) > 1:
        raise ValueError(f"{where}: the answer {value!r} is the text of options {[texts[j] for j in stripped]} "
                         f"(at {[LETTERS[j] for j in stripped]}) once spaces are stripped: make the options differ "
                         "by more than spaces, or give the answer as an index")
    return stripped[0] if stripped else None


def _auto_format(value: Any, texts: list[str], keys: list[str] | None, *, where: str) -> str:
    """What ``answer_format: auto`` reads ``value`` as; a digit string, or a letter that is also
    an option's text at another place, reads two ways and is refused."""
    if keys is not None:
        return "key"
    if isinstance(value, int) and not isinstance(value, bool):
        return "index"
    if isinstance(value, str) and value.strip() in [t.strip() for t in texts]:
        letter = value.strip().upper()
        at = _text_index(value, texts, where=where)
        if len(value.strip()) == 1 and letter in LETTERS and at is not None and LETTERS.find(letter) != at:
            raise ValueError(
                f"{where}: the answer {value!r} reads two ways: as a letter it is option {letter} "
                f"({texts[LETTERS.find(letter)]!r}), as text it is option {LETTERS[at]} ({texts[at]!r}): set "
                "answer_format to letter or text")
        return "text"
    if isinstance(value, str) and value.strip().isdigit():
        raise ValueError(
            f"{where}: the answer {value!r} is a digit string, which datasets write 0-based (HellaSwag) "
            "and 1-based (WinoGrande, Social IQa): set answer_format to index (0-based) or number (1-based)"
        )
    if isinstance(value, str) and len(value.strip()) == 1 and value.strip() in LETTERS:
        return "letter"
    return "text"  # not among the options: gold_index names the row


def lettered(texts: Sequence[str]) -> str:
    """A question's options as lines ``A. first``, ``B. second``... for prompts that show them."""
    return "\n".join(f"{LETTERS[j]}. {t}" for j, t in enumerate(texts))


def option_answers(texts: Sequence[str], answer_template: str) -> list[str]:
    """A question's options as answer texts: ``answer_template`` with ``{answer}`` and ``{letter}``."""
    return [answer_template.format(answer=t, letter=LETTERS[j]) for j, t in enumerate(texts)]


__all__ = ["ANSWER_FORMATS", "LETTERS", "OPTIONS_FIELD", "AnswerFormat", "MultipleChoiceRows", "check_answer_column",
           "gold_index",
           "lettered", "multiple_choice_rows", "option_answers", "question_options"]
