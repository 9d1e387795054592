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
from typing import TYPE_CHECKING, Any

import numpy as np

from fmmeta.atomic import replace_text
from fmmeta.progress import Progress
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
from fmmeta.tasks.rows import TaskRows
from fmmeta.tasks.task import Task, TaskSet, check_unique_names

if TYPE_CHECKING:  # types only: a run on a built-in suite never imports datasets (fmmeta.tasks.data says why)
    import datasets

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


PART_FILES = 64
"""Files per part of a source that makes one task per file. A part is what one rank reads, checks
and tokenizes, and one cache folder: ranks share a folder of 1,600 files 25 ways, no more than a
part's rows are held as text at once, and an edited file re-tokenizes its part only."""


@dataclasses.dataclass(frozen=True, eq=False)  # each part is itself (its files are a list)
class SourcePart:
    """Part ``k`` of ``count`` of a source: all of it, or :data:`PART_FILES` of its files.

    Attributes:
        src: the source.
        index: the source's position in the collection.
        k: the part's position in the source.
        count: the source's parts.
        files: the local files this part reads (None: a hub dataset, read whole).
    """

    src: CollectionSource
    index: int
    k: int
    count: int
    files: list[str] | None

    def fingerprint(self, cache_dir: str | None) -> str:
        """What the part's rows are known by, found without reading them as rows.

        Local files: an xxh3 digest of their bytes (GB/s) and their names (a file's name names its
        task); a ``save_to_disk`` folder: the fingerprint it was saved with; a hub dataset: the one
        ``datasets`` gives the revision it loads (Arrow-cached after the first time).
        """
        if self.files is None:
            return _load(self.src, None, cache_dir)._fingerprint
        plain = [f for f in self.files if not is_saved_dataset(f)]
        saved = [_load(self.src, [f], cache_dir)._fingerprint for f in self.files if is_saved_dataset(f)]
        return "|".join([*saved, *([f"content-{content_digest(plain)}", *map(dataset_name, plain)] if plain else [])])


def source_parts(src: CollectionSource, index: int) -> list[SourcePart]:
    """The parts ``src`` is read and built in: one per :data:`PART_FILES` files for a source of
    one task per file, else one.

    Raises:
        ValueError: for a local path that names no data (:func:`source_files`).
    """
    files = source_files(src)
    if not _one_per_file(src, files) or files is None:
        return [SourcePart(src, index, 0, 1, files)]
    chunks = [files[a : a + PART_FILES] for a in range(0, len(files), PART_FILES)]
    return [SourcePart(src, index, k, len(chunks), chunk) for k, chunk in enumerate(chunks)]


def _one_per_file(src: CollectionSource, files: list[str] | None) -> bool:
    """Whether ``src`` makes one task of each of its files (a folder, for a builder of one task
    per file)."""
    builder = src.task_builder
    return builder is not None and builder.one_task_per_file and files is not None and len(files) > 1


def read_source(
    src: CollectionSource, options: TaskOptions, *, seed: int, index: int = 0,
    cache_dir: str | None = None, part: SourcePart | None = None,
) -> list[TaskRows]:
    """Reads and checks one source, or one part of it: its tasks' texts.

    Args:
        src: the source.
        options: the source's options (:meth:`CollectionSource.task_options`): its episode
            shape and family.
        seed: seeds the ``max_examples`` draw.
        index: the source's position in the collection (seeds its draw apart from the others).
        cache_dir: where ``datasets`` keeps converted files (None = its own cache).
        part: read only this part of ``src`` (:func:`source_parts`); None reads all of it.

    Returns:
        The checked rows of each task.

    Raises:
        ValueError: the first problem with this source's data, naming the fix.
    """
    builder, keys = src.task_builder, src.section()
    assert builder is not None  # the config check refused a source without one
    task_name = getattr(keys, "task_name", None)  # the builders of one task per dataset take it
    every_file = source_files(src) if part is None or part.count == 1 else None
    files = part.files if part is not None else every_file
    if part is not None and part.count > 1 or _one_per_file(src, every_file):
        assert files is not None  # one task per file: local files
        if task_name is not None:
            raise ValueError(
                f"task_name={task_name!r} names one task but path={src.path!r} holds "
                "several files (one task each, named by file): remove task_name"
            )
        parts = _one_task_per_file(src, files, cache_dir)
    else:
        default_name = task_name or (dataset_name(files[0]) if files else src.path)
        parts = [(default_name, _load(src, files, cache_dir))]
    rows: list[TaskRows] = []
    for name, ds in parts:
        rows.extend(builder.rows(ds, keys, src.common(name, options.spec)))
    # A part draws from a stream of its own, so a part's rows never depend on who reads the others.
    rng = np.random.default_rng([seed, index] if part is None or part.count == 1 else [seed, index, part.k])
    return [r.subsample(src.max_examples, rng) for r in rows]


def describe(src: CollectionSource, index: int) -> str:
    """How problems name a source: its key and enough of its value to find it in the YAML."""
    what = f"builder={src.builder!r}" if src.builder else f"preset={src.preset!r}"
    return f"collection[{index}] (path={src.path!r}, {what})"


_FINGERPRINTS: dict[str, str] = {}
"""Each part's fingerprint as the config check computed it, by :func:`_part_id`, for
the build of the same process: a digest of every byte of the data is not read twice."""

_CHECKED: dict[str, list[TaskRows]] = {}
"""Rows the config check read, by :func:`_check_key`, until the build of the same process takes
them: the check and the build share one read of each part (up to :data:`KEEP_ROWS`)."""

KEEP_ROWS = 200_000
"""Rows the check keeps for the build, at most. Past it a part's rows are let go once checked and
the build reads them again, from the Arrow files ``datasets`` converted in the check (no JSON is
parsed twice): text of millions of rows would otherwise sit in memory until the build."""


def _check_key(part: SourcePart, seed: int, fingerprint: str) -> str:
    """What a part's check depends on: its data, its source's settings, its place and the seed."""
    from fmmeta.tasks.cache import cache_key

    return cache_key("checked", fingerprint, dataclasses.asdict(part.src), seed, part.index, part.k, part.count)


def _part_id(part: SourcePart) -> str:
    """What names a part within one process: its source's settings, its place and its files."""
    from fmmeta.tasks.cache import cache_key

    return cache_key("part", dataclasses.asdict(part.src), part.index, part.k, part.count, part.files)


def _checked_record(cache_dir: str | None, key: str) -> Path:
    """Where a part that passed its check records its tasks' names and families, so that the next
    check of the same data and settings reads no row (``<cache_dir>/checked``, or beside the
    token cache in the datasets cache)."""
    import datasets

    root = Path(cache_dir) / "checked" if cache_dir else Path(str(datasets.config.HF_DATASETS_CACHE)) / "fmmeta_checked"
    return root / f"{key}.json"


def _checked_tasks(part: SourcePart, *, seed: int, max_length: int, cache_dir: str | None) -> list[tuple[str, str]]:
    """(name, family) of each task ``part`` builds, from its record when its data and settings
    passed the check before, else read and checked now (the rows kept for the build).

    Raises:
        ValueError: the first problem with the part's data.
    """
    fingerprint = part.fingerprint(datasets_cache(cache_dir))
    _FINGERPRINTS[_part_id(part)] = fingerprint
    key = _check_key(part, seed, fingerprint)
    record = _checked_record(cache_dir, key)
    try:
        return [(str(n), str(f)) for n, f in json.loads(record.read_text(encoding="utf-8"))]
    except (OSError, ValueError, TypeError):
        pass  # no record (or an unreadable one): check the rows
    options = part.src.task_options(max_length=max_length)
    rows = read_source(part.src, options, seed=seed, index=part.index, cache_dir=datasets_cache(cache_dir), part=part)
    if sum(len(r.prompts) for kept in _CHECKED.values() for r in kept) + sum(len(r.prompts) for r in rows) <= KEEP_ROWS:
        _CHECKED[key] = rows
    tasks = [(r.name, r.family or r.name) for r in rows]
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        replace_text(record, json.dumps(tasks))
    except OSError as err:  # a read-only cache still checks, only again next time
        logger.info("could not record the check of %s (%s): the next run checks it again", part.src.path, err)
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
            built = [t for part in source_parts(src, i)
                     for t in _checked_tasks(part, seed=seed, max_length=max_length, cache_dir=cache_dir)]
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


def datasets_cache(cache_dir: str | None) -> str | None:
    """Where ``datasets`` keeps the Arrow files it converts: ``<cache_dir>/datasets``, or its own
    default cache when ``tasks.cache_dir`` is null."""
    return os.path.join(cache_dir, "datasets") if cache_dir else None


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

    A source is built in parts (:func:`source_parts`: :data:`PART_FILES` files each for a source
    of one task per file), each its own cache folder. In a distributed job the ranks of a machine deal the parts out,
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
    parts = [part for i, src in enumerate(sources) for part in source_parts(src, i)]
    keys = {}  # part -> (its cache key, its check key)
    for part in parts:
        fp = _FINGERPRINTS.pop(_part_id(part), None) or part.fingerprint(data_dir)
        keys[part] = (cache_key(tok_fp, fp, dataclasses.asdict(part.src), seed, part.index, part.k, part.count),
                      _check_key(part, seed, fp))
    cached = {key for key, _ in keys.values() if os.path.isdir(os.path.join(root, key))}
    threads = max(1, usable_cores() // ranks)  # a rank tokenizes on its share of the machine's cores
    progress = Progress("building tasks", len(parts), "parts", every_s=10)
    built: dict[SourcePart, list[Task]] = {}

    def build(part: SourcePart) -> None:
        key, check = keys[part]
        o = part.src.task_options(max_length=max_length, separator=separator)

        def rows() -> list[TaskRows]:
            checked = _CHECKED.pop(check, None)
            return checked if checked is not None else read_source(
                part.src, o, seed=seed, index=part.index, cache_dir=data_dir, part=part)

        built[part] = cached_tasks(key, rows, tokenizer, cache_dir=root, max_length=o.max_length,
                                   on_too_long=o.on_too_long, separator=o.separator, threads=threads)[0]
        progress.advance()

    if ranks > 1:  # each rank tokenizes its share, then reads the others' from the cache
        logger.info("building the collection's %d parts: this machine's %d ranks tokenize a share each",
                    len(parts), ranks)
    for part in parts[rank::ranks]:
        build(part)
    barrier()
    for part in parts:
        if part not in built:
            build(part)
    _CHECKED.clear()  # rows checked for other settings would not be asked for again
    _FINGERPRINTS.clear()
    tasks = [t for part in parts for t in built[part]]
    hits = sum(all(keys[p][0] in cached for p in parts if p.index == i) for i in range(len(sources)))
    check_unique_names(tasks, where="tasks.collection")
    where, problems = assign_splits([(t.name, t.family) for t in tasks], split, seed=seed)
    if problems:
        raise ValueError("tasks." + "; tasks.".join(problems))
    out = TaskSet(**{s: [t for t in tasks if where[t.name] == s] for s in SPLITS},
                  format_shift=split.format_shift_families)
    logger.info(
        "collection: %d sources (%d from the cache in %s), %d/%d/%d meta-train/val/test tasks",
        len(sources), hits, root, len(out.meta_train), len(out.validation), len(out.held_out),
    )
    return out


__all__ = [
    "PRESETS",
    "PART_FILES",
    "SourcePart",
    "build_collection",
    "source_parts",
    "CollectionSource",
    "CollectionSplit",
    "assign_splits",
    "collection_problems",
    "describe",
    "read_source",
    "read_task_list",
    "source_files",
]
