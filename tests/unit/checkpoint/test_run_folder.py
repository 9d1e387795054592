"""The output-folder lock, the resume check, and claiming a folder without touching it on refusal."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fmmeta.checkpoint import CheckpointManager
from fmmeta.checkpoint.lock import LOCK_NAME, RunLock, RunLockError
from fmmeta.checkpoint.resume import RESUME_FACTS, resume_differences, resume_facts, resume_problems
from fmmeta.checkpoint.run_folder import claim_output_dir
from fmmeta.config import load_config
from fmmeta.errors import UserInputError
from fmmeta.recipe_config import RecipeConfig


def _cfg(out: Path, *overrides: str) -> RecipeConfig:
    return load_config(RecipeConfig, None, [f"output_dir={out}", "model.tiny=true",
                                            "model.tokenizer=bytes", *overrides])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_second_lock_is_refused_naming_pid_and_host(tmp_path: Path) -> None:
    with RunLock.acquire(tmp_path):
        # flock is per open file: a second open in this very process is a second holder.
        with pytest.raises(RunLockError) as err:
            RunLock.acquire(tmp_path)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(err.value)
        assert "another output_dir" in str(err.value)
    assert not (tmp_path / LOCK_NAME).exists()  # released: removed
    RunLock.acquire(tmp_path).release()  # and free again


def test_lock_held_by_another_process_is_refused(tmp_path: Path) -> None:
    code = ("import sys, time; from fmmeta.checkpoint.lock import RunLock; "
            f"l = RunLock.acquire({str(tmp_path)!r}); print('held', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(RunLockError, match=f"pid {child.pid} "):
            RunLock.acquire(tmp_path)
    finally:
        child.kill()  # dies holding the lock: the kernel releases it, the file stays behind
        child.wait()
    assert (tmp_path / LOCK_NAME).exists()
    RunLock.acquire(tmp_path).release()


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "gone", "started_unix": 0}))
    with caplog.at_level(logging.WARNING), RunLock.acquire(tmp_path):
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
    assert "left by pid 999999 on host gone" in caplog.text and "no longer running" in caplog.text


def test_resume_differences_lists_each_changed_key_and_honours_allowed() -> None:
    saved = {"lora.alpha": 16.0, "lora.target_modules": ["q_proj"], "algorithm.name": "fomaml"}
    now = {"lora.alpha": 32.0, "lora.target_modules": ("q_proj",), "algorithm.name": "reptile",
           "train.seed": 0}  # a key the checkpoint predates is not compared
    assert resume_differences(saved, now) == [
        "lora.alpha: 16.0 in the checkpoint, 32.0 now",
        "algorithm.name: 'fomaml' in the checkpoint, 'reptile' now",
    ]
    assert resume_differences(saved, now, allowed=["lora.alpha", "algorithm.name"]) == []


def test_a_methods_own_section_is_a_resume_fact(tmp_path: Path) -> None:
    saved = resume_facts(_cfg(tmp_path, "methods=[reptile]"), "reptile")
    assert saved["algorithm.reptile"] == {"query_step": False}
    now = resume_facts(_cfg(tmp_path, "methods=[reptile]", "algorithm.reptile.query_step=true"), "reptile")
    assert resume_differences(saved, now) == [
        "algorithm.reptile: {'query_step': False} in the checkpoint, {'query_step': True} now"]
    # a method without settings of its own has none to compare; another method's are not its own
    assert resume_facts(_cfg(tmp_path), "fomaml")["algorithm.fomaml"] is None
    assert "algorithm.reptile" not in resume_facts(_cfg(tmp_path), "fomaml")


def _fake_checkpoint(out: Path, cfg: RecipeConfig, method: str, step: int = 3) -> Path:
    mgr = CheckpointManager(out / method / "checkpoints")
    ckpt = mgr.save(step, lambda w: w.save_json("state.json", {"step": step}),
                    meta={RESUME_FACTS: resume_facts(cfg, method)})
    return ckpt.path


def test_resume_problems_refuse_changed_settings_and_another_method(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "methods=[fomaml]")
    path = _fake_checkpoint(tmp_path, cfg, "fomaml")
    assert resume_problems(cfg, tmp_path) == []
    changed = _cfg(tmp_path, "methods=[fomaml]", "lora.alpha=32", "optim.outer_lr=0.5")
    [problem] = resume_problems(changed, tmp_path)
    assert "lora.alpha: 16.0 in the checkpoint, 32.0 now" in problem
    assert "optim.outer_lr" in problem and "train.resume_changes=[lora.alpha, optim.outer_lr]" in problem
    assert resume_problems(_cfg(tmp_path, "methods=[fomaml]", "lora.alpha=32", "optim.outer_lr=0.5",
                                "train.resume_changes=[lora.alpha,optim.outer_lr]"), tmp_path) == []
    # A Reptile run pointed at a FOMAML checkpoint.
    [problem] = resume_problems(_cfg(tmp_path, "methods=[reptile]", f"train.resume={path}"), tmp_path)
    assert "algorithm.name: 'fomaml' in the checkpoint, 'reptile' now" in problem
    [problem] = resume_problems(_cfg(tmp_path, "train.resume_changes=[lora.alpah]"), tmp_path)
    assert "did you mean 'lora.alpha'" in problem
    # Settings that only change speed or bookkeeping may change freely.
    assert resume_problems(_cfg(tmp_path, "methods=[fomaml]", "train.meta_steps=99",
                                "sampler.micro_batch_size=2", "eval.seeds=1"), tmp_path) == []


def test_refused_claim_leaves_the_folder_byte_identical_and_unlocked(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "methods=[fomaml]")
    claim = claim_output_dir(cfg)
    claim.accept(cfg)
    claim.release()
    _fake_checkpoint(tmp_path, cfg, "fomaml")
    before = _snapshot(tmp_path)
    with pytest.raises(UserInputError, match="nothing in .* was changed"):
        claim_output_dir(_cfg(tmp_path, "methods=[fomaml]", "lora.r=4"))
    assert _snapshot(tmp_path) == before
    claim_output_dir(cfg).release()


def test_claim_refuses_a_file_as_output_dir_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "run"):
        with pytest.raises(UserInputError, match="is a file"):
            claim_output_dir(_cfg(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_claim_writes_nothing_until_accepted_and_removes_the_folders_it_made(tmp_path: Path) -> None:
    """A run refused after the claim (LoRA targets, data, eval.query: found once the model and
    tasks are built) leaves no config.yaml behind, and no new folder; an existing one stays."""
    out = tmp_path / "a" / "b" / "run"
    claim = claim_output_dir(_cfg(out))
    assert sorted(p.name for p in out.iterdir()) == [".fmmeta.lock"]  # the lock only
    claim.release()
    assert sorted(tmp_path.iterdir()) == []
    (tmp_path / "empty").mkdir()
    claim_output_dir(_cfg(tmp_path / "empty")).release()
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    claim = claim_output_dir(_cfg(out))
    claim.accept(_cfg(out))
    claim.release()
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml"]



def test_a_hand_edited_config_yaml_is_named_not_overwritten(tmp_path: Path) -> None:
    """A finished run's config.yaml edited (lora.r 8 -> 16), then the same command: the edit was
    overwritten without a word and the run extended with the old value."""
    import yaml

    from fmmeta.config import save_resolved

    cfg = _cfg(tmp_path, "methods=[fomaml]")
    save_resolved(cfg, tmp_path / "config.yaml")  # the run's own config.yaml
    _fake_checkpoint(tmp_path, cfg, "fomaml")
    assert resume_problems(cfg, tmp_path) == []
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    saved["lora"]["r"] = 16
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    before = (tmp_path / "config.yaml").read_bytes()
    [problem] = resume_problems(cfg, tmp_path)
    assert "config.yaml' disagrees with the run's checkpoints, so it was edited after the run wrote it" in problem
    assert "fomaml: lora.r: 8 in the checkpoint, 16 in config.yaml" in problem and "put the file back" in problem
    with pytest.raises(UserInputError, match="edited after the run wrote it"):
        claim_output_dir(cfg)
    assert (tmp_path / "config.yaml").read_bytes() == before


def test_a_run_folder_that_cannot_be_locked_is_a_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only finished run folder was the lock file's raw OSError (simulated: the tests may
    run as root, for whom a read-only mode does not stop a write)."""
    cfg = _cfg(tmp_path, "methods=[fomaml]")

    def read_only(folder: Path) -> RunLock:
        raise PermissionError(13, "Permission denied", str(folder / LOCK_NAME))

    monkeypatch.setattr(RunLock, "acquire", staticmethod(read_only))
    with pytest.raises(UserInputError, match="cannot be locked for this run \\(Permission denied: .*make it writable"):
        claim_output_dir(cfg)
