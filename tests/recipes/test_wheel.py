"""A built wheel, installed into a fresh virtual environment, runs without the repository.

``pip wheel --no-deps`` builds fmmeta as a user's ``pip install fmmeta`` gets it; the throwaway
venv borrows the dependencies (torch, deepspeed, ...) of this one through a ``.pth`` line, which
adds their folder without running its ``.pth`` files, so the editable install of this checkout
stays out and the wheel's fmmeta is the one imported. The commands run from an empty folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.recipes import _recipe


def _sh(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 240) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"rc={proc.returncode}: {' '.join(cmd)}\n{proc.stdout[-4000:]}"
    return proc.stdout


@pytest.mark.timeout(600)
def test_wheel_in_a_fresh_venv_runs_fmmeta_train(tmp_path: Path) -> None:
    env = _recipe.environment()
    env.pop("PYTHONPATH")
    wheels, venv, cwd = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    cwd.mkdir()
    _sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(wheels), str(_recipe.REPO)], cwd, env)
    (wheel,) = wheels.glob("fmmeta-*.whl")
    _sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd, env)
    _sh([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
         "--no-deps", str(wheel)], cwd, env)
    site = Path(subprocess.check_output([str(venv / "bin" / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    where = _sh([str(venv / "bin" / "python"), "-c",
                 "import fmmeta.recipes.train as t, fmmeta.shipped as s; print(t.__file__); "
                 "print(s.shipped_path('ds_configs/zero3.json')); print(s.shipped_path('recipes/configs/smoke.yaml'))"],
                cwd, env).split()
    assert all(p.startswith(str(site)) and os.path.isfile(p) for p in where), where

    helptext = _sh([str(venv / "bin" / "fmmeta"), "train", "--help"], cwd, env)
    assert helptext.startswith("usage: fmmeta train") and "train.meta_steps" in helptext
    # The README's smoke command, by repository path, from a folder without the repository (one
    # process, local engine: the DeepSpeed JSON would make it a DeepSpeed run, whose first start
    # compiles an extension; the JSON's shipped copy is found above).
    out = _sh([str(venv / "bin" / "fmmeta"), "train", "--config", "recipes/configs/smoke.yaml",
               "methods=[fomaml]", "train.meta_steps=1", "train.checkpoint_every=0", "eval.enabled=false",
               "output_dir=run"], cwd, env)
    assert "done in" in out and (cwd / "run" / "fomaml" / "adapter" / "adapter_model.safetensors").is_file()
