"""A user's new task, from a support file and a query file, as the episode the evaluation adapts on.

A meta-trained adapter meets its user's task the way it met a held-out task in evaluation: as an
:class:`~fmmeta.tasks.episode.Episode`, support examples to adapt on and query examples to score.
Here the rows come from the user's files (any format :func:`~fmmeta.tasks.data.read_dataset`
reads) and become examples through the same options a YAML task source takes (``builder``,
``template``, columns, ``answer_template``) and the same tokenization rules as the task builders
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
from fmmeta.tasks.registry import task_builder, task_builders
from fmmeta.tasks.tokens import encode, eos_ids

logger = logging.getLogger(__name__)


def adapt_builders() -> list[str]:
    """The task builders adapt reads a user's files with (those registered with an ``adapt`` format)."""
    return [b.name for b in task_builders() if b.adapt is not None]


def _adapt_builders_text() -> str:
    return ", ".join(f"{b.name} ({b.summary})" for b in task_builders() if b.adapt is not None)

FORMAT_KEYS = ("builder", "template", "answer_template", "text_column", "label_column", "input_column",
               "output_column", "labels", "options_column", "option_columns", "answer_format")
"""The keys of :class:`TaskFormat`: what a YAML list of tasks may set per task."""


@dataclass(frozen=True, kw_only=True)
class TaskFormat:
    """How rows become examples: the keys of a YAML task source that apply to one task.

    Attributes:
        builder: a task builder of :mod:`fmmeta.tasks.registry` that adapt reads files with
            (:func:`adapt_builders`): ``"classification"`` (a label per row; the answer is its
            label word), ``"dataset"`` (generation: the answer is the output column's text),
            ``"multiple_choice"`` (each row its own options; ``label_column`` names the gold one), ...
        template: prompt format over column names; ``None`` = the text (or input) column alone.
        answer_template: answer format; ``{answer}`` is the label word or the output text.
        text_column, label_column: classification's text and label columns.
        input_column, output_column: generation's prompt and answer columns.
        labels: classification's label set, in order; ``None`` = the support's labels in order
            of first appearance. A support label outside an explicit set is refused.
        options_column, option_columns, answer_format: multiple choice's options (one list or
            ``{text, label}`` column, or a column per option) and how the label names the gold one
            (:mod:`fmmeta.tasks.choice_rows`).
    """

    builder: str = "classification"
    template: str | None = None
    answer_template: str = " {answer}"
    text_column: str = "text"
    label_column: str = "label"
    input_column: str = "input"
    output_column: str = "output"
    labels: tuple[str, ...] | None = None
    options_column: str | None = None
    option_columns: tuple[str, ...] | None = None
    answer_format: str = "auto"

    @classmethod
    def from_source(cls, source: Any) -> TaskFormat:
        """The format of a ``tasks.collection`` source of the run's config (its resolved keys).

        Raises:
            UserInputError: the source's builder reads one file as many tasks (``task_column``).
        """
        args = source.resolved()
        builder = args.get("builder")
        if builder not in adapt_builders():
            raise UserInputError(f"source {describe_source(source)!r} has builder={builder!r}: a user's task is "
                                 f"one task per support file; use a source of {' / '.join(adapt_builders())}, "
                                 "or give --builder and the columns yourself")
        words = source.verbalizer
        labels = tuple(words.values() if isinstance(words, dict) else words) if words else None
        keys = {k: args[k] for k in ("template", "text_column", "label_column", "input_column", "output_column",
                                     "options_column", "answer_format") if args.get(k) is not None}
        if args.get("option_columns"):
            keys["option_columns"] = tuple(args["option_columns"])
        return cls(builder=builder, answer_template=source.answer_template, labels=labels, **keys)

    def replace(self, **changes: Any) -> TaskFormat:
        """This format with ``changes`` (``None`` values are ignored: an option not given)."""
        unknown = sorted(set(changes) - set(FORMAT_KEYS))
        if unknown:
            raise UserInputError(f"unknown task key(s) {unknown}: allowed are {list(FORMAT_KEYS)}")
        given = {k: v for k, v in changes.items() if v is not None}
        if isinstance(given.get("labels"), str):
            given["labels"] = tuple(w.strip() for w in given["labels"].split(",") if w.strip())
        elif "labels" in given:
            given["labels"] = tuple(str(w) for w in given["labels"])
        if isinstance(given.get("option_columns"), str):
            given["option_columns"] = tuple(c.strip() for c in given["option_columns"].split(",") if c.strip())
        elif "option_columns" in given:
            given["option_columns"] = tuple(str(c) for c in given["option_columns"])
        if given.get("builder", self.builder) not in adapt_builders():
            raise UserInputError(f"builder={given['builder']!r} is invalid: {_adapt_builders_text()}")
        return dataclasses.replace(self, **given)

    @property
    def reader(self) -> AdaptFormat:
        """How this format's rows are read and tokenized (its builder's adapt format)."""
        name = task_builder(self.builder).adapt
        assert name is not None  # replace() and from_source() admit adapt's builders only
        return ADAPT_FORMATS[name]


def describe_source(source: Any) -> str:
    """A source's name as ``--source`` takes it: its task_name, else its path's file stem."""
    return str(source.task_name or Path(str(source.path)).stem)


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
        return self.episode.choices is not None or self.format.reader.ranks

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


def _prompts(rows: list[dict[str, Any]], fmt: TaskFormat, first: str, *, where: str,
             options: Sequence[Sequence[str]] | None = None) -> list[str]:
    """Each row's prompt text: the template over its columns (``first`` alone without one); for
    multiple choice (``options`` given) ``{options}`` shows the row's options as lettered lines."""
    template = resolve_template(fmt.template, first)
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
    labels = fmt.labels if fmt.labels is not None else tuple(dict.fromkeys(s for s in support if s is not None))
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
    reader = fmt.reader
    answer = answer_template_problem(fmt.answer_template, multiple_choice=reader.letters, key="--answer-template")
    if answer is not None:
        raise UserInputError(f"task {name!r}: {answer}")
    support = read_rows(files.support, what=f"task {name!r} support")
    query = [] if files.query is None else read_rows(files.query, what=f"task {name!r} query")
    s_ans = reader.answers(fmt, support, True, f"task {name!r} support")
    q_ans = reader.answers(fmt, query, False, f"task {name!r} query")
    return reader.read(files, support, query, (s_ans, q_ans))


def _read_classification(files: TaskFiles, support: list[dict[str, Any]], query: list[dict[str, Any]],
                         answers: tuple[list[str | None], list[str | None]]) -> TaskTexts:
    """A classification task's rows: prompts over the text column, and its label set."""
    fmt, name = files.format, files.name
    prompts = (_prompts(support, fmt, fmt.text_column, where=f"task {name!r} support"),
               _prompts(query, fmt, fmt.text_column, where=f"task {name!r} query"))
    return TaskTexts(files, support, prompts, answers, _label_set(fmt, *answers, name))


def _read_generation(files: TaskFiles, support: list[dict[str, Any]], query: list[dict[str, Any]],
                     answers: tuple[list[str | None], list[str | None]]) -> TaskTexts:
    """A generation task's rows: prompts over the input column."""
    fmt, name = files.format, files.name
    prompts = (_prompts(support, fmt, fmt.input_column, where=f"task {name!r} support"),
               _prompts(query, fmt, fmt.input_column, where=f"task {name!r} query"))
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
    prompts = (_prompts(support, fmt, fmt.input_column, where=f"task {name!r} support", options=s_q[0]),
               _prompts(query, fmt, fmt.input_column, where=f"task {name!r} query", options=q_q[0]))
    return TaskTexts(files, support, prompts, answers, (), (s_q[0], q_q[0]), (s_q[1], q_q[1]))


def _questions(rows: list[dict[str, Any]], answers: list[str | None], fmt: TaskFormat, *, where: str
               ) -> tuple[list[list[str]], list[int | None]]:
    """Each multiple-choice row's option texts and gold option (``None`` where its label is absent)."""
    if (fmt.options_column is None) == (not fmt.option_columns):
        raise UserInputError(f"{where}: a multiple-choice task needs exactly one of --options-column (a list or "
                             "{text, label} column) and --option-columns (a column per option)")
    cols = [fmt.options_column] if fmt.options_column is not None else list(fmt.option_columns or ())
    missing = [c for c in cols if any(c not in r for r in rows)]
    if missing:
        raise UserInputError(f"{where}: column(s) {missing} not found; the rows have columns {sorted(rows[0])}")
    texts: list[list[str]] = []
    gold: list[int | None] = []
    try:
        check_answer_column([r.get(fmt.label_column) for r, a in zip(rows, answers) if a is not None],
                            fmt.answer_format, where=f"{where}: {fmt.label_column}")
        for i, (r, a) in enumerate(zip(rows, answers)):
            value = r[cols[0]] if fmt.options_column is not None else [r[c] for c in cols]
            opts, keys = question_options(value, where=f"{where}: row {i}")
            texts.append(opts)
            raw = r.get(fmt.label_column)
            gold.append(None if a is None else gold_index(raw, opts, keys, fmt.answer_format,
                                                         where=f"{where}: row {i} ({fmt.label_column})"))
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
    s_ids, q_ids = (encode(tokenizer, p) for p in texts.files.format.reader.prompt_texts(texts, tokenizer))
    sep = tuple(encode(tokenizer, [separator])[0]) if separator else ()
    task = texts.files.format.reader.build(texts, s_ids, q_ids, tokenizer, max_length, sep)
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


def register_adapt_format(fmt: AdaptFormat) -> AdaptFormat:
    """Adds ``fmt`` to :data:`ADAPT_FORMATS` (a builder module's registration)."""
    ADAPT_FORMATS[fmt.name] = fmt
    return fmt


def _labels(fmt: TaskFormat, rows: list[dict[str, Any]], required: bool, where: str) -> list[str | None]:
    return _answers(rows, fmt.label_column, required=required, where=where)


def _outputs(fmt: TaskFormat, rows: list[dict[str, Any]], required: bool, where: str) -> list[str | None]:
    return _answers(rows, fmt.output_column, required=required, where=where)


register_adapt_format(AdaptFormat(name="classification", answers=_labels, read=_read_classification,
                                  build=_classification, ranks=True))
register_adapt_format(AdaptFormat(name="generation", answers=_outputs, read=_read_generation, build=_generation))
register_adapt_format(AdaptFormat(name="multiple_choice", answers=_labels, read=_read_multiple_choice,
                                  build=_multiple_choice, ranks=True, letters=True))


__all__ = ["ADAPT_FORMATS", "AdaptFormat", "register_adapt_format", "adapt_builders", "FORMAT_KEYS", "TaskFiles", "TaskFormat", "TaskTexts", "UserTask", "build_task", "describe_source",
           "read_rows", "read_task"]
