"""The ``fmmeta`` commands and the module entry points run the same recipes as ``recipes/*.py``.

* ``fmmeta train`` under ``torchrun --nproc_per_node 2 --no-python`` (every rank runs the console
  script) writes the adapter ``python recipes/train.py`` writes with the same config (ZeRO-3 over 2
  ranks against one process: the tolerance of test_launchers.py, for the same reason).
* ``fmmeta evaluate --run`` writes a new report folder each time, leaves training's ``eval/``
  untouched, reproduces its numbers, and evaluates a run whose task suite was registered from
  Python once ``--import`` names the module (without it: exit 2, nothing written).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipes import _recipe

BIN = Path(sys.executable).parent
RTOL = 5e-5

SUITE_MODULE = '''
from fmmeta.tasks.suites import build_synthetic_suite, register_suite

register_suite("mine", build_synthetic_suite)
'''
"""A user's module registering a task suite from Python (not importable as 'module:function'
from the config: the name 'mine' exists only once this module ran)."""

CHEAP_EVAL = ["eval.seeds=1", "eval.max_steps=1", "eval.lr_grid=[0.1]", "eval.in_context=false"]


def _run(cmd: list[str], *, cwd: Path = _recipe.REPO, env: dict[str, str] | None = None,
         timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env or _recipe.environment(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    return proc


@pytest.mark.timeout(400)
def test_fmmeta_train_under_torchrun_matches_python_recipe(tmp_path: Path, local_short: Path) -> None:
    out = tmp_path / "torchrun"
    cmd = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(_recipe._free_port()),
           "--no-python", str(BIN / "fmmeta"), "train", "--config", str(_recipe.SMOKE),
           *_recipe.SHORT, f"output_dir={out}"]
    proc = _run(cmd, timeout_s=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "world size 2 | ZeRO stage 3" in proc.stdout, proc.stdout[-3000:]
    diff = _recipe.max_relative_diff(_recipe.adapter(out / "fomaml" / "adapter"),
                                     _recipe.adapter(local_short / "fomaml" / "adapter"))
    assert diff <= RTOL, diff
    assert [r[0] for r in _recipe.losses(out / "metrics.jsonl")] == list(range(8))


@pytest.mark.timeout(60)
def test_module_entry_point_and_fmmeta_help() -> None:
    proc = _run([sys.executable, "-m", "fmmeta.recipes.evaluate", "--help"], timeout_s=50)
    assert proc.returncode == 0 and "NEW report folder eval-YYYYmmdd-HHMMSS" in proc.stdout, proc.stdout
    proc = _run([str(BIN / "fmmeta"), "train", "--help"], timeout_s=50)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: fmmeta train"), proc.stdout[:500]
    assert "--import MODULE" in proc.stdout and "train.meta_steps" in proc.stdout
    proc = _run([str(BIN / "fmmeta"), "fit"], timeout_s=50)
    assert proc.returncode == 2 and "unknown command 'fit'" in proc.stdout


def _reports(run: Path) -> list[Path]:
    return sorted(p for p in run.iterdir() if p.name.startswith("eval-"))


@pytest.mark.timeout(600)
def test_evaluate_run_new_folder_each_time_and_a_suite_registered_in_python(tmp_path: Path) -> None:
    (tmp_path / "my_suites.py").write_text(SUITE_MODULE)
    env = _recipe.environment()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    run = tmp_path / "run"
    train = [str(BIN / "fmmeta"), "train", "--config", str(_recipe.SMOKE), "--import", "my_suites",
             "tasks.suite=mine", "tasks.max_length=32", "methods=[fomaml]", "train.meta_steps=2",
             "train.checkpoint_every=0", *CHEAP_EVAL, f"output_dir={run}"]
    proc = _run(train, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    before = {p.name: p.read_bytes() for p in (run / "eval").iterdir()}
    assert "eval.json" in before

    # The suite exists only once my_suites is imported: refused, and nothing is written.
    proc = _run([str(BIN / "fmmeta"), "evaluate", "--run", str(run)], env=env)
    assert proc.returncode == 2 and "'mine'" in proc.stdout and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert _reports(run) == []

    for n in (1, 2):
        proc = _run([str(BIN / "fmmeta"), "evaluate", "--run", str(run), "--import", "my_suites"], env=env)
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert len(_reports(run)) == n
    assert {p.name: p.read_bytes() for p in (run / "eval").iterdir()} == before  # untouched
    trained = json.loads(before["eval.json"])["records"]
    for report in _reports(run):
        again = json.loads((report / "eval.json").read_text())["records"]
        assert [(r["method"], r["task"], r["step"]) for r in again] == \
            [(r["method"], r["task"], r["step"]) for r in trained]
        for a, b in zip(again, trained):
            assert abs(a["loss"] - b["loss"]) <= 1e-6 * max(1.0, abs(b["loss"])) and a["accuracy"] == b["accuracy"]


@pytest.mark.timeout(60)
def test_evaluate_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    proc = _run([sys.executable, "-m", "fmmeta.recipes.evaluate", "--run", str(tmp_path)], timeout_s=50)
    assert proc.returncode == 2 and "has no config.yaml" in proc.stdout, proc.stdout[-2000:]
    (tmp_path / "config.yaml").write_text("methods: [fomaml]\n")
    proc = _run([sys.executable, "-m", "fmmeta.recipes.evaluate", "--run", str(tmp_path)], timeout_s=50)
    assert proc.returncode == 2 and "has no trained adapter" in proc.stdout, proc.stdout[-2000:]
    assert _reports(tmp_path) == []
