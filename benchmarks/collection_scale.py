"""Task collections at real size: what a Super-NaturalInstructions-sized ``tasks.collection`` costs.

Writes SNI-shaped synthetic collections (a folder of ``--tasks`` JSON-lines files, one task each,
rows ``{"input", "output"}``: an instruction-like input of a few hundred tokens, a short answer)
at each size of ``--rows`` (total rows, split evenly over the tasks) and, for each size, builds
the collection the way the recipe does (``collection_problems``, the config check, then
``build_collection`` with a ``dataset`` source over the folder, 4 shots, 4 queries, the default
split) in fresh processes:

* ``cold_s``: the config check plus the build with an empty cache (reading, checking and
  tokenizing every row, writing the cache); ``warm_s``: the same with the cache filled. Both
  exclude the child's imports and tokenizer load (``startup_s``, reported on its own);
* ``cold_peak_rss_gb`` / ``warm_peak_rss_gb``: the child's peak RSS; ``base_rss_gb``: the peak RSS
  of a child that only imports and loads the tokenizer, and ``rss_per_million_rows_gb``: the
  slope of cold and warm peak RSS between the smallest and the largest size. The tokenizer load
  peaks above what it keeps (SmolLM2's GGUF parse), which can hide a small build's memory, so
  ``*_build_peak_rss_gb`` is the peak of the check and build alone and ``*_growth_gb`` that peak
  less what the child held before it;
* ``bare_tokenize_s``: the fast tokenizer's batch encode of the same prompts and answers, read
  once with plain ``json`` (``read_s``), and ``cold_over_bare = cold_s / (bare_tokenize_s + read_s)``:
  what the build costs above the work it cannot avoid;
* ``episodes_per_s``: episodes drawn from random meta-train tasks of the warm build;
* for each rank count above 1 in ``--ranks``: the cold build under ``torchrun`` with a gloo
  process group (the ranks tokenize a share of the parts each, then read the rest from the cache),
  ``cold_<n>ranks_s`` (rank 0's time to tasks ready), ``cold_<n>ranks_over_1`` and
  ``same_tasks_<n>ranks`` (every rank's tasks digest equals the one-rank build's).

Children run as a recipe does: ``TOKENIZERS_PARALLELISM=false`` and ``OMP_NUM_THREADS=1``; the
build gives the tokenizer the cores a rank has to itself (both, for one rank on 2 cores), and so
does the bare baseline (its best configuration). ``cold_1core_s`` is the one-rank cold build held
to one core: what two ranks, one core each, are compared with (``cold_2ranks_over_1core``). Progress goes to stderr, one line per phase; each child's own stderr
(``datasets``' progress bars, the library's warnings) to ``<work>/logs``.

Usage:
    python benchmarks/collection_scale.py [--tokenizer smollm2|tiny] [--tasks 1600]
        [--rows 50000,500000,2000000] [--ranks 1,2] [--seconds 2] [--work DIR]

The defaults write ~3 GB of JSON lines at the largest size and take many minutes on 2 cores.
The last line of output is one JSON object with the measurements.
"""

from __future__ import annotations

import time

START = time.perf_counter()  # a child's startup_s counts its imports from here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runs from a checkout without `pip install -e .` too

VOCAB = (
    # function words first: the Zipf weights below follow this order
    "the of and to a in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if more what "
    "will can its into only other than then them these so some may could should each about two "
    "after first also new any such must how most over where between both under during without "
    "task given input output answer sentence question text word words list number following "
    "write generate classify return whether label correct example examples story article "
    "review paragraph context passage title summary translate language english response "
    "statement claim true false positive negative category topic person people time year years "
    "way day man woman child world life hand part place case week company system program "
    "government group country problem fact school city state family student book water money "
    "point home night room mother area game line end member law car market food history music "
    "team river village church season film album station county century population party "
    "national public university research report data study result results model method value "
    "make use find give tell ask work call try need feel become leave put mean keep let begin "
    "seem help show hear play run move live believe bring happen provide sit stand lose pay "
    "meet include continue set learn change lead understand watch follow stop create speak read "
    "allow add spend grow open walk win offer remember consider appear buy wait serve die send "
    "expect build stay fall cut reach kill remain suggest raise pass sell require decide "
    "good great small large long little old big high different important early young few "
    "public bad same able late hard major better best possible whole free military true local "
    "sure clear recent certain personal open red difficult available likely short single "
    "medical current wrong private past foreign fine common poor natural significant similar "
    "hot dead central happy serious ready simple left physical general environmental financial "
    "however therefore because although while before since until unless whereas instead"
).split()
VOCAB = list(dict.fromkeys(VOCAB))  # once each, in first-seen order

OPENINGS = (
    "In this task, you are given", "You are given", "Given a", "In this task, you need to read",
    "Read the following", "Your task is to", "Given the",
)
"""How SNI definitions tend to begin: a per-task instruction opens every row's input."""


# ------------------------------------------------------------------------------------ the data


def make_corpus(rng: np.random.Generator, n_words: int) -> tuple[str, np.ndarray]:
    """English-like text of ``n_words`` words (Zipf-weighted common words, sentences of 6-24
    words, some numbers and commas) and the character offset of each word (one past the end last)."""
    vocab = np.array(VOCAB, dtype=object)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    words = vocab[rng.choice(len(vocab), size=n_words, p=weights / weights.sum())]
    numbers = rng.random(n_words) < 0.02
    words[numbers] = rng.integers(0, 10_000, size=int(numbers.sum())).astype(str).astype(object)
    ends = np.cumsum(rng.integers(6, 25, size=n_words // 6 + 1)) - 1
    ends = ends[ends < n_words]
    commas = np.flatnonzero(rng.random(n_words) < 0.04)
    words[commas] = [w + "," for w in words[commas]]
    words[ends] = [w.rstrip(",") + "." for w in words[ends]]
    heads = np.concatenate([[0], ends[ends + 1 < n_words] + 1])
    words[heads] = [w.capitalize() for w in words[heads]]
    lens = np.fromiter((len(w) for w in words), dtype=np.int64, count=n_words)
    offsets = np.concatenate([[0], np.cumsum(lens + 1)])
    return " ".join(words.tolist()), offsets


def word_counts(rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    """``n`` lognormal lengths in words around ``median``, clipped to ``[lo, hi]``."""
    return np.clip(np.rint(median * rng.lognormal(0.0, sigma, size=n)), lo, hi).astype(np.int64)


def write_collection(folder: Path, args: argparse.Namespace, n_rows: int) -> dict:
    """``args.tasks`` files ``task0000.jsonl``... in ``folder`` holding ``n_rows`` rows in all (an
    even split, the first tasks one row more); returns what was written."""
    rng = np.random.default_rng([args.seed, n_rows])
    corpus, offsets = make_corpus(rng, 1 << 20)
    n_words = len(offsets) - 1
    per_task = np.full(args.tasks, n_rows // args.tasks, dtype=np.int64)
    per_task[: n_rows % args.tasks] += 1

    def piece(start: int, n: int) -> str:
        return corpus[offsets[start]: offsets[start + n] - 1]

    folder.mkdir(parents=True)
    total_bytes = 0
    for t, n in enumerate(per_task.tolist()):
        opening = OPENINGS[int(rng.integers(len(OPENINGS)))]
        d_words = int(rng.integers(15, 60))
        definition = f"{opening} {piece(int(rng.integers(n_words - d_words)), d_words).rstrip('.')}."
        inputs = word_counts(rng, n, args.input_words, args.input_sigma, 8, 3 * args.input_words) - d_words
        outputs = word_counts(rng, n, args.output_words, args.output_sigma, 1, 15 * args.output_words)
        inputs = np.maximum(inputs, 5)
        starts_in = rng.integers(0, n_words - inputs)
        starts_out = rng.integers(0, n_words - outputs)
        lines = [
            json.dumps({"input": f"{definition}\n\nInput: {piece(a, k)}\nOutput:", "output": piece(b, m)})
            for a, k, b, m in zip(starts_in.tolist(), inputs.tolist(), starts_out.tolist(), outputs.tolist())
        ]
        text = "\n".join(lines) + "\n"
        (folder / f"task{t:04d}.jsonl").write_text(text, encoding="utf-8")
        total_bytes += len(text)
    return {"tasks_written": args.tasks, "rows": n_rows, "data_mb": round(total_bytes / 2**20, 1)}


# ----------------------------------------------------------------------------------- the child


def _peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _rss_now_gb() -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Restarts the peak RSS count (Linux >= 4.0; ``ru_maxrss`` follows it), so the build's own
    peak is not hidden under the tokenizer load's (SmolLM2's GGUF parse peaks above what it keeps)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _startup(spec: dict, *, build: bool) -> tuple[object, dict]:
    """Imports what the mode needs and loads the tokenizer, timed from the script's start."""
    if build:
        import torch.distributed  # noqa: F401  (build_collection asks it for a process group)

        import fmmeta.tasks.collection  # noqa: F401
        import fmmeta.tasks.task  # noqa: F401
    from benchmarks.episodes import load_tokenizer

    imported = time.perf_counter()
    tok = load_tokenizer(spec["tokenizer"])
    done = time.perf_counter()
    return tok, {"import_s": imported - START, "tokenizer_s": done - imported, "startup_s": done - START,
                 "startup_peak_rss_gb": _peak_rss_gb(), "startup_rss_gb": _rss_now_gb()}


def child_bare(spec: dict) -> dict:
    """Plain ``json`` read of every file, then the backend's batch encode of prompts and answers."""
    tok, out = _startup(spec, build=False)
    t0 = time.perf_counter()
    prompts: list[str] = []
    answers: list[str] = []
    for path in sorted(Path(spec["data"]).glob("*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                prompts.append(row["input"])  # the default template: the input itself
                answers.append(" " + row["output"])  # the default answer_template " {answer}"
    read_s = time.perf_counter() - t0
    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # the baseline's best: every core
    backend = tok.backend_tokenizer
    chunk = 16_384  # batches of texts, as a Dataset.map would hand them over
    counts = {"prompt": 0, "answer": 0}
    t0 = time.perf_counter()
    for key, texts in (("prompt", prompts), ("answer", answers)):
        for i in range(0, len(texts), chunk):
            # .ids makes the Python lists the builders keep (encode() in fmmeta.tasks.tokens)
            counts[key] += sum(len(e.ids) for e in backend.encode_batch(texts[i: i + chunk], add_special_tokens=False))
    tokenize_s = time.perf_counter() - t0
    n = max(len(prompts), 1)
    return {**out, "read_s": read_s, "tokenize_s": tokenize_s, "rows": len(prompts),
            "mean_prompt_tokens": counts["prompt"] / n, "mean_answer_tokens": counts["answer"] / n,
            "peak_rss_gb": _peak_rss_gb()}  # fmt: skip


def child_build(spec: dict) -> dict:
    """The recipe's check and build of the collection; the digests of what it built; episodes."""
    tok, out = _startup(spec, build=True)
    import torch.distributed as dist

    from fmmeta.tasks.collection import CollectionSource, CollectionSplit, build_collection, collection_problems
    from fmmeta.tasks.task import tasks_fingerprint

    if spec.get("cores"):  # the build as on a machine of that many cores
        import fmmeta.tasks.cache

        fmmeta.tasks.cache.usable_cores = lambda: spec["cores"]  # type: ignore[assignment]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        from datetime import timedelta

        t0 = time.perf_counter()
        dist.init_process_group("gloo", timeout=timedelta(seconds=spec["pg_timeout"]))
        dist.barrier()  # every rank starts the build together
        out["pg_init_s"] = time.perf_counter() - t0
    source = CollectionSource(path=spec["data"], builder="dataset", input_column="input",
                              output_column="output", shots=spec["shots"], query=spec["query"])  # fmt: skip
    split = CollectionSplit()
    reset = _reset_peak_rss()
    t0 = time.perf_counter()
    problems = collection_problems([source], split, cache_dir=spec["cache"])
    check_s = time.perf_counter() - t0
    if problems:
        raise SystemExit(f"the benchmark's collection was refused: {problems}")
    suite = build_collection([source], split, tok, seed=spec["seed"], max_length=spec["max_length"],
                             cache_dir=spec["cache"])  # fmt: skip
    ready_s = time.perf_counter() - t0
    splits = {"meta_train": suite.meta_train, "validation": suite.validation, "held_out": suite.held_out}
    out.update({
        "rank": int(os.environ.get("RANK", "0")), "world_size": world,
        "check_s": check_s, "build_s": ready_s - check_s, "ready_s": ready_s,
        "peak_rss_gb": max(out["startup_peak_rss_gb"], _peak_rss_gb()),
        "build_peak_rss_gb": _peak_rss_gb() if reset else None, "rss_after_gb": _rss_now_gb(),
        "tasks": {k: len(v) for k, v in splits.items()},
        "examples": sum(len(t) for v in splits.values() for t in v),
        "digest": {k: tasks_fingerprint(v) for k, v in splits.items()},
    })  # fmt: skip
    if spec["seconds"] > 0 and suite.meta_train:
        rng = np.random.default_rng(spec["seed"] + 1)
        tasks = suite.meta_train
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < spec["seconds"]:
            for _ in range(50):
                tasks[int(rng.integers(len(tasks)))].sample_episode(rng)
            n += 50
        out["episodes_per_s"] = n / elapsed
    if world > 1:
        dist.destroy_process_group()
    return out


def child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    mode = spec["mode"]
    if mode == "base":
        _, out = _startup(spec, build=True)
        out["peak_rss_gb"] = _peak_rss_gb()
    elif mode == "bare":
        out = child_bare(spec)
    else:
        out = child_build(spec)
    Path(spec["out"].format(rank=os.environ.get("RANK", "0"))).write_text(json.dumps(out), encoding="utf-8")


# ---------------------------------------------------------------------------------- the parent


def log(message: str) -> None:
    print(f"[collection_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def child_env(args: argparse.Namespace) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO)}  # fmt: skip
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a launcher's leftovers must not make a one-rank child join a group
    return env


def run_child(args: argparse.Namespace, work: Path, name: str, spec: dict, ranks: int = 1) -> list[dict]:
    """Runs this script as a child in ``spec["mode"]`` (under torchrun for ``ranks`` > 1); returns
    each rank's result and puts the child's wall seconds, launch included, in the first."""
    spec_path = work / "specs" / f"{name}.json"
    spec_path.parent.mkdir(exist_ok=True)
    out = work / "specs" / f"{name}.rank{{rank}}.out.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out), "tokenizer": args.tokenizer}), encoding="utf-8")
    script = [str(Path(__file__).resolve()), "--child", str(spec_path)]
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
              if ranks > 1 else [sys.executable])  # fmt: skip
    (work / "logs").mkdir(exist_ok=True)
    log_path = work / "logs" / f"{name}.log"
    t0 = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as err:
        done = subprocess.run([*launch, *script], cwd=REPO, env=child_env(args), stdout=err,
                              stderr=subprocess.STDOUT, timeout=args.child_timeout)  # fmt: skip
    wall_s = time.perf_counter() - t0
    if done.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
        raise SystemExit(f"child {name} failed with exit code {done.returncode}; its log ({log_path}) ends:\n{tail}")
    results = [json.loads(Path(str(out).format(rank=r)).read_text(encoding="utf-8")) for r in range(ranks)]
    results[0]["process_s"] = wall_s
    return results


def folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def machine() -> dict:
    model, flags = "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    return {"cpu_model": model, "avx512_bf16": "avx512_bf16" in flags.split(), "cpu_count": os.cpu_count(),
            "python": platform.python_version()}


def r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


def minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def one_rank_figures(bare: dict, cold: dict, warm: dict) -> dict:
    """A size's figures from its bare, cold and warm children's results."""
    bare_s = bare["tokenize_s"] + bare["read_s"]
    return {
        "tokens_per_row": r(bare["mean_prompt_tokens"] + bare["mean_answer_tokens"], 1),
        "mean_prompt_tokens": r(bare["mean_prompt_tokens"], 1),
        "mean_answer_tokens": r(bare["mean_answer_tokens"], 1),
        "read_s": r(bare["read_s"]),
        "bare_tokenize_s": r(bare["tokenize_s"]),
        "bare_peak_rss_gb": r(bare["peak_rss_gb"]),
        "cold_s": r(cold["ready_s"]),
        "cold_check_s": r(cold["check_s"]),
        "cold_build_s": r(cold["build_s"]),
        "warm_s": r(warm["ready_s"]),
        "warm_check_s": r(warm["check_s"]),
        "warm_build_s": r(warm["build_s"]),
        "cold_over_bare": r(cold["ready_s"] / bare_s, 2),
        "warm_over_bare": r(warm["ready_s"] / bare_s, 2),
        "startup_s": r(cold["startup_s"]),
        "cold_process_s": r(cold["process_s"], 2),
        "cold_peak_rss_gb": r(cold["peak_rss_gb"]),
        "warm_peak_rss_gb": r(warm["peak_rss_gb"]),
        # the peak while checking and building only, and what the child held before (tokenizer
        # loaded): their difference is what the collection costs above the model's share
        "cold_build_peak_rss_gb": r(cold["build_peak_rss_gb"]),
        "warm_build_peak_rss_gb": r(warm["build_peak_rss_gb"]),
        "cold_growth_gb": r(minus(cold["build_peak_rss_gb"], cold["startup_rss_gb"])),
        "warm_growth_gb": r(minus(warm["build_peak_rss_gb"], warm["startup_rss_gb"])),
        "cold_rss_after_gb": r(cold["rss_after_gb"]),
        "warm_rss_after_gb": r(warm["rss_after_gb"]),
        "tasks_built": {**cold["tasks"], "total": sum(cold["tasks"].values())},
        "examples": cold["examples"],
        "digest": cold["digest"],
        "warm_same_tasks": warm["digest"] == cold["digest"],
        "episodes_per_s": r(warm.get("episodes_per_s", 0.0), 1),
    }


def measure_size(args: argparse.Namespace, work: Path, n_rows: int, ranks: list[int], base: dict) -> dict:
    """Every figure of one collection size (its data written first, its caches fresh)."""
    root = work / f"rows{n_rows}"
    log(f"{n_rows:,} rows: writing {args.tasks} task files")
    t0 = time.perf_counter()
    written = write_collection(root / "data", args, n_rows)
    write_s = time.perf_counter() - t0
    common = {"data": str(root / "data"), "shots": args.shots, "query": args.query, "seed": args.seed,
              "max_length": args.max_length, "seconds": 0.0, "pg_timeout": 60}  # fmt: skip
    log(f"{n_rows:,} rows: {written['data_mb']} MB written in {write_s:.1f} s; bare read + tokenize")
    (bare,) = run_child(args, work, f"rows{n_rows}_bare", {**common, "mode": "bare"})
    log(f"{n_rows:,} rows: cold build, 1 rank")
    (cold,) = run_child(args, work, f"rows{n_rows}_cold", {**common, "mode": "build", "cache": str(root / "cache1")})
    cache_mb = folder_mb(root / "cache1")
    log(f"{n_rows:,} rows: cold {cold['ready_s']:.2f} s; warm build, 1 rank, then episodes")
    (warm,) = run_child(args, work, f"rows{n_rows}_warm",
                        {**common, "mode": "build", "cache": str(root / "cache1"), "seconds": args.seconds})
    out = {**written, "rows_per_task": n_rows / args.tasks, "write_s": r(write_s, 2),
           **one_rank_figures(bare, cold, warm), "cache_mb": r(cache_mb, 1)}  # fmt: skip
    if any(n > 1 for n in ranks):
        log(f"{n_rows:,} rows: cold build, 1 rank on 1 core")
        (one_core,) = run_child(args, work, f"rows{n_rows}_cold_1core",
                                {**common, "mode": "build", "cache": str(root / "cache1core"), "cores": 1})
        out["cold_1core_s"] = r(one_core["ready_s"])
        out["same_tasks_1core"] = one_core["digest"] == cold["digest"]
    for n in ranks:
        if n <= 1:
            continue
        log(f"{n_rows:,} rows: cold build, {n} ranks (torchrun, gloo)")
        spec = {**common, "mode": "build", "cache": str(root / f"cache{n}"),
                # the ranks beyond 0 wait at a barrier for the whole cold build: a timeout above
                # it, yet short enough that a hang fails the run instead of stalling it
                "pg_timeout": int(60 + 4 * cold["ready_s"])}  # fmt: skip
        per_rank = run_child(args, work, f"rows{n_rows}_cold_{n}ranks", spec, ranks=n)
        out[f"cold_{n}ranks_s"] = r(per_rank[0]["ready_s"])
        out[f"cold_{n}ranks_last_s"] = r(max(p["ready_s"] for p in per_rank))
        out[f"cold_{n}ranks_over_1"] = r(per_rank[0]["ready_s"] / cold["ready_s"], 2)
        out[f"cold_{n}ranks_over_1core"] = r(per_rank[0]["ready_s"] / one_core["ready_s"], 2)
        out[f"cold_{n}ranks_peak_rss_gb"] = [r(p["peak_rss_gb"]) for p in per_rank]
        out[f"cold_{n}ranks_build_peak_rss_gb"] = [r(p["build_peak_rss_gb"]) for p in per_rank]
        out[f"digest_{n}ranks"] = [p["digest"] for p in per_rank]
        out[f"same_tasks_{n}ranks"] = all(p["digest"] == cold["digest"] for p in per_rank)
    log(f"{n_rows:,} rows: done (cold {out['cold_s']} s, warm {out['warm_s']} s, "
        f"bare {out['bare_tokenize_s'] + out['read_s']:.2f} s)")
    shutil.rmtree(root, ignore_errors=True)  # the next size gets the disk back
    return out


def slope(sizes: list[dict], key: str) -> float | None:
    """GB per million rows of ``key`` between the smallest and the largest size."""
    lo, hi = sizes[0], sizes[-1]
    if hi["rows"] == lo["rows"] or lo[key] is None or hi[key] is None:
        return None
    return r((hi[key] - lo[key]) / ((hi["rows"] - lo["rows"]) / 1e6), 4)


def int_list(text: str) -> list[int]:
    return [int(v.replace("_", "")) for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", choices=("tiny", "smollm2"), default="smollm2")
    parser.add_argument("--tasks", type=int, default=1600, help="task files (SNI has ~1,600 tasks)")
    parser.add_argument("--rows", type=int_list, default=[50_000, 500_000, 2_000_000],
                        help="collection sizes in total rows, comma-separated, split evenly over the tasks")
    parser.add_argument("--ranks", type=int_list, default=[1, 2],
                        help="rank counts of the cold build (one rank is always measured)")
    parser.add_argument("--seconds", type=float, default=2.0, help="episode sampling window of the warm child")
    parser.add_argument("--input-words", type=int, default=210, help="median words of a row's input")
    parser.add_argument("--input-sigma", type=float, default=0.35, help="lognormal sigma of input words")
    parser.add_argument("--output-words", type=int, default=8, help="median words of a row's output")
    parser.add_argument("--output-sigma", type=float, default=1.0, help="lognormal sigma of output words")
    parser.add_argument("--max-length", type=int, default=1024, help="tasks.max_length (tokens per example)")
    parser.add_argument("--shots", type=int, default=4)
    parser.add_argument("--query", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child-timeout", type=float, default=3600.0, help="seconds any one child may take")
    parser.add_argument("--work", default=None,
                        help="work folder, kept with its logs (each size's data and caches are removed once "
                             "measured); default a temporary one, removed")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None:
        small = min(args.rows) // args.tasks if args.rows else 0
        if not args.rows or small < args.shots + args.query:
            parser.error(f"--rows {args.rows} over --tasks {args.tasks} leaves {small} rows per task: "
                         f"a task needs at least shots + query = {args.shots + args.query}")
    return args


def main() -> None:
    args = parse_args()
    if args.child is not None:
        child_main(args.child)
        return
    sizes_rows = sorted(set(args.rows))
    ranks = sorted(set(args.ranks))
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="collection_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        log(f"work folder {work}; base child (imports and tokenizer only)")
        (base,) = run_child(args, work, "base", {"mode": "base"})
        sizes = [measure_size(args, work, n, ranks, base) for n in sizes_rows]
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "collection_scale",
        **machine(),
        "tokenizer": args.tokenizer,
        "tasks": args.tasks,
        "rows": sizes_rows,
        "ranks": ranks,
        "max_length": args.max_length,
        "shots": args.shots,
        "query": args.query,
        "startup_s": r(base["startup_s"]),
        "import_s": r(base["import_s"]),
        "tokenizer_s": r(base["tokenizer_s"]),
        "base_rss_gb": r(base["peak_rss_gb"]),
        "base_rss_held_gb": r(base["startup_rss_gb"]),
        # whole-process peaks (the tokenizer load's included) and the build's own
        "rss_per_million_rows_gb": {"cold": slope(sizes, "cold_peak_rss_gb"),
                                    "warm": slope(sizes, "warm_peak_rss_gb"),
                                    "cold_build": slope(sizes, "cold_build_peak_rss_gb"),
                                    "warm_build": slope(sizes, "warm_build_peak_rss_gb")},
        "sizes": sizes,
    }  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
