"""The order tests are handed out in: the longest files first.

``make test`` gives each pytest-xdist worker whole files (``--dist loadfile``), in collection order
as workers free up. Collected by name, the longest file (``test_benchmarks.py``, minutes) came
near the end and ran alone on one worker while the other had finished: the suite's last minutes
on one core. Handed out first, the short files fill in around them. The list is of files measured
longest in a clean-clone run (``--durations``); a file missing from it only runs later.
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = (
    "tests/unit/test_benchmarks.py",
    "tests/distributed/test_equivalence.py",
    "tests/recipes/test_gpu_check.py",
    "tests/distributed/test_compiled_zero.py",
    "tests/recipes/test_multinode.py",
    "tests/recipes/test_study.py",
    "tests/unit/algorithms/test_compiled.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order
