"""One entry point for every place a task's data can come from.

Builders accept a ``datasets.Dataset``, a ``DatasetDict`` plus a split, a hub dataset name plus
config and split, local json/jsonl/csv/parquet/arrow files, or a folder written by
``save_to_disk`` (the form most Hugging Face users keep data in). :func:`read_dataset` turns each
into one ``datasets.Dataset`` so builders only ever deal with that, and errors about the data
itself (a missing split, a file that does not exist, an unreachable hub) surface here with a fix.

``datasets`` is imported where rows are read, here and in the other task modules, never at import
time: with pandas and pyarrow it took 1.3 s of every process's start, and a run on a built-in suite
(the recipes' default, the smoke config) reads no dataset at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from fmmeta.tasks.json_values import restore_mixed_columns

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

DatasetLike = Union["datasets.Dataset", "datasets.DatasetDict", str, os.PathLike, Sequence[Union[str, os.PathLike]]]
"""What a builder accepts as rows: a Dataset, a DatasetDict, a hub name, or local file path(s)."""

FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}

SAVED_MARKERS = ("state.json", "dataset_dict.json")
"""Files ``save_to_disk`` writes at the top of its folder: a ``Dataset``'s, a ``DatasetDict``'s."""

SPLIT_FOLDERS = frozenset({"train", "validation", "valid", "val", "dev", "test"})
"""Folder names that name a split, not a dataset (a task is then named by the folder above)."""


@contextlib.contextmanager
def local_read() -> Iterator[None]:
    """No network while local data is read.

    ``datasets`` counts every ``load_dataset`` as a hub download with a HEAD request, local files
    too. Offline the request costs a timeout per call (0.1 s where the name fails fast, minutes
    where name resolution hangs, with no output); a local file is no download, so the count is off
    while one is read (``HF_HUB_OFFLINE`` would also refuse the hub reads a user asked for).
    """
    from datasets import config

    before = config.HF_UPDATE_DOWNLOAD_COUNTS
    config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        yield
    finally:
        config.HF_UPDATE_DOWNLOAD_COUNTS = before


def is_saved_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in SAVED_MARKERS)


def dataset_name(path: str | os.PathLike) -> str:
    """A task's name from its file or ``save_to_disk`` folder: the file name without its
    extensions, or the folder's name (the one above it where the folder names a split, as in
    ``ai2_arc/ARC-Easy/validation``)."""
    p = Path(path)
    if is_saved_dataset(p):
        return p.parent.name if p.name.lower() in SPLIT_FOLDERS and p.parent.name else p.name
    name = p.name
    for suffix in reversed(p.suffixes):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    return name


def _file_format(path: str) -> str | None:
    suffixes = Path(path).suffixes
    # data.jsonl.gz style compression: the format is the suffix before the compression suffix
    for suf in reversed(suffixes[-2:]):
        if suf.lower() in FORMATS:
            return FORMATS[suf.lower()]
    return None


def read_dataset(
    data: DatasetLike,
    *,
    split: str | None = None,
    name: str | None = None,
    data_files: str | Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.Dataset:
    """Returns the rows of ``data`` as one ``datasets.Dataset``.

    Args:
        data: a ``Dataset`` (returned as is); a ``DatasetDict`` (``split`` picks one, optional
            when it has a single split); a path or list of paths to local ``.json``, ``.jsonl``,
            ``.csv``, ``.parquet`` or ``.arrow`` files (one format); a folder written by
            ``save_to_disk`` (a ``Dataset``'s, or a ``DatasetDict``'s with ``split``); or a hub
            dataset name.
        split: the split to use; required for hub names and for a saved ``DatasetDict`` of
            several splits, checked against a saved ``Dataset``'s own split, ignored for local
            files (their rows form one split).
        name: the hub dataset's configuration name (``load_dataset(path, name)``).
        data_files: hub datasets only: which of its files to read (``load_dataset(data_files=)``).
        cache_dir: where ``datasets`` caches converted files (defaults to its own cache).

    Raises:
        ValueError: for a missing or unknown split, a file that does not exist, mixed or unknown
            file formats, or a hub dataset that cannot be loaded.

    Example:
        >>> ds = read_dataset("data/train.jsonl")  # doctest: +SKIP
        >>> ds = read_dataset("super_glue", name="boolq", split="train")  # doctest: +SKIP
    """
    import datasets

    if isinstance(data, datasets.Dataset):
        return data
    if isinstance(data, datasets.DatasetDict):
        splits = list(data.keys())
        if split is None:
            if len(splits) == 1:
                return data[splits[0]]
            raise ValueError(
                f"data is a DatasetDict with splits {splits}: pass split=... to pick one"
            )
        if split not in data:
            raise ValueError(
                f"split={split!r} is not in the DatasetDict; its splits are {splits}: "
                "pass one of them"
            )
        return data[split]
    if isinstance(data, (str, os.PathLike)):
        paths = [os.fspath(data)]
    elif isinstance(data, Sequence) and data and all(
        isinstance(p, (str, os.PathLike)) for p in data
    ):
        paths = [os.fspath(p) for p in data]
    else:
        raise ValueError(
            f"data of type {type(data).__name__} is not supported: pass a datasets.Dataset, "
            "a DatasetDict (+ split), a hub dataset name (+ name, split), local "
            ".json/.jsonl/.csv/.parquet/.arrow file path(s) or a save_to_disk folder"
        )
    saved = [p for p in paths if is_saved_dataset(p)]
    if saved:
        if len(paths) > 1:
            raise ValueError(
                f"data {paths} holds save_to_disk folder(s) {saved} among other paths: read one "
                "saved folder at a time (a YAML folder source makes each one a task of its own)"
            )
        return _load_saved(saved[0], split)
    formats = {p: _file_format(p) for p in paths}
    if any(f is not None for f in formats.values()) or len(paths) > 1:
        return _load_files(paths, formats, cache_dir)
    hub_name = paths[0]
    if os.path.exists(hub_name):
        raise ValueError(
            f"data={hub_name!r} is a local path without a supported extension and not a "
            "save_to_disk folder (no state.json or dataset_dict.json in it): use .json, .jsonl, "
            ".csv, .parquet or .arrow files, or a folder written by save_to_disk"
        )
    return _load_hub(hub_name, name=name, split=split, data_files=data_files, cache_dir=cache_dir)


def _load_saved(path: str, split: str | None) -> datasets.Dataset:
    """The rows of a ``save_to_disk`` folder (memory-mapped, not copied), ``split`` picking or
    checking the split."""
    import datasets

    try:
        with local_read():
            loaded = datasets.load_from_disk(path)
    except Exception as err:  # a torn folder raises FileNotFoundError, ArrowInvalid, json errors
        raise ValueError(
            f"data={path!r} is a save_to_disk folder that could not be read ({type(err).__name__}: "
            f"{err}): save it again with save_to_disk, or check that none of its files is missing"
        ) from err
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None and len(splits) != 1:
            raise ValueError(f"data={path!r} is a saved DatasetDict with splits {splits}: set split "
                             "to one of them")
        if split is not None and split not in loaded:
            raise ValueError(f"split={split!r} is not in the saved DatasetDict {path!r}; its splits are "
                             f"{splits}: set split to one of them")
        ds = loaded[split if split is not None else splits[0]]
    else:
        ds = loaded
        own = None if ds.split is None else str(ds.split)
        if split is not None and own is not None and split != own:
            raise ValueError(f"split={split!r} does not match {path!r}, a saved Dataset of the split "
                             f"{own!r}: set split to {own!r} (or leave it out)")
    if len(ds) == 0:
        raise ValueError(f"data={path!r} holds no rows: add rows, or leave it out")
    logger.info("loaded %d rows from the save_to_disk folder %s", len(ds), path)
    return ds


def _load_files(
    paths: list[str], formats: dict[str, str | None], cache_dir: str | os.PathLike | None
) -> datasets.Dataset:
    import datasets

    unknown = [p for p, f in formats.items() if f is None]
    if unknown:
        raise ValueError(
            f"files {unknown} have no supported extension: use .json, .jsonl, .csv, .parquet or .arrow"
        )
    kinds = sorted({f for f in formats.values() if f is not None})
    if len(kinds) > 1:
        raise ValueError(
            f"files {paths} mix formats {kinds}: read_dataset reads one format at a time; "
            "convert them or build one task list per format"
        )
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(
            f"data file(s) {missing} do not exist (working directory {os.getcwd()!r}): "
            "check the path(s)"
        )
    for path in paths:
        problem = _text_problem(path, kinds[0])
        if problem is not None:
            raise ValueError(problem)
    # The "json" builder reads both JSON arrays and JSON lines; every file lands in one split.
    # datasets keys its cache of local files on their path and modification time, so a file edited
    # with its time kept (cp -p, rsync -a, tar) came back with its old rows; the content digest as
    # the config name keys the cache (and the fingerprint every later cache uses) on the bytes.
    try:
        with local_read():
            ds = datasets.load_dataset(
                kinds[0],
                name=f"content-{content_digest(paths)}",
                data_files={"train": paths},
                split="train",
                cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
            )
    except Exception as err:  # datasets raises StopIteration, ArrowInvalid, its own types
        # Its messages name neither the file nor the line, so find them ourselves (only on failure:
        # parsing every good file twice would double the load time of large data).
        bad = [_first_bad_json_line(p) for p in paths] if kinds[0] == "json" else []
        raise ValueError(next((b for b in bad if b is not None), None) or (
            f"data file(s) {paths} could not be read as {kinds[0]} ({type(err).__name__}: {err}): "
            "check that they are well-formed files of that format"
        )) from err
    if len(ds) == 0:  # e.g. a JSON file holding []
        raise ValueError(f"data file(s) {paths} hold no rows: add rows, or leave the file(s) out")
    if kinds[0] == "json":  # "1" and 1 in one column must stay apart (labels would merge)
        ds = restore_mixed_columns(ds, paths)
    logger.info("loaded %d rows from %d %s file(s)", len(ds), len(paths), kinds[0])
    return ds


def content_digest(paths: Sequence[str]) -> str:
    """A 64-bit xxh3 digest of the files' bytes, in order: what their rows are known by.

    xxh3 (a dependency of ``datasets``) hashes several GB/s, so reading a file's bytes once more
    costs little beside parsing it (docs/guarantees.md gives the figure for 100 MB).
    """
    import xxhash

    digest = xxhash.xxh3_64()
    for path in paths:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")  # where one file ends: a byte moved across files changes the digest
    return digest.hexdigest()


def json_line_count(path: str) -> int:
    """The rows of a JSON-lines file: its non-blank lines (what the ``json`` builder reads)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _text_problem(path: str, kind: str) -> str | None:
    """What makes a JSON or CSV file unusable before parsing: no rows, only a CSV header, or a byte
    that is not UTF-8 (``datasets`` loads that without a word and fails later, when a row is read,
    naming neither file nor line). Compressed and parquet files are left to their reader."""
    if kind not in ("json", "csv") or Path(path).suffix.lower() not in FORMATS:
        return None
    rows = 0  # non-blank lines
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):  # a newline byte is never inside a UTF-8 character
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                return (
                    f"data file {path!r} line {number}: byte 0x{line[err.start]:02x} at column "
                    f"{err.start + 1} is not UTF-8: save the file as UTF-8 (e.g. "
                    "iconv -f latin1 -t utf-8 in.jsonl > out.jsonl)"
                )
            rows += bool(text.strip())
    if rows == 0:
        return f"data file {path!r} is empty (no rows): add rows, or leave the file out"
    if kind == "csv" and rows == 1:
        return f"data file {path!r} has only a header line, no rows: add rows, or leave the file out"
    return None


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _first_bad_json_line(path: str) -> str | None:
    """A JSON array file parses whole; otherwise every non-blank line must be one JSON object."""
    if Path(path).suffix.lower() not in FORMATS:
        return None  # compressed
    text = Path(path).read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
        if isinstance(whole, list):
            return None if whole else f"data file {path!r} holds an empty JSON array: add rows, or leave the file out"
    except json.JSONDecodeError:
        pass
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return (
                f"data file {path!r} line {number} is not valid JSON ({err.msg} at column "
                f"{err.colno}): {line[:80]!r}. Each line of a JSON-lines file must be one JSON "
                "object: fix or remove that line"
            )
        if not isinstance(row, dict):
            return (
                f"data file {path!r} line {number} is a JSON {_JSON_KINDS.get(type(row), 'value')}, "
                f"not an object: {line[:80]!r}. Each line must be one object such as "
                '{"input": "...", "output": "..."}: fix or remove that line'
            )
    return None


def _load_hub(
    path: str,
    *,
    name: str | None,
    split: str | None,
    data_files: str | Sequence[str] | None,
    cache_dir: str | os.PathLike | None,
) -> datasets.Dataset:
    import datasets

    if split is None:
        raise ValueError(
            f"data={path!r} is a hub dataset name, so split is required "
            "(e.g. split='train'); name= picks its configuration"
        )
    try:
        ds: Any = datasets.load_dataset(
            path,
            name,
            split=split,
            data_files=list(data_files) if isinstance(data_files, (list, tuple)) else data_files,
            cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        )
    except Exception as err:  # the hub raises many types; all mean "cannot get these rows"
        raise ValueError(
            f"could not load hub dataset {path!r} (name={name!r}, split={split!r}): "
            f"{type(err).__name__}: {err}. Check the name and config, your network or HF_TOKEN; "
            "offline, pass local files or a Dataset instead"
        ) from err
    if not isinstance(ds, datasets.Dataset):
        raise ValueError(
            f"hub dataset {path!r} split={split!r} loaded as {type(ds).__name__}, not a "
            "Dataset: pass a single split name"
        )
    return ds
