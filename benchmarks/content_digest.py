#!/usr/bin/env python
"""What knowing a data file by its content costs: the xxh3 digest every local data file gets
(fmmeta.tasks.data.content_digest), against parsing the same file with ``datasets``.

    python benchmarks/content_digest.py             # a 100 MB JSON-lines file
    python benchmarks/content_digest.py --mb 1      # small, as make test runs it

Prints one JSON object last: the file's size, the median digest time over ``--reps`` runs (page
cache warm, as on a second read), the digest's GB/s, and its share of a cold ``load_dataset`` parse
of the same file (a fresh cache folder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import datasets

from fmmeta.tasks.data import content_digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100.0, help="size of the JSON-lines file written")
    parser.add_argument("--reps", type=int, default=5, help="digest runs; the median is reported")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.jsonl")
        line = json.dumps({"input": "question " * 10, "output": "answer " * 5}) + "\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(line * max(1, int(args.mb * 2**20 / len(line))))
        content_digest([path])  # warm the page cache, as the parse that follows would
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            content_digest([path])
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        datasets.load_dataset("json", data_files={"train": [path]}, split="train", cache_dir=os.path.join(tmp, "c"))
        parse_s = time.perf_counter() - start
        size = os.path.getsize(path)
    digest_s = statistics.median(times)
    print(json.dumps({"bytes": size, "digest_s": round(digest_s, 4), "digest_gb_per_s": round(size / digest_s / 1e9, 2),
                      "parse_s": round(parse_s, 3), "digest_share_of_parse": round(digest_s / parse_s, 4)}))


if __name__ == "__main__":
    main()
