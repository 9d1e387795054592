"""Bad collection configs: each is refused by ``load_config`` (so before any model loads) with a
message that names the source (its key and path) and the fix; several at once come back in one
error. One case goes through the recipe's ``main`` to show no model is built."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from fmmeta.config import ConfigError, load_config
from fmmeta.recipe_config import RecipeConfig

REPO = Path(__file__).resolve().parents[3]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _raw(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _gen(tmp_path: Path, name: str = "gen.jsonl") -> str:
    """Two generation tasks, 6 rows each, columns task / input / output."""
    rows = [{"task": t, "input": f"{t} {i}", "output": str(i)} for t in ("t1", "t2") for i in range(6)]
    return _jsonl(tmp_path / name, rows)


def _labeled(tmp_path: Path, labels: tuple[str, ...] = ("yes", "no"), name: str = "labeled.jsonl") -> str:
    rows = [{"text": f"row {i}", "label": labels[i % len(labels)]} for i in range(12)]
    return _jsonl(tmp_path / name, rows)


def _good(tmp_path: Path) -> list[dict]:
    """A valid collection: 2 + 1 + 1 tasks, so every split can get one."""
    return [
        {"path": _gen(tmp_path), "builder": "task_column", "family": "gen", "shots": 2, "query": 2},
        {"path": _labeled(tmp_path), "builder": "classification", "task_name": "yn",
         "family": "cls", "shots": 2, "query": 2},
        {"path": _jsonl(tmp_path / "qa.jsonl", [{"input": f"q{i}", "output": f"a{i}"} for i in range(6)]),
         "builder": "dataset", "family": "qa", "shots": 2, "query": 2},
    ]  # fmt: skip


def _problems(tmp_path: Path, collection: list[dict], split: dict | None = None, **tasks) -> str:
    path = tmp_path / "run.yaml"
    section = {"collection": collection, "split": split or {"held_out": ["qa"], "validation": ["t2"]},
               "cache_dir": str(tmp_path / "cache"), **tasks}  # fmt: skip
    path.write_text(yaml.safe_dump({"model": {"tiny": True, "tokenizer": "bytes"}, "tasks": section}))
    with pytest.raises(ConfigError) as err:
        load_config(RecipeConfig, path, [])
    return str(err.value)


def _with(tmp_path: Path, index: int, **changes) -> list[dict]:
    sources = _good(tmp_path)
    sources[index] = {k: v for k, v in {**sources[index], **changes}.items() if v is not None}
    return sources


def test_the_good_collection_loads(tmp_path: Path) -> None:
    """The baseline every bad case changes one thing of."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"tasks": {"collection": _good(tmp_path),
                                              "split": {"held_out": ["qa"], "validation": ["t2"]}}}))
    cfg = load_config(RecipeConfig, path, ["model.tiny=true", "model.tokenizer=bytes"])
    assert cfg.tasks.resolved_suite() == "collection" and len(cfg.tasks.collection) == 3


CASES = {
    "missing column": (
        lambda p: _with(p, 0, output_column="answer"),
        ["tasks.collection[0] (path=", "gen.jsonl", "column(s) ['answer'] not found",
         "the dataset has columns ['task', 'input', 'output']"],
    ),
    "template field not in the data": (
        lambda p: _with(p, 2, template="Question: {question}"),
        ["tasks.collection[2] (path=", "qa.jsonl", "column(s) ['question'] not found",
         "pass the right column name(s)"],
    ),
    "template field with a format spec": (  # padded every row to 300 MB before any check: OOM
        lambda p: _with(p, 2, template="Text: {input:>300000000}"),
        ["tasks.collection[2] (path=", "has the field {input:>300000000}: templates take plain column names "
         "only (no format spec, conversion, attribute or index): write {input}"],
    ),
    "template field with an attribute": (
        lambda p: _with(p, 2, template="Text: {input.__class__}"),
        ["has the field {input.__class__}", "write {input}"],
    ),
    "template that never shows its data": (
        lambda p: _with(p, 2, template="Question: {{input}}"),
        ["tasks.collection[2] (path=", "template='Question: {{input}}' refers to no column",
         "every prompt would be the same text", "name the column in single braces"],
    ),
    "unknown builder": (
        lambda p: _with(p, 1, builder="clasification"),
        ["tasks.collection[1].builder='clasification' is invalid: allowed values are "
         "'classification', 'task_column', 'dataset', 'multiple_choice'"],
    ),
    "no builder and no preset": (
        lambda p: _with(p, 1, builder=None),
        ["tasks.collection[1].builder is missing: set builder to classification, task_column, dataset, "
         "multiple_choice or chat, or preset to metaicl or natural_instructions"],
    ),
    "unknown key in a source": (
        lambda p: _with(p, 2, templat="{input}"),
        ["unknown key 'tasks.collection[2].templat'; did you mean 'tasks.collection[2].template'?"],
    ),
    "misspelt answer template field": (
        lambda p: _with(p, 2, answer_template=" {anwser}"),
        ["tasks.collection[2].answer_template=' {anwser}' names {anwser}: an answer template takes {answer} "
         "(did you mean {answer}?)"],
    ),
    "key that does not apply to the builder": (
        lambda p: _with(p, 0, verbalizer=["a", "b"]),
        ["tasks.collection[0].verbalizer=['a', 'b'] does not apply to builder='task_column' "
         "(only to classification): remove it or change the builder"],
    ),
    "path that does not exist": (
        lambda p: _with(p, 2, path=str(p / "nope.jsonl")),
        ["tasks.collection[2] (path=", "nope.jsonl", "does not exist",
         "give an existing file, folder or glob, or a hub id"],
    ),
    "empty file": (
        lambda p: _with(p, 2, path=str(p / "empty.jsonl")),
        ["tasks.collection[2] (path=", "empty.jsonl", "is empty (no rows): add rows, or leave the file out"],
    ),
    "blank lines only": (
        lambda p: _with(p, 2, path=_raw(p / "blank.jsonl", b"\n  \n")),
        ["tasks.collection[2] (path=", "blank.jsonl' is empty (no rows)"],
    ),
    "byte that is not UTF-8": (
        lambda p: _with(p, 2, path=_raw(p / "latin1.jsonl", b'{"input": "q", "output": "a"}\n'
                                        b'{"input": "caf\xe9", "output": "b"}\n')),
        ["latin1.jsonl' line 2: byte 0xe9 at column 15 is not UTF-8: save the file as UTF-8"],
    ),
    "malformed JSON line": (
        lambda p: _with(p, 2, path=_raw(p / "broken.jsonl", b'{"input": "q", "output": "a"}\n'
                                        b'{"input": "q2" "output": "b"}\n')),
        ["broken.jsonl' line 2 is not valid JSON (Expecting ',' delimiter at column 16)",
         "fix or remove that line"],
    ),
    "CSV with only a header": (
        lambda p: _with(p, 2, path=_raw(p / "header.csv", b"input,output\n")),
        ["header.csv' has only a header line, no rows: add rows, or leave the file out"],
    ),
    "list value in an answer column": (
        lambda p: _with(p, 2, path=_jsonl(p / "lists.jsonl", [
            {"input": f"q{i}", "output": ["a", "b"] if i == 3 else f"a{i}"} for i in range(6)])),
        ["tasks.collection[2] (path=", "output[3]=['a', 'b'] is a list, not one answer text",
         "make each row's 'output' a single string"],
    ),
    "label column with one class": (
        lambda p: _with(p, 1, path=_labeled(p, labels=("yes",), name="one_class.jsonl")),
        ["tasks.collection[1] (path=", "label has a single class ['yes']: classification needs at "
         "least 2 classes"],
    ),
    "int and str labels that read alike": (  # datasets alone would read "1" back as 1: one class
        lambda p: _with(p, 1, path=_labeled(p, labels=(1, "1"), name="mixed.jsonl"),
                        verbalizer={1: "one", "1": "uno"}),
        ["tasks.collection[1] (path=", "label mixes label types ['int', 'str'] (e.g. 1, '1')",
         "use one type for every label"],
    ),
    "labels that differ only in spaces": (
        lambda p: _with(p, 1, path=_labeled(p, labels=("yes", "yes ", "no"), name="spaces.jsonl")),
        ["tasks.collection[1] (path=", "classes 'yes' and 'yes ' have answer words that differ only "
         "in spaces", "no answer could tell them apart"],
    ),
    "verbalizer giving two classes one word": (
        lambda p: _with(p, 1, verbalizer={"yes": "ok", "no": "ok"}),
        ["tasks.collection[1] (path=", "classes 'no' and 'yes' have the same answer word ('ok', 'ok')",
         "give each class its own word in the verbalizer"],
    ),
    "too few examples for an episode": (
        lambda p: _with(p, 0, shots=4, query=4),
        ["tasks.collection[0] (path=", "task 't1' has 6 examples but an episode needs shots + "
         "query = 8: add examples, lower shots/query, or pass drop_small_tasks=True"],
    ),
    "zero shots": (
        lambda p: _with(p, 2, shots=0),
        ["tasks.collection[2].shots=0 is invalid: shots must be an int >= 1"],
    ),
    "same task name from two sources": (
        lambda p: _with(p, 2, path=_gen(p, "gen_again.jsonl"), builder="task_column"),
        ["tasks.collection[2] (path=", "task 't1' is also built by collection[0]: task names must "
         "be unique; set task_name or name_prefix"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_source_is_refused_naming_source_and_fix(case: str, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    make, expected = CASES[case]
    msg = _problems(tmp_path, make(tmp_path))
    for part in expected:
        assert part in msg, f"{case}: {part!r} not in\n{msg}"


SPLIT_CASES = {
    "task in two splits": (
        {"held_out": ["qa", "t1"], "validation": ["t1"]},
        ["tasks.split: task 't1' is put in two splits (held_out and validation): a task belongs "
         "to one split; remove it from one list"],
    ),
    "held-out family with no tasks": (
        {"held_out_families": ["QA"], "validation": ["t2"]},
        ["tasks.split.held_out_families has family 'QA' with no tasks; did you mean 'qa'?",
         "set family: QA on a source or fix the name"],
    ),
    "held-out task no source builds": (
        {"held_out": ["qa", "t3"], "validation": ["t2"]},
        ["tasks.split.held_out names task 't3', which no source builds; did you mean 't2'?"],
    ),
    "held-out list file missing": (
        {"held_out_file": "no/such/test_tasks.txt", "validation": ["t2"]},
        ["tasks.split.held_out_file='no/such/test_tasks.txt': the file does not exist"],
    ),
    "nothing left to train on": (
        {"held_out_families": ["gen", "qa"], "validation_families": ["cls"]},
        ["tasks.split leaves meta_train empty", "hold out fewer tasks or add sources"],
    ),
    "fraction out of range": (
        {"held_out_fraction": 1.5},
        ["tasks.split.held_out_fraction=1.5 is invalid: must be in [0, 1)"],
    ),
}


@pytest.mark.parametrize("case", sorted(SPLIT_CASES))
def test_bad_split_is_refused_with_the_fix(case: str, tmp_path: Path) -> None:
    split, expected = SPLIT_CASES[case]
    msg = _problems(tmp_path, _good(tmp_path), split)
    for part in expected:
        assert part in msg, f"{case}: {part!r} not in\n{msg}"


def test_every_problem_of_every_source_in_one_error(tmp_path: Path) -> None:
    sources = _good(tmp_path)
    sources[0]["output_column"] = "answer"
    sources[1]["builder"] = "clasification"
    sources[2]["path"] = str(tmp_path / "nope.jsonl")
    msg = _problems(tmp_path, sources, options={"x": 1})
    assert msg.startswith("4 problems in the configuration:"), msg
    for part in ("tasks.collection[0] (path=", "tasks.collection[1].builder=",
                 "tasks.collection[2] (path=", "tasks.options={'x': 1} is set but a collection"):
        assert part in msg, msg


def test_suite_and_collection_together_are_refused(tmp_path: Path) -> None:
    msg = _problems(tmp_path, _good(tmp_path), suite="cldr")
    assert "tasks.suite='cldr' and collection (3 sources) are both set: remove suite" in msg


def test_recipe_refuses_a_bad_collection_before_building_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("train_recipe", REPO / "recipes" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the config was checked")

    # The recipe builds the model through the engine face (EngineFactory.build_base).
    monkeypatch.setattr("fmmeta.engine.factory.build_model_and_tokenizer", no_model)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"tasks": {"collection": _with(tmp_path, 0, output_column="answer")}}))
    assert train.main(["--config", str(path), f"output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "tasks.collection[0] (path=" in err and "column(s) ['answer'] not found" in err
    assert not (tmp_path / "run").exists()


def test_data_files_with_a_local_path_is_refused(tmp_path: Path) -> None:
    for path in (str(tmp_path / "gen.jsonl"), "no/such/file.jsonl"):
        msg = _problems(tmp_path, _with(tmp_path, 0, path=path, data_files=["x.jsonl"]))
        assert f"tasks.collection[0].data_files is set but path={path!r} is local" in msg, msg


def test_a_template_field_holding_lists_is_refused_not_trained_on_as_python_reprs(tmp_path: Path) -> None:
    from fmmeta.tasks.columns import render

    with pytest.raises(ValueError, match=r"column 'text' row 1 is a list \(\['owl', 'OWL'\]\), not text"):
        render("Word: {text}", {"text": ["cat", ["owl", "OWL"]]}, 2, where="task 'w'")
    assert render("Word: {text} ({n})", {"text": ["cat"], "n": [3]}, 1, where="task 'w'") == ["Word: cat (3)"]


def test_a_label_column_of_lists_is_refused_naming_the_row() -> None:
    from fmmeta.tasks.labels import labels_to_classes

    with pytest.raises(ValueError, match=r"label\[1\]=\['a', 'b'\] is a list, not one label"):
        labels_to_classes(["a", ["a", "b"]], verbalizer=None, feature_names=None, key="label", where="task 't'")
