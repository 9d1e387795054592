"""A user's new task, from a support file and a query file, as the episode the evaluation adapts on.

A meta-trained adapter meets its user's task the way it met a held-out task in evaluation: as an
:class:`~fmmeta.tasks.episode.Episode`, support examples to adapt on and query examples to score.
Here the rows come from the user's files (any format :func:`~fmmeta.tasks.data.read_dataset`
reads) and become examples through the same options a YAML task source takes (``builder``,
``template``, ``answer_template`` and the builder's own keys: :mod:`.task_format`) and the same tokenization rules as the task builders
(answer words with EOS, prompts cut from the left to ``tasks.max_length``), so an example of a
held-out task written out as text comes back as the very token ids the evaluation scored.

Query labels are read only to report accuracy and loss: they are never part of the support, so
they never reach adaptation.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fmmeta.adaptation.task_format import TaskFormat, adapt_builders, describe_source
from fmmeta.errors import UserInputError
from fmmeta.tasks.choice_rows import (
    OPTIONS_FIELD,
    check_answer_column,
    gold_index,
    lettered,
    option_answers,
    question_options,
)
from fmmeta.tasks.classification import answer_word_ids
from fmmeta.tasks.columns import answer_template_problem, column, render, resolve_template, template_fields
from fmmeta.tasks.episode import Episode, Example
from fmmeta.tasks.registry import task_builder
from fmmeta.tasks.tokens import encode, eos_ids

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskFiles:
    """One task of a call: its name, its support and query files and its format."""

    name: str
    support: Path | Sequence[Mapping[str, Any]]
    query: Path | Sequence[Mapping[str, Any]] | None
    format: TaskFormat = field(default_factory=TaskFormat)


@dataclass(frozen=True)
class UserTask:
    """A user's task tokenized: the episode to adapt on, and what predictions need.

    Attributes:
        episode: support (labelled) and query examples; a query without a known answer has the
            longest candidate (classification) or no tokens (generation) as its answer.
        labels: classification's label words (``episode.choices`` in order); empty for generation.
        query_known: per query, whether its label (or answer) was given.
        format: the format the rows were read with (predict reads new rows the same way).
        support_rows: the support rows as read (predict builds new queries beside them).
        query_options: multiple choice: each query's option texts (what its prediction names).
    """

    name: str
    episode: Episode
    labels: tuple[str, ...]
    query_known: tuple[bool, ...]
    format: TaskFormat
    support_rows: tuple[dict[str, Any], ...] = ()
    query_options: tuple[tuple[str, ...], ...] = ()
    n_cut: int = 0
    """Prompts (support and query) cut from the left to fit ``tasks.max_length``."""

    @property
    def is_classification(self) -> bool:
        """Whether the task ranks candidates (a label set, or each question's options) rather than
        generating."""
        return self.episode.choices is not None or reader(self.format).ranks

    def candidate_words(self) -> list[tuple[str, ...]]:
        """Per query, the names of the candidates it is ranked among (its label set or options)."""
        return list(self.query_options) if self.query_options else [self.labels] * len(self.episode.query)


def read_rows(data: Path | Sequence[Mapping[str, Any]], *, what: str) -> list[dict[str, Any]]:
    """The rows of a file (any format the task builders read) or of a list of dicts.

    Raises:
        UserInputError: a path that does not exist, cannot be read, or holds no rows.
    """
    if not isinstance(data, (str, Path)):
        rows = [dict(r) for r in data]
    else:
        path = Path(data).expanduser()
        if not path.exists():
            raise UserInputError(f"{what} {str(path)!r} does not exist: give a .jsonl, .json, .csv, .parquet or "
                                 ".arrow file (or a save_to_disk folder)")
        from fmmeta.tasks.data import read_dataset

        try:
            ds = read_dataset(str(path))  # with no network: it is a local file
        except (ValueError, OSError) as err:
            raise UserInputError(f"{what} {str(path)!r} cannot be read: {err}") from None
        rows = [dict(zip(ds.column_names, values)) for values in zip(*(column(ds, c) for c in ds.column_names))]
    if not rows:
        raise UserInputError(f"{what} has no rows: a support set needs >= 1 labelled row per label, a query "
                             ">= 1 row")
    return rows


def _prompts(rows: list[dict[str, Any]], template: str, *, where: str,
             options: Sequence[Sequence[str]] | None = None) -> list[str]:
    """Each row's prompt text: the template over its columns; for multiple choice (``options``
    given) ``{options}`` shows the row's options as lettered lines."""
    try:
        fields = template_fields(template, key="template")
    except ValueError as err:
        raise UserInputError(f"{where}: {err}") from None
    if options is not None and OPTIONS_FIELD in fields:
        rows = [{**r, OPTIONS_FIELD: lettered(o)} for r, o in zip(rows, options)]
    missing = [f for f in fields if any(f not in r for r in rows)]
    if missing:
        raise UserInputError(f"{where}: column(s) {missing} not found; the rows have columns {sorted(rows[0])}: "
                             "pass --template / --text-column / --input-column naming columns the file has")
    try:
        return render(template, {f: [r[f] for r in rows] for f in fields}, len(rows), where=where)
    except ValueError as err:
        raise UserInputError(str(err)) from None


def _answers(rows: list[dict[str, Any]], key: str, *, required: bool, where: str) -> list[str | None]:
    """Each row's label or output as text (``None`` where absent, refused where ``required``)."""
    out: list[str | None] = []
    for i, r in enumerate(rows):
        v = r.get(key)
        if v is None or (isinstance(v, str) and not v.strip()):
            if required:
                raise UserInputError(f"{where}: row {i} has no {key!r}: every support row needs its label or "
                                     f"answer in column {key!r} (--label-column / --output-column name another)")
            out.append(None)
        elif isinstance(v, float) and v.is_integer():
            # A CSV column of integers with a blank row is read as floats (0.0, 1.0): the label is
            # the integer, as in the file and in the rows without a gap.
            out.append(str(int(v)))
        else:
            out.append(str(v))
    return out


def _label_set(fmt: TaskFormat, support: list[str | None], query: list[str | None], name: str) -> tuple[str, ...]:
    """The candidates: the given labels, else the support's in order of first appearance."""
    words = _verbalizer_words(fmt)
    labels = fmt.labels if fmt.labels is not None else tuple(dict.fromkeys(words.values())) if words else tuple(
        dict.fromkeys(s for s in support if s is not None))
    for what, values in (("support", support), ("query", query)):
        bad = sorted({v for v in values if v is not None and v not in labels})
        if bad:
            raise UserInputError(f"task {name!r}: {what} label(s) {bad} are not in the label set {list(labels)}: "
                                 "fix the rows, or add them to --labels")
    if len(labels) < 2:
        raise UserInputError(f"task {name!r}: the label set {list(labels)} has {len(labels)} label(s): "
                             "classification ranks >= 2 candidates; give --labels or support rows of >= 2 labels")
    empty = [w for w in labels if w not in support]
    if empty:
        raise UserInputError(f"task {name!r}: label(s) {empty} have no support row: adaptation learns a label "
                             "from its examples; add >= 1 support row per label, or drop it from --labels")
    return labels


def _cut(prompt: Sequence[int], room: int) -> tuple[int, ...]:
    """A prompt cut from the left to ``room`` tokens (as the task builders cut long prompts)."""
    return tuple(prompt[-room:]) if len(prompt) > room else tuple(prompt)


@dataclass(frozen=True)
class TaskTexts:
    """A task's rows read and checked, not yet tokenized (every check that needs no tokenizer, so
    a bad file is refused before any model loads)."""

    files: TaskFiles
    support: list[dict[str, Any]]
    prompts: tuple[list[str], list[str]]
    answers: tuple[list[str | None], list[str | None]]
    labels: tuple[str, ...]
    options: tuple[list[list[str]], list[list[str]]] = ([], [])
    """Multiple choice: each support and query row's option texts."""
    gold: tuple[list[int | None], list[int | None]] = ([], [])
    """Multiple choice: each row's gold option (``None`` for a query without its label)."""


def read_task(files: TaskFiles) -> TaskTexts:
    """Reads and checks one task's support and query rows (see :func:`build_task`)."""
    fmt, name = files.format, files.name
    fmt_reader = reader(fmt)
    answer = answer_template_problem(fmt.answer_template, multiple_choice=fmt_reader.letters, key="--answer-template")
    if answer is not None:
        raise UserInputError(f"task {name!r}: {answer}")
    support = read_rows(files.support, what=f"task {name!r} support")
    query = [] if files.query is None else read_rows(files.query, what=f"task {name!r} query")
    s_ans = fmt_reader.answers(fmt, support, True, f"task {name!r} support")
    q_ans = fmt_reader.answers(fmt, query, False, f"task {name!r} query")
    return fmt_reader.read(files, support, query, (s_ans, q_ans))


def _read_classification(files: TaskFiles, support: list[dict[str, Any]], query: list[dict[str, Any]],
                         answers: tuple[list[str | None], list[str | None]]) -> TaskTexts:
    """A classification task's rows: prompts over the text column, and its label set."""
    fmt, name = files.format, files.name
    template = resolve_template(fmt.template, fmt.keys.text_column)
    prompts = (_prompts(support, template, where=f"task {name!r} support"),
               _prompts(query, template, where=f"task {name!r} query"))
    return TaskTexts(files, support, prompts, answers, _label_set(fmt, *answers, name))


def _read_generation(files: TaskFiles, support: list[dict[str, Any]], query: list[dict[str, Any]],
                     answers: tuple[list[str | None], list[str | None]]) -> TaskTexts:
    """A generation task's rows: prompts over the input column."""
    fmt, name = files.format, files.name
    template = resolve_template(fmt.template, fmt.keys.input_column)
    prompts = (_prompts(support, template, where=f"task {name!r} support"),
               _prompts(query, template, where=f"task {name!r} query"))
    return TaskTexts(files, support, prompts, answers, ())


def _read_multiple_choice(files: TaskFiles, support: list[dict[str, Any]], query: list[dict[str, Any]],
                          answers: tuple[list[str | None], list[str | None]]) -> TaskTexts:
    """A multiple-choice task's rows: each question's options and gold, and prompts that may show them."""
    fmt, name = files.format, files.name
    if fmt.template is None:
        raise UserInputError(f"task {name!r} support: a multiple-choice task needs --template over its columns, "
                             "e.g. 'Question: {question}\nAnswer:'")
    s_q = _questions(support, answers[0], fmt, where=f"task {name!r} support")
    q_q = _questions(query, answers[1], fmt, where=f"task {name!r} query")
    prompts = (_prompts(support, fmt.template, where=f"task {name!r} support", options=s_q[0]),
               _prompts(query, fmt.template, where=f"task {name!r} query", options=q_q[0]))
    return TaskTexts(files, support, prompts, answers, (), (s_q[0], q_q[0]), (s_q[1], q_q[1]))


def _questions(rows: list[dict[str, Any]], answers: list[str | None], fmt: TaskFormat, *, where: str
               ) -> tuple[list[list[str]], list[int | None]]:
    """Each multiple-choice row's option texts and gold option (``None`` where its label is absent)."""
    keys = fmt.keys
    answer_format = keys.answer_format or "auto"
    if (keys.options_column is None) == (not keys.option_columns):
        raise UserInputError(f"{where}: a multiple-choice task needs exactly one of --options-column (a list or "
                             "{text, label} column) and --option-columns (a column per option)")
    cols = [keys.options_column] if keys.options_column is not None else list(keys.option_columns or ())
    missing = [c for c in cols if any(c not in r for r in rows)]
    if missing:
        raise UserInputError(f"{where}: column(s) {missing} not found; the rows have columns {sorted(rows[0])}")
    texts: list[list[str]] = []
    gold: list[int | None] = []
    try:
        check_answer_column([r.get(keys.label_column) for r, a in zip(rows, answers) if a is not None],
                            answer_format, where=f"{where}: {keys.label_column}")
        for i, (r, a) in enumerate(zip(rows, answers)):
            value = r[cols[0]] if keys.options_column is not None else [r[c] for c in cols]
            opts, option_keys = question_options(value, where=f"{where}: row {i}")
            texts.append(opts)
            raw = r.get(keys.label_column)
            gold.append(None if a is None else gold_index(raw, opts, option_keys, answer_format,
                                                         where=f"{where}: row {i} ({keys.label_column})"))
    except ValueError as err:
        raise UserInputError(str(err)) from None
    return texts, gold


def build_task(files: TaskFiles | TaskTexts, tokenizer: Any, *, max_length: int, separator: str = "\n\n") -> UserTask:
    """Reads and tokenizes one task's support and query rows into its episode.

    Raises:
        UserInputError: missing files or columns, empty rows, a support row without its label,
            labels outside the label set, or an answer too long for ``max_length``.
    """
    texts = read_task(files) if isinstance(files, TaskFiles) else files
    s_ids, q_ids = (encode(tokenizer, p) for p in reader(texts.files.format).prompt_texts(texts, tokenizer))
    sep = tuple(encode(tokenizer, [separator])[0]) if separator else ()
    task = reader(texts.files.format).build(texts, s_ids, q_ids, tokenizer, max_length, sep)
    cut = [sum(len(e.prompt_ids) < len(p) for e, p in zip(examples, ids))
           for examples, ids in ((task.episode.support, s_ids), (task.episode.query, q_ids))]
    if sum(cut):  # as training says of its tasks: their opening tokens are gone
        logger.warning("task %r: cut %d of %d support and %d of %d query prompts from the left to fit "
                       "tasks.max_length=%d (their opening tokens are lost)", task.name, cut[0], len(s_ids), cut[1],
                       len(q_ids), max_length)
    return dataclasses.replace(task, n_cut=sum(cut))


def _classification(texts: TaskTexts, s_ids: list[list[int]], q_ids: list[list[int]], tokenizer: Any,
                    max_length: int, sep: tuple[int, ...]) -> UserTask:
    """A classification task's episode: label words with EOS; a prompt cut to leave room for the longest."""
    fmt, name, labels = texts.files.format, texts.files.name, texts.labels
    (s_ans, q_ans), support = texts.answers, texts.support
    words = [tuple(w) for w in answer_word_ids(tokenizer, [fmt.answer_template.format(answer=w) for w in labels])]
    room = max_length - max(len(w) for w in words)
    if room < 1:
        raise UserInputError(f"task {name!r}: a label word takes {max(len(w) for w in words)} tokens, leaving no "
                             f"room for a prompt in tasks.max_length={max_length}: use shorter labels")
    longest = max(words, key=len)

    def example(p: Sequence[int], a: str | None) -> Example:
        return Example(_cut(p, room), longest, None) if a is None else Example(
            _cut(p, room), words[labels.index(a)], labels.index(a))

    episode = Episode(name, tuple(example(p, a) for p, a in zip(s_ids, s_ans)),
                      tuple(example(p, a) for p, a in zip(q_ids, q_ans)), shots=len(support), ways=len(labels),
                      choices=tuple(words), separator_ids=sep)
    return UserTask(name, episode, labels, tuple(a is not None for a in q_ans), fmt, tuple(support))


def _generation(texts: TaskTexts, s_ids: list[list[int]], q_ids: list[list[int]], tokenizer: Any,
                max_length: int, sep: tuple[int, ...]) -> UserTask:
    """A generation task's episode: answers with EOS; a prompt cut to leave room for its answer."""
    eos = list(eos_ids(tokenizer))
    files, (s_ans, q_ans), support = texts.files, texts.answers, texts.support
    fmt = files.format

    def example(p: Sequence[int], a: str | None, i: int, what: str) -> Example:
        if a is None:
            return Example(_cut(p, max_length - 1), ())
        ids = tuple(encode(tokenizer, [fmt.answer_template.format(answer=a)])[0] + eos)
        if len(ids) + 1 > max_length:
            raise UserInputError(f"task {files.name!r} {what} row {i}: its answer takes {len(ids)} tokens, more than "
                                 f"tasks.max_length={max_length} leaves beside a prompt: shorten it")
        return Example(_cut(p, max_length - len(ids)), ids)

    episode = Episode(files.name, tuple(example(p, a, i, "support") for i, (p, a) in enumerate(zip(s_ids, s_ans))),
                      tuple(example(p, a, i, "query") for i, (p, a) in enumerate(zip(q_ids, q_ans))),
                      shots=len(s_ids), separator_ids=sep)
    return UserTask(files.name, episode, (), tuple(a is not None for a in q_ans), fmt, tuple(support))


def _multiple_choice(texts: TaskTexts, s_ids: list[list[int]], q_ids: list[list[int]], tokenizer: Any,
                     max_length: int, sep: tuple[int, ...]) -> UserTask:
    """A multiple-choice task's episode: every question with its own options (EOS included); a
    prompt cut to leave room for its longest option; a query without its label answers with that."""
    fmt, name = texts.files.format, texts.files.name

    def example(p: Sequence[int], opts: list[str], g: int | None, i: int, what: str) -> Example:
        ids = tuple(tuple(o) for o in answer_word_ids(tokenizer, option_answers(opts, fmt.answer_template)))
        longest = max(ids, key=len)
        if len(longest) + 1 > max_length:
            raise UserInputError(f"task {name!r} {what} row {i}: an option takes {len(longest)} tokens, more than "
                                 f"tasks.max_length={max_length} leaves beside a prompt: shorten it")
        return Example(_cut(p, max_length - len(longest)), longest if g is None else ids[g], g, ids)

    (s_opts, q_opts), (s_gold, q_gold) = texts.options, texts.gold
    episode = Episode(name, tuple(example(p, o, g, i, "support") for i, (p, o, g) in enumerate(zip(s_ids, s_opts, s_gold))),
                      tuple(example(p, o, g, i, "query") for i, (p, o, g) in enumerate(zip(q_ids, q_opts, q_gold))),
                      shots=len(s_ids), separator_ids=sep)
    return UserTask(name, episode, (), tuple(g is not None for g in q_gold), fmt, tuple(texts.support),
                    tuple(tuple(o) for o in q_opts))


@dataclass(frozen=True, kw_only=True)
class AdaptFormat:
    """How adapt reads a user's files for one kind of task (a builder's ``adapt`` names it).

    Attributes:
        name: its key in :data:`ADAPT_FORMATS`.
        answers: ``answers(format, rows, required, where)``: each row's answer (its label, output
            or gold option's name), ``None`` where absent; refused where absent and ``required``
            (the support).
        read: ``read(files, support, query, (support answers, query answers))``: the checked texts.
        build: ``build(texts, support ids, query ids, tokenizer, max_length, separator ids)``:
            the task's episode.
        ranks: its tasks rank candidates (a label set or each question's options), not generate.
        letters: its answer template may name ``{letter}``.
        prompt_texts: the support and query prompts as the text to tokenize (default: as read).
    """

    name: str
    answers: Callable[[TaskFormat, list[dict[str, Any]], bool, str], list[str | None]]
    read: Callable[[TaskFiles, list[dict[str, Any]], list[dict[str, Any]],
                    tuple[list[str | None], list[str | None]]], TaskTexts]
    build: Callable[[TaskTexts, list[list[int]], list[list[int]], Any, int, tuple[int, ...]], UserTask]
    ranks: bool = False
    letters: bool = False
    prompt_texts: Callable[[TaskTexts, Any], tuple[list[str], list[str]]] = lambda texts, tokenizer: texts.prompts


ADAPT_FORMATS: dict[str, AdaptFormat] = {}
"""Adapt's formats by name: what a builder's registration names as its ``adapt``."""


def reader(fmt: TaskFormat) -> AdaptFormat:
    """How ``fmt``'s rows are read and tokenized: its builder's adapt format."""
    name = task_builder(fmt.builder).adapt
    assert name is not None  # TaskFormat admits adapt's builders only
    return ADAPT_FORMATS[name]


def register_adapt_format(fmt: AdaptFormat) -> AdaptFormat:
    """Adds ``fmt`` to :data:`ADAPT_FORMATS` (a builder module's registration)."""
    ADAPT_FORMATS[fmt.name] = fmt
    return fmt


def _labels(fmt: TaskFormat, rows: list[dict[str, Any]], required: bool, where: str) -> list[str | None]:
    return _answers(rows, fmt.keys.label_column, required=required, where=where)


def _class_labels(fmt: TaskFormat, rows: list[dict[str, Any]], required: bool, where: str) -> list[str | None]:
    """Each row's label, as its verbalizer word where the verbalizer names one (a label that is a
    word already stays as it is)."""
    words = _verbalizer_words(fmt)
    if words is None:
        return _labels(fmt, rows, required, where)
    return [None if a is None else words.get(a, a) for a in _labels(fmt, rows, required, where)]


def _verbalizer_words(fmt: TaskFormat) -> dict[str, str] | None:
    """Classification's verbalizer as label text -> word (a list: by integer label), or None."""
    words = getattr(fmt.keys, "verbalizer", None)
    if words is None:
        return None
    return {str(k): str(w) for k, w in (words.items() if isinstance(words, dict) else enumerate(words))}


def _outputs(fmt: TaskFormat, rows: list[dict[str, Any]], required: bool, where: str) -> list[str | None]:
    return _answers(rows, fmt.keys.output_column, required=required, where=where)


register_adapt_format(AdaptFormat(name="classification", answers=_class_labels, read=_read_classification,
                                  build=_classification, ranks=True))
register_adapt_format(AdaptFormat(name="generation", answers=_outputs, read=_read_generation, build=_generation))
register_adapt_format(AdaptFormat(name="multiple_choice", answers=_labels, read=_read_multiple_choice,
                                  build=_multiple_choice, ranks=True, letters=True))


__all__ = ["ADAPT_FORMATS", "AdaptFormat", "TaskFiles", "TaskFormat", "TaskTexts", "UserTask", "adapt_builders",
           "build_task", "describe_source", "read_rows", "read_task", "reader", "register_adapt_format"]
