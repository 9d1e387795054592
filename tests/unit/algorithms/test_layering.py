"""The algorithm layer must not pull in the distributed frameworks (only engines know them)."""

from __future__ import annotations

import subprocess
import sys


def test_algorithms_import_neither_deepspeed_nor_accelerate() -> None:
    code = (
        "import sys, fmmeta.algorithms, fmmeta.algorithms.meta_step, fmmeta.engine.local, "
        "fmmeta.engine.optim\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('deepspeed', 'accelerate'))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
