"""Two real processes (gloo, CPU) build one task collection, each tokenizing a share of its parts.

Each rank checks the config and builds as the recipe does; the cache folders each rank wrote
before the barrier are recorded, and the tasks every rank ends with are compared with one
process's build of the same collection (their token-id fingerprints, split by split).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.distributed._common import exit_worker

WORLD = 2
FILES = 7
PART_FILES = 2  # 7 files in 4 parts, so both ranks get work and the split is uneven


def _collection(data: Path) -> tuple[list, object]:
    from fmmeta.tasks.collection import CollectionSource, CollectionSplit

    return ([CollectionSource(path=str(data), builder="dataset", shots=2, query=2, max_examples=6),
             CollectionSource(path=str(data / "task00.jsonl"), builder="dataset", task_name="again",
                              shots=2, query=2)],
            CollectionSplit(held_out=["task01"], validation=["task02"]))


def _build(data: Path, cache: Path, on_barrier=None):  # noqa: ANN001, ANN202
    from fmmeta.tasks import collection
    from fmmeta.tasks.testing import tiny_tokenizer

    if on_barrier is not None:
        group = collection._process_group

        def recorded():  # noqa: ANN202
            rank, ranks, barrier = group()
            return rank, ranks, lambda: (on_barrier(), barrier())

        collection._process_group = recorded
    sources, split = _collection(data)
    assert collection.collection_problems(sources, split, cache_dir=str(cache), max_length=32) == []
    return collection.build_collection(sources, split, tiny_tokenizer(), seed=0, max_length=32, cache_dir=str(cache))


def _digests(suite) -> dict[str, str]:  # noqa: ANN001
    from fmmeta.tasks.task import tasks_fingerprint

    return {name: tasks_fingerprint(getattr(suite, name)) for name in ("meta_train", "validation", "held_out")}


def _folders(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "tokenized").iterdir() if not p.name.startswith("."))


def _worker(rank: int, init_file: str, data: str, cache: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    from fmmeta.tasks import collection

    collection.PART_FILES = PART_FILES  # a spawned process of its own: nothing else sees it
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        from fmmeta.tasks import cache as task_cache

        written: list[str] = []
        write = task_cache._write
        task_cache._write = lambda folder, *a: (written.append(folder.name), write(folder, *a))[1]
        at_barrier: list[list[str]] = []
        suite = _build(Path(data), Path(cache), lambda: at_barrier.append(_folders(Path(cache))))
        result = {"digests": _digests(suite), "at_barrier": at_barrier[0], "written": written,
                  "names": [t.name for t in suite.meta_train]}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    except BaseException:
        dist.destroy_process_group()
        raise
    exit_worker()


@pytest.mark.timeout(120)
def test_two_ranks_share_the_build_and_hold_one_processs_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmmeta.tasks import collection

    monkeypatch.setattr(collection, "PART_FILES", PART_FILES)  # for the one-process build below
    data = tmp_path / "data"
    data.mkdir()
    for k in range(FILES):
        rows = [{"input": f"task {k} row {i}", "output": f" {(i * k) % 5}"} for i in range(8 + k)]
        (data / f"task{k:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(data), str(tmp_path / "shared"), str(tmp_path)),
             nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    alone = _build(data, tmp_path / "alone")
    assert ranks[0]["digests"] == ranks[1]["digests"] == _digests(alone)
    assert ranks[0]["names"] == [t.name for t in alone.meta_train]
    # 5 parts (4 of the folder, 1 of the file): each rank wrote its own before the barrier
    assert _folders(tmp_path / "alone") == _folders(tmp_path / "shared") and len(_folders(tmp_path / "alone")) == 5
    # Rank 0 tokenized parts 0, 2, 4 and rank 1 parts 1, 3, each before the barrier, none twice.
    assert [len(r["written"]) for r in ranks] == [3, 2]
    assert sorted(ranks[0]["written"] + ranks[1]["written"]) == _folders(tmp_path / "shared")
    for r in ranks:
        assert set(r["written"]) <= set(r["at_barrier"])
