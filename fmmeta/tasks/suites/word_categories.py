"""The default suite's out-of-format family: plain English words by category (held out only).

Every meta-training task of the CLDR suite reads ``"<Field>: <name>\\n<Question>:"`` and answers
with a translated name or a label word from one pool of twelve. A user's own task rarely looks
like that, and an adapter meta-trained on the suite can do worse there than the base model (a
3-way word-category task: Reptile at chance, the base model adapted 0.94). This family measures
that: its template (a question and an answer line) and its label words (the categories, not
remapped) appear in no meta-training task, and the report scores it apart, every method against
the base model (:data:`FAMILY`).

The words are the project's own: eight categories of twelve common words, none of them a word
of the suite's label pool, and four tasks of four categories (each episode draws three).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fmmeta.tasks.classification import ClassificationTask
from fmmeta.tasks.spec import EpisodeSpec

FAMILY = "word-categories"
"""The family name in the report (marked ``format_shift`` on the suite's TaskSet)."""

WORDS: dict[str, tuple[str, ...]] = {
    "fruit": ("banana", "cherry", "grape", "mango", "orange", "peach", "pear", "plum", "melon", "kiwi",
              "apricot", "fig"),
    "color": ("red", "blue", "green", "yellow", "purple", "pink", "brown", "black", "white", "gray", "violet",
              "beige"),
    "tool": ("hammer", "saw", "drill", "wrench", "screwdriver", "chisel", "pliers", "shovel", "rake", "axe",
             "ladder", "trowel"),
    "vehicle": ("car", "bus", "train", "truck", "bicycle", "boat", "plane", "tram", "taxi", "van", "ship",
                "scooter"),
    "body part": ("arm", "leg", "hand", "foot", "head", "knee", "elbow", "finger", "shoulder", "ankle", "neck",
                  "chin"),
    "clothing": ("shirt", "coat", "jacket", "dress", "skirt", "sock", "hat", "scarf", "glove", "boot", "sweater",
                 "trousers"),
    "instrument": ("guitar", "violin", "drum", "flute", "trumpet", "cello", "harp", "banjo", "clarinet", "oboe",
                   "tuba", "saxophone"),
    "drink": ("water", "milk", "tea", "coffee", "juice", "beer", "wine", "soda", "cocoa", "cider", "lemonade",
              "smoothie"),
}  # fmt: skip

TASKS: tuple[tuple[str, ...], ...] = (
    ("fruit", "color", "tool", "vehicle"),
    ("body part", "clothing", "instrument", "drink"),
    ("fruit", "tool", "clothing", "drink"),
    ("color", "vehicle", "body part", "instrument"),
)
"""The categories of each task: every category in two tasks, every pair of them at most once."""

TEMPLATE = 'Q: Which category does "{word}" belong to?\nA:'
"""A question and an answer line: no meta-training task of the suite is written so."""

SPEC = EpisodeSpec(shots=2, query=2, ways=3)
"""3-way episodes of 2 shots and 2 queries a class, as the suite's langid and continent, with the
categories themselves as the answers (no remapping)."""


def word_category_tasks(tokenizer: Any, *, max_length: int, spec: EpisodeSpec = SPEC,
                        groups: Sequence[Sequence[str]] = TASKS) -> list[ClassificationTask]:
    """The family's tasks, one per group of categories."""
    out = []
    for i, group in enumerate(groups):
        prompts = [TEMPLATE.format(word=w) for c in group for w in WORDS[c]]
        labels = [k for k, c in enumerate(group) for _ in WORDS[c]]
        out.append(ClassificationTask.from_texts(f"words-{i + 1}", prompts, labels, list(group), tokenizer,
                                                 spec=spec, family=FAMILY, max_length=max_length))
    return out


__all__ = ["FAMILY", "SPEC", "TASKS", "TEMPLATE", "WORDS", "word_category_tasks"]
