"""Episode sampling from cached tasks: no overlap, fresh resamples, seeds, labels, loss masks."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fmmeta.tasks.episode import IGNORE_INDEX, collate
from fmmeta.tasks.task import (
    ClassificationTask,
    EpisodeSpec,
    GenerationTask,
    Task,
    TaskSet,
    ensure_pad_token,
    split_tasks,
)
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()
EOS = TOK.eos_token_id
POOL = ("apple", "river", "stone", "cloud", "maple", "tiger")


def _gen_task(n: int = 20, shots: int = 3, query: int = 4, name: str = "gen") -> Task:
    prompts = [f"Q{i}: what is {i} plus one?" for i in range(n)]
    answers = [f" {i + 1}" for i in range(n)]
    return GenerationTask.from_texts(name, prompts, answers, TOK, spec=EpisodeSpec(shots=shots, query=query))


def _cls_task(
    n_per_class: int = 6, n_classes: int = 4, ways: int = 3, remap: bool = False
) -> Task:
    prompts, labels = [], []
    for c in range(n_classes):
        for i in range(n_per_class):
            prompts.append(f"item {c}-{i}:")
            labels.append(c)
    spec = EpisodeSpec(
        shots=2, query=2, ways=ways, remap_labels=remap, label_pool=POOL if remap else None
    )
    return ClassificationTask.from_texts(
        "cls", prompts, labels, [f"class{c}" for c in range(n_classes)], TOK, spec=spec
    )


def _key(ex) -> tuple:
    return ex.prompt_ids


def test_generation_episode_has_no_overlap_and_right_sizes() -> None:
    task = _gen_task()
    for seed in range(30):
        ep = task.sample_episode(np.random.default_rng(seed))
        assert len(ep.support) == 3 and len(ep.query) == 4
        keys = [_key(e) for e in ep.support + ep.query]
        assert len(set(keys)) == 7, "support and query overlap"
        assert ep.ways is None and ep.choices is None and ep.task == "gen"


def test_answers_end_with_eos_and_match_prompt() -> None:
    task = _gen_task()
    ep = task.sample_episode(np.random.default_rng(0))
    for ex in ep.support + ep.query:
        prompt = TOK.decode(ex.prompt_ids)
        i = int(prompt[1 : prompt.index(":")])
        assert ex.answer_ids[-1] == EOS
        assert TOK.decode(ex.answer_ids[:-1]) == f" {i + 1}"


def test_same_seed_same_episode_different_seed_or_resample_differs() -> None:
    task = _gen_task(n=40)
    a = task.sample_episode(np.random.default_rng(7))
    b = task.sample_episode(np.random.default_rng(7))
    assert a == b
    c = task.sample_episode(np.random.default_rng(8))
    assert a != c
    rng = np.random.default_rng(7)
    first, second = task.sample_episode(rng), task.sample_episode(rng)
    assert first == a
    assert {_key(e) for e in first.support + first.query} != {
        _key(e) for e in second.support + second.query
    }


def test_task_is_a_sampler_episode_source() -> None:
    from fmmeta.sampling.source import EpisodeSource

    task = _gen_task()
    assert isinstance(task, EpisodeSource)
    assert task.family == "gen"
    assert task.lengths.tolist() == [ex.n_tokens for ex in task.examples]


def test_resampling_covers_the_task() -> None:
    task = _gen_task(n=20)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(30):
        ep = task.sample_episode(rng)
        seen.update(_key(e) for e in ep.support + ep.query)
    assert len(seen) == 20


def test_classification_episode_ways_shots_no_overlap_and_labels() -> None:
    task = _cls_task()
    for seed in range(20):
        ep = task.sample_episode(np.random.default_rng(seed))
        assert ep.ways == 3 and ep.shots == 2
        assert len(ep.support) == 6 and len(ep.query) == 6
        assert len({_key(e) for e in ep.support + ep.query}) == 12
        assert len(ep.choices) == 3
        for ex in ep.support + ep.query:
            assert ex.answer_ids == ep.choices[ex.label]
            true_class = int(TOK.decode(ex.prompt_ids).split()[1].split("-")[0])
            assert TOK.decode(ex.answer_ids[:-1]) == f" class{true_class}"
        for split in (ep.support, ep.query):
            counts = np.bincount([e.label for e in split], minlength=3)
            assert counts.tolist() == [2, 2, 2]


def test_remapped_labels_use_pool_words_consistently_and_vary() -> None:
    task = _cls_task(remap=True)
    rng = np.random.default_rng(3)
    mappings = set()
    for _ in range(20):
        ep = task.sample_episode(rng)
        words = [TOK.decode(c[:-1]).strip() for c in ep.choices]
        assert len(set(words)) == 3 and set(words) <= set(POOL)
        by_class: dict[str, str] = {}
        for ex in ep.support + ep.query:
            true_class = TOK.decode(ex.prompt_ids).split()[1].split("-")[0]
            word = TOK.decode(ex.answer_ids[:-1]).strip()
            assert word == words[ex.label]
            assert by_class.setdefault(true_class, word) == word, "class mapped to two words"
        mappings.add(tuple(sorted(by_class.items())))
    assert len(mappings) > 10, "remapping is not random per episode"


def test_collate_labels_cover_answer_tokens_only() -> None:
    task = _gen_task()
    ep = task.sample_episode(np.random.default_rng(0))
    batch = collate(ep.support, pad_id=TOK.pad_token_id)
    for i, ex in enumerate(ep.support):
        p, a = len(ex.prompt_ids), len(ex.answer_ids)
        row = batch.labels[i]
        assert (row[:p] == IGNORE_INDEX).all(), "prompt tokens entered the loss mask"
        assert row[p : p + a].tolist() == list(ex.answer_ids), "answer tokens missing from loss"
        assert (row[p + a :] == IGNORE_INDEX).all(), "padding entered the loss mask"
        assert batch.input_ids[i, :p].tolist() == list(ex.prompt_ids)
    assert batch.n_answer_tokens == sum(len(e.answer_ids) for e in ep.support)


def test_in_context_query_puts_support_before_query_and_labels_only_query_answer() -> None:
    task = _gen_task()
    ep = task.sample_episode(np.random.default_rng(1))
    icq = ep.in_context_query()
    sep = tuple(TOK("\n\n", add_special_tokens=False)["input_ids"])
    assert ep.separator_ids == sep
    demo = sum((s.prompt_ids + s.answer_ids + sep for s in ep.support), ())
    for q, orig in zip(icq, ep.query):
        assert q.prompt_ids == demo + orig.prompt_ids
        assert q.answer_ids == orig.answer_ids
    batch = collate(icq, pad_id=TOK.pad_token_id)
    labelled = (batch.labels != IGNORE_INDEX).sum().item()
    assert labelled == sum(len(q.answer_ids) for q in ep.query)
    # no support answer token is labelled: all labels sit after the demonstrations
    first_label_col = (batch.labels[0] != IGNORE_INDEX).nonzero()[0].item()
    assert first_label_col == len(icq[0].prompt_ids)


def test_in_context_query_truncates_demonstrations_from_the_left() -> None:
    ep = _gen_task().sample_episode(np.random.default_rng(1))
    full = ep.in_context_query()
    limit = max(q.n_tokens for q in full) - 5
    cut = ep.in_context_query(max_length=limit)
    for q, whole in zip(cut, full):
        assert q.n_tokens <= limit and q.answer_ids == whole.answer_ids
        assert whole.prompt_ids[len(whole.prompt_ids) - len(q.prompt_ids) :] == q.prompt_ids
    assert any(q.n_tokens < w.n_tokens for q, w in zip(cut, full))
    assert ep.in_context_query(max_length=10**6) == full


def test_truncation_cuts_prompt_from_left_never_answer() -> None:
    long_prompt = "x" * 50 + " tail:"
    task = GenerationTask.from_texts(
        "t", [long_prompt] * 3, [" yes"] * 3, TOK,
        spec=EpisodeSpec(shots=1, query=1), max_length=20,
    )  # fmt: skip
    ex = task.examples[0]
    assert ex.n_tokens == 20
    assert TOK.decode(ex.answer_ids) == " yes</s>"
    assert TOK.decode(ex.prompt_ids).endswith(" tail:")


def test_too_long_answer_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    prompts = [f"p{i}:" for i in range(5)]
    answers = [" ok", " ok", " " + "z" * 30, " ok", " ok"]
    with caplog.at_level(logging.WARNING):
        task = GenerationTask.from_texts("t", prompts, answers, TOK, spec=EpisodeSpec(shots=2, query=2),
                               max_length=12)  # fmt: skip
    assert len(task) == 4 and task.n_dropped == 1
    assert "dropped 1 of 5 examples" in caplog.text


def test_too_long_answer_error() -> None:
    with pytest.raises(ValueError, match=r"example 2 has an answer of 32 tokens .* max_length=12"):
        GenerationTask.from_texts(
            "t", [f"p{i}:" for i in range(5)], [" ok", " ok", " " + "z" * 30, " ok", " ok"], TOK,
            spec=EpisodeSpec(shots=2, query=2), max_length=12, on_too_long="error",
        )  # fmt: skip


def test_ensure_pad_token_uses_eos_when_missing() -> None:
    tok = tiny_tokenizer(with_pad=False)
    assert tok.pad_token is None
    pad = ensure_pad_token(tok)
    assert pad == tok.eos_token_id == tok.pad_token_id
    assert ensure_pad_token(TOK) == 0
    tok.pad_token = tok.eos_token = None
    with pytest.raises(ValueError, match="neither a pad nor an eos token"):
        ensure_pad_token(tok)


def test_with_spec_keeps_cache_changes_shape() -> None:
    task = _cls_task(n_per_class=8, remap=True)
    bigger = task.with_spec(EpisodeSpec(shots=2, query=6, ways=4, remap_labels=True, label_pool=POOL))
    ep = bigger.sample_episode(np.random.default_rng(0))
    assert len(ep.query) == 24 and ep.ways == 4
    assert bigger.examples == task.examples


def test_split_tasks_disjoint_deterministic_and_seeded() -> None:
    tasks = [_gen_task(n=8, shots=2, query=2, name=f"t{i}") for i in range(20)]
    a = split_tasks(tasks, seed=0, fractions=(0.6, 0.2, 0.2))
    names = a.names()
    sets = [set(v) for v in names.values()]
    assert [len(s) for s in sets] == [12, 4, 4]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert set().union(*sets) == {t.name for t in tasks}
    assert split_tasks(tasks, seed=0, fractions=(0.6, 0.2, 0.2)).names() == names
    assert split_tasks(tasks, seed=1, fractions=(0.6, 0.2, 0.2)).names() != names


def test_split_tasks_by_names() -> None:
    tasks = [_gen_task(n=8, shots=2, query=2, name=f"t{i}") for i in range(5)]
    s = split_tasks(tasks, seed=0, names={"validation": ["t1"], "held_out": ["t3", "t4"]})
    assert s.names() == {"meta_train": ["t0", "t2"], "validation": ["t1"], "held_out": ["t3", "t4"]}
    with pytest.raises(ValueError, match="task 't1' is named in both 'validation' and 'held_out'"):
        split_tasks(tasks, seed=0, names={"validation": ["t1"], "held_out": ["t1"]})


def test_duplicate_task_names_error() -> None:
    tasks = [_gen_task(n=8, shots=2, query=2, name="same") for _ in range(2)]
    with pytest.raises(ValueError, match=r"duplicate task names \{'same': 2\}"):
        split_tasks(tasks, seed=0)
    with pytest.raises(ValueError, match="duplicate task names"):
        TaskSet(meta_train=tasks[:1], held_out=tasks[1:])


def test_task_with_too_few_examples_error() -> None:
    with pytest.raises(ValueError, match=r"task 'gen' has 5 examples but an episode needs shots \+ query = 3 \+ 4 = 7"):
        _gen_task(n=5)


def test_episode_spec_validation() -> None:
    with pytest.raises(ValueError, match="EpisodeSpec.shots=0 is invalid"):
        EpisodeSpec(shots=0, query=1)
    with pytest.raises(ValueError, match="remap_labels=True needs label_pool"):
        EpisodeSpec(shots=1, query=1, ways=2, remap_labels=True)
    with pytest.raises(ValueError, match="label_pool has 2 words but ways=3"):
        EpisodeSpec(shots=1, query=1, ways=3, remap_labels=True, label_pool=("a", "b"))

