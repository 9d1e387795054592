"""The embedded default task suite: country names across languages, from CLDR via ``babel``.

Unicode CLDR ships in the ``babel`` package, so this suite needs no network and no download. It
reproduces the setup calibrated on SmolLM2-135M (docs/design.md, "Inner-loop SGD on LoRA is fragile"),
with two families side by side:

* ``translation``: one generation task per language L, "English country name -> its name in L"
  (``"Country: France\\nIn German:"`` -> ``" Frankreich"``). A multi-task model can learn these
  without reading the support set, which is where multi-task training matches meta-learning.
* ``langid``: 3-way classification of a country name written in some language, by language, with
  the three labels remapped to random words from a pool of 12 in every episode. Only the support
  set says which word means which language, which is where meta-learning earns its place.
* ``continent`` (held out as a whole family: held-out only): 3-way classification of a country
  name written in a held-out language by its continent, labels remapped the same way. No
  meta-training task asks about continents, so it tests learning a *new kind* of task from a
  handful of examples, not a new language of a trained kind.
* ``words`` (held out only): English words by category, in a template and with label words no
  meta-training task has (:mod:`~fmmeta.tasks.suites.word_categories`): a user's task of another
  format, which the report scores apart against the base model.

Languages are assigned to meta-train / validation / held-out once (seeded) and shared by
all families, so a held-out task never uses a language the meta-learner trained on. The held-out
``langid`` tasks are every 3-language subset of the held-out languages (10 tasks with 5
languages), so the classification score rests on many tasks, not one.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from fmmeta.tasks.suites.word_categories import FAMILY as WORDS_FAMILY
from fmmeta.tasks.suites.word_categories import word_category_tasks
from fmmeta.tasks.task import ClassificationTask, EpisodeSpec, GenerationTask, OnTooLong, Task, TaskSet

logger = logging.getLogger(__name__)

RENAMED_OPTIONS = {"n_val_languages": "n_validation_languages", "n_test_languages": "n_held_out_languages"}
"""Earlier names of :func:`build_cldr_suite`'s options (``tasks.options`` in YAML) -> today's."""

_DEFAULTS = {"n_validation_languages": 5, "n_held_out_languages": 5, "score_on": "held_out"}


def read_options(given: dict[str, Any], renamed: dict[str, Any]) -> dict[str, Any]:
    """``given`` with the options a YAML file still names by their earlier names taken in, checked.

    A run folder's ``config.yaml`` keeps the names it was written with and a resume must read it,
    so an earlier name keeps working, with a warning that names today's; an earlier name and
    today's both set, or a name never used, is refused.
    """
    out = dict(given)
    unknown = sorted(set(renamed) - set(RENAMED_OPTIONS))
    if unknown:
        raise ValueError(f"build_cldr_suite got unknown options {unknown}: allowed are the keyword "
                         f"arguments of build_cldr_suite (e.g. {sorted(_DEFAULTS)})")
    for old, value in renamed.items():
        new = RENAMED_OPTIONS[old]
        if out[new] != _DEFAULTS[new]:
            raise ValueError(f"tasks.options sets both {old}={value!r} and {new}={out[new]!r}: "
                             f"{old} is the earlier name of {new}; keep only {new}")
        logger.warning("tasks.options.%s is deprecated: it is now %s (read as %s=%r)", old, new, new, value)
        out[new] = value
    if out["score_on"] == "test":
        logger.warning("tasks.options.score_on='test' is deprecated: it is now 'held_out' (read as such)")
        out["score_on"] = "held_out"
    if out["score_on"] not in ("held_out", "validation"):
        raise ValueError(f"build_cldr_suite score_on={out['score_on']!r} is invalid: choose 'held_out' or "
                         "'validation'")
    return out

SuiteSplit = TaskSet
"""What a suite builder returns: disjoint ``meta_train``, ``validation`` and ``held_out`` task lists."""

DEFAULT_LANGUAGES: tuple[str, ...] = (
    "de", "fr", "es", "it", "pt", "nl", "sv", "da", "nb", "fi",
    "pl", "cs", "sk", "hu", "ro", "hr", "sl", "et", "lv", "lt",
    "tr", "id", "ms", "vi", "sw", "ca", "eu", "gl", "is", "ga",
    "cy", "sq", "ru", "uk", "bg", "el", "sr", "ja", "zh", "ko",
)  # fmt: skip
"""40 CLDR locales with full territory names (Latin, Cyrillic, Greek and CJK scripts)."""

COUNTRIES: tuple[str, ...] = (
    "FR", "DE", "ES", "IT", "PT", "NL", "BE", "CH", "AT", "SE", "NO", "DK", "FI", "PL", "CZ",
    "HU", "RO", "GR", "TR", "RU", "UA", "IE", "GB", "US", "CA", "MX", "BR", "AR", "CL", "PE",
    "CO", "CU", "JP", "CN", "KR", "IN", "PK", "ID", "TH", "VN", "PH", "AU", "NZ", "EG", "MA",
    "ZA", "NG", "KE", "ET", "SA", "IR", "IQ", "IL", "AF", "IS", "HR", "BG", "RS", "DZ", "TN",
)  # fmt: skip
"""60 well-known countries (ISO 3166-1 alpha-2), so prompts name things a small LM has seen."""

CONTINENTS: dict[str, str] = {
    **dict.fromkeys(
        ("FR", "DE", "ES", "IT", "PT", "NL", "BE", "CH", "AT", "SE", "NO", "DK", "FI", "PL", "CZ",
         "HU", "RO", "GR", "RU", "UA", "IE", "GB", "IS", "HR", "BG", "RS"), "Europe"),
    **dict.fromkeys(
        ("TR", "JP", "CN", "KR", "IN", "PK", "ID", "TH", "VN", "PH", "SA", "IR", "IQ", "IL", "AF"),
        "Asia"),
    **dict.fromkeys(("US", "CA", "MX", "BR", "AR", "CL", "PE", "CO", "CU"), "America"),
    **dict.fromkeys(("EG", "MA", "ZA", "NG", "KE", "ET", "DZ", "TN"), "Africa"),
    **dict.fromkeys(("AU", "NZ"), "Oceania"),
}  # fmt: skip
"""The continent of each of :data:`COUNTRIES` (Turkey counted in Asia, Russia in Europe). Oceania
has too few countries for an episode, so ``continent`` episodes draw 3 of the other 4."""

LABEL_POOL: tuple[str, ...] = (
    "apple", "river", "stone", "cloud", "tiger", "piano",
    "lemon", "candle", "forest", "silver", "rocket", "garden",
)  # fmt: skip
"""12 remapping words for the ``langid`` family (short, common English words)."""

TRANSLATION_SPEC = EpisodeSpec(shots=4, query=4)
"""Calibration setup: 4-shot support, 4 queries."""

LANGID_SPEC = EpisodeSpec(shots=2, query=2, ways=3, remap_labels=True, label_pool=LABEL_POOL)
"""Calibration setup: 3-way, 2 shots + 2 queries per class, labels remapped from 12 words."""

TRANSLATION_TEMPLATES: tuple[str, ...] = ("Country: {english}\nIn {language}:", "{english} in {language}:",
                                          "English: {english}\n{language}:")
"""The translation family's prompt templates: the first always; the others only with
``meta_train_templates`` > 1, and only in meta-training tasks."""

LANGID_TEMPLATES: tuple[str, ...] = ("Name: {name}\nLanguage:", "{name}\nThat name is written in",
                                     "Language of '{name}':")
"""The langid family's prompt templates, used as :data:`TRANSLATION_TEMPLATES` are. None is written
as the out-of-format family is (a question and an answer line)."""

FAMILIES: tuple[str, ...] = ("translation", "langid", "continent", "words")
HELD_OUT_ONLY: tuple[str, ...] = ("continent", "words")
"""Families built for held-out only: a new kind of task (continent), and a new format (words:
:mod:`~fmmeta.tasks.suites.word_categories`, scored apart as out of format)."""


def _territory_names(lang: str, countries: Sequence[str]) -> dict[str, str]:
    from babel import Locale

    names = Locale.parse(lang).territories
    return {c: names[c] for c in countries if c in names}


def _language_name(lang: str) -> str:
    from babel import Locale

    return Locale("en").languages.get(lang, lang)



def _check_families(families: Sequence[str], templates: int = 1) -> None:
    """Refuses unknown families, a suite with nothing to meta-train on, and more templates than
    each family has."""
    if not 1 <= templates <= len(LANGID_TEMPLATES):
        raise ValueError(f"build_cldr_suite meta_train_templates={templates} is invalid: choose 1 to "
                         f"{len(LANGID_TEMPLATES)} (the templates each family has)")
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ValueError(
            f"build_cldr_suite families={list(families)!r} is invalid: choose from "
            f"{', '.join(map(repr, FAMILIES))}"
        )
    if set(families) <= set(HELD_OUT_ONLY):
        raise ValueError(
            f"build_cldr_suite families={list(families)!r} leaves nothing to meta-train on: "
            f"{' and '.join(HELD_OUT_ONLY)} are held out only; add 'translation' or 'langid'"
        )


def _locale_names(lang: str, countries: Sequence[str]) -> dict[str, str]:
    """The countries' names in ``lang``, with an error naming the language babel does not know."""
    try:
        return _territory_names(lang, countries)
    except Exception as err:  # babel raises UnknownLocaleError / ValueError
        raise ValueError(
            f"build_cldr_suite: language {lang!r} is not a CLDR locale babel knows "
            f"({type(err).__name__}: {err}); use codes like 'de', 'fr', 'ja'"
        ) from err

def build_cldr_suite(
    tokenizer: Any,
    *,
    seed: int = 0,
    max_length: int = 48,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    countries: Sequence[str] = COUNTRIES,
    n_validation_languages: int = 5,
    n_held_out_languages: int = 5,
    n_langid_train_languages: int = 15,
    langid_group_size: int = 5,
    families: Sequence[str] = FAMILIES,
    translation_spec: EpisodeSpec = TRANSLATION_SPEC,
    langid_spec: EpisodeSpec = LANGID_SPEC,
    on_too_long: OnTooLong = "drop",
    score_on: str = "held_out",
    meta_train_templates: int = 1,
    **renamed: Any,
) -> SuiteSplit:
    """Builds the CLDR suite: translation, remapped language-id and continent tasks, split by language.

    With the defaults: 40 languages, 30 for meta-training (30 translation tasks; the first 15
    also form 3 ``langid`` tasks of 5 languages each), 5 for validation (one translation task
    per language plus one ``langid`` task over the 5 languages) and 5 for held-out (one
    translation and one ``continent`` task per language, and a ``langid`` task for every
    ``ways``-subset of the 5 languages), plus the 4 ``words`` tasks, held out and out of format.

    Args:
        tokenizer: a Hugging Face tokenizer (any; sequences stay short with SmolLM2's).
        seed: seeds the assignment of languages to splits.
        max_length: token budget of one example; longer prompts are cut from the left.
        languages: CLDR locale codes; the first ``len - val - test`` after a seeded shuffle train.
        countries: ISO 3166-1 alpha-2 codes whose names form the examples.
        n_validation_languages: languages (none meta-trained on) of the validation tasks.
        n_held_out_languages: languages (none meta-trained on) of the held-out tasks.
        n_langid_train_languages: meta-train languages used by the ``langid`` family.
        langid_group_size: languages per ``langid`` task (each episode draws ``ways`` of them).
        families: which families to build, among ``"translation"``, ``"langid"``,
            ``"continent"`` and ``"words"`` (the last two held out only).
        translation_spec: episode shape of translation tasks.
        langid_spec: episode shape of ``langid`` and ``continent`` tasks (classification with
            remapping).
        on_too_long: what to do with an example whose answer cannot fit ``max_length``.
        score_on: ``"held_out"`` builds ``held_out`` on the held-out languages. ``"validation"``
            builds its classification families (every ``langid`` subset, ``continent``) on the
            validation languages instead, so a run's settings (meta-steps, outer lr, inner
            steps) can be chosen by scoring on validation tasks without ever seeing a held-out
            language. Meta-train and validation stay as they are; translation is not scored,
            since its validation tasks are the validation ones (a task lives in one split).
        meta_train_templates: every meta-training task's rows under this many prompt templates
            (1 to 3; :data:`TRANSLATION_TEMPLATES`, :data:`LANGID_TEMPLATES`), each row once per
            template: a lever against learning the suite's one format (validation and held-out
            tasks keep the first template, so their scores compare across settings).
        **renamed: the options' earlier names, still read from YAML with a warning:
            ``n_val_languages``, ``n_test_languages`` (and ``score_on="test"``).

    Returns:
        Disjoint meta-train / validation / held-out task lists.

    Raises:
        ValueError: on unknown families or languages, or too few languages for the split.

    Example:
        >>> suite = build_cldr_suite(tokenizer, seed=0)  # doctest: +SKIP
        >>> [t.name for t in suite.held_out][:2]  # doctest: +SKIP
        ['translate-xx', ...]
    """
    _check_families(families, meta_train_templates)
    n_validation_languages, n_held_out_languages, score_on = read_options(
        {"n_validation_languages": n_validation_languages, "n_held_out_languages": n_held_out_languages,
         "score_on": score_on}, renamed).values()
    langs = list(dict.fromkeys(languages))
    n_train = len(langs) - n_validation_languages - n_held_out_languages
    if n_train < 1:
        raise ValueError(
            f"build_cldr_suite: {len(langs)} languages leave none for meta-training after "
            f"n_validation_languages={n_validation_languages} and n_held_out_languages={n_held_out_languages}"
        )
    shuffled = [langs[i] for i in np.random.default_rng(seed).permutation(len(langs))]
    split_langs = {
        "meta_train": shuffled[:n_train],
        "validation": shuffled[n_train : n_train + n_validation_languages],
        "held_out": shuffled[n_train + n_validation_languages :],
    }
    if score_on == "validation":  # the held-out layout, on languages meant for choosing settings
        split_langs["held_out"] = split_langs["validation"]
    names = {lang: _locale_names(lang, countries) for lang in langs}
    english = _territory_names("en", countries)
    # Scoring on validation languages leaves out what is not split by language: translation's
    # validation tasks are the validation split's, and the words family has no languages.
    held = families if score_on == "held_out" else [f for f in families if f not in ("translation", "words")]
    scored = {"meta_train": families, "validation": families, "held_out": held}
    out = {
        split: _split_tasks(
            split, ls, families=scored[split], english=english, names=names, tokenizer=tokenizer,
            translation_spec=translation_spec, langid_spec=langid_spec, max_length=max_length,
            on_too_long=on_too_long, n_langid_train_languages=n_langid_train_languages,
            langid_group_size=langid_group_size, templates=meta_train_templates if split == "meta_train" else 1,
        )
        for split, ls in split_langs.items()
    }  # fmt: skip
    suite = TaskSet(**out, format_shift=[WORDS_FAMILY] if "words" in scored["held_out"] else [])
    logger.info(
        "CLDR suite: %d meta-train, %d validation, %d held-out tasks (held-out languages %s / %s%s)",
        len(suite.meta_train), len(suite.validation), len(suite.held_out),
        split_langs["validation"], split_langs["held_out"],
        ", scoring on the validation languages" if score_on == "validation" else "",
    )  # fmt: skip
    return suite


def _split_tasks(
    split: str,
    ls: Sequence[str],
    *,
    families: Sequence[str],
    english: dict[str, str],
    names: dict[str, dict[str, str]],
    tokenizer: Any,
    translation_spec: EpisodeSpec,
    langid_spec: EpisodeSpec,
    max_length: int,
    on_too_long: OnTooLong,
    n_langid_train_languages: int,
    langid_group_size: int,
    templates: int = 1,
) -> list[Task]:
    """The tasks of one split's languages ``ls``, family by family (continent: held-out only)."""
    out: list[Task] = []
    if "translation" in families:
        for lang in ls:
            out.append(
                _translation_task(
                    lang, english, names[lang], tokenizer, translation_spec, max_length,
                    on_too_long, TRANSLATION_TEMPLATES[:templates],
                )  # fmt: skip
            )
    if "langid" in families:
        ways = langid_spec.ways or 2
        if split == "meta_train":
            pool = ls[:n_langid_train_languages]
            groups = [
                pool[i : i + langid_group_size] for i in range(0, len(pool), langid_group_size)
            ]
        elif split == "validation":
            groups = [ls]
        else:
            groups = [list(g) for g in itertools.combinations(ls, ways)]
        for group in groups:
            if len(group) >= ways:
                out.append(
                    _langid_task(group, names, tokenizer, langid_spec, max_length, LANGID_TEMPLATES[:templates])
                )
    if "continent" in families and split == "held_out":
        for lang in ls:
            out.append(
                _continent_task(lang, names[lang], tokenizer, langid_spec, max_length)
            )
    if "words" in families and split == "held_out":
        out.extend(word_category_tasks(tokenizer, max_length=max_length))
    return out


def _translation_task(
    lang: str,
    english: dict[str, str],
    local: dict[str, str],
    tokenizer: Any,
    spec: EpisodeSpec,
    max_length: int,
    on_too_long: OnTooLong,
    templates: Sequence[str] = TRANSLATION_TEMPLATES[:1],
) -> Task:
    lang_name = _language_name(lang)
    codes = [c for c in english if c in local]
    return GenerationTask.from_texts(
        f"translate-{lang}",
        [t.format(english=english[c], language=lang_name) for t in templates for c in codes],
        [f" {local[c]}" for _ in templates for c in codes],
        tokenizer,
        spec=spec,
        family="cldr-translation",
        max_length=max_length,
        on_too_long=on_too_long,
    )


def _langid_task(
    group: Sequence[str],
    names: dict[str, dict[str, str]],
    tokenizer: Any,
    spec: EpisodeSpec,
    max_length: int,
    templates: Sequence[str] = LANGID_TEMPLATES[:1],
) -> Task:
    # A name spelled the same in two languages of the group ("Francia" in es/it) has no single
    # right answer, so it is left out.
    seen: dict[str, int] = {}
    for lang in group:
        for n in set(names[lang].values()):
            seen[n] = seen.get(n, 0) + 1
    prompts: list[str] = []
    labels: list[int] = []
    for template in templates:
        for k, lang in enumerate(group):
            for n in sorted(set(names[lang].values())):
                if seen[n] == 1:
                    prompts.append(template.format(name=n))
                    labels.append(k)
    return ClassificationTask.from_texts(
        "langid-" + "-".join(group),
        prompts,
        labels,
        [_language_name(lang) for lang in group],
        tokenizer,
        spec=spec,
        family="cldr-langid",
        max_length=max_length,
    )


def _continent_task(
    lang: str, local: dict[str, str], tokenizer: Any, spec: EpisodeSpec, max_length: int
) -> Task:
    classes = sorted(set(CONTINENTS.values()))
    codes = [c for c in local if c in CONTINENTS]
    return ClassificationTask.from_texts(
        f"continent-{lang}",
        [f"Country: {local[c]}\nContinent:" for c in codes],
        [classes.index(CONTINENTS[c]) for c in codes],
        classes,
        tokenizer,
        spec=spec,
        family="cldr-continent",
        max_length=max_length,
    )
