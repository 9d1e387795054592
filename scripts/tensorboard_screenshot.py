#!/usr/bin/env python
"""A run's metrics.jsonl as TensorBoard event files, and a PNG screenshot of its scalars.

Replays the records through the same trackers a run with ``train.report_to=tensorboard`` writes
to (one TensorBoard run per method), so a finished run, or the committed default run, can be
looked at in TensorBoard without training again. With ``--png`` it also starts TensorBoard on a
local port and takes a screenshot with a headless Chromium (``chromium`` on PATH, or
``--browser``). Debian's Chromium 156 drew the charts without their lines (with or without
SwiftShader's WebGL), so no screenshot is committed; with a browser that draws them:

    python scripts/tensorboard_screenshot.py docs/default_run/metrics.jsonl runs/tb-default \\
        --png runs/tb-default/tensorboard.png
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from fmmeta.tracking import MetricsLog, open_trackers


def write_events(metrics: Path, out: Path) -> list[str]:
    """Writes every record of ``metrics`` into ``out/tensorboard/<method>``; returns the methods."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    methods = list(dict.fromkeys(r["method"] for r in records))
    for method in methods:
        trackers = open_trackers("tensorboard", out, run=method, first_step=0, rank=0)
        # metrics.jsonl is rewritten by MetricsLog; replay into a scratch file, not the input.
        with MetricsLog(out / "replayed.jsonl", rank=0, method=method, keep_until=-1, trackers=trackers) as log:
            for record in records:
                if record["method"] == method:
                    log.write(record)
    return methods


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def screenshot(logdir: Path, png: Path, browser: str, wait_s: float, size: str, tag_filter: str) -> None:
    """Serves ``logdir`` with TensorBoard on localhost and saves its scalars page (the charts
    whose tag matches the regex ``tag_filter``) as ``png``."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/?darkMode=false&tagFilter={urllib.parse.quote(tag_filter)}#timeseries"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=2)
                break
            except OSError:
                time.sleep(1)
        png.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size={size}", f"--virtual-time-budget={int(wait_s * 1000)}",
                        f"--screenshot={png.resolve()}", url], check=True, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("out", type=Path, help="folder for the event files (out/tensorboard/<method>)")
    parser.add_argument("--png", type=Path, help="also save a screenshot of the scalars here")
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    parser.add_argument("--wait-s", type=float, default=20.0, help="page time before the shot")
    parser.add_argument("--size", default="1600,1200", help="window width,height in pixels")
    parser.add_argument("--tag-filter", default="loss", help="regex of the chart tags shown")
    # On a loaded machine headless Chromium may shoot before the lower charts are drawn.
    parser.add_argument("--keep-height", type=int, help="crop the PNG to its top N pixels")
    args = parser.parse_args()
    methods = write_events(args.metrics, args.out)
    print(f"wrote {', '.join(methods)} to {args.out / 'tensorboard'}")
    if args.png is not None:
        screenshot(args.out / "tensorboard", args.png, args.browser, args.wait_s, args.size, args.tag_filter)
        if args.keep_height:
            from PIL import Image

            with Image.open(args.png) as img:
                cropped = img.crop((0, 0, img.width, min(img.height, args.keep_height)))
            cropped.save(args.png)
        print(f"saved {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
