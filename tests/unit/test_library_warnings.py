"""Library warnings once per run: two processes set up logging as ``recipes/train.py`` does (rank 0
and rank 1), then hit the same library warnings; the combined output shows each once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import importlib.util, logging, sys, warnings
spec = importlib.util.spec_from_file_location("train_recipe", sys.argv[2])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
rank = int(sys.argv[1])
train.setup_logging(rank)
for _ in range(3):  # the same place warns on every call, as a library does in a loop
    warnings.warn("old_api is deprecated", FutureWarning)
    with warnings.catch_warnings():  # resets Python's memory of what it showed (torch does this)
        pass
logging.getLogger("transformers.modeling_utils").warning("a library logger warning")
logging.getLogger("fmmeta.train").warning("rank %d has something to say", rank)
logging.getLogger("torch.distributed").error("a library error")
"""


def test_library_warnings_show_once_over_two_ranks() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": ""}
    procs = [subprocess.run([sys.executable, "-c", WORKER, str(rank), str(ROOT / "recipes" / "train.py")],
                            env=env, capture_output=True, text=True, timeout=120) for rank in (0, 1)]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    out = "".join(p.stdout + p.stderr for p in procs)
    assert out.count("old_api is deprecated") == 1, out
    assert "[rank0] WARNING py.warnings:" in out  # through logging, naming its rank
    assert out.count("a library logger warning") == 1, out
    # fmmeta's own warnings and every error still show on every rank.
    assert "rank 0 has something to say" in out and "rank 1 has something to say" in out
    assert out.count("a library error") == 2, out
