"""Task collections from YAML: every builder kind, every split style, the MetaICL and
Super-NaturalInstructions layouts, suites by import string, and the tokenization disk cache.

Every config goes through the recipe's own entry point (``load_config(RecipeConfig, ...)``), so
what is checked here is what a user's YAML gets.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from fmmeta.config import ConfigError, load_config
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks import cache as task_cache
from fmmeta.tasks.builders import classification_tasks, tasks_from_column
from fmmeta.tasks.config import build_task_set
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.task import ClassificationTask, EpisodeSpec, GenerationTask, TaskSet
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()
TINY = {"model": {"tiny": True, "tokenizer": "bytes"}}


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _metaicl_rows() -> list[dict]:
    """MetaICL's columns: two classification tasks (fixed options) and a generation task."""
    rows = []
    for i in range(8):
        rows.append({"task": "sentiment", "input": f"review {i} good", "output": "positive",
                     "options": ["positive", "negative"]})
        rows.append({"task": "sentiment", "input": f"review {i} bad", "output": "negative",
                     "options": ["positive", "negative"]})
        rows.append({"task": "parity", "input": f"number {2 * i}", "output": "even",
                     "options": ["even", "odd"]})
        rows.append({"task": "parity", "input": f"number {2 * i + 1}", "output": "odd",
                     "options": ["even", "odd"]})
        rows.append({"task": "echo", "input": f"say {i}", "output": f"{i}", "options": []})
    return rows


def _sni_rows() -> list[dict]:
    """Super-NaturalInstructions' columns: the definition must open every prompt."""
    rows = []
    for task, definition in (("task001_add_one", "Add one to the number."),
                             ("task002_double", "Double the number."),
                             ("task003_negate", "Negate the number.")):
        for i in range(6):
            target = {"task001_add_one": i + 1, "task002_double": 2 * i, "task003_negate": -i}[task]
            rows.append({"task_name": task, "id": f"{task}-{i}", "definition": definition,
                         "inputs": str(i), "targets": str(target)})
    return rows


def _topics(tmp_path: Path) -> str:
    path = tmp_path / "topics.csv"
    lines = ["text,label"] + [f"sentence {i} about {lab},{lab}" for i in range(5)
                              for lab in ("sport", "music", "science")]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _arith(tmp_path: Path) -> str:
    folder = tmp_path / "arith"
    for k in (1, 2, 3):
        _jsonl(folder / f"add{k}.jsonl", [{"input": f"{a}+{k}=", "output": str(a + k)} for a in range(8)])
    return str(folder)


def _collection(tmp_path: Path) -> list[dict]:
    """Four sources: one of each builder kind (the dataset one from a folder) and a preset."""
    return [
        {"path": _jsonl(tmp_path / "metaicl.jsonl", _metaicl_rows()), "preset": "metaicl",
         "family": "mix", "shots": 2, "query": 2},
        {"path": _jsonl(tmp_path / "sni.jsonl", _sni_rows()), "preset": "natural_instructions",
         "family": "numbers", "shots": 2, "query": 2},
        {"path": _topics(tmp_path), "builder": "classification", "task_name": "topic",
         "template": "Sentence: {text}\nTopic:", "family": "mix", "shots": 2, "query": 2},
        {"path": _arith(tmp_path), "builder": "dataset", "family": "arithmetic",
         "shots": 2, "query": 2},
    ]


def _config(tmp_path: Path, tasks: dict, *overrides: str) -> RecipeConfig:
    path = tmp_path / "run.yaml"
    tasks = {"cache_dir": str(tmp_path / "cache"), "max_length": 64, **tasks}
    path.write_text(yaml.safe_dump({**TINY, "tasks": tasks}), encoding="utf-8")
    return load_config(RecipeConfig, path, list(overrides))


def _problems(tmp_path: Path, tasks: dict) -> str:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, tasks)
    return str(err.value)


def _build(cfg: RecipeConfig, seed: int = 0) -> TaskSet:
    return build_task_set(cfg.tasks, TOK, seed=seed)


def _by_name(suite: TaskSet) -> dict:
    return {t.name: t for t in [*suite.meta_train, *suite.validation, *suite.held_out]}


# ---------------------------------------------------------------------------------------- kinds


def test_every_builder_kind_and_both_layouts_from_yaml(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"collection": _collection(tmp_path),
                             "split": {"held_out_families": ["arithmetic"],
                                       "validation": ["echo"]}})  # fmt: skip
    suite = _build(cfg)
    assert suite.names() == {
        "meta_train": ["sentiment", "parity", "task001_add_one", "task002_double",
                       "task003_negate", "topic"],
        "validation": ["echo"],
        "held_out": ["add1", "add2", "add3"],
    }  # fmt: skip
    tasks = _by_name(suite)
    # MetaICL: a fixed option list makes a classification task over it; options [] a generation one.
    assert isinstance(tasks["sentiment"], ClassificationTask)
    assert tasks["sentiment"].class_names == ("negative", "positive")
    assert isinstance(tasks["echo"], GenerationTask) and not hasattr(tasks["echo"], "class_names")
    # Super-NaturalInstructions: the task's definition opens each prompt.
    prompt = TOK.decode(tasks["task002_double"].examples[3].prompt_ids)
    assert prompt == "Double the number.\n\nInput: 3\nOutput:"
    assert TOK.decode(tasks["task002_double"].examples[3].answer_ids) == " 6</s>"
    # classification builder: CSV rows, template, 3 classes; dataset builder: one task per file.
    assert tasks["topic"].ways == 3 and TOK.decode(tasks["topic"].examples[0].prompt_ids) == (
        "Sentence: sentence 0 about sport\nTopic:")
    assert {t.family for t in suite.held_out} == {"arithmetic"}
    assert tasks["task001_add_one"].family == "numbers" and tasks["echo"].family == "mix"
    for t in tasks.values():  # every task samples a full episode
        ep = t.sample_episode(np.random.default_rng(0))
        assert len(ep.support) == t.episode_size[0] and len(ep.query) == t.episode_size[1]


def test_yaml_tasks_equal_the_python_builders(tmp_path: Path) -> None:
    """The YAML path (through the disk cache) gives the ids the Python builders give."""
    topics, metaicl = _topics(tmp_path), _jsonl(tmp_path / "m.jsonl", _metaicl_rows())
    cfg = _config(tmp_path, {"collection": [
        {"path": topics, "builder": "classification", "task_name": "topic", "shots": 2,
         "query": 2, "verbalizer": {"sport": "S", "music": "M", "science": "X"}},
        {"path": metaicl, "builder": "task_column", "shots": 2, "query": 2},
    ], "split": {"held_out": ["parity"], "validation": ["echo"]}})  # fmt: skip
    yaml_tasks = _by_name(_build(cfg))
    spec = EpisodeSpec(shots=2, query=2)
    python_tasks = {t.name: t for t in [
        *classification_tasks(topics, TOK, TaskOptions(spec=spec, max_length=64), name="topic", verbalizer={"sport": "S", "music": "M", "science": "X"}),
        *tasks_from_column(metaicl, TOK, TaskOptions(spec=spec, max_length=64)),
    ]}  # fmt: skip
    assert sorted(yaml_tasks) == sorted(python_tasks)
    for name, t in python_tasks.items():
        assert yaml_tasks[name].examples == t.examples, name
        assert type(yaml_tasks[name]) is type(t), name
        if isinstance(t, ClassificationTask):
            assert yaml_tasks[name].class_names == t.class_names


# ---------------------------------------------------------------------------------------- splits


def test_split_by_files_txt_and_metaicl_json(tmp_path: Path) -> None:
    (tmp_path / "test_tasks.txt").write_text("# held out\ntask003_negate\n\nparity\n")
    (tmp_path / "setting.json").write_text(json.dumps({"train": ["sentiment"], "test": ["echo"]}))
    cfg = _config(tmp_path, {"collection": _collection(tmp_path)[:2], "split": {
        "held_out_file": str(tmp_path / "test_tasks.txt"),
        "validation_file": str(tmp_path / "setting.json")}})  # fmt: skip
    names = _build(cfg).names()
    assert sorted(names["held_out"]) == ["parity", "task003_negate"] and names["validation"] == ["echo"]


def test_split_by_seeded_fractions(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"collection": _collection(tmp_path), "split": {
        "held_out_fraction": 0.3, "validation_fraction": 0.2}})  # fmt: skip
    a, b, c = _build(cfg, seed=0).names(), _build(cfg, seed=0).names(), _build(cfg, seed=1).names()
    assert a == b and a != c
    assert [len(a[s]) for s in ("meta_train", "validation", "held_out")] == [5, 2, 3]  # of 10 tasks


def test_split_default_draws_a_tenth_for_each_unnamed_split(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"collection": _collection(tmp_path),
                             "split": {"held_out_families": ["arithmetic"]}})
    names = _build(cfg).names()
    assert names["held_out"] == ["add1", "add2", "add3"]  # named: no share drawn on top
    assert len(names["validation"]) == 1 and len(names["meta_train"]) == 6  # max(1, round(0.1 * 7))


# ---------------------------------------------------------------------------------------- suites


def test_suite_by_import_string(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_suite.py").write_text(textwrap.dedent("""
        from fmmeta.tasks.suites import build_suite

        def build(tokenizer, *, seed, max_length, scale=1):
            suite = build_suite("synthetic", tokenizer, seed=seed, max_length=max_length)
            return type(suite)(meta_train=suite.meta_train[:scale], validation=suite.validation,
                               held_out=suite.held_out)

        NOT_A_FUNCTION = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(RecipeConfig, None, ["tasks.suite=my_suite:build", "tasks.options={scale: 2}"])
    suite = build_task_set(cfg.tasks, TOK, seed=0)
    assert len(suite.meta_train) == 2 and suite.held_out
    for bad, expected in (
        ("no_such_module:build", "module 'no_such_module' does not import"),
        ("my_suite:buld", "has no 'buld'; did you mean 'build'?"),
        ("my_suite:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is a int, not a function"),
    ):
        with pytest.raises(ConfigError, match=expected):
            load_config(RecipeConfig, None, [f"tasks.suite={bad}"])
    sys.modules.pop("my_suite", None)


# ---------------------------------------------------------------------------------------- cache


def _one_source(tmp_path: Path, template: str = "{input}") -> RecipeConfig:
    return _config(tmp_path, {"collection": [
        {"path": _jsonl(tmp_path / "m.jsonl", _metaicl_rows()), "preset": "metaicl",
         "template": template, "shots": 2, "query": 2}],
        "split": {"held_out": ["parity"], "validation": ["echo"]}})  # fmt: skip


def _cache_folders(tmp_path: Path) -> list[Path]:
    root = tmp_path / "cache" / "tokenized"
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def test_cache_hit_skips_tokenization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _one_source(tmp_path)
    first = _by_name(_build(cfg))
    assert len(_cache_folders(tmp_path)) == 1

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again: the cache missed")

    monkeypatch.setattr(task_cache, "_write", no_tokenizing)
    again = _by_name(_build(cfg))
    assert {n: t.examples for n, t in again.items()} == {n: t.examples for n, t in first.items()}


def test_cache_misses_after_a_changed_template(tmp_path: Path) -> None:
    before = _by_name(_build(_one_source(tmp_path)))
    after = _by_name(_build(_one_source(tmp_path, template="Q: {input}")))
    assert len(_cache_folders(tmp_path)) == 2
    assert TOK.decode(after["echo"].examples[0].prompt_ids) == "Q: say 0"
    assert TOK.decode(before["echo"].examples[0].prompt_ids) == "say 0"


def test_corrupt_cache_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _one_source(tmp_path)
    # As lists: the tasks read the cache in place, and the cut below edits the file they map.
    first = {n: list(t.examples) for n, t in _by_name(_build(cfg)).items()}
    (folder,) = _cache_folders(tmp_path)
    ids = folder / "prompt.ids"
    ids.write_bytes(ids.read_bytes()[:100])  # a write cut short
    with caplog.at_level(logging.WARNING, logger="fmmeta.tasks.cache"):
        again = _by_name(_build(cfg))
    assert "is unreadable" in caplog.text and "rebuilding it" in caplog.text
    assert {n: t.examples for n, t in again.items()} == first
    assert _cache_folders(tmp_path) == [folder]  # rebuilt in place, readable again
    assert _by_name(_build(cfg))["echo"].examples == first["echo"]


def test_encode_fast_path_gives_the_tokenizers_ids() -> None:
    """``encode`` calls a fast tokenizer's backend directly; ids must not change, and a backend
    set to truncate goes through the tokenizer (which turns truncation off per call)."""
    from fmmeta.tasks.task import encode

    texts = ["Hello world", " Paris", "Ünïcode naïve 東京", "  two  spaces", "a\n\nb", "x" * 300]
    tok = tiny_tokenizer()
    reference = list(tok(texts, add_special_tokens=False)["input_ids"])
    assert encode(tok, texts) == reference
    tok.backend_tokenizer.enable_truncation(max_length=5)
    assert encode(tok, texts) == reference


def test_a_rank_tokenizes_its_share_before_the_barrier_and_reads_the_rest_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process playing both ranks of a machine: rank 1 of 2 writes only its share before the
    barrier; once every share is in the cache, no rank tokenizes again and each reads after it."""
    from fmmeta.tasks import collection

    cfg = _one_source(tmp_path)  # one source: one part, rank 0's
    seen: list[int] = []
    monkeypatch.setattr(collection, "_process_group",
                        lambda: (1, 2, lambda: seen.append(len(_cache_folders(tmp_path)))))
    first = _by_name(_build(cfg))
    assert seen == [0]  # rank 1 had nothing of its own to write before the barrier
    assert len(_cache_folders(tmp_path)) == 1  # and, alone here, built rank 0's part after it

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized instead of reading the cache")

    for rank in (0, 1):
        order: list[str] = []
        monkeypatch.setattr(task_cache, "_write", no_tokenizing)
        monkeypatch.setattr(collection, "_process_group", lambda: (rank, 2, lambda: order.append("barrier")))
        real_read = task_cache._read
        monkeypatch.setattr(task_cache, "_read", lambda *a: (order.append("read"), real_read(*a))[1])
        again = _by_name(_build(cfg))
        assert order == (["read", "barrier"] if rank == 0 else ["barrier", "read"])
        assert {n: t.examples for n, t in again.items()} == {n: t.examples for n, t in first.items()}
        monkeypatch.setattr(task_cache, "_read", real_read)


def test_help_lists_the_keys_of_a_collection_source() -> None:
    from fmmeta.config import describe_config

    text = describe_config(RecipeConfig())
    for key in ("tasks.collection[].path (str, default <required>)", "tasks.collection[].template",
                "tasks.collection[].max_examples", "tasks.split.held_out_families"):
        assert key in text, key
    # Each builder's own keys, from its registered section: its name, then every key with its default and doc.
    from fmmeta.config import field_docs
    from fmmeta.tasks.registry import task_builders

    for builder in task_builders():
        assert f"tasks.collection[].<keys of builder {builder.name}>" in text, builder.name
        after = text[text.index(f"<keys of builder {builder.name}>"):]
        for f in dataclasses.fields(builder.section):
            doc = field_docs(builder.section)[f.name]
            assert doc and f"tasks.collection[].{f.name} (" in after and f"): {doc}" in after, (builder.name, f.name)
    assert "tasks.collection[].text_column (str, default 'text'): The text column" in text


def test_a_source_reads_its_builders_keys_from_flat_yaml_and_writes_them_back_flat(tmp_path: Path) -> None:
    from fmmeta.config import build_config, to_dict
    from fmmeta.tasks.collection_config import CollectionSource

    verbalizer = {"sport": "S", "music": "M", "science": "X"}
    src = build_config(CollectionSource, {"path": _topics(tmp_path), "builder": "classification",
                                          "text_column": "text", "verbalizer": verbalizer})
    assert src.keys == {"text_column": "text", "verbalizer": verbalizer}
    assert src.section().verbalizer == verbalizer and src.label_column == "label"
    written = to_dict(src)
    assert "keys" not in written and written["verbalizer"] == verbalizer
    assert CollectionSource(path="x.jsonl", builder="dataset", input_column="q").input_column == "q"


def test_own_tasks_yaml_saved_config_loads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's config.yaml (what recipes/evaluate.py reloads) holds the collection and split."""
    from fmmeta.config import save_resolved

    repo = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(repo)  # the example's paths are relative to the repository root
    overrides = ["model.tiny=true", "model.tokenizer=bytes", f"tasks.cache_dir={tmp_path}"]
    cfg = load_config(RecipeConfig, repo / "recipes" / "configs" / "own_tasks.yaml", overrides)
    again = load_config(RecipeConfig, save_resolved(cfg, tmp_path / "config.yaml"))
    assert again.tasks == cfg.tasks and len(again.tasks.collection) == 4
    assert again.tasks.split.held_out_families == ["arithmetic"]


def test_split_by_validation_and_held_out_families(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"collection": _collection(tmp_path), "split": {
        "held_out_families": ["arithmetic"], "validation_families": ["numbers"]}})  # fmt: skip
    names = _build(cfg).names()
    assert names["validation"] == ["task001_add_one", "task002_double", "task003_negate"]
    assert names["held_out"] == ["add1", "add2", "add3"]
    assert sorted(names["meta_train"]) == ["echo", "parity", "sentiment", "topic"]


def test_tasks_read_from_the_cache_leave_their_ids_on_disk(tmp_path: Path) -> None:
    """A cached task's ids are a view of the memory-mapped cache file, not a copy in memory: a
    rank's memory then follows what its episodes touch, not the collection's size."""
    tasks = _by_name(_build(_one_source(tmp_path)))
    (folder,) = _cache_folders(tmp_path)
    for t in tasks.values():
        values = t._prompts.values
        assert isinstance(values, np.memmap) and Path(values.filename) == folder / "prompt.ids", t.name
    echo = tasks["echo"]
    assert isinstance(echo._answers.values, np.memmap)
    # and every row reads back as the tokenizer's ids
    assert TOK.decode(echo.examples[0].prompt_ids) == "say 0"


def _sni_folder(root: Path, files: int = 6) -> Path:
    root.mkdir(parents=True)
    for k in range(files):
        rows = [{"input": f"task {k} row {i}", "output": f" {i % 3}"} for i in range(5 + k)]
        _jsonl(root / f"task{k:02d}.jsonl", rows)
    return root


def test_each_source_is_read_once_cold_and_not_at_all_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config check reads a new source and the build takes its rows; with the cache filled,
    neither reads a row (a restarted run: the check's record and the token cache answer)."""
    from fmmeta.tasks import collection

    tasks = {"collection": [
        {"path": str(_sni_folder(tmp_path / "sni")), "builder": "dataset", "shots": 2, "query": 2},
        {"path": _jsonl(tmp_path / "m.jsonl", _metaicl_rows()), "preset": "metaicl", "shots": 2, "query": 2}],
        "split": {"held_out": ["task00"], "validation": ["echo"]}}  # fmt: skip
    reads: list[str] = []
    real = collection.read_source
    monkeypatch.setattr(collection, "read_source", lambda src, *a, **k: (reads.append(src.path), real(src, *a, **k))[1])
    cfg = _config(tmp_path, tasks)  # load_config runs the check
    assert len(reads) == 2 and len(collection._CHECKED) == 2
    first = _by_name(_build(cfg))
    assert len(reads) == 2 and collection._CHECKED == {}  # the build took the check's rows
    reads.clear()
    cfg = _config(tmp_path, tasks)
    assert reads == []  # warm: the check's record answers
    again = _by_name(_build(cfg))
    assert reads == []  # and the token cache
    assert {n: t.examples for n, t in again.items()} == {n: t.examples for n, t in first.items()}


def test_a_folder_of_jsonl_files_is_one_read_split_by_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fmmeta.tasks import collection

    src = collection.CollectionSource(path=str(_sni_folder(tmp_path / "sni")), builder="dataset", shots=2, query=2)
    options = src.task_options(max_length=64)
    loads: list[int] = []
    real = collection._load
    monkeypatch.setattr(collection, "_load", lambda s, files, c: (loads.append(len(files)), real(s, files, c))[1])
    together = collection.read_source(src, options, seed=0)
    assert loads == [6]  # one read of the six files
    # the same rows as reading each file alone (what other formats, or differing columns, get)
    monkeypatch.setattr(collection, "json_line_count", lambda path: -1)
    alone = collection.read_source(src, options, seed=0)
    assert loads[1:] == [6, 1, 1, 1, 1, 1, 1]  # the counts disagree: file by file
    assert [(r.name, r.prompts, r.answers) for r in together] == [(r.name, r.prompts, r.answers) for r in alone]
    assert [len(r.prompts) for r in together] == [5, 6, 7, 8, 9, 10]


def test_tokenizing_takes_the_cores_a_rank_has_and_gives_the_same_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank on 2+ cores tokenizes on its threads, two ranks on 2 cores on one each; either way
    the ids are the same, and the process's setting (the recipe's ``false``) comes back after."""
    import os

    from fmmeta.tasks import collection

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    seen: list[str | None] = []
    write = task_cache._write
    monkeypatch.setattr(task_cache, "_write",
                        lambda *a: (seen.append(os.environ.get("TOKENIZERS_PARALLELISM")), write(*a))[1])
    monkeypatch.setattr(task_cache, "usable_cores", lambda: 2)
    threaded = _by_name(_build(_one_source(tmp_path / "a")))
    monkeypatch.setattr(collection, "_process_group", lambda: (0, 2, lambda: None))
    one_each = _by_name(_build(_one_source(tmp_path / "b")))
    assert seen == ["true", "false"] and os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert {n: t.examples for n, t in threaded.items()} == {n: t.examples for n, t in one_each.items()}


def test_a_big_folder_is_built_in_parts_and_an_edited_file_retokenizes_its_part_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fmmeta.tasks import collection

    monkeypatch.setattr(collection, "PART_FILES", 2)
    folder = _sni_folder(tmp_path / "sni", files=5)
    tasks = {"collection": [{"path": str(folder), "builder": "dataset", "shots": 2, "query": 2}],
             "split": {"held_out": ["task00"], "validation": ["task01"]}}
    first = _by_name(_build(_config(tmp_path, tasks)))
    assert sorted(first) == [f"task{k:02d}" for k in range(5)]
    assert len(_cache_folders(tmp_path)) == 3  # files 0-1, 2-3, 4
    _jsonl(folder / "task03.jsonl", [{"input": f"edited {i}", "output": " 1"} for i in range(6)])
    written: list[str] = []
    write = task_cache._write
    monkeypatch.setattr(task_cache, "_write", lambda f, *a: (written.append(f.name), write(f, *a))[1])
    again = _by_name(_build(_config(tmp_path, tasks)))
    assert len(written) == 1  # the part of files 2-3 only
    assert TOK.decode(again["task03"].examples[0].prompt_ids) == "edited 0"
    assert {n: again[n].examples for n in ("task00", "task02", "task04")} == {
        n: first[n].examples for n in ("task00", "task02", "task04")}


def test_past_the_rows_it_may_keep_the_check_lets_rows_go_and_the_build_reads_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fmmeta.tasks import collection

    tasks = {"collection": [{"path": _jsonl(tmp_path / "m.jsonl", _metaicl_rows()), "preset": "metaicl",
                             "shots": 2, "query": 2}], "split": {"held_out": ["parity"], "validation": ["echo"]}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    kept = _by_name(_build(_config(tmp_path / "a", tasks)))
    monkeypatch.setattr(collection, "KEEP_ROWS", 10)  # fewer than the source's 40 rows
    reads: list[str] = []
    real = collection.read_source
    monkeypatch.setattr(collection, "read_source", lambda src, *a, **k: (reads.append(src.path), real(src, *a, **k))[1])
    cfg = _config(tmp_path / "b", tasks)
    assert len(reads) == 1 and collection._CHECKED == {}  # checked, not kept
    again = _by_name(_build(cfg))
    assert len(reads) == 2
    assert {n: t.examples for n, t in again.items()} == {n: t.examples for n, t in kept.items()}


def test_the_build_takes_the_checks_digest_of_the_data_instead_of_reading_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fmmeta.tasks import collection

    digests: list[int] = []
    real = collection.content_digest
    monkeypatch.setattr(collection, "content_digest", lambda paths: (digests.append(len(paths)), real(paths))[1])
    cfg = _one_source(tmp_path)  # the check: one digest of the one file
    assert digests == [1]
    _build(cfg)
    assert digests == [1] and collection._FINGERPRINTS == {}
    _build(cfg)  # a build without a check before it digests the data itself
    assert digests == [1, 1]
