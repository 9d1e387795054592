"""The output folder at the recipe level: one run per folder, refused resumes change nothing,
and Ctrl-C says how to resume (issue 12)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests._zygote import Forked, start_python
from tests.recipes import _recipe


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _start(args: list[str], log: Path, *, fresh: bool = False) -> Forked | subprocess.Popen[Any]:
    """``python recipes/train.py ARGS`` started as from a terminal, where Ctrl-C is delivered (a
    shell that starts a command in the background, ``make test &``, sets SIGINT to ignored, and
    that is inherited); forked from the preloaded interpreter unless ``fresh``."""
    with log.open("w") as fh:
        return start_python(_recipe.command("python", args)[1:], env=_recipe.environment(), cwd=_recipe.REPO,
                            stdout=fh, sigint_default=True, fresh=fresh)


def _wait_for_step(proc: Forked | subprocess.Popen[Any], metrics: Path, step: int, log: Path) -> None:
    deadline = time.monotonic() + 120
    while max(_recipe.steps(metrics), default=-1) < step:
        assert proc.poll() is None, f"run ended (rc={proc.returncode}) early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_second_run_into_the_same_folder_is_refused_and_the_first_is_unharmed(
    tmp_path: Path, local_short: Path
) -> None:
    out = tmp_path / "run"
    first_log = tmp_path / "first.log"
    # Long enough that the second run (in this process: its imports are done) meets it running.
    first = _start([*_recipe.SHORT, "train.meta_steps=40", f"output_dir={out}"], first_log)
    try:
        _wait_for_step(first, out / "metrics.jsonl", 0, first_log)
        config_before = (out / "config.yaml").read_bytes()
        second = _recipe.run_here([*_recipe.SHORT, f"output_dir={out}", "lora.r=2"], check=False)
        assert second.returncode == 2, second.stdout[-3000:]
        assert re.search(rf"output_dir='{re.escape(str(out))}' is in use by another run: pid "
                         rf"{first.pid} on host \S+", second.stdout), second.stdout[-3000:]
        assert "Traceback" not in second.stdout and "model and" not in second.stdout
        assert first.poll() is None, "the first run ended before the second was refused"
        assert (out / "config.yaml").read_bytes() == config_before
        assert first.wait(timeout=240) == 0, first_log.read_text()[-3000:]
    finally:
        _recipe.kill_group(first)
    # The first run is exactly the run it would have been alone: each step logged once, and its
    # first 8 steps equal the 8-step reference's (a constant lr: the length changes nothing before).
    got = _recipe.losses(out / "metrics.jsonl")
    assert [r[0] for r in got] == list(range(40))
    assert got[:8] == _recipe.losses(local_short / "metrics.jsonl")
    assert not (out / ".fmmeta.lock").exists()


@pytest.mark.timeout(240)
def test_refused_resume_leaves_the_folder_byte_identical(tmp_path: Path, local_short: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(local_short, out)
    before = _snapshot(out)
    cases = {
        "lora.r=2": "lora.r: 4 in the checkpoint, 2 now",
        "lora.alpha=32": "lora.alpha: 16.0 in the checkpoint, 32.0 now",
        "sampler.strategy=hard": "sampler.strategy: 'diversity' in the checkpoint, 'hard' now",
    }
    for override, message in cases.items():
        proc = _recipe.run_here([*_recipe.SHORT, f"output_dir={out}", override], check=False)
        assert proc.returncode == 2, proc.stdout[-3000:]
        assert message in proc.stdout and "nothing in" in proc.stdout, proc.stdout[-3000:]
        assert "Traceback" not in proc.stdout
        assert _snapshot(out) == before, override
    # A Reptile run pointed at a FOMAML checkpoint.
    ckpt = out / "fomaml" / "checkpoints" / "step_00000007"
    proc = _recipe.run_here([*_recipe.SHORT, f"output_dir={out}", "methods=[reptile]", f"train.resume={ckpt}"],
                            check=False)
    assert proc.returncode == 2 and "algorithm.name: 'fomaml' in the checkpoint, 'reptile' now" in proc.stdout
    assert _snapshot(out) == before
    # The explicit override accepts the change (nothing left to train: 8 of 8 steps are done).
    proc = _recipe.run_here([*_recipe.SHORT, f"output_dir={out}", "lora.alpha=32",
                             "train.resume_changes=[lora.alpha]"])
    assert "resumed from" in proc.stdout


@pytest.mark.timeout(240)
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    # long enough that the run cannot finish between seeing step 2 and the signal, however loaded
    proc = _start([*_recipe.SHORT, f"output_dir={out}", "train.meta_steps=100000"], log)
    try:
        _wait_for_step(proc, out / "metrics.jsonl", 2, log)  # step 1's checkpoint is complete
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        _recipe.kill_group(proc)
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert re.search(r"fomaml interrupted during meta-step \d+\. Last checkpoint: \S+step_0000000[1-9] "
                     r"\(after meta-step \d+\)\. Rerun the same command to resume", text), text[-3000:]
    assert "Traceback" not in text
    assert not (out / ".fmmeta.lock").exists()


@pytest.mark.timeout(300)
def test_a_finished_run_whose_checkpoints_do_not_verify_is_not_restarted(
    tmp_path: Path, local_short: Path
) -> None:
    """A crash or a full disk can leave every checkpoint's manifest half-written: the rerun must
    refuse (exit 2) and leave the finished adapter, the checkpoints and the metrics untouched,
    not start from step 0 over them."""
    out = tmp_path / "run"
    shutil.copytree(local_short, out)
    manifests = sorted(out.glob("fomaml/checkpoints/step_*/manifest.json"))
    assert manifests
    for m in manifests:
        m.write_bytes(m.read_bytes()[: len(m.read_bytes()) // 2])
    before = _snapshot(out)
    done = _recipe.run("python", [*_recipe.SHORT, f"output_dir={out}"], timeout_s=60, check=False)
    assert done.returncode == 2, done.stdout[-3000:]
    assert "none verifies" in done.stdout and "train.resume=never" in done.stdout, done.stdout[-3000:]
    assert "fomaml/adapter" in done.stdout and "Traceback" not in done.stdout
    assert _snapshot(out) == before


@pytest.mark.timeout(120)
def test_a_folder_that_is_not_a_run_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """The user's own config.yaml and metrics.jsonl are not a run's: refused, byte-identical."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("learning_rate: 3e-4\nepochs: 2\n")
    (out / "metrics.jsonl").write_text('{"loss": 1.0}\n')
    (out / "notes").mkdir()
    before = _snapshot(out)
    done = _recipe.run("python", [*_recipe.SHORT, f"output_dir={out}"], timeout_s=60, check=False)
    assert done.returncode == 2, done.stdout[-3000:]
    assert re.search(r"holds files no fmmeta run wrote \(config\.yaml, metrics\.jsonl, notes/\)",
                     done.stdout), done.stdout[-3000:]
    assert "Traceback" not in done.stdout
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == [
        "config.yaml", "metrics.jsonl", "notes"]


@pytest.mark.timeout(120)
def test_ctrl_c_while_the_recipe_imports_is_a_message(tmp_path: Path) -> None:
    """Ctrl-C in the first second (torch, transformers and DeepSpeed still importing): exit 130
    with one line, no traceback from inside an import, and no output folder."""
    log = tmp_path / "log"
    # a fresh interpreter: a forked one has the libraries imported already
    proc = _start([*_recipe.SHORT, f"output_dir={tmp_path / 'run'}"], log, fresh=True)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130, log.read_text()[-3000:]
    text = log.read_text()
    assert "stopped by Ctrl-C while starting up; nothing was written" in text, text[-3000:]
    assert "Traceback" not in text and not (tmp_path / "run").exists()


@pytest.mark.timeout(240)
def test_a_rerun_of_a_finished_run_rewrites_no_file(tmp_path: Path) -> None:
    """Files a rerun does not change keep their bytes and their times: ``fmmeta adapt`` compares an
    adapter's time with its evaluation's, and a rewritten adapter read as one trained after it."""
    out = tmp_path / "run"
    args = [*_recipe.SHORT, "train.meta_steps=2", f"output_dir={out}"]
    # Two string-hash seeds that order {"q_proj", "v_proj"} differently: peft writes its adapter
    # config's target_modules from a set, so each process would write the same config another way.
    _recipe.run("python", args, timeout_s=120, env={**_recipe.environment(), "PYTHONHASHSEED": "0"})
    times = lambda: {p.relative_to(out).as_posix(): p.stat().st_mtime_ns for p in sorted(out.rglob("*"))
                     if p.is_file() and not p.name.endswith(".lock")}
    before, snapshot = times(), _snapshot(out)
    time.sleep(0.05)  # a rewrite would carry a later time
    _recipe.run("python", args, timeout_s=120, env={**_recipe.environment(), "PYTHONHASHSEED": "3"})
    assert _snapshot(out) == snapshot
    assert times() == before, sorted(k for k, v in times().items() if before.get(k) != v)
