"""Reading a ``datasets.Dataset`` for the builders: columns, templates, and checks on their values.

Every check here runs before anything is tokenized and raises one ``ValueError`` naming the
column, the row, the value and the fix.
"""

from __future__ import annotations

import difflib
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # types only: a run on a built-in suite never imports datasets (fmmeta.tasks.data says why)
    import datasets


def template_fields(template: str, *, key: str) -> list[str]:
    """Column names a ``str.format`` template refers to."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"{key}={template!r} is not a valid format string: {err}") from err
    for _, field_name, format_spec, conversion in parsed:
        if field_name is None:
            continue
        base = field_name.split(".")[0].split("[")[0]
        if not base or base.isdigit():
            raise ValueError(
                f"{key}={template!r} has a positional field {{{field_name}}}: name the column, "
                "e.g. '{text}'"
            )
        if field_name != base or format_spec or conversion:
            # A format spec runs on every row before any check ({text:>300000000} padded each row to
            # 300 MB until the kernel killed the run), and attribute or index access reads past the value.
            whole = field_name + (f"!{conversion}" if conversion else "") + (f":{format_spec}" if format_spec else "")
            raise ValueError(
                f"{key}={template!r} has the field {{{whole}}}: templates take plain column names only "
                f"(no format spec, conversion, attribute or index): write {{{base}}}"
            )
        if base not in fields:
            fields.append(base)
    if not fields:
        raise ValueError(
            f"{key}={template!r} refers to no column ('{{{{' and '}}}}' are escaped braces, "
            "printed as they are), so every prompt would be the same text: name the column in "
            "single braces, e.g. 'Review: {text}'"
        )
    return fields


def answer_template_problem(template: str, *, multiple_choice: bool, key: str = "answer_template") -> str | None:
    """What is wrong with an answer template, or None: it may name ``{answer}`` (the label word,
    output or option) and, for multiple choice, ``{letter}``; any other field would fail on the
    first row (a ``KeyError`` after the model loaded)."""
    allowed = ("answer", "letter") if multiple_choice else ("answer",)
    try:
        fields = template_fields(template, key=key)
    except ValueError as err:
        if "refers to no column" in str(err):
            return f"{key}={template!r} names no field, so every answer would be the same text: include {{answer}}"
        return str(err)
    unknown = [f for f in fields if f not in allowed]
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        return (f"{key}={template!r} names {{{unknown[0]}}}: an answer template takes "
                + " and ".join(f"{{{a}}}" for a in allowed) + (f" (did you mean {{{close[0]}}}?)" if close else ""))
    return None


def template_tail(template: str) -> str:
    """The fixed text after a template's last field (``"\nSentiment:"`` of
    ``"Review: {text}\nSentiment:"``): what a prompt cut from the left keeps longest."""
    parsed = list(string.Formatter().parse(template))
    return parsed[-1][0] if parsed and parsed[-1][1] is None else ""


def column(ds: datasets.Dataset, name: str) -> list[Any]:
    """A whole column as a list, read in one slice (iterating a column formats row by row, about
    100x slower on a million rows)."""
    return list(ds[name][:])


def require_columns(ds: datasets.Dataset, columns: Iterable[str], *, where: str) -> None:
    """Raises if ``ds`` lacks any of ``columns``, listing the columns it has."""
    existing = list(ds.column_names)
    missing = [c for c in dict.fromkeys(columns) if c not in existing]
    if missing:
        raise ValueError(
            f"{where}: column(s) {missing} not found; the dataset has columns {existing}: "
            "pass the right column name(s) or rename the columns"
        )


def render(template: str, cols: Mapping[str, list[Any]], n: int, *, where: str) -> list[str]:
    """Formats ``template`` for each of ``n`` rows, after checking referenced values."""
    for name, values in cols.items():
        for i, v in enumerate(values):
            if v is None or (isinstance(v, str) and not v.strip()):
                raise ValueError(
                    f"{where}: column {name!r} row {i} is {v!r}: every referenced text must be "
                    f"non-empty; filter such rows first (dataset.filter(lambda r: r[{name!r}]))"
                )
            if isinstance(v, (list, tuple, dict)):  # its Python repr would be the prompt's text
                raise ValueError(
                    f"{where}: column {name!r} row {i} is a {type(v).__name__} ({str(v)[:60]}), not text: a "
                    f"template field must be a string or a number; join the values into one string first "
                    f"(dataset.map), or, for a question's options, use builder multiple_choice and {{options}}"
                )
    names = list(cols)
    return [template.format(**{c: cols[c][i] for c in names}) for i in range(n)]


def check_present(values: Sequence[Any], *, key: str, where: str) -> None:
    """Raises on None, blank or non-scalar values; numbers pass (CSV files read "1" as an int).
    A list or an object would otherwise become its Python repr in the answer text."""
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is empty: every {key} must be non-empty; "
                f"filter such rows first (dataset.filter(lambda r: r[{key!r}]))"
            )
        if isinstance(v, (list, tuple, dict)):
            raise ValueError(
                f"{where}: {key}[{i}]={v!r} is a {type(v).__name__}, not one answer text: make each "
                f"row's {key!r} a single string (e.g. keep the first of several reference answers)"
            )


def draw_rows(n: int, max_examples: int | None, rng: np.random.Generator) -> list[int] | None:
    """Sorted indices of ``max_examples`` of ``n`` rows drawn by ``rng``; None keeps them all."""
    if max_examples is None or n <= max_examples:
        return None
    return np.sort(rng.choice(n, size=max_examples, replace=False)).tolist()


def resolve_template(template: str | None, input_column: str) -> str:
    """``template``, or the bare input column when none is given."""
    return template if template is not None else "{" + input_column + "}"


__all__ = ["check_present", "column", "draw_rows", "render", "template_tail", "require_columns", "resolve_template", "template_fields"]
