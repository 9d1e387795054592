"""Built-in suites: the CLDR suite's content, language-disjoint splits, and the registry."""

from __future__ import annotations

import numpy as np
import pytest
from babel import Locale

from fmmeta.tasks.suites import build_suite
from fmmeta.tasks.suites.cldr import (
    CONTINENTS,
    COUNTRIES,
    DEFAULT_LANGUAGES,
    LABEL_POOL,
    build_cldr_suite,
)
from fmmeta.tasks.task import ClassificationTask, TaskSet
from fmmeta.tasks.testing import tiny_tokenizer

TOK = tiny_tokenizer()


@pytest.fixture(scope="module")
def suite() -> TaskSet:
    return build_cldr_suite(TOK, seed=0, max_length=128)


def _langs(name: str) -> set[str]:
    return set(name.split("-")[1:])


def test_cldr_suite_shape_and_language_disjoint_splits(suite: TaskSet) -> None:
    names = suite.names()
    trans = {k: [n for n in v if n.startswith("translate-")] for k, v in names.items()}
    langid = {k: [n for n in v if n.startswith("langid-")] for k, v in names.items()}
    assert [len(trans[k]) for k in names] == [30, 5, 5]
    continent = {k: [n for n in v if n.startswith("continent-")] for k, v in names.items()}
    assert [len(langid[k]) for k in names] == [3, 1, 10]  # every 3-language subset of 5 held out
    assert [len(continent[k]) for k in names] == [0, 0, 5]  # a family held out whole
    assert {_langs(n).pop() for n in continent["held_out"]} == {
        lang for n in trans["held_out"] for lang in _langs(n)}
    words = {k: [n for n in v if n.startswith("words-")] for k, v in names.items()}
    assert [len(words[k]) for k in names] == [0, 0, 4] and suite.format_shift == ["word-categories"]
    names = {k: [n for n in v if not n.startswith("words-")] for k, v in names.items()}  # no languages
    used = {k: set().union(*(_langs(n) for n in v)) for k, v in names.items()}
    assert not used["meta_train"] & used["validation"]
    assert not used["meta_train"] & used["held_out"]
    assert not used["validation"] & used["held_out"]
    assert used["meta_train"] | used["validation"] | used["held_out"] == set(DEFAULT_LANGUAGES)
    for t in suite.meta_train + suite.validation + suite.held_out:
        assert t.family in ("cldr-translation", "cldr-langid", "cldr-continent", "word-categories")
        # only a generation task drops examples (a classification task refuses instead)
        assert isinstance(t, ClassificationTask) or t.n_dropped == 0


def test_cldr_suite_is_seeded(suite: TaskSet) -> None:
    again = build_cldr_suite(TOK, seed=0, max_length=128, families=("translation",))
    other = build_cldr_suite(TOK, seed=1, max_length=128, families=("translation",))
    test_names = [n for n in suite.names()["held_out"] if n.startswith("translate-")]
    assert again.names()["held_out"] == test_names
    assert other.names()["held_out"] != test_names


def test_translation_examples_are_cldr_names(suite: TaskSet) -> None:
    english = Locale("en").territories
    for task in suite.meta_train + suite.held_out:
        if not task.name.startswith("translate-"):
            continue
        lang = task.name.split("-")[1]
        local = Locale.parse(lang).territories
        lang_name = Locale("en").languages[lang]
        assert len(task) == len(COUNTRIES)
        by_english = {english[c]: local[c] for c in COUNTRIES}
        ep = task.sample_episode(np.random.default_rng(0))
        assert len(ep.support) == 4 and len(ep.query) == 4
        for ex in ep.support + ep.query:
            prompt = TOK.decode(ex.prompt_ids)
            assert prompt.startswith("Country: ") and prompt.endswith(f"\nIn {lang_name}:")
            country = prompt[len("Country: ") : prompt.index("\n")]
            assert TOK.decode(ex.answer_ids) == f" {by_english[country]}</s>"


def test_german_france_example_present(suite: TaskSet) -> None:
    all_tasks = {t.name: t for t in suite.meta_train + suite.validation + suite.held_out}
    de = all_tasks["translate-de"]
    pairs = {(TOK.decode(e.prompt_ids), TOK.decode(e.answer_ids)) for e in de.examples}
    assert ("Country: France\nIn German:", " Frankreich</s>") in pairs


def test_langid_episodes_are_remapped_3way_and_consistent(suite: TaskSet) -> None:
    task = next(t for t in suite.held_out if t.name.startswith("langid-"))
    langs = task.name.split("-")[1:]
    local_names = {lang: set(Locale.parse(lang).territories[c] for c in COUNTRIES) for lang in langs}
    rng = np.random.default_rng(0)
    for _ in range(10):
        ep = task.sample_episode(rng)
        assert ep.ways == 3 and len(ep.support) == 6 and len(ep.query) == 6
        words = [TOK.decode(c) for c in ep.choices]
        assert all(w.endswith("</s>") and w[1:-4] in LABEL_POOL for w in words)
        lang_of_label: dict[int, str] = {}
        for ex in ep.support + ep.query:
            name = TOK.decode(ex.prompt_ids)[len("Name: ") : -len("\nLanguage:")]
            owners = [lang for lang in langs if name in local_names[lang]]
            assert len(owners) == 1, f"{name!r} is ambiguous or unknown: {owners}"
            assert lang_of_label.setdefault(ex.label, owners[0]) == owners[0]
        assert len(set(lang_of_label.values())) == 3


def test_build_suite_registry() -> None:
    syn = build_suite("synthetic", TOK, seed=0)
    assert syn.names() == build_suite("synthetic", TOK, seed=0).names()
    assert {len(v) > 0 for v in syn.names().values()} == {True}
    ep = syn.meta_train[0].sample_episode(np.random.default_rng(0))
    for ex in ep.support:
        a, k = TOK.decode(ex.prompt_ids).rstrip("=").split("+")
        assert TOK.decode(ex.answer_ids) == f" {int(a) + int(k)}</s>"
    with pytest.raises(ValueError, match=r"unknown task suite 'cldrr': choose one of \['cldr', 'public', 'synthetic'\]. Did you mean 'cldr'\?"):
        build_suite("cldrr", TOK)


def test_continent_episodes_name_each_country_by_its_continent(suite: TaskSet) -> None:
    assert set(CONTINENTS) == set(COUNTRIES)
    task = next(t for t in suite.held_out if t.name.startswith("continent-"))
    lang = task.name.split("-")[1]
    local = Locale.parse(lang).territories
    continent_of = {local[c]: CONTINENTS[c] for c in COUNTRIES}
    rng = np.random.default_rng(3)
    for _ in range(5):
        ep = task.sample_episode(rng)
        assert ep.ways == 3 and len(ep.support) == 6 and len(ep.query) == 6
        words = [TOK.decode(c).removesuffix("</s>").strip() for c in ep.choices]
        assert set(words) <= set(LABEL_POOL)  # remapped: the continent names never appear
        meaning: dict[int, str] = {}
        for ex in ep.support + ep.query:
            prompt = TOK.decode(ex.prompt_ids)
            assert prompt.startswith("Country: ") and prompt.endswith("\nContinent:")
            continent = continent_of[prompt[len("Country: "):prompt.index("\n")]]
            assert meaning.setdefault(ex.label, continent) == continent  # one word, one continent
        assert len(set(meaning.values())) == 3 and "Oceania" not in meaning.values()


def test_held_out_only_families_alone_are_refused() -> None:
    for families in (("continent",), ("words",), ("continent", "words")):
        with pytest.raises(ValueError, match="held out only"):
            build_cldr_suite(TOK, families=families)


def test_the_words_family_is_out_of_format_every_meta_training_task_being_otherwise(suite: TaskSet) -> None:
    """Its template and its label words appear in no meta-training (or validation) task."""
    from fmmeta.tasks.suites.word_categories import TEMPLATE, WORDS

    words = [t for t in suite.held_out if t.family == "word-categories"]
    head = TEMPLATE.split("{")[0]
    categories = {c for t in words for c in t.class_names}
    assert categories == set(WORDS) and not categories & set(LABEL_POOL)
    assert not set().union(*WORDS.values()) & set(LABEL_POOL)
    rng = np.random.default_rng(0)
    for task in words:
        ep = task.sample_episode(rng)
        assert ep.ways == 3 and all(TOK.decode(list(ex.prompt_ids)).startswith(head) for ex in ep.support)
        for ex in ep.support:  # the category is the word's own
            word = TOK.decode(list(ex.prompt_ids)).split('"')[1]
            label = TOK.decode(list(ep.choices[ex.label])).strip()
            assert word in WORDS[label.removesuffix(TOK.eos_token or "").strip()]
    for task in suite.meta_train + suite.validation:
        prompt = TOK.decode(list(task.sample_episode(rng).support[0].prompt_ids))
        assert not prompt.startswith(head)


def test_score_on_validation_builds_the_held_out_layout_on_validation_languages(suite: TaskSet) -> None:
    tuning = build_cldr_suite(TOK, seed=0, max_length=128, score_on="validation")
    names, default = tuning.names(), suite.names()
    assert names["meta_train"] == default["meta_train"]  # training is untouched
    assert names["validation"] == default["validation"]
    val_langs = set().union(*(_langs(n) for n in default["validation"]))
    scored = set().union(*(_langs(n) for n in names["held_out"]))
    by_language = [n for n in default["held_out"] if not n.startswith("words-")]
    assert scored == val_langs and not scored & set().union(*(_langs(n) for n in by_language))
    # the held-out split's classification tasks (10 langid, 5 continent); translation's
    # validation tasks already choose the adaptation lr in validation
    prefix = lambda ns: sorted(n.split("-")[0] for n in ns if not n.startswith("translate-"))  # noqa: E731
    assert prefix(names["held_out"]) == prefix(by_language) == ["continent"] * 5 + ["langid"] * 10
    assert not any(n.startswith(("translate-", "words-")) for n in names["held_out"])  # words has no languages
    assert tuning.format_shift == []
    with pytest.raises(ValueError, match="score_on='heldout' is invalid"):
        build_cldr_suite(TOK, seed=0, max_length=128, score_on="heldout")


def test_earlier_option_names_still_read_from_yaml_with_a_warning(
    suite: TaskSet, caplog: pytest.LogCaptureFixture
) -> None:
    """A run folder's config.yaml written with the splits' earlier names must still resume."""
    from fmmeta.tasks.config import TasksConfig, build_task_set

    new = build_cldr_suite(TOK, seed=0, max_length=128, n_validation_languages=4, n_held_out_languages=3)
    with caplog.at_level("WARNING", logger="fmmeta.tasks.suites.cldr"):
        old = build_task_set(TasksConfig(max_length=128, options={"n_val_languages": 4, "n_test_languages": 3}),
                             TOK, seed=0)
    assert old.names() == new.names() != suite.names()
    assert "n_val_languages is deprecated: it is now n_validation_languages" in caplog.text
    assert "n_test_languages is deprecated: it is now n_held_out_languages" in caplog.text
    with caplog.at_level("WARNING", logger="fmmeta.tasks.suites.cldr"):
        assert build_cldr_suite(TOK, seed=0, max_length=128, score_on="test").names() == suite.names()
    assert "score_on='test' is deprecated: it is now 'held_out'" in caplog.text
    with pytest.raises(ValueError, match="sets both n_test_languages=3 and n_held_out_languages=4"):
        build_cldr_suite(TOK, seed=0, max_length=128, n_test_languages=3, n_held_out_languages=4)
    with pytest.raises(ValueError, match=r"unknown options \['n_heldout_languages'\]"):
        build_cldr_suite(TOK, seed=0, max_length=128, n_heldout_languages=3)


def test_earlier_split_names_are_refused_with_the_fix() -> None:
    """Python callers (a suite builder of one's own) are told the new names, not a bare TypeError."""
    from fmmeta.tasks.task import split_tasks

    with pytest.raises(TypeError, match=r"renamed \(meta_val -> validation, meta_test -> held_out\)"):
        TaskSet(meta_val=[], meta_test=[])
    with pytest.raises(ValueError, match=r"renamed \(meta_test -> held_out\)"):
        split_tasks([], seed=0, names={"meta_test": []})


def test_only_a_held_out_family_can_be_out_of_format(suite: TaskSet) -> None:
    with pytest.raises(ValueError, match=r"format_shift families \['cldr-langid'\] have no held-out task"):
        TaskSet(suite.meta_train, [], [t for t in suite.held_out if t.family != "cldr-langid"],
                format_shift=["cldr-langid"])


def test_meta_train_templates_multiply_meta_training_rows_only(suite: TaskSet) -> None:
    from fmmeta.tasks.suites.cldr import LANGID_TEMPLATES, TRANSLATION_TEMPLATES

    three = build_cldr_suite(TOK, seed=0, max_length=128, meta_train_templates=3)
    assert three.names() == suite.names()
    for split in ("validation", "held_out"):  # scored alike under every setting
        for a, b in zip(getattr(suite, split), getattr(three, split)):
            assert [e.prompt_ids for e in a.examples] == [e.prompt_ids for e in b.examples]
    for one, many in zip(suite.meta_train, three.meta_train):
        assert len(many.examples) == 3 * len(one.examples)
        heads = {TOK.decode(list(e.prompt_ids))[:6] for e in many.examples}
        templates = LANGID_TEMPLATES if one.name.startswith("langid-") else TRANSLATION_TEMPLATES
        assert len(heads) >= len(templates)  # every template's rows are there
    with pytest.raises(ValueError, match="meta_train_templates=4 is invalid: choose 1 to 3"):
        build_cldr_suite(TOK, meta_train_templates=4)
