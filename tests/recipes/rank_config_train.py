"""Test-only launcher: ``recipes/train.py`` with rank 1 given other overrides (``RANK1_ARGS``, split
on spaces), as a launch whose nodes hold different config files would be."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

if os.environ.get("RANK") == "1":
    sys.argv += os.environ.get("RANK1_ARGS", "").split()
sys.argv[0] = str(REPO / "recipes" / "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
