"""Test-only launcher: ``recipes/train.py`` with rank 1's compute slowed by ``DELAY_S`` per meta-step.

The delay is patched in here, from outside (FOMAML's ``rank_gradient`` sleeps after its passes on
rank 1), so the product code carries no test hook. It comes after the rank's last forward, where
no collective follows until the outer step: rank 0 waits there, as for a slow node.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from fmmeta.algorithms.first_order import FOMAML  # noqa: E402

DELAY_S = 1.0
_rank_gradient = FOMAML.rank_gradient


def _slowed(self: FOMAML, *args: Any, **kwargs: Any) -> Any:
    result = _rank_gradient(self, *args, **kwargs)
    if os.environ.get("RANK") == "1":
        time.sleep(DELAY_S)
    return result


FOMAML.rank_gradient = _slowed  # type: ignore[method-assign]
sys.argv[0] = str(REPO / "recipes" / "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
