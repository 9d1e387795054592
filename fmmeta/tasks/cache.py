"""Tokenize a task source once, keep the ids on disk, and read them back memory-mapped.

A collection of thousands of tasks takes minutes to tokenize and seconds to read, so tokenized
ids are cached per source under a key made of the tokenizer, the source's data fingerprint and
the builder's arguments: change any of them and the key changes.

The format is the one a reader needs to leave the ids on disk: per ragged column (prompts,
answers, options) one flat file of int32 ids and a ``.npy`` of row offsets, both memory-mapped
when read, so tasks are views into the files (:class:`~fmmeta.tasks.ragged.RaggedIds`) and a
rank's memory follows the rows its episodes touch, not the collection's size; the page cache is
shared by every rank of the machine. Rows are tokenized in batches and appended as they come, so
writing never holds more than a batch of ids either. A folder is written under a temporary name
and renamed when complete, so a reader never sees half a cache; one that cannot be read back
(truncated, edited, another version) is logged, removed and rebuilt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fmmeta.progress import Progress
from fmmeta.tasks.choice_rows import MultipleChoiceRows
from fmmeta.tasks.classification import ClassificationTask, answer_word_ids
from fmmeta.tasks.generation import GenerationTask
from fmmeta.tasks.multiple_choice import MultipleChoiceTask
from fmmeta.tasks.ragged import IDS_DTYPE, RaggedIds
from fmmeta.tasks.rows import ClassificationRows, GenerationRows, TaskRows, tail_tokens
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.task import Task
from fmmeta.tasks.tokens import OnTooLong, check_texts, encode, eos_ids

logger = logging.getLogger(__name__)

CACHE_VERSION = 3
"""Bumped whenever the cached layout or the tokenization changes, so old caches miss."""

BATCH_ROWS = 4096
"""Rows tokenized per call: big enough for the tokenizer's batch speed, small enough that a
source of millions of rows never holds more than one batch of ids as Python lists."""

_RAGGED = ("prompt", "answer", "option")
"""The ragged arrays of a cache folder: ``<name>.ids`` (int32 values) and ``<name>.offsets.npy``.
Options are ragged twice: ``option_rows.npy`` says which options belong to each row."""


def default_cache_dir() -> str:
    """``<datasets cache>/fmmeta_tasks``: next to the Arrow files ``datasets`` converts."""
    import datasets

    return os.path.join(str(datasets.config.HF_DATASETS_CACHE), "fmmeta_tasks")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of everything about ``tokenizer`` that changes token ids (vocabulary, merges,
    normalizer, special tokens), computed from its serialized form, not its Python identity."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # a slow tokenizer: its vocabulary is what it has
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(repr((tokenizer.eos_token_id, tokenizer.pad_token_id)).encode())
    template = getattr(tokenizer, "chat_template", None)
    if template:  # a builder may render prompts with it
        h.update(json.dumps(template, sort_keys=True).encode())
    return h.hexdigest()


def _str_keys(value: Any) -> Any:
    """``value`` with every dict key a str that keeps its type (a verbalizer may map both 1 and
    "1"; JSON would merge them, and sorting mixed keys fails)."""
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else f"{type(k).__name__}:{k}"): _str_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_str_keys(v) for v in value]
    return value


def cache_key(*parts: Any) -> str:
    """A stable hex key of JSON-able parts (no ``hash()``: it changes between processes)."""
    blob = json.dumps(_str_keys([CACHE_VERSION, *parts]), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@contextlib.contextmanager
def tokenizer_threads(threads: int) -> Iterator[None]:
    """The fast tokenizer's batch encode on ``threads`` cores (1: no threads of its own), for the block.

    On 2 cores, one process encoding SNI-like rows (~290 tokens) ran 1.8x faster on both cores
    (docs/benchmarks.md); two ranks on those 2 cores each take one. Recipes set
    ``TOKENIZERS_PARALLELISM=false`` for their worker processes (a fork after the tokenizer's
    threads ran would deadlock them), so the setting is restored when the block ends. The thread
    count applies where the tokenizer's pool starts here (``RAYON_NUM_THREADS``, unless set).
    """
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    if threads > 1:
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def usable_cores() -> int:
    """The cores this process may run on (its affinity, which containers and launchers narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _task_meta(r: TaskRows, start: int, end: int) -> dict[str, Any]:
    """A task's entry in ``meta.json``: its rows' range, its kind, and what is not token ids
    (only a classification task has ``words``, ``class_names`` and ``pool``)."""
    s = r.spec
    meta: dict[str, Any] = {
        "name": r.name, "family": r.family, "start": start, "end": end,
        "spec": {"shots": s.shots, "query": s.query, "ways": s.ways,
                 "remap_labels": s.remap_labels, "label_pool": list(s.label_pool or ()) or None},
        "words": None, "class_names": None, "pool": None, "template_tail": r.template_tail,
        "kind": r.KIND,
    }  # fmt: skip
    if isinstance(r, ClassificationRows):
        meta.update(words=r.words, class_names=r.class_names, pool=r.pool or None)
    return meta


class _RaggedWriter:
    """Appends rows of ids to ``<name>.ids`` as they are tokenized; the offsets are written last."""

    def __init__(self, folder: Path, name: str) -> None:
        self.name = name
        self._file = open(folder / f"{name}.ids", "wb")  # noqa: SIM115 (closed by finish)
        self._lengths: list[np.ndarray] = []

    def add(self, rows: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        values = np.fromiter(itertools.chain.from_iterable(rows), dtype=IDS_DTYPE, count=int(lengths.sum()))
        self._file.write(values.tobytes())
        self._lengths.append(lengths)

    def finish(self, folder: Path) -> int:
        """Closes the values file, writes the offsets, returns the number of values."""
        self._file.close()
        offsets = np.concatenate([[0], np.cumsum(np.concatenate([np.zeros(0, np.int64), *self._lengths]))])
        np.save(folder / f"{self.name}.offsets.npy", offsets.astype(np.int64))
        return int(offsets[-1])


def _tokenize_rows(r: TaskRows, tokenizer: Any, eos: list[int], out: dict[str, _RaggedWriter],
                   labels: list[np.ndarray], option_counts: list[np.ndarray]) -> None:
    """Tokenizes one task's rows batch by batch into the writers (answers and options with EOS)."""
    check_texts(r.prompts, key="prompt", where=f"task {r.name!r}")
    if isinstance(r, GenerationRows):
        check_texts(r.answers, key="answer", where=f"task {r.name!r}")
    for a in range(0, len(r.prompts), BATCH_ROWS):
        b = min(a + BATCH_ROWS, len(r.prompts))
        out["prompt"].add(encode(tokenizer, r.prompt_texts(tokenizer, a, b)))
        options = r.options[a:b] if isinstance(r, MultipleChoiceRows) else [[] for _ in range(a, b)]
        answers = r.answers[a:b] if isinstance(r, GenerationRows) else []
        # Answers and options repeat (labels, short outputs): each distinct one is tokenized once.
        distinct = list(dict.fromkeys([*answers, *(o for opts in options for o in opts)]))
        ids = {text: t + eos for text, t in zip(distinct, encode(tokenizer, distinct))}
        out["answer"].add([ids[x] for x in answers] if answers else [[] for _ in range(a, b)])
        out["option"].add([ids[o] for opts in options for o in opts])
        option_counts.append(np.fromiter(map(len, options), dtype=np.int64, count=b - a))
        labels.append(np.full(b - a, -1, np.int32) if isinstance(r, GenerationRows)
                      else np.asarray(r.labels[a:b], dtype=np.int32))


def _write(folder: Path, rows: Sequence[TaskRows], tokenizer: Any, key: str) -> None:
    """Tokenizes ``rows`` in batches straight into the cache's files and publishes the folder
    atomically (written under a temporary name, then renamed)."""
    eos = list(eos_ids(tokenizer))
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    total = sum(len(r.prompts) for r in rows)
    progress = Progress(f"tokenizing {folder.name[:8]}", total, "rows")
    try:
        out = {name: _RaggedWriter(tmp, name) for name in _RAGGED}
        labels: list[np.ndarray] = []
        option_counts: list[np.ndarray] = []
        meta: list[dict[str, Any]] = []
        start = 0
        for r in rows:
            _tokenize_rows(r, tokenizer, eos, out, labels, option_counts)
            meta.append(_task_meta(r, start, start + len(r.prompts)))
            start += len(r.prompts)
            progress.advance(len(r.prompts))
        values = {name: w.finish(tmp) for name, w in out.items()}
        np.save(tmp / "label.npy", np.concatenate([np.zeros(0, np.int32), *labels]))
        counts = np.concatenate([np.zeros(0, np.int64), *option_counts])
        np.save(tmp / "option_rows.npy", np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        info = {"version": CACHE_VERSION, "key": key, "n_rows": start, "values": values, "tasks": meta}
        (tmp / "meta.json").write_text(json.dumps(info), encoding="utf-8")
        if folder.exists():  # another process finished the same key first: same content
            shutil.rmtree(tmp)
            return
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class _Cached:
    """A cache folder's arrays, memory-mapped: nothing is read until a row is."""

    def __init__(self, folder: Path, info: dict[str, Any]) -> None:
        n = info["n_rows"]
        self.ragged: dict[str, RaggedIds] = {}
        for name in _RAGGED:
            offsets = np.load(folder / f"{name}.offsets.npy", mmap_mode="r")
            count = info["values"][name]
            path = folder / f"{name}.ids"
            if path.stat().st_size != count * np.dtype(IDS_DTYPE).itemsize or int(offsets[-1]) != count:
                raise ValueError(f"{path.name} holds {path.stat().st_size} bytes, not {count} ids")
            values = np.memmap(path, dtype=IDS_DTYPE, mode="r", shape=(count,)) if count else np.zeros(0, IDS_DTYPE)
            self.ragged[name] = RaggedIds.from_offsets(values, offsets)
        self.labels = np.load(folder / "label.npy", mmap_mode="r")
        self.option_rows = np.load(folder / "option_rows.npy", mmap_mode="r")
        if not (len(self.ragged["prompt"]) == len(self.ragged["answer"]) == len(self.labels) == n
                and len(self.option_rows) == n + 1 and int(self.option_rows[-1]) == len(self.ragged["option"])):
            raise ValueError(f"cache arrays disagree with its {n} rows")

    def rows(self, name: str, a: int, b: int) -> RaggedIds:
        """Rows ``a:b`` of a ragged array, as a view."""
        r = self.ragged[name]
        return RaggedIds(r.values, r.starts[a:b], r.ends[a:b])

    def options(self, a: int, b: int) -> list[list[tuple[int, ...]]]:
        """Each of rows ``a:b``'s options as ids (multiple-choice tasks keep them as tuples)."""
        opts, at = self.ragged["option"], self.option_rows
        return [[opts.row(k) for k in range(at[i], at[i + 1])] for i in range(a, b)]


def _read(folder: Path, key: str) -> tuple[_Cached, list[dict[str, Any]]]:
    """The cached ids (memory-mapped) and task metadata; raises on anything inconsistent."""
    info = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if info.get("version") != CACHE_VERSION or info.get("key") != key:
        raise ValueError(f"cache holds key {info.get('key')!r} version {info.get('version')!r}")
    return _Cached(folder, info), info["tasks"]


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One cached task's ids and what its metadata says, as its kind's restore reads them."""

    cached: _Cached
    m: dict[str, Any]
    spec: EpisodeSpec
    tail: int
    separator_ids: list[int]

    @property
    def prompts(self) -> RaggedIds:
        return self.cached.rows("prompt", self.m["start"], self.m["end"])


def _multiple_choice(e: _Entry, tokenizer: Any, max_length: int, on_too_long: OnTooLong) -> Task:
    a, b, prompts = e.m["start"], e.m["end"], e.prompts
    return MultipleChoiceTask.from_ids(
        e.m["name"], [prompts.row(i) for i in range(len(prompts))], e.cached.options(a, b),
        e.cached.labels[a:b].tolist(), spec=e.spec, family=e.m["family"], max_length=max_length,
        on_too_long=on_too_long, separator_ids=e.separator_ids, tail_tokens=e.tail,
    )  # fmt: skip


def _classification(e: _Entry, tokenizer: Any, max_length: int, on_too_long: OnTooLong) -> Task:
    m = e.m
    words = answer_word_ids(tokenizer, [*m["words"], *(m["pool"] or ())])
    return ClassificationTask.from_ids(
        m["name"], e.prompts, e.cached.labels[m["start"]:m["end"]], words[: len(m["words"])],
        class_names=m["class_names"], spec=e.spec, pool_answers=words[len(m["words"]):],
        family=m["family"], max_length=max_length, separator_ids=e.separator_ids, tail_tokens=e.tail,
    )  # fmt: skip


def _generation(e: _Entry, tokenizer: Any, max_length: int, on_too_long: OnTooLong) -> Task:
    return GenerationTask.from_ids(
        e.m["name"], e.prompts, e.cached.rows("answer", e.m["start"], e.m["end"]), spec=e.spec,
        family=e.m["family"], max_length=max_length, on_too_long=on_too_long,
        separator_ids=e.separator_ids, tail_tokens=e.tail,
    )  # fmt: skip


_RESTORE: dict[str, Callable[[_Entry, Any, int, OnTooLong], Task]] = {
    MultipleChoiceRows.KIND: _multiple_choice, ClassificationRows.KIND: _classification,
    GenerationRows.KIND: _generation,
}
"""How a task of each kind (its rows' ``KIND``, stored in ``meta.json``) comes back from the cache."""


def _assemble(
    cached: _Cached, meta: list[dict[str, Any]], tokenizer: Any, *, max_length: int,
    on_too_long: OnTooLong, separator: str,
) -> list[Task]:
    """Tasks over the cached ids (views, no copy): the words of classification tasks are
    tokenized here (a handful)."""
    separator_ids = encode(tokenizer, [separator])[0] if separator else []
    tasks: list[Task] = []
    for m in meta:
        spec = EpisodeSpec(**{**m["spec"], "label_pool": tuple(m["spec"]["label_pool"] or ()) or None})
        entry = _Entry(cached, m, spec, tail_tokens(tokenizer, m.get("template_tail", "")), separator_ids)
        tasks.append(_RESTORE[m["kind"]](entry, tokenizer, max_length, on_too_long))
    return tasks


def cached_tasks(
    key: str,
    make_rows: Callable[[], Sequence[TaskRows]],
    tokenizer: Any,
    *,
    cache_dir: str | os.PathLike,
    max_length: int,
    on_too_long: OnTooLong = "drop",
    separator: str = "\n\n",
    threads: int = 1,
) -> tuple[list[Task], bool]:
    """The tasks of one source, from the cache under ``key`` or tokenized (and cached) now.

    Args:
        key: the source's cache key (:func:`cache_key` of tokenizer, data and arguments).
        make_rows: reads and checks the source's texts; called only on a miss.
        tokenizer: a Hugging Face tokenizer (the one in the key).
        cache_dir: the cache's root folder.
        max_length: token budget of one example (applied after reading, so not in the key).
        on_too_long: ``"drop"`` or ``"error"`` for an answer over budget.
        separator: text between in-context demonstrations.
        threads: cores to tokenize on (the fast tokenizer's threads, :func:`tokenizer_threads`):
            the cores this rank has to itself.

    Returns:
        (tasks, whether they came from the cache).

    Example:
        >>> tasks, hit = cached_tasks(key, lambda: rows, tok, cache_dir="cache", max_length=64)  # doctest: +SKIP
    """
    folder = Path(cache_dir) / key
    if folder.exists():
        try:
            cached, meta = _read(folder, key)
            return _assemble(cached, meta, tokenizer, max_length=max_length,
                             on_too_long=on_too_long, separator=separator), True  # fmt: skip
        except Exception as err:  # any unreadable cache means the same thing: rebuild it
            logger.warning("task cache %s is unreadable (%s: %s): rebuilding it", folder,
                           type(err).__name__, err)  # fmt: skip
            shutil.rmtree(folder, ignore_errors=True)
    rows = make_rows()
    with tokenizer_threads(threads):
        _write(folder, rows, tokenizer, key)
    cached, meta = _read(folder, key)
    return _assemble(cached, meta, tokenizer, max_length=max_length, on_too_long=on_too_long,
                     separator=separator), False  # fmt: skip


__all__ = ["CACHE_VERSION", "cache_key", "cached_tasks", "default_cache_dir", "tokenizer_fingerprint"]
