"""No network on local data: reading a collection asks no host anything.

``datasets`` sends a download-count request for every local file it loads; where name resolution
hangs (an offline machine) a run sat silent in ``getaddrinfo`` for minutes. The guard below
records and refuses every look-up and connect; a control shows it sees ``datasets``' request."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import datasets
import pytest

from fmmeta.tasks.collection import CollectionSource, CollectionSplit, build_collection, collection_problems
from fmmeta.tasks.testing import tiny_tokenizer


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every network call made while the test runs (each refused), with the count switched on."""
    calls: list[str] = []

    def refuse(what: str):  # noqa: ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls.append(f"{what} {args[:2]}")
            raise OSError("no network in this test")
        return call

    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)
    return calls


def _folder(root: Path, files: int) -> Path:
    root.mkdir(parents=True)
    for k in range(files):
        rows = [{"input": f"task {k} row {i}", "output": f" {i % 3}"} for i in range(6)]
        (root / f"task{k:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


def test_the_guard_sees_the_request_datasets_makes(tmp_path: Path, asked: list[str]) -> None:
    folder = _folder(tmp_path / "data", 1)
    datasets.load_dataset("json", data_files=[str(folder / "task00.jsonl")], cache_dir=str(tmp_path / "c"))
    assert asked, "the control made no network call: the guard below would prove nothing"


def test_a_folder_collection_is_checked_and_built_without_the_network(tmp_path: Path, asked: list[str]) -> None:
    folder = _folder(tmp_path / "data", 12)
    sources = [CollectionSource(path=str(folder), builder="dataset", shots=2, query=2)]
    split = CollectionSplit(held_out=["task00"], validation=["task01"])
    cache = str(tmp_path / "cache")
    assert collection_problems(sources, split, cache_dir=cache) == []
    suite = build_collection(sources, split, tiny_tokenizer(), seed=0, max_length=32, cache_dir=cache)
    assert len(suite.meta_train) == 10
    again = build_collection(sources, split, tiny_tokenizer(), seed=0, max_length=32, cache_dir=cache)
    assert [t.name for t in again.meta_train] == [t.name for t in suite.meta_train]
    assert asked == []
