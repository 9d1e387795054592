"""The four builders from every kind of data, and one test per input error."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import datasets
import numpy as np
import pytest

from fmmeta.tasks.builders import (
    DatasetSpec,
    classification_tasks,
    multiple_choice_tasks,
    tasks_from_column,
    tasks_from_datasets,
    tasks_from_examples,
)
from fmmeta.tasks.data import read_dataset
from fmmeta.tasks.episode import IGNORE_INDEX
from fmmeta.tasks.options import TaskOptions
from fmmeta.tasks.task import EpisodeSpec, split_tasks
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()
SPEC3 = EpisodeSpec(shots=2, query=2, ways=3)
GEN = EpisodeSpec(shots=2, query=3)

LANGS = {"de": ["Frankreich", "Spanien", "Italien", "Polen", "Schweden"],
         "fr": ["Allemagne", "Espagne", "Italie", "Pologne", "Suède"],
         "es": ["Alemania", "Francia", "Italia", "Polonia", "Suecia"],
         "it": ["Germania", "Grecia", "Spagna", "Ungheria", "Svezia"]}  # fmt: skip


def _cls_rows() -> list[dict]:
    return [{"text": w, "label": lang} for lang, ws in LANGS.items() for w in ws]


def _mix_rows() -> list[dict]:
    rows = []
    for k in (1, 2, 3):
        for a in range(6):
            rows.append({"task": f"add{k}", "input": f"{a}+{k}=", "output": str(a + k)})
    return rows


def _write(rows: list[dict], path: Path) -> Path:
    ds = datasets.Dataset.from_list(rows)
    if path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".csv":
        ds.to_csv(str(path), index=False)
    else:
        ds.to_parquet(str(path))
    return path


def _sources(rows: list[dict], tmp_path: Path, kind: str):
    ds = datasets.Dataset.from_list(rows)
    if kind == "dataset":
        return ds, None
    if kind == "datasetdict":
        return datasets.DatasetDict({"train": ds, "validation": ds.select([0])}), "train"
    return str(_write(rows, tmp_path / f"data.{kind}")), None


KINDS = ["dataset", "datasetdict", "json", "jsonl", "csv", "parquet"]


@pytest.mark.parametrize("kind", KINDS)
def test_classification_tasks_from_every_kind_of_data(kind: str, tmp_path: Path) -> None:
    src, split = _sources(_cls_rows(), tmp_path, kind)
    (task,) = classification_tasks(src, TOK, TaskOptions(spec=SPEC3), name="lang", template="Word: {text}\nLanguage:", split=split, verbalizer={"de": "German", "fr": "French", "es": "Spanish", "it": "Italian"})  # fmt: skip
    assert len(task) == 20 and task.class_names == ("de", "es", "fr", "it")
    truth = {w: lang for lang, ws in LANGS.items() for w in ws}
    words = {"de": " German", "fr": " French", "es": " Spanish", "it": " Italian"}
    ep = task.sample_episode(np.random.default_rng(0))
    assert len(ep.support) == 6 and len(ep.query) == 6
    assert len({e.prompt_ids for e in ep.support + ep.query}) == 12
    for ex in ep.support + ep.query:
        prompt = TOK.decode(ex.prompt_ids)
        assert prompt.startswith("Word: ") and prompt.endswith("\nLanguage:")
        word = prompt[len("Word: ") : -len("\nLanguage:")]
        assert TOK.decode(ex.answer_ids) == words[truth[word]] + "</s>"
        assert ex.answer_ids == ep.choices[ex.label]


def test_classification_classlabel_and_remap() -> None:
    rows = _cls_rows()
    names = sorted(LANGS)
    ds = datasets.Dataset.from_dict(
        {"text": [r["text"] for r in rows], "label": [names.index(r["label"]) for r in rows]},
        features=datasets.Features(
            {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)}
        ),
    )
    pool = ("alpha", "beta", "gamma", "delta", "omega")
    spec = EpisodeSpec(shots=2, query=2, ways=3, remap_labels=True, label_pool=pool)
    (task,) = classification_tasks(ds, TOK, TaskOptions(spec=spec))
    assert task.class_names == tuple(names)
    ep = task.sample_episode(np.random.default_rng(1))
    assert {TOK.decode(c) for c in ep.choices} <= {f" {w}</s>" for w in pool}


@pytest.mark.parametrize("kind", KINDS)
def test_tasks_from_column_from_every_kind_of_data(kind: str, tmp_path: Path) -> None:
    src, split = _sources(_mix_rows(), tmp_path, kind)
    tasks = tasks_from_column(src, TOK, TaskOptions(spec=GEN), split=split, template="Sum: {input}")
    assert [t.name for t in tasks] == ["add1", "add2", "add3"]
    for t in tasks:
        k = int(t.name[-1])
        ep = t.sample_episode(np.random.default_rng(k))
        assert len(ep.support) == 2 and len(ep.query) == 3
        for ex in ep.support + ep.query:
            a = int(TOK.decode(ex.prompt_ids)[len("Sum: ") :].split("+")[0])
            assert TOK.decode(ex.answer_ids) == f" {a + k}</s>"


@pytest.mark.parametrize("kind", KINDS)
def test_tasks_from_datasets_from_every_kind_of_data(kind: str, tmp_path: Path) -> None:
    rows = [{"q": f"capital {i}?", "a": f"city{i}"} for i in range(8)]
    src, split = _sources(rows, tmp_path, kind)
    other = datasets.Dataset.from_list([{"input": f"x{i}", "output": f"y{i}"} for i in range(6)])
    tasks = tasks_from_datasets([DatasetSpec(name="capitals", data=src, split=split, input_column="q",
                     output_column="a", template="Q: {q}\nA:", family="qa"),
         DatasetSpec(name="copy", data=other, episode=EpisodeSpec(shots=1, query=1))], TOK, TaskOptions(spec=GEN))  # fmt: skip
    assert [t.name for t in tasks] == ["capitals", "copy"]
    assert tasks[0].family == "qa" and tasks[1].family == "copy"
    ep = tasks[0].sample_episode(np.random.default_rng(0))
    for ex in ep.query:
        i = TOK.decode(ex.prompt_ids).split()[2].rstrip("?")
        assert TOK.decode(ex.answer_ids) == f" city{i}</s>"
    assert len(tasks[1].sample_episode(np.random.default_rng(0)).query) == 1


def test_readme_custom_task_set() -> None:
    # --- docs/tasks.md's "A task set from Python" snippet, verbatim apart from the tokenizer ---
    from fmmeta.tasks import EpisodeSpec, TaskOptions, collate, ensure_pad_token, split_tasks
    from fmmeta.tasks.builders import tasks_from_examples

    tokenizer = tiny_tokenizer()  # docs/tasks.md: AutoTokenizer.from_pretrained(...)
    ensure_pad_token(tokenizer)
    options = TaskOptions(spec=EpisodeSpec(shots=4, query=4))

    def addition(k):  # a generator function: one task per k
        def gen():
            for a in range(40):
                yield f"{a}+{k}=", f" {a + k}"
        return gen

    tasks = [tasks_from_examples(f"add{k}", addition(k), tokenizer, options) for k in range(10)]
    reviews = [("great", "pos"), ("awful", "neg"), ("lovely", "pos"), ("bad", "neg"),
               ("superb", "pos"), ("dull", "neg"), ("fine", "pos"), ("poor", "neg")]
    tasks.append(tasks_from_examples(  # classification; label words remapped in every episode
        "sentiment",
        [{"prompt": f"Review: {w}\nSentiment:", "label": lab} for w, lab in reviews],
        tokenizer,
        TaskOptions(spec=EpisodeSpec(shots=2, query=2, ways=2, remap_labels=True, label_pool=("foo", "bar", "baz"))),
    ))
    split = split_tasks(tasks, seed=0, names={"held_out": ["add9", "sentiment"]})
    rng = np.random.default_rng(0)
    episode = split.held_out[0].sample_episode(rng)  # 4 support + 4 query, no overlap
    batch = collate(episode.support, pad_id=tokenizer.pad_token_id)  # loss on answer tokens only
    # ---
    assert [t.name for t in split.held_out] == ["add9", "sentiment"]
    assert len(split.meta_train) == 9
    assert episode.task == "add9" and len(episode.support) == 4
    for i, ex in enumerate(episode.support):
        a = int(tokenizer.decode(ex.prompt_ids).split("+")[0])
        labelled = batch.labels[i][batch.labels[i] != IGNORE_INDEX].tolist()
        assert tokenizer.decode(labelled) == f" {a + 9}</s>"
    sent = split.held_out[1].sample_episode(rng)
    assert sent.ways == 2 and len(sent.support) == 4
    assert len({e.prompt_ids for e in sent.support + sent.query}) == 8
    assert {tokenizer.decode(c) for c in sent.choices} <= {" foo</s>", " bar</s>", " baz</s>"}


def test_tasks_from_examples_accepts_dicts_and_generators() -> None:
    t1 = tasks_from_examples("d", [{"prompt": f"p{i}", "answer": f" a{i}"} for i in range(5)], TOK, TaskOptions(spec=GEN))  # fmt: skip
    t2 = tasks_from_examples("g", lambda: ((f"p{i}", f" a{i}") for i in range(5)), TOK, TaskOptions(spec=GEN))
    assert t1.examples == t2.examples
    assert TOK.decode(t1.examples[3].answer_ids) == " a3</s>"


# ------------------------------------------------------------------------------ one test per error


def test_error_missing_column_lists_existing() -> None:
    ds = datasets.Dataset.from_list(_cls_rows())
    with pytest.raises(ValueError, match=r"column\(s\) \['sentence'\] not found; the dataset has columns \['text', 'label'\]"):
        classification_tasks(ds, TOK, TaskOptions(spec=SPEC3), text_column="sentence")


def test_error_missing_template_column() -> None:
    with pytest.raises(ValueError, match=r"column\(s\) \['question'\] not found"):
        tasks_from_column(datasets.Dataset.from_list(_mix_rows()), TOK, TaskOptions(spec=GEN), template="{question}")  # fmt: skip


def test_error_small_class_named_with_count() -> None:
    rows = _cls_rows() + [{"text": "Tokio", "label": "ja"}]
    with pytest.raises(ValueError, match=r"fewer than shots \+ query = 2 \+ 2 = 4 examples: 'ja' has 1\. .*drop_small_classes=True"):
        classification_tasks(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=SPEC3))


def test_drop_small_classes_warns_and_drops(caplog: pytest.LogCaptureFixture) -> None:
    rows = _cls_rows() + [{"text": "Tokio", "label": "ja"}]
    with caplog.at_level(logging.WARNING):
        (task,) = classification_tasks(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=SPEC3), drop_small_classes=True)  # fmt: skip
    assert "dropping class(es) too small for an episode: 'ja' has 1" in caplog.text
    assert task.class_names == ("de", "es", "fr", "it") and len(task) == 20


def test_error_fewer_classes_than_ways() -> None:
    with pytest.raises(ValueError, match=r"4 class\(es\) can supply an episode but ways=5"):
        classification_tasks(datasets.Dataset.from_list(_cls_rows()), TOK, TaskOptions(spec=EpisodeSpec(shots=2, query=2, ways=5)))  # fmt: skip


def test_error_empty_text() -> None:
    rows = _cls_rows()
    rows[3]["text"] = "  "
    with pytest.raises(ValueError, match=r"text\[3\]='  ' is empty"):
        classification_tasks(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=SPEC3))


def test_error_none_text() -> None:
    rows = _mix_rows()
    rows[2]["input"] = None
    with pytest.raises(ValueError, match=r"column 'input' row 2 is None"):
        tasks_from_column(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=GEN))


def test_error_none_answer() -> None:
    with pytest.raises(ValueError, match=r"answer\[1\]=None is empty"):
        tasks_from_examples("t", [("a", " b"), ("c", None)], TOK, TaskOptions(spec=GEN))


def test_error_mixed_label_types() -> None:
    items = [{"prompt": f"p{i}", "label": lab} for i, lab in enumerate([1, "one", 1, "one"] * 3)]
    with pytest.raises(ValueError, match=r"label mixes label types \['int', 'str'\]"):
        tasks_from_examples("t", items, TOK, TaskOptions(spec=EpisodeSpec(shots=1, query=1, ways=2)))


def test_error_int_labels_need_verbalizer() -> None:
    rows = [{"text": f"t{i}", "label": i % 3} for i in range(12)]
    with pytest.raises(ValueError, match=r"holds int labels \[0, 1, 2\] without class names: pass verbalizer"):
        classification_tasks(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=SPEC3))


def test_error_task_with_no_examples() -> None:
    with pytest.raises(ValueError, match=r"tasks_from_examples\(name='empty'\): the task has no examples"):
        tasks_from_examples("empty", [], TOK, TaskOptions(spec=GEN))


def test_error_task_too_small_in_column_and_drop() -> None:
    rows = _mix_rows()[:-2]  # add3 keeps 4 rows < 5
    with pytest.raises(ValueError, match=r"task 'add3' has 4 examples but an episode needs shots \+ query = 5"):
        tasks_from_column(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=GEN))
    tasks = tasks_from_column(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=GEN), drop_small_tasks=True)
    assert [t.name for t in tasks] == ["add1", "add2"]


def test_error_duplicate_task_names() -> None:
    ds = datasets.Dataset.from_list(_mix_rows())
    with pytest.raises(ValueError, match=r"duplicate task names \{'x': 2\}"):
        tasks_from_datasets([DatasetSpec(name="x", data=ds), DatasetSpec(name="x", data=ds)], TOK, TaskOptions(spec=GEN))  # fmt: skip
    with pytest.raises(ValueError, match=r"duplicate task names \{'add1': 2\}"):
        a = tasks_from_column(ds, TOK, TaskOptions(spec=GEN))
        split_tasks(a + a[:1], seed=0)


def test_error_answer_longer_than_budget() -> None:
    rows = _mix_rows()
    rows[0]["output"] = "9" * 40
    with pytest.raises(ValueError, match=r"example 0 has an answer of 42 tokens .*max_length=32.*raise max_length to at least 43"):
        tasks_from_column(datasets.Dataset.from_list(rows), TOK, TaskOptions(spec=GEN, max_length=32, on_too_long="error"))  # fmt: skip


def test_error_label_word_longer_than_budget() -> None:
    with pytest.raises(ValueError, match=r"longest answer word takes 10 tokens .* max_length=8.*at least 11"):
        classification_tasks(datasets.Dataset.from_list(_cls_rows()), TOK, TaskOptions(spec=SPEC3, max_length=8), verbalizer={k: f"verylon{i}" for i, k in enumerate(LANGS)})  # fmt: skip


def test_error_datasetdict_needs_split() -> None:
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(_mix_rows()),
                               "test": datasets.Dataset.from_list(_mix_rows())})  # fmt: skip
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train', 'test'\]: pass split="):
        tasks_from_column(dd, TOK, TaskOptions(spec=GEN))
    with pytest.raises(ValueError, match=r"split='dev' is not in the DatasetDict; its splits are \['train', 'test'\]"):
        tasks_from_column(dd, TOK, TaskOptions(spec=GEN), split="dev")


def test_read_dataset_reads_several_files_as_one_split(tmp_path: Path) -> None:
    rows = _mix_rows()
    a = _write(rows[:10], tmp_path / "a.jsonl")
    b = _write(rows[10:], tmp_path / "b.jsonl")
    ds = read_dataset([a, b])
    assert ds.to_list() == rows
    with pytest.raises(ValueError, match=r"mix formats \['csv', 'json'\]"):
        read_dataset([a, _write(rows, tmp_path / "c.csv")])


def test_error_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data file\(s\) \[.*nope.jsonl'\] do not exist"):
        read_dataset(str(tmp_path / "nope.jsonl"))


def test_read_dataset_names_file_and_line_of_unreadable_data(tmp_path: Path) -> None:
    """The loader's own errors (StopIteration, an ArrowInvalid, a UnicodeDecodeError only when a row
    is read) become one message with the file, the line and the fix; good files load as before."""
    cases = {
        "empty.jsonl": (b"", "is empty (no rows)"),
        "array.json": (b"[]", "holds an empty JSON array"),
        "scalar.jsonl": (b'{"input": "a"}\n\n7\n', "line 3 is a JSON number, not an object: '7'"),
        "cp1252.csv": (b"input,output\nna\xefve,1\n", "line 2: byte 0xef at column 3 is not UTF-8"),
        "header.csv": (b"input,output\n", "has only a header line, no rows"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=re.escape(f"{name}' {message}")):
            read_dataset(str(tmp_path / name))
    (tmp_path / "good.jsonl").write_bytes(b'{"input": "na\xc3\xafve"}\n\n{"input": "b"}\n')
    assert read_dataset(str(tmp_path / "good.jsonl"))["input"] == ["na\u00efve", "b"]


def test_error_hub_dataset_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline mode makes the real load_dataset code path fail fast instead of retrying the network.
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"could not load hub dataset 'no-such-user/no-such-dataset' \(name='cfg', split='train'\)"):
        read_dataset("no-such-user/no-such-dataset", name="cfg", split="train")
    with pytest.raises(ValueError, match="is a hub dataset name, so split is required"):
        read_dataset("no-such-user/no-such-dataset")


@pytest.mark.parametrize("builder", ["classification", "dataset", "multiple_choice"])
def test_a_cut_that_keeps_only_the_templates_ending_is_refused(builder: str, caplog: pytest.LogCaptureFixture) -> None:
    """Long rows cut from the left: with room for some of the row's text the cut is counted and
    warned; with room for the template's ending alone every such prompt reads the same, refused."""
    ending = "\nSo the answer is:"  # 18 bytes: 18 tokens of the byte tokenizer
    ds = datasets.Dataset.from_dict({"text": [f"row {i} " + "x" * 60 for i in range(8)], "label": ["a", "b"] * 4,
                                     "opts": [["a", "b"]] * 8})
    options = TaskOptions(spec=EpisodeSpec(shots=1, query=1))

    def build(max_length: int) -> None:
        o = TaskOptions(spec=options.spec, max_length=max_length)
        if builder == "classification":
            classification_tasks(ds, TOK, o, template="Text: {text}" + ending)
        elif builder == "dataset":
            tasks_from_datasets([DatasetSpec(name="d", data=ds, input_column="text", output_column="label",
                                             template="Text: {text}" + ending)], TOK, o)
        else:
            multiple_choice_tasks(ds, TOK, o, template="Text: {text}" + ending, options_column="opts")

    with caplog.at_level(logging.WARNING):
        build(48)  # room for ~26 bytes of the row's text
    assert "cut 8 of 8 prompts from the left" in caplog.text
    with pytest.raises(ValueError, match="is no more than the template's fixed ending .18 tokens.: none of those rows' own text is left"):
        build(20)


def test_the_registry_lists_builders_alike_whichever_module_was_imported_first() -> None:
    # Messages and --help list the builders; importing the chat builder's module first (as a test
    # or a user's script may) must not reorder them.
    import subprocess
    import sys

    code = "{}from fmmeta.tasks.registry import task_builders; print([b.name for b in task_builders()])"
    plain, chat_first = (subprocess.run([sys.executable, "-c", code.format(pre)], capture_output=True, text=True,
                                        check=True).stdout for pre in ("", "import fmmeta.tasks.chat; "))
    assert plain == chat_first and "'chat'" in plain, (plain, chat_first)
