"""Tokenize a task source once, keep the ids on disk, and read them back memory-mapped.

A collection of thousands of tasks takes minutes to tokenize and seconds to read, so tokenized
ids are cached per source under a key made of the tokenizer, the source's data fingerprint (the
one ``datasets`` computes for the files or hub revision it read) and the builder's arguments:
change any of them and the key changes. The format is ``datasets``' own: ``Dataset.map`` does
the tokenization (batched, ``num_proc`` workers for big sources, the key as its fingerprint) and
``save_to_disk`` / ``load_from_disk`` write and memory-map the Arrow files. A folder is written
under a temporary name and renamed when complete, so a reader never sees half a cache; one that
cannot be read back (truncated, edited, another version) is logged, removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets

from fmmeta.tasks.choice_rows import MultipleChoiceRows
from fmmeta.tasks.classification import ClassificationTask, answer_word_ids
from fmmeta.tasks.generation import GenerationTask
from fmmeta.tasks.multiple_choice import MultipleChoiceTask
from fmmeta.tasks.rows import ClassificationRows, GenerationRows, TaskRows, tail_tokens, tasks_from_rows
from fmmeta.tasks.spec import EpisodeSpec
from fmmeta.tasks.task import Task
from fmmeta.tasks.tokens import OnTooLong, check_texts, encode, eos_ids

logger = logging.getLogger(__name__)

CACHE_VERSION = 2
"""Bumped whenever the cached layout or the tokenization changes, so old caches miss."""

PARALLEL_ROWS = 200_000
"""Sources with at least this many rows are tokenized by several processes (``num_proc``)..."""

PARALLEL_CPUS = 4
"""...on machines with at least this many CPUs: on 2 cores, worker start-up, sharded writes and
the merge cost more than they save (100k rows: 18 s with 2 workers, 12 s without)."""

_FEATURES = datasets.Features({
    "prompt_ids": datasets.List(datasets.Value("int32")),
    "answer_ids": datasets.List(datasets.Value("int32")),
    "label": datasets.Value("int32"),
    "option_ids": datasets.List(datasets.List(datasets.Value("int32"))),
})  # fmt: skip


def default_cache_dir() -> str:
    """``<datasets cache>/fmmeta_tasks``: next to the Arrow files ``datasets`` converts."""
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
    return h.hexdigest()


def cache_key(*parts: Any) -> str:
    """A stable hex key of JSON-able parts (no ``hash()``: it changes between processes)."""
    blob = json.dumps([CACHE_VERSION, *parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _encode_batch(batch: dict[str, list[Any]], tokenizer: Any) -> dict[str, list[Any]]:
    # Answers repeat (labels, short outputs): each distinct one is tokenized once.
    distinct = list(dict.fromkeys([*batch["answer"], *(o for opts in batch["options"] for o in opts)]))
    ids = dict(zip(distinct, encode(tokenizer, distinct)))
    return {
        "prompt_ids": encode(tokenizer, batch["prompt"]),
        "answer_ids": [ids[a] for a in batch["answer"]],
        "label": batch["label"],
        "option_ids": [[ids[o] for o in opts] for opts in batch["options"]],
    }


def _task_meta(r: TaskRows, start: int, end: int) -> dict[str, Any]:
    """A task's entry in ``meta.json``: its rows' range, its kind, and what is not token ids
    (only a classification task has ``words``, ``class_names`` and ``pool``)."""
    s = r.spec
    meta: dict[str, Any] = {
        "name": r.name, "family": r.family, "start": start, "end": end,
        "spec": {"shots": s.shots, "query": s.query, "ways": s.ways,
                 "remap_labels": s.remap_labels, "label_pool": list(s.label_pool or ()) or None},
        "words": None, "class_names": None, "pool": None, "template_tail": r.template_tail,
        "kind": "multiple_choice" if isinstance(r, MultipleChoiceRows) else
                "classification" if isinstance(r, ClassificationRows) else "generation",
    }  # fmt: skip
    if isinstance(r, ClassificationRows):
        meta.update(words=r.words, class_names=r.class_names, pool=r.pool or None)
    return meta


def _write(folder: Path, rows: Sequence[TaskRows], tokenizer: Any, key: str) -> None:
    """Tokenizes ``rows`` with ``Dataset.map`` and writes the cache folder atomically."""
    prompts: list[str] = []
    answers: list[str] = []
    labels: list[int] = []
    options: list[list[str]] = []
    meta: list[dict[str, Any]] = []
    for r in rows:
        check_texts(r.prompts, key="prompt", where=f"task {r.name!r}")
        start = len(prompts)
        prompts.extend(r.prompts)
        if isinstance(r, GenerationRows):
            check_texts(r.answers, key="answer", where=f"task {r.name!r}")
            answers.extend(r.answers)
            labels.extend([-1] * len(r.prompts))
        else:
            answers.extend([""] * len(r.prompts))
            labels.extend(r.labels)
        options.extend(r.options if isinstance(r, MultipleChoiceRows) else [[] for _ in r.prompts])
        meta.append(_task_meta(r, start, len(prompts)))
    texts = datasets.Dataset.from_dict({"prompt": prompts, "answer": answers, "label": labels, "options": options},
                                       features=datasets.Features({
                                           "prompt": datasets.Value("string"), "answer": datasets.Value("string"),
                                           "label": datasets.Value("int32"),
                                           "options": datasets.List(datasets.Value("string"))}))
    cpus = os.cpu_count() or 1
    parallel = len(texts) >= PARALLEL_ROWS and cpus >= PARALLEL_CPUS
    ids = texts.map(
        _encode_batch, batched=True, batch_size=2000, fn_kwargs={"tokenizer": tokenizer},
        remove_columns=["prompt", "answer", "options"], features=_FEATURES, new_fingerprint=key,
        num_proc=min(cpus // 2, 8) if parallel else None,
        desc=f"tokenizing {len(texts)} examples",
    )  # fmt: skip
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        ids.save_to_disk(str(tmp / "data"))
        info = {"version": CACHE_VERSION, "key": key, "n_rows": len(ids), "tasks": meta}
        (tmp / "meta.json").write_text(json.dumps(info), encoding="utf-8")
        if folder.exists():  # another process finished the same key first: same content
            shutil.rmtree(tmp)
            return
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read(folder: Path, key: str) -> tuple[datasets.Dataset, list[dict[str, Any]]]:
    """The cached ids (memory-mapped) and task metadata; raises on anything inconsistent."""
    info = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if info.get("version") != CACHE_VERSION or info.get("key") != key:
        raise ValueError(f"cache holds key {info.get('key')!r} version {info.get('version')!r}")
    ds = datasets.load_from_disk(str(folder / "data"))
    if len(ds) != info["n_rows"] or set(ds.column_names) != set(_FEATURES):
        raise ValueError(f"cache holds {len(ds)} rows / columns {ds.column_names}")
    return ds, info["tasks"]


def _assemble(
    ds: datasets.Dataset, meta: list[dict[str, Any]], tokenizer: Any, *, max_length: int,
    on_too_long: OnTooLong, separator: str,
) -> list[Task]:
    """Tasks from cached ids: the words of classification tasks are tokenized here (a handful)."""
    prompt_ids = ds.data.column("prompt_ids").to_pylist()
    answer_ids = ds.data.column("answer_ids").to_pylist()
    labels = ds.data.column("label").to_pylist()
    option_ids = ds.data.column("option_ids").to_pylist()
    eos = list(eos_ids(tokenizer))
    separator_ids = encode(tokenizer, [separator])[0] if separator else []
    tasks: list[Task] = []
    for m in meta:
        a, b = m["start"], m["end"]
        tail = tail_tokens(tokenizer, m.get("template_tail", ""))
        # Caches written before the rename to "family" call it "domain"; the key (and so the
        # folder) is the same, so they are read as they are rather than rebuilt.
        family = m["family"] if "family" in m else m["domain"]
        spec = EpisodeSpec(**{**m["spec"], "label_pool": tuple(m["spec"]["label_pool"] or ()) or None})
        if m.get("kind") == "multiple_choice":
            tasks.append(MultipleChoiceTask.from_ids(
                m["name"], prompt_ids[a:b], [[o + eos for o in opts] for opts in option_ids[a:b]],
                labels[a:b], spec=spec, family=family, max_length=max_length,
                on_too_long=on_too_long, separator_ids=separator_ids, tail_tokens=tail,
            ))  # fmt: skip
        elif m["words"] is not None:
            words = answer_word_ids(tokenizer, [*m["words"], *(m["pool"] or ())])
            tasks.append(ClassificationTask.from_ids(
                m["name"], prompt_ids[a:b], labels[a:b], words[: len(m["words"])],
                class_names=m["class_names"], spec=spec, pool_answers=words[len(m["words"]):],
                family=family, max_length=max_length, separator_ids=separator_ids, tail_tokens=tail,
            ))  # fmt: skip
        else:
            tasks.append(GenerationTask.from_ids(
                m["name"], prompt_ids[a:b], [x + eos for x in answer_ids[a:b]], spec=spec,
                family=family, max_length=max_length, on_too_long=on_too_long,
                separator_ids=separator_ids, tail_tokens=tail,
            ))  # fmt: skip
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
    write: bool = True,
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
        write: False tokenizes without writing (a rank that found no cache after the leader's).

    Returns:
        (tasks, whether they came from the cache).

    Example:
        >>> tasks, hit = cached_tasks(key, lambda: rows, tok, cache_dir="cache", max_length=64)  # doctest: +SKIP
    """
    folder = Path(cache_dir) / key
    if folder.exists():
        try:
            ds, meta = _read(folder, key)
            return _assemble(ds, meta, tokenizer, max_length=max_length,
                             on_too_long=on_too_long, separator=separator), True  # fmt: skip
        except Exception as err:  # any unreadable cache means the same thing: rebuild it
            logger.warning("task cache %s is unreadable (%s: %s): rebuilding it", folder,
                           type(err).__name__, err)  # fmt: skip
            shutil.rmtree(folder, ignore_errors=True)
    rows = make_rows()
    if not write:
        return tasks_from_rows(rows, tokenizer, max_length=max_length, on_too_long=on_too_long,
                               separator=separator), False  # fmt: skip
    _write(folder, rows, tokenizer, key)
    ds, meta = _read(folder, key)
    return _assemble(ds, meta, tokenizer, max_length=max_length, on_too_long=on_too_long,
                     separator=separator), False  # fmt: skip


__all__ = ["CACHE_VERSION", "cache_key", "cached_tasks", "default_cache_dir", "tokenizer_fingerprint"]
