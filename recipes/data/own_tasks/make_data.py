#!/usr/bin/env python
"""Writes the example collection of ``recipes/configs/own_tasks.yaml`` (run from anywhere).

Small, hand-checked word lists turned into rows of the layouts people already have, so the
example reads like a real collection and stays deterministic:

* ``instructions.jsonl``: Super-NaturalInstructions rows (``task_name``, ``definition``,
  ``inputs``, ``targets``), four generation tasks of the ``word_forms`` family;
* ``metaicl.jsonl``: MetaICL rows (``task``, ``input``, ``output``, ``options``), three
  classification tasks (a fixed option list) of the ``word_classes`` family;
* ``topics.csv``: one labeled CSV (``text``, ``label``) for the ``classification`` builder;
* ``arithmetic/*.jsonl``: one task per file (``input``, ``output``), the held-out ``arithmetic``
  family.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

PLURALS = {
    "cat": "cats", "dog": "dogs", "box": "boxes", "city": "cities", "child": "children",
    "mouse": "mice", "leaf": "leaves", "bus": "buses", "foot": "feet", "tooth": "teeth",
    "baby": "babies", "wish": "wishes", "knife": "knives", "man": "men", "woman": "women",
    "book": "books", "tree": "trees", "car": "cars", "glass": "glasses", "story": "stories",
    "house": "houses", "river": "rivers", "party": "parties", "apple": "apples", "church": "churches",
    "wolf": "wolves", "goose": "geese", "day": "days", "key": "keys", "hero": "heroes",
}
PAST = {
    "walk": "walked", "go": "went", "see": "saw", "eat": "ate", "play": "played", "run": "ran",
    "take": "took", "jump": "jumped", "write": "wrote", "sing": "sang", "swim": "swam",
    "talk": "talked", "make": "made", "come": "came", "give": "gave", "know": "knew",
    "think": "thought", "buy": "bought", "open": "opened", "watch": "watched", "drink": "drank",
    "find": "found", "sleep": "slept", "read": "read", "cook": "cooked", "fly": "flew",
    "draw": "drew", "fall": "fell", "learn": "learned", "speak": "spoke",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "old": "new", "high": "low",
    "light": "dark", "hard": "soft", "rich": "poor", "early": "late", "long": "short",
    "strong": "weak", "wet": "dry", "full": "empty", "open": "closed", "clean": "dirty",
    "loud": "quiet", "thick": "thin", "heavy": "light", "young": "old", "easy": "difficult",
    "good": "bad", "right": "wrong", "first": "last", "top": "bottom", "near": "far",
    "true": "false", "cheap": "expensive", "inside": "outside", "win": "lose",
}
WORDS = sorted(set(PLURALS) | set(PAST))[:30]

ANIMALS = ["cat", "horse", "eagle", "shark", "tiger", "rabbit", "snake", "whale", "frog", "owl",
           "sheep", "camel", "zebra", "mouse", "goat", "lion"]
FOODS = ["bread", "cheese", "apple", "rice", "soup", "pasta", "carrot", "cake", "butter", "honey",
         "salad", "pizza", "grape", "onion", "bean", "egg"]
POSITIVE = ["wonderful", "great", "lovely", "excellent", "happy", "delightful", "superb",
            "pleasant", "brilliant", "charming", "joyful", "fantastic", "cheerful", "kind",
            "beautiful", "perfect"]
NEGATIVE = ["terrible", "awful", "horrible", "sad", "dreadful", "nasty", "poor", "boring",
            "ugly", "painful", "miserable", "rude", "gloomy", "annoying", "cruel", "bad"]
HOT = ["fire", "sun", "oven", "desert", "lava", "summer", "stove", "coffee", "flame", "sauna",
       "volcano", "toast", "grill", "furnace", "tea", "candle"]
COLD = ["ice", "snow", "winter", "glacier", "freezer", "frost", "hail", "igloo", "arctic",
        "sleet", "iceberg", "blizzard", "popsicle", "fridge", "polar", "icicle"]

TOPICS = {
    "sport": ["The team scored a late goal.", "She won the tennis final.", "The runner broke the record.",
              "He swam four laps before breakfast.", "The match ended in a draw.",
              "Our coach planned a new defence.", "The cyclist climbed the mountain stage.",
              "They lost the basketball game by two points.", "The boxer trained every morning.",
              "Fans cheered as the race began.", "The goalkeeper saved a penalty.",
              "The golf ball rolled into the hole."],
    "science": ["The cell divides into two.", "Water boils at one hundred degrees.",
                "The telescope found a new planet.", "Plants turn light into sugar.",
                "The atom has a small nucleus.", "Sound travels slower than light.",
                "The chemist mixed two acids.", "Gravity pulls the apple down.",
                "The virus was seen under the microscope.", "Magnets attract iron.",
                "The experiment measured the speed of sound.", "Rocks change slowly over time."],
    "music": ["She played a song on the piano.", "The band released a new album.",
              "He tuned his guitar before the show.", "The choir sang in the church.",
              "The drummer kept a steady beat.", "The orchestra played a symphony.",
              "They wrote a song about the sea.", "The violin sounded sweet.",
              "The concert sold out in a day.", "She practised scales every evening.",
              "The singer hit a high note.", "The jazz trio played until midnight."],
}


def word_forms() -> list[dict]:
    tasks = {
        "plural_nouns": ("Write the plural form of the English noun.", PLURALS),
        "past_tense": ("Write the simple past tense of the English verb.", PAST),
        "opposites": ("Write a word that means the opposite of the given word.", OPPOSITES),
        "uppercase": ("Rewrite the word in capital letters.", {w: w.upper() for w in WORDS}),
    }
    return [
        {"task_name": name, "id": f"{name}-{i}", "definition": definition, "inputs": word,
         "targets": target}
        for name, (definition, pairs) in tasks.items()
        for i, (word, target) in enumerate(pairs.items())
    ]


def word_classes() -> list[dict]:
    tasks = {
        "animal_or_food": ("Is this an animal or a food? {w}", ["animal", "food"], ANIMALS, FOODS),
        "word_sentiment": ("Is this word positive or negative? {w}", ["positive", "negative"],
                           POSITIVE, NEGATIVE),
        "hot_or_cold": ("Is this hot or cold? {w}", ["hot", "cold"], HOT, COLD),
    }
    rows = []
    for name, (prompt, options, first, second) in tasks.items():
        for a, b in zip(first, second):  # interleaved, so a cut-off file keeps both classes
            rows.append({"task": name, "input": prompt.format(w=a), "output": options[0], "options": options})
            rows.append({"task": name, "input": prompt.format(w=b), "output": options[1], "options": options})
    return rows


def arithmetic() -> dict[str, list[dict]]:
    return {
        "add_ten": [{"input": f"{a} + 10 =", "output": str(a + 10)} for a in range(1, 31)],
        "double": [{"input": f"Twice {a} is", "output": str(2 * a)} for a in range(1, 31)],
        "next_number": [{"input": f"After {a} comes", "output": str(a + 1)} for a in range(10, 40)],
    }


def main() -> None:
    with (HERE / "instructions.jsonl").open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in word_forms())
    with (HERE / "metaicl.jsonl").open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in word_classes())
    with (HERE / "topics.csv").open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        for i in range(12):
            for label, texts in TOPICS.items():
                writer.writerow([texts[i], label])
    (HERE / "arithmetic").mkdir(exist_ok=True)
    for name, rows in arithmetic().items():
        with (HERE / "arithmetic" / f"{name}.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
