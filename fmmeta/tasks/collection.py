"""A task collection declared in YAML: sources -> checked rows -> meta-train / val / test tasks.

The recipe's ``tasks.collection`` lists sources (:class:`CollectionSource`), each read by one of
the builders of :mod:`fmmeta.tasks.builders`; ``tasks.split`` (:class:`CollectionSplit`) says
which tasks are held out. Reading a collection needs no tokenizer, so the whole section is
checked (:func:`collection_problems`) while the config is validated, before any model loads, and
every problem of every source is reported at once. :func:`build_collection` then tokenizes
through the disk cache of :mod:`fmmeta.tasks.cache`.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import datasets
import numpy as np

from fmmeta.tasks.builders import TaskRows, classification_rows, column_rows, dataset_rows
from fmmeta.tasks.source import _FORMATS, load_source
from fmmeta.tasks.task import EpisodeSpec, Task, TaskSet, check_unique_names

logger = logging.getLogger(__name__)

Builder = Literal["classification", "task_column", "dataset"]
Preset = Literal["metaicl", "natural_instructions"]

PRESETS: dict[str, dict[str, Any]] = {
    # MetaICL (github.com/facebookresearch/MetaICL; on the hub as allenai/metaicl-data): one
    # JSON line per example, {"task", "input", "output", "options"}; options is [] for
    # generation tasks and the class words for classification tasks.
    "metaicl": {
        "builder": "task_column", "task_column": "task", "input_column": "input",
        "output_column": "output", "options_column": "options",
    },
    # Super-NaturalInstructions (github.com/allenai/natural-instructions; on the hub as
    # Muennighoff/natural-instructions): {"task_name", "definition", "inputs", "targets"}; the
    # task's definition (its instruction) opens every prompt.
    "natural_instructions": {
        "builder": "task_column", "task_column": "task_name", "input_column": "inputs",
        "output_column": "targets", "template": "{definition}\n\nInput: {inputs}\nOutput:",
    },
}  # fmt: skip
"""Column names and templates of collection layouts people already have, by preset name."""

_ONLY_FOR: dict[str, tuple[str, ...]] = {
    "text_column": ("classification",),
    "label_column": ("classification",),
    "verbalizer": ("classification",),
    "task_column": ("task_column",),
    "options_column": ("task_column",),
    "name_prefix": ("task_column",),
    "input_column": ("task_column", "dataset"),
    "output_column": ("task_column", "dataset"),
    "task_name": ("classification", "dataset"),
}
"""Source keys that only one or two builders take (setting one for another builder is an error)."""

_DEFAULTS: dict[str, Any] = {
    "text_column": "text", "label_column": "label", "task_column": "task",
    "input_column": "input", "output_column": "output",
}  # fmt: skip


@dataclass(kw_only=True)
class CollectionSource:
    """One source of tasks: where its rows are and which builder turns them into tasks."""

    path: str
    """Hub dataset id, local .jsonl/.json/.csv/.parquet file, a folder of them, or a glob."""
    builder: Builder | None = None
    """"classification" (one N-way task), "task_column" (a task per value of a column) or
    "dataset" (one task per file); null = the preset's."""
    preset: Preset | None = None
    """Known layout: "metaicl" (task, input, output, options) or "natural_instructions"
    (task_name, definition, inputs, targets)."""
    name: str | None = None
    """Hub dataset configuration (load_dataset's name); hub ids only."""
    split: str | None = None
    """Split to read; required for hub ids, ignored for local files (their rows are one split)."""
    data_files: list[str] | None = None
    """Hub ids only: which of the dataset's files to read (load_dataset's data_files)."""
    task_name: str | None = None
    """classification / dataset: the task's name; null = the file's stem (or the hub id)."""
    task_column: str | None = None
    """task_column: the column naming each row's task (default "task")."""
    input_column: str | None = None
    """task_column / dataset: the prompt column used by the default template (default "input")."""
    output_column: str | None = None
    """task_column / dataset: the answer column (default "output")."""
    options_column: str | None = None
    """task_column: answer options per row; a task with one fixed option list becomes classification."""
    text_column: str | None = None
    """classification: the text column used by the default template (default "text")."""
    label_column: str | None = None
    """classification: the label column (default "label"); at least 2 classes."""
    template: str | None = None
    """Prompt format over column names, e.g. "Review: {text}\\nSentiment:"; null = the input column."""
    answer_template: str = " {answer}"
    """Answer format; {answer} is the output value or the label word."""
    verbalizer: list[str] | dict[int | str, str] | None = None
    """classification: words per class, a list by integer label or a {label: word} mapping."""
    name_prefix: str = ""
    """task_column: prepended to each task value to form the task name."""
    family: str = ""
    """Family of every task of this source (diversity sampling, held-out families); "" = each
    task's own name."""
    shots: int = 4
    """Support examples per episode (per class for classification), >= 1."""
    query: int = 4
    """Query examples per episode (per class for classification), >= 1."""
    ways: int | None = None
    """Classification: classes per episode (>= 2); null = every class."""
    remap_labels: bool = False
    """Classification: map each episode's classes to random words from label_pool."""
    label_pool: list[str] | None = None
    """Words for remap_labels (at least ways, distinct)."""
    max_examples: int | None = None
    """Keep at most this many examples per task (a seeded draw; >= shots + query); null = all."""
    drop_small: bool = False
    """Drop (with a warning) tasks or classes too small for an episode instead of refusing them."""
    on_too_long: Literal["drop", "error"] = "drop"
    """An example whose answer cannot fit tasks.max_length: "drop" it (counted) or "error"."""

    def resolved(self) -> dict[str, Any]:
        """The builder's arguments: the preset's values, then this source's, then the defaults."""
        out: dict[str, Any] = dict(PRESETS.get(self.preset or "", {}))
        for key in ("builder", *_ONLY_FOR, "template"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key, value in _DEFAULTS.items():
            if out.get("builder") in _ONLY_FOR[key]:
                out.setdefault(key, value)
        return out

    def spec(self) -> EpisodeSpec:
        """The episode shape (raises ValueError naming the bad value)."""
        return EpisodeSpec(
            shots=self.shots, query=self.query, ways=self.ways, remap_labels=self.remap_labels,
            label_pool=tuple(self.label_pool) if self.label_pool is not None else None,
        )  # fmt: skip

    def validate(self) -> list[str]:
        """Checks that need no data: a builder, keys that fit it, the episode shape, the path."""
        problems: list[str] = []
        args = self.resolved()
        builder = args.get("builder")
        if builder is None:
            problems.append(
                "builder is missing: set builder to classification, task_column or dataset, or "
                "preset to metaicl or natural_instructions"
            )
        for key, builders in _ONLY_FOR.items():
            if builder is not None and getattr(self, key) not in (None, "") and builder not in builders:
                problems.append(
                    f"{key}={getattr(self, key)!r} does not apply to builder={builder!r} (only to "
                    f"{' / '.join(builders)}): remove it or change the builder"
                )
        try:
            self.spec()
        except ValueError as err:
            problems.append(str(err).replace("EpisodeSpec.", ""))
        if self.max_examples is not None and self.max_examples < self.shots + self.query:
            problems.append(
                f"max_examples={self.max_examples} is invalid: a task needs at least shots + "
                f"query = {self.shots + self.query} examples; raise it or set it to null"
            )
        if not self.path:
            problems.append("path is empty: give a hub id, a local file, a folder or a glob")
        elif self.data_files is not None and _is_local(self.path):
            problems.append(
                f"data_files is set but path={self.path!r} is local: data_files picks files of a "
                "hub dataset; point path at the files instead"
            )
        return problems


def _is_local(path: str) -> bool:
    """True if ``path`` names local data (an existing path, a glob, or a path-like string)."""
    from fmmeta.config import looks_like_local_path

    expanded = os.path.expanduser(path)
    return (
        os.path.exists(expanded) or any(ch in expanded for ch in "*?[")
        or looks_like_local_path(expanded) or Path(expanded).suffix.lower() in _FORMATS
    )


@dataclass(kw_only=True)
class CollectionSplit:
    """Which collection tasks are held out: names, families, files of names, or seeded shares."""

    held_out: list[str] = field(default_factory=list)
    """Task names for meta-test (touched only by the final evaluation)."""
    validation: list[str] = field(default_factory=list)
    """Task names for meta-validation (choose each method's adaptation lr)."""
    held_out_families: list[str] = field(default_factory=list)
    """Families whose every task goes to meta-test."""
    validation_families: list[str] = field(default_factory=list)
    """Families whose every task goes to meta-validation."""
    held_out_file: str | None = None
    """File of meta-test task names: .txt (one per line, # comments) or .json (a list, or
    MetaICL's {"test": [...]})."""
    validation_file: str | None = None
    """File of meta-validation task names, same formats as held_out_file."""
    held_out_fraction: float | None = None
    """Share in [0, 1) of the tasks named nowhere drawn for meta-test (seeded by train.seed);
    null = 0.1 if nothing names a meta-test task, else 0."""
    validation_fraction: float | None = None
    """Share in [0, 1) of the tasks named nowhere drawn for meta-validation; null = 0.1 if
    nothing names a meta-validation task, else 0."""

    def validate(self) -> list[str]:
        """Checks that need no data: shares in range, files that exist and parse."""
        problems: list[str] = []
        for key in ("held_out_fraction", "validation_fraction"):
            value = getattr(self, key)
            if value is not None and not 0.0 <= value < 1.0:
                problems.append(f"{key}={value} is invalid: must be in [0, 1) (a share of the tasks)")
        for key in ("held_out_file", "validation_file"):
            path = getattr(self, key)
            if path is not None:
                try:
                    read_task_list(path)
                except ValueError as err:
                    problems.append(f"{key}={path!r}: {err}")
        return problems


def read_task_list(path: str) -> list[str]:
    """Task names from a .txt file (one per line, # comments) or a .json list / {"test": [...]}.

    Raises:
        ValueError: if the file is missing or holds something else, with the fix.
    """
    file = Path(os.path.expanduser(path))
    if not file.is_file():
        raise ValueError(f"the file does not exist (working directory {os.getcwd()!r}): check the path")
    text = file.read_text(encoding="utf-8")
    if file.suffix.lower() != ".json":
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err}): fix the file") from err
    if isinstance(data, dict) and "test" in data:
        data = data["test"]  # MetaICL's config/<setting>.json: {"train": [...], "test": [...]}
    if not isinstance(data, list) or not all(isinstance(n, str) for n in data):
        raise ValueError(
            'must hold a JSON list of task names or an object {"test": [names]}: fix the file'
        )
    return data


# ---------------------------------------------------------------------------------------- reading


def source_files(src: CollectionSource) -> list[str] | None:
    """The local files ``src.path`` names (file, folder or glob), or None for a hub id.

    Raises:
        ValueError: for a local path that does not exist, matches nothing, or holds no data files.
    """
    path = os.path.expanduser(src.path)
    if any(ch in path for ch in "*?["):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
        if not files:
            raise ValueError(f"path={src.path!r} matches no file: check the pattern")
        return files
    if os.path.isdir(path):
        files = sorted(
            str(f) for f in Path(path).rglob("*") if f.is_file() and f.suffix.lower() in _FORMATS
        )
        if not files:
            raise ValueError(
                f"path={src.path!r} is a folder without .jsonl/.json/.csv/.parquet files: put the "
                "data files there or point path at them"
            )
        return files
    if os.path.isfile(path):
        return [path]
    from fmmeta.config import looks_like_local_path

    if looks_like_local_path(path) or Path(path).suffix.lower() in _FORMATS:
        raise ValueError(
            f"path={src.path!r} does not exist (working directory {os.getcwd()!r}): give an "
            "existing file, folder or glob, or a hub id such as 'Muennighoff/natural-instructions'"
        )
    return None


def _load(src: CollectionSource, files: list[str] | None, cache_dir: str | None) -> datasets.Dataset:
    if files is None:
        return load_source(
            src.path, split=src.split, name=src.name, data_files=src.data_files, cache_dir=cache_dir
        )
    return load_source(files, cache_dir=cache_dir)  # refuses empty, non-UTF-8 and malformed files


def _stem(path: str) -> str:
    name = Path(path).name
    for suffix in reversed(Path(path).suffixes):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


def read_source(
    src: CollectionSource, *, seed: int, index: int = 0, cache_dir: str | None = None
) -> tuple[list[TaskRows], str]:
    """Reads and checks one source: its tasks' texts and a fingerprint of the rows it read.

    Args:
        src: the source.
        seed: seeds the ``max_examples`` draw.
        index: the source's position in the collection (seeds its draw apart from the others).
        cache_dir: where ``datasets`` keeps converted files (None = its own cache).

    Returns:
        (checked rows of each task, fingerprint of the source's data).

    Raises:
        ValueError: the first problem with this source's data, naming the fix.
    """
    args = src.resolved()
    builder = args["builder"]
    spec = src.spec()
    files = source_files(src)
    if builder == "dataset" and files is not None and len(files) > 1:
        if src.task_name is not None:
            raise ValueError(
                f"task_name={src.task_name!r} names one task but path={src.path!r} holds "
                f"{len(files)} files (one task each, named by file): remove task_name"
            )
        parts = [(_stem(f), _load(src, [f], cache_dir)) for f in files]
    else:
        default_name = src.task_name or (_stem(files[0]) if files else src.path)
        parts = [(default_name, _load(src, files, cache_dir))]
    rows: list[TaskRows] = []
    for task_name, ds in parts:
        common = {"spec": spec, "template": args.get("template"),
                  "answer_template": src.answer_template, "domain": src.family}  # fmt: skip
        if builder == "classification":
            rows.append(classification_rows(
                ds, name=task_name, text_column=args["text_column"],
                label_column=args["label_column"], verbalizer=src.verbalizer,
                drop_small_classes=src.drop_small, **common,
            ))  # fmt: skip
        elif builder == "task_column":
            rows.extend(column_rows(
                ds, task_column=args["task_column"], input_column=args["input_column"],
                output_column=args["output_column"], options_column=args.get("options_column"),
                name_prefix=src.name_prefix, drop_small_tasks=src.drop_small, **common,
            ))  # fmt: skip
        else:
            rows.append(dataset_rows(
                ds, name=task_name, input_column=args["input_column"],
                output_column=args["output_column"], **common,
            ))  # fmt: skip
    rng = np.random.default_rng([seed, index])
    rows = [r.subsample(src.max_examples, rng) for r in rows]
    fingerprint = "|".join(ds._fingerprint for _, ds in parts)
    return rows, fingerprint


def describe(src: CollectionSource, index: int) -> str:
    """How problems name a source: its key and enough of its value to find it in the YAML."""
    what = f"builder={src.builder!r}" if src.builder else f"preset={src.preset!r}"
    return f"collection[{index}] (path={src.path!r}, {what})"


# ---------------------------------------------------------------------------------------- splits


SPLITS = ("meta_train", "meta_val", "meta_test")
AUTO_FRACTION = 0.1
"""Share drawn for a split that nothing names (held_out_fraction / validation_fraction null)."""


def _closest(name: str, options: Sequence[str]) -> list[str]:
    """The option closest to ``name``, ignoring case (a family "QA" meant as "qa")."""
    lower = {o.lower(): o for o in options}
    return [lower[m] for m in difflib.get_close_matches(name.lower(), list(lower), n=1, cutoff=0.5)]


def assign_splits(
    tasks: Sequence[tuple[str, str]], split: CollectionSplit, *, seed: int
) -> tuple[dict[str, str], list[str]]:
    """Puts every task in exactly one of meta_train / meta_val / meta_test.

    Args:
        tasks: (name, family) of every task, in collection order.
        split: the split section.
        seed: seeds the draw of the fractions.

    Returns:
        (task name -> split, problems); problems are prefixed ``split.`` (the section's keys).
    """
    problems: list[str] = []
    names = [n for n, _ in tasks]
    family = dict(tasks)
    families = sorted(set(family.values()))
    wanted: dict[str, dict[str, str]] = {}  # task -> {split: where it was asked for}

    def want(task: str, to: str, why: str) -> None:
        wanted.setdefault(task, {})[to] = why

    named = {
        "meta_test": [("held_out", split.held_out)],
        "meta_val": [("validation", split.validation)],
    }
    for key, to in (("held_out_file", "meta_test"), ("validation_file", "meta_val")):
        path = getattr(split, key)
        if path is not None:
            try:
                named[to].append((key, read_task_list(path)))
            except ValueError:
                pass  # reported by CollectionSplit.validate
    for to, lists in named.items():
        for key, listed in lists:
            for n in listed:
                if n in family:
                    want(n, to, f"{key}")
                else:
                    close = _closest(n, names)
                    problems.append(
                        f"split.{key} names task {n!r}, which no source builds"
                        + (f"; did you mean {close[0]!r}?" if close else "")
                        + f" ({len(names)} tasks, e.g. {names[:5]}): fix the name or remove it"
                    )
    for key, to in (("held_out_families", "meta_test"), ("validation_families", "meta_val")):
        for fam in getattr(split, key):
            members = [n for n in names if family[n] == fam]
            if not members:
                close = _closest(fam, families)
                problems.append(
                    f"split.{key} has family {fam!r} with no tasks"
                    + (f"; did you mean {close[0]!r}?" if close else "")
                    + f" (families: {families[:10]}): set family: {fam} on a source or fix the name"
                )
            for n in members:
                want(n, to, f"{key} ({fam})")
    where: dict[str, str] = {}
    for n, asks in wanted.items():
        if len(asks) > 1:
            detail = " and ".join(f"{s} via {why}" for s, why in sorted(asks.items()))
            problems.append(
                f"split: task {n!r} is put in two splits ({detail}): a task belongs to one "
                "split; remove it from one list"
            )
        where[n] = next(iter(sorted(asks)))
    rest = [n for n in names if n not in where]
    order = np.random.default_rng(seed).permutation(len(rest))
    shuffled = [rest[i] for i in order]
    for key, to in (("held_out_fraction", "meta_test"), ("validation_fraction", "meta_val")):
        share = getattr(split, key)
        if share is None:
            share = 0.0 if to in where.values() else AUTO_FRACTION
        k = max(1, round(share * len(rest))) if share > 0 and rest else 0
        for n in shuffled[:k]:
            where[n] = to
        shuffled = shuffled[k:]
    for n in shuffled:
        where[n] = "meta_train"
    counts = {s: sum(1 for v in where.values() if v == s) for s in SPLITS}
    fixes = {
        "meta_train": "hold out fewer tasks or add sources",
        "meta_val": "name tasks in split.validation / validation_families or set split.validation_fraction",
        "meta_test": "name tasks in split.held_out / held_out_families or set split.held_out_fraction",
    }
    if names and not problems:
        for s in SPLITS:
            if counts[s] == 0:
                problems.append(
                    f"split leaves {s} empty ({len(names)} tasks: {counts}): {fixes[s]}"
                )
    return where, problems


# ---------------------------------------------------------------------------------------- checks


def collection_problems(
    sources: Sequence[CollectionSource], split: CollectionSplit, *, seed: int = 0,
    cache_dir: str | None = None,
) -> list[str]:
    """Every problem with a collection's data and split, found without a tokenizer or a model.

    Each source's data problem is reported with the source's key and path (one per source, so
    one round trip fixes them all); split problems follow. Sources that already failed their own
    key checks are skipped here.
    """
    problems: list[str] = []
    tasks: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    read_all = True
    for i, src in enumerate(sources):
        if src.validate():
            read_all = False
            continue  # its key problems are reported with the section
        try:
            rows, _ = read_source(src, seed=seed, index=i, cache_dir=datasets_cache(cache_dir))
        except ValueError as err:
            problems.append(f"{describe(src, i)}: {err}")
            read_all = False
            continue
        for r in rows:
            if r.name in seen:
                problems.append(
                    f"{describe(src, i)}: task {r.name!r} is also built by collection"
                    f"[{seen[r.name]}]: task names must be unique; set task_name or name_prefix"
                )
                continue
            seen[r.name] = i
            tasks.append((r.name, r.domain or r.name))
    if read_all and tasks:
        problems.extend(assign_splits(tasks, split, seed=seed)[1])
    return problems


# ---------------------------------------------------------------------------------------- build


def _process_group() -> tuple[int, Callable[[], None]]:
    """(rank, barrier) of the running job; (0, no-op) outside one.

    torch.distributed only (no DeepSpeed, no accelerate): the launcher has already made the
    group, and a barrier is all the cache needs.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.barrier
    return 0, lambda: None


def datasets_cache(cache_dir: str | None) -> str | None:
    """Where ``datasets`` keeps the Arrow files it converts: ``<cache_dir>/datasets``, or its own
    default cache when ``tasks.cache_dir`` is null."""
    return os.path.join(cache_dir, "datasets") if cache_dir else None


def source_fingerprint(src: CollectionSource, *, cache_dir: str | None = None) -> str:
    """The fingerprint ``datasets`` gives the rows ``src`` reads (cheap: Arrow-cached)."""
    files = source_files(src)
    if src.resolved()["builder"] == "dataset" and files is not None and len(files) > 1:
        return "|".join(_load(src, [f], cache_dir)._fingerprint for f in files)
    return _load(src, files, cache_dir)._fingerprint


def build_collection(
    sources: Sequence[CollectionSource],
    split: CollectionSplit,
    tokenizer: Any,
    *,
    seed: int,
    max_length: int,
    cache_dir: str | None = None,
    separator: str = "\n\n",
) -> TaskSet:
    """Builds a declared collection: tokenized (through the disk cache) and split.

    In a distributed job rank 0 reads, tokenizes and writes the cache first; the other ranks
    wait at a barrier and then read it, so a node does the tokenization once, not once per rank.

    Args:
        sources: the collection's sources (checked by :func:`collection_problems` before).
        split: which tasks are held out.
        tokenizer: the model's tokenizer.
        seed: seeds the ``max_examples`` draws and the split fractions.
        max_length: token budget of one example.
        cache_dir: the tokenization cache (None = :func:`~fmmeta.tasks.cache.default_cache_dir`).
        separator: text between in-context demonstrations.

    Raises:
        ValueError: if the split is inconsistent (the config check reports it first).

    Example:
        >>> suite = build_collection([CollectionSource(path="data/qa.jsonl", builder="dataset")],
        ...     CollectionSplit(), tok, seed=0, max_length=64)  # doctest: +SKIP
    """
    from fmmeta.tasks.cache import cache_key, cached_tasks, default_cache_dir, tokenizer_fingerprint

    root = os.path.join(cache_dir, "tokenized") if cache_dir else default_cache_dir()
    data_dir = datasets_cache(cache_dir)
    rank, barrier = _process_group()
    if rank != 0:
        barrier()  # rank 0 fills the cache first
    tok_fp = tokenizer_fingerprint(tokenizer)
    tasks: list[Task] = []
    hits = 0
    for i, src in enumerate(sources):
        fp = source_fingerprint(src, cache_dir=data_dir)
        key = cache_key(tok_fp, fp, dataclasses.asdict(src), seed, i)
        built, hit = cached_tasks(
            key, lambda: read_source(src, seed=seed, index=i, cache_dir=data_dir)[0], tokenizer,
            cache_dir=root, max_length=max_length, on_too_long=src.on_too_long,
            separator=separator, write=rank == 0,
        )  # fmt: skip
        hits += hit
        tasks.extend(built)
    if rank == 0:
        barrier()
    check_unique_names(tasks, where="tasks.collection")
    where, problems = assign_splits([(t.name, t.domain) for t in tasks], split, seed=seed)
    if problems:
        raise ValueError("tasks." + "; tasks.".join(problems))
    out = TaskSet(**{s: [t for t in tasks if where[t.name] == s] for s in SPLITS})
    logger.info(
        "collection: %d sources (%d from the cache in %s), %d/%d/%d meta-train/val/test tasks",
        len(sources), hits, root, len(out.meta_train), len(out.meta_val), len(out.meta_test),
    )
    return out


__all__ = [
    "PRESETS",
    "build_collection",
    "source_fingerprint",
    "CollectionSource",
    "CollectionSplit",
    "assign_splits",
    "collection_problems",
    "describe",
    "read_source",
    "read_task_list",
    "source_files",
]
