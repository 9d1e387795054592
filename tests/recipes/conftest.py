"""Runs shared between the recipe tests (each launch costs seconds to tens of seconds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests._once import built_once
from tests.recipes import _recipe


@pytest.fixture(scope="session")
def local_short(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, the shared short run, uninterrupted: the reference of every other run."""
    return built_once(tmp_path_factory, "local_short", lambda out: _recipe.run(
        "python", [*_recipe.SHORT, f"output_dir={out}"], timeout_s=120))


@pytest.fixture(scope="session")
def local_dropout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process reference with LoRA dropout on, so the losses depend on the torch RNG
    stream too and a resume that failed to restore it would show."""
    return built_once(tmp_path_factory, "local_dropout", lambda out: _recipe.run(
        "python", [*_recipe.SHORT, *_recipe.DROPOUT, f"output_dir={out}"], timeout_s=120))


DEEPSPEED_TRACKING = ["train.report_to=tensorboard"] if importlib.util.find_spec("tensorboard") else []
"""The shared deepspeed run also writes TensorBoard events where tensorboard is installed
(test_tracking.py's two-rank checks read them, and its log, instead of launching a run of their own;
where it is not, that file is skipped)."""


@pytest.fixture(scope="session")
def deepspeed_short(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two processes under ``deepspeed`` (ZeRO-3), the shared short run, uninterrupted; its launcher's
    output is kept beside it (:func:`deepspeed_short_log`)."""

    def build(out: Path) -> None:
        proc = _recipe.run("deepspeed", [*_recipe.SHORT, *DEEPSPEED_TRACKING, f"output_dir={out}"], nprocs=2,
                           timeout_s=180)
        out.with_name(out.name + ".log").write_text(proc.stdout)

    return built_once(tmp_path_factory, "deepspeed_short", build)


@pytest.fixture(scope="session")
def deepspeed_short_log(deepspeed_short: Path) -> str:
    """What the launcher of :func:`deepspeed_short` printed (both ranks, merged)."""
    return deepspeed_short.with_name(deepspeed_short.name + ".log").read_text()
