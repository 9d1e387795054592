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
import glob
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from fmmeta.atomic import replace_text
from fmmeta.progress import Progress
from fmmeta.tasks.choice_rows import multiple_choice_rows
from fmmeta.tasks.collection_config import PRESETS, CollectionSource, CollectionSplit, read_task_list
from fmmeta.tasks.collection_split import SPLITS, assign_splits
from fmmeta.tasks.data import (
    FORMATS,
    SAVED_MARKERS,
    content_digest,
    dataset_name,
    is_saved_dataset,
    json_line_count,
    read_dataset,
)
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.rows import TaskRows, classification_rows, column_rows, dataset_rows
from fmmeta.tasks.task import Task, TaskSet, check_unique_names

logger = logging.getLogger(__name__)


def source_files(src: CollectionSource) -> list[str] | None:
    """The local files ``src.path`` names (file, folder or glob), or None for a hub id.

    Raises:
        ValueError: for a local path that does not exist, matches nothing, or holds no data files.
    """
    path = os.path.expanduser(src.path)
    if any(ch in path for ch in "*?["):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f) or is_saved_dataset(f))
        if not files:
            raise ValueError(f"path={src.path!r} matches no file: check the pattern")
        return files
    if is_saved_dataset(path):
        return [path]
    if os.path.isdir(path):
        files = _folder_data(Path(path))
        if not files:
            raise ValueError(
                f"path={src.path!r} is a folder without .jsonl/.json/.csv/.parquet/.arrow files or "
                "save_to_disk folders: put the data there or point path at it"
            )
        return files
    if os.path.isfile(path):
        return [path]
    from fmmeta.config import looks_like_local_path

    if looks_like_local_path(path) or Path(path).suffix.lower() in FORMATS:
        raise ValueError(
            f"path={src.path!r} does not exist (working directory {os.getcwd()!r}): give an "
            "existing file, folder or glob, or a hub id such as 'Muennighoff/natural-instructions'"
        )
    return None


def _folder_data(root: Path) -> list[str]:
    """The data under ``root``: every ``save_to_disk`` folder in it (one dataset each) and every
    data file outside them (their Arrow and JSON files are parts of the saved dataset, not data)."""
    saved = sorted({str(p.parent) for marker in SAVED_MARKERS for p in root.rglob(marker)
                    if is_saved_dataset(p.parent)})
    inside = tuple(os.path.join(folder, "") for folder in saved)
    files = [str(f) for f in root.rglob("*")
             if f.is_file() and f.suffix.lower() in FORMATS and not str(f).startswith(inside)]
    # A saved DatasetDict holds saved Datasets (one per split): it is the one dataset, not them.
    top = [f for f in saved if not any(f != o and f.startswith(os.path.join(o, "")) for o in saved)]
    return sorted([*top, *files])


def _load(src: CollectionSource, files: list[str] | None, cache_dir: str | None) -> datasets.Dataset:
    if files is None:
        return read_dataset(
            src.path, split=src.split, name=src.name, data_files=src.data_files, cache_dir=cache_dir
        )
    # refuses empty, non-UTF-8 and malformed files; split picks a saved DatasetDict's
    return read_dataset(files, split=src.split, cache_dir=cache_dir)


def _one_task_per_file(src: CollectionSource, files: list[str], cache_dir: str | None
                       ) -> list[tuple[str, datasets.Dataset]]:
    """Each file's rows as its own task's dataset.

    JSON-lines files are read as one dataset (one ``load_dataset`` over the list, which keeps the
    files' order) and split by each file's row count: 1,600 files then cost one read, not 1,600
    calls of fixed overhead and 1,600 progress bars. Where that cannot be done (other formats,
    files whose columns differ, a count that disagrees) each file is read alone, as before.
    """
    if len(files) > 1 and all(Path(f).suffix.lower() == ".jsonl" for f in files):
        try:
            counts = [json_line_count(f) for f in files]
            whole = _load(src, files, cache_dir)
        except ValueError:
            whole = None  # read them one by one: the error then names the file it is about
        if whole is not None and sum(counts) == len(whole):
            ends = np.cumsum(counts)
            return [(dataset_name(f), whole.select(range(int(e - n), int(e)))) for f, n, e in zip(files, counts, ends)]
    return [(dataset_name(f), _load(src, [f], cache_dir)) for f in files]


def read_source(
    src: CollectionSource, options: TaskOptions, *, seed: int, index: int = 0,
    cache_dir: str | None = None,
) -> tuple[list[TaskRows], str]:
    """Reads and checks one source: its tasks' texts and a fingerprint of the rows it read.

    Args:
        src: the source.
        options: the source's options (:meth:`CollectionSource.task_options`): its episode
            shape and family.
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
    files = source_files(src)
    if builder in ("dataset", "multiple_choice") and files is not None and len(files) > 1:
        if src.task_name is not None:
            raise ValueError(
                f"task_name={src.task_name!r} names one task but path={src.path!r} holds "
                f"{len(files)} files (one task each, named by file): remove task_name"
            )
        parts = _one_task_per_file(src, files, cache_dir)
    else:
        default_name = src.task_name or (dataset_name(files[0]) if files else src.path)
        parts = [(default_name, _load(src, files, cache_dir))]
    rows: list[TaskRows] = []
    for task_name, ds in parts:
        spec, family, template = options.spec, options.family, args.get("template")
        if builder == "classification":
            rows.append(classification_rows(
                ds, name=task_name, text_column=args["text_column"],
                label_column=args["label_column"], verbalizer=src.verbalizer,
                drop_small_classes=src.drop_small, spec=spec, template=template,
                answer_template=src.answer_template, family=family,
            ))  # fmt: skip
        elif builder == "multiple_choice":
            rows.append(multiple_choice_rows(
                ds, name=task_name, spec=spec, template=template,
                options_column=args.get("options_column"), option_columns=args.get("option_columns"),
                label_column=args["label_column"], answer_format=args.get("answer_format") or "auto",
                answer_template=src.answer_template, family=family,
            ))  # fmt: skip
        elif builder == "task_column":
            rows.extend(column_rows(
                ds, task_column=args["task_column"], input_column=args["input_column"],
                output_column=args["output_column"], options_column=args.get("options_column"),
                name_prefix=src.name_prefix, drop_small_tasks=src.drop_small, spec=spec,
                template=template, answer_template=src.answer_template, family=family,
            ))  # fmt: skip
        else:
            rows.append(dataset_rows(
                ds, name=task_name, input_column=args["input_column"],
                output_column=args["output_column"], spec=spec, template=template,
                answer_template=src.answer_template, family=family,
            ))  # fmt: skip
    rng = np.random.default_rng([seed, index])
    rows = [r.subsample(src.max_examples, rng) for r in rows]
    fingerprint = "|".join(ds._fingerprint for _, ds in parts)
    return rows, fingerprint


def describe(src: CollectionSource, index: int) -> str:
    """How problems name a source: its key and enough of its value to find it in the YAML."""
    what = f"builder={src.builder!r}" if src.builder else f"preset={src.preset!r}"
    return f"collection[{index}] (path={src.path!r}, {what})"


_CHECKED: dict[str, list[TaskRows]] = {}
"""Rows the config check read, by :func:`_check_key`, until the build of the same process takes
them: the check and the build share one read of each source."""


def _check_key(src: CollectionSource, index: int, seed: int, fingerprint: str) -> str:
    """What a source's check depends on: its data, its settings, its place and the seed."""
    from fmmeta.tasks.cache import cache_key

    return cache_key("checked", fingerprint, dataclasses.asdict(src), seed, index)


def _checked_record(cache_dir: str | None, key: str) -> Path:
    """Where a source that passed its check records its tasks' names and families, so that the
    next check of the same data and settings reads no row (``<cache_dir>/checked``, or beside the
    token cache in the datasets cache)."""
    root = Path(cache_dir) / "checked" if cache_dir else Path(str(datasets.config.HF_DATASETS_CACHE)) / "fmmeta_checked"
    return root / f"{key}.json"


def _checked_tasks(src: CollectionSource, index: int, *, seed: int, max_length: int,
                   cache_dir: str | None) -> list[tuple[str, str]]:
    """(name, family) of each task ``src`` builds, from its record when its data and settings
    passed the check before, else read and checked now (the rows kept for the build).

    Raises:
        ValueError: the first problem with the source's data.
    """
    fingerprint = source_fingerprint(src, cache_dir=datasets_cache(cache_dir))
    key = _check_key(src, index, seed, fingerprint)
    record = _checked_record(cache_dir, key)
    try:
        return [(str(n), str(f)) for n, f in json.loads(record.read_text(encoding="utf-8"))]
    except (OSError, ValueError, TypeError):
        pass  # no record (or an unreadable one): check the rows
    options = src.task_options(max_length=max_length)
    rows, _ = read_source(src, options, seed=seed, index=index, cache_dir=datasets_cache(cache_dir))
    _CHECKED[key] = rows
    tasks = [(r.name, r.family or r.name) for r in rows]
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        replace_text(record, json.dumps(tasks))
    except OSError as err:  # a read-only cache still checks, only again next time
        logger.info("could not record the check of %s (%s): the next run checks it again", src.path, err)
    return tasks


def collection_problems(
    sources: Sequence[CollectionSource], split: CollectionSplit, *, seed: int = 0,
    cache_dir: str | None = None, max_length: int = 256,
) -> list[str]:
    """Every problem with a collection's data and split, found without a tokenizer or a model.

    Each source's data problem is reported with the source's key and path (one per source, so
    one round trip fixes them all); split problems follow. Sources that already failed their own
    key checks are skipped here. A source is read (every row checked) only where the same data
    and settings have not passed before; the rows read are kept for :func:`build_collection`, so a
    run reads each source once.
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
            built = _checked_tasks(src, i, seed=seed, max_length=max_length, cache_dir=cache_dir)
        except ValueError as err:
            problems.append(f"{describe(src, i)}: {err}")
            read_all = False
            continue
        for name, family in built:
            if name in seen:
                problems.append(
                    f"{describe(src, i)}: task {name!r} is also built by collection"
                    f"[{seen[name]}]: task names must be unique; set task_name or name_prefix"
                )
                continue
            seen[name] = i
            tasks.append((name, family))
    if read_all and tasks:
        problems.extend(assign_splits(tasks, split, seed=seed)[1])
    return problems


# ---------------------------------------------------------------------------------------- build


def _process_group() -> tuple[int, int, Callable[[], None]]:
    """(rank among this machine's ranks, ranks on this machine, barrier of the whole job) of the
    running job; (0, 1, no-op) outside one.

    torch.distributed only (no DeepSpeed, no accelerate): the launcher has already made the group.
    Ranks share the build per machine, not per job: the cache is a folder, and nodes need not
    share a file system, so every machine builds the whole collection with its own ranks.
    """
    import socket

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1, lambda: None
    hosts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    rank = dist.get_rank()
    mine = [r for r, h in enumerate(hosts) if h == hosts[rank]]
    return mine.index(rank), len(mine), dist.barrier


PART_FILES = 64
"""Files per part of a source that makes one task per file: a part is what one rank tokenizes and
one cache folder holds, so ranks share a folder of 1,600 files 25 ways."""


def _part_count(src: CollectionSource) -> int:
    """How many parts ``src`` is built in: one per :data:`PART_FILES` files for a source of one
    task per file, else one."""
    files = source_files(src)
    if src.resolved()["builder"] in ("dataset", "multiple_choice") and files is not None and len(files) > 1:
        return -(-len(files) // PART_FILES)
    return 1


class _SourceRows:
    """A source's checked rows, read at most once (or taken from the config check) and then
    handed out by part: its ``max_examples`` draws run across all its tasks in order, so a part's
    rows are a slice of the whole source's, whoever asks first."""

    def __init__(self, src: CollectionSource, index: int, seed: int, options: TaskOptions,
                 checked: list[TaskRows] | None, data_dir: str | None) -> None:
        self.src, self.index, self.seed, self.options, self.data_dir = src, index, seed, options, data_dir
        self._rows = checked

    def part(self, k: int, count: int) -> list[TaskRows]:
        if self._rows is None:
            self._rows = read_source(self.src, self.options, seed=self.seed, index=self.index,
                                     cache_dir=self.data_dir)[0]
        return self._rows if count == 1 else self._rows[k * PART_FILES : (k + 1) * PART_FILES]


@dataclasses.dataclass(frozen=True)
class _Part:
    """Part ``k`` of ``count`` of source ``source``: one cache folder, one rank's work."""

    source: int
    k: int
    count: int
    key: str
    whole: _SourceRows
    options: TaskOptions

    def rows(self) -> list[TaskRows]:
        return self.whole.part(self.k, self.count)


def datasets_cache(cache_dir: str | None) -> str | None:
    """Where ``datasets`` keeps the Arrow files it converts: ``<cache_dir>/datasets``, or its own
    default cache when ``tasks.cache_dir`` is null."""
    return os.path.join(cache_dir, "datasets") if cache_dir else None


def source_fingerprint(src: CollectionSource, *, cache_dir: str | None = None) -> str:
    """What the rows ``src`` reads are known by, found without reading them as rows.

    Local files: an xxh3 digest of their bytes (GB/s) and their names (a file's name names its
    task); a ``save_to_disk`` folder: the fingerprint it was saved with; a hub dataset: the one
    ``datasets`` gives the revision it loads (Arrow-cached after the first time).
    """
    files = source_files(src)
    if files is None:
        return _load(src, None, cache_dir)._fingerprint
    plain = [f for f in files if not is_saved_dataset(f)]
    saved = [_load(src, [f], cache_dir)._fingerprint for f in files if is_saved_dataset(f)]
    return "|".join([*saved, *([f"content-{content_digest(plain)}", *map(dataset_name, plain)] if plain else [])])


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

    A source is built in parts (:data:`PART_FILES` files each for a source of one task per file),
    each its own cache folder. In a distributed job the ranks of a machine deal the parts out,
    each tokenizing and writing its share, then meet at a barrier and read the rest from the
    cache: a machine tokenizes the collection once, its ranks side by side.

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
    from fmmeta.tasks.cache import cache_key, cached_tasks, default_cache_dir, tokenizer_fingerprint, usable_cores

    root = os.path.join(cache_dir, "tokenized") if cache_dir else default_cache_dir()
    data_dir = datasets_cache(cache_dir)
    rank, ranks, barrier = _process_group()
    tok_fp = tokenizer_fingerprint(tokenizer)
    parts: list[_Part] = []
    for i, src in enumerate(sources):
        fp = source_fingerprint(src, cache_dir=data_dir)
        options = src.task_options(max_length=max_length, separator=separator)
        whole = _SourceRows(src, i, seed, options, _CHECKED.pop(_check_key(src, i, seed, fp), None), data_dir)
        count = _part_count(src)
        parts.extend(_Part(i, k, count, cache_key(tok_fp, fp, dataclasses.asdict(src), seed, i, k, count), whole, options)
                     for k in range(count))  # fmt: skip
    _CHECKED.clear()  # rows checked for other settings would not be asked for again
    cached = {p.key for p in parts if os.path.isdir(os.path.join(root, p.key))}
    progress = Progress("building tasks", len(parts), "parts", every_s=10)
    built: dict[str, list[Task]] = {}

    threads = max(1, usable_cores() // ranks)  # a rank tokenizes on its share of the machine's cores

    def build(part: _Part) -> None:
        o = part.options
        built[part.key] = cached_tasks(
            part.key, part.rows, tokenizer, cache_dir=root, max_length=o.max_length,
            on_too_long=o.on_too_long, separator=o.separator, threads=threads,
        )[0]  # fmt: skip
        progress.advance()

    if ranks > 1:  # each rank tokenizes its share, then reads the others' from the cache
        logger.info("building the collection's %d parts: this machine's %d ranks tokenize a share each",
                    len(parts), ranks)
    for part in parts[rank::ranks]:
        build(part)
    barrier()
    for part in parts:
        if part.key not in built:
            build(part)
    tasks = [t for p in parts for t in built[p.key]]
    hits = sum(all(p.key in cached for p in parts if p.source == i) for i in range(len(sources)))
    check_unique_names(tasks, where="tasks.collection")
    where, problems = assign_splits([(t.name, t.family) for t in tasks], split, seed=seed)
    if problems:
        raise ValueError("tasks." + "; tasks.".join(problems))
    out = TaskSet(**{s: [t for t in tasks if where[t.name] == s] for s in SPLITS})
    logger.info(
        "collection: %d sources (%d from the cache in %s), %d/%d/%d meta-train/val/test tasks",
        len(sources), hits, root, len(out.meta_train), len(out.validation), len(out.held_out),
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
