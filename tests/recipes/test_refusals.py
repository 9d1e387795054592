"""Refusals that come late (once the model and tasks are built) or from the environment, at the
recipe level: each exits with its code and one message, no traceback, and leaves the folder as it
was: a new folder is not created, a run folder stays byte-identical (issue 31)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from fmmeta.checkpoint import CheckpointManager
from tests._zygote import start_python
from tests.recipes import _recipe


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"fmmeta_recipe_{name}", _recipe.REPO / "recipes" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LATE = {
    "lora target that matches nothing": (["lora.target_modules=[nope]"],
                                         "lora.target_modules=['nope'] is invalid"),
    "lora target on the LM head": (["lora.target_modules=[lm_head]"], "'lm_head' is the LM head"),
    "examples longer than tasks.max_length": (["tasks.max_length=8"],
                                              "Raise tasks.max_length (now 8 tokens per example)"),
    "eval.query more than a task has": (["eval.query=500"], "eval.query=500 is too many for task"),
    "meta-batch larger than the pool": (
        ["sampler.meta_batch_size=40"],
        "sampler.meta_batch_size=40 is larger than the meta-training pool (33 tasks), so a "
        "meta-batch would hold a task twice: set sampler.meta_batch_size to at most 33"),
}
"""Refused once the model and tasks are built; before this issue each left a config.yaml in a
new folder (and the meta-batch case was a raw ValueError with exit code 1)."""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(LATE))
def test_a_late_refusal_creates_no_folder_and_leaves_a_run_byte_identical(
    case: str, tmp_path: Path, local_short: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides, message = LATE[case]
    train = _load("train")
    smoke = ["--config", str(_recipe.SMOKE), "methods=[fomaml]"]
    new = tmp_path / "new" / "run"
    assert train.main([*smoke, f"output_dir={new}", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "new").exists()  # not even the parent it would have made
    # A finished run started afresh (train.resume=never) and refused: not one byte changes.
    run = tmp_path / "run"
    shutil.copytree(local_short, run)
    before = _snapshot(run)
    assert train.main([*smoke, *_recipe.SHORT, "eval.enabled=true", f"output_dir={run}",
                       "train.resume=never", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert _snapshot(run) == before


@pytest.mark.timeout(300)
def test_evaluate_run_refuses_changed_settings_in_the_words_of_training(
    tmp_path: Path, local_short: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``evaluate --run`` with ``lora.r`` changed raised a size mismatch from peft; with
    ``lora.alpha`` changed it evaluated every adapter at the wrong scale without a word."""
    run = tmp_path / "run"
    shutil.copytree(local_short, run)
    before = _snapshot(run)
    same = ("whose state was made with other settings: lora.alpha: 16.0 in the checkpoint, 32.0 "
            "now. Rerun with the checkpoint's values")
    train, evaluate = _load("train"), _load("evaluate")
    assert train.main(["--config", str(_recipe.SMOKE), *_recipe.SHORT, f"output_dir={run}", "lora.alpha=32"]) == 2
    assert same in capsys.readouterr().err
    for override, diff in (("lora.alpha=32", "lora.alpha: 16.0 in the checkpoint, 32.0 now"),
                           ("lora.r=2", "lora.r: 4 in the checkpoint, 2 now")):
        assert evaluate.main(["--run", str(run), override]) == 2
        err = capsys.readouterr().err
        assert f"--run {str(run)!r} refused; nothing in {str(run)!r} was changed" in err, err
        assert diff in err and "evaluate it with --config and --adapter NAME=PATH" in err, err
        assert "Traceback" not in err
        assert _snapshot(run) == before and not any(run.glob("eval-*"))
    assert evaluate.main(["--run", str(run), "lora.alpha=32"]) == 2
    assert same in capsys.readouterr().err  # the very words training used
    # Without checkpoints (deleted to save space) the run's config.yaml says what the adapter is.
    shutil.rmtree(run / "fomaml" / "checkpoints")
    assert evaluate.main(["--run", str(run), "lora.r=2"]) == 2
    err = capsys.readouterr().err
    assert f"as trained from {str(run / 'config.yaml')!r}" in err and "lora.r: 4 in the run's config.yaml, 2 now" in err, err


@pytest.mark.timeout(300)
def test_a_finished_method_whose_checkpoints_were_deleted_is_not_trained_over(
    tmp_path: Path, local_short: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting a finished method's checkpoints to free disk, then extending the run, restarted it
    from step 0 over its adapter and metrics without a word; now it is refused, byte for byte."""
    run = tmp_path / "run"
    shutil.copytree(local_short, run)
    shutil.rmtree(run / "fomaml" / "checkpoints")
    before = _snapshot(run)
    train = _load("train")
    args = ["--config", str(_recipe.SMOKE), *_recipe.SHORT, f"output_dir={run}"]
    assert train.main([*args, "train.meta_steps=10"]) == 2
    err = capsys.readouterr().err
    assert f"fomaml: its adapter {str(run / 'fomaml' / 'adapter')!r} is finished but it has no checkpoint" in err
    assert "rerun with train.resume=never or another output_dir" in err and "Traceback" not in err, err
    assert _snapshot(run) == before


@pytest.mark.timeout(300)
def test_evaluate_run_refuses_a_run_that_is_still_training(
    tmp_path: Path, local_short: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It scored the previous adapter, with curves from a half-written metrics.jsonl, without a word."""
    from fmmeta.checkpoint.lock import RunLock

    run = tmp_path / "run"
    shutil.copytree(local_short, run)
    before = _snapshot(run)
    held = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom fmmeta.checkpoint.lock import RunLock\n"
                             f"RunLock.acquire({str(run)!r}); print('held', flush=True); time.sleep(60)"],
                            cwd=_recipe.REPO, env=_recipe.environment(), stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "held"
        assert _load("evaluate").main(["--run", str(run)]) == 2
    finally:
        held.kill()
        held.wait()
    err = capsys.readouterr().err
    assert f"--run {str(run)!r} is in use" in err and "wait for it to finish" in err and "Traceback" not in err, err
    assert {k: v for k, v in _snapshot(run).items() if k != ".fmmeta.lock"} == {
        k: v for k, v in before.items() if k != ".fmmeta.lock"} and not any(run.glob("eval-*"))
    RunLock.acquire(run).release()  # the lock is free again once the holder is gone


@pytest.mark.parametrize("recipe", ["train", "evaluate", "study"])
def test_a_second_config_file_is_refused_not_dropped(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse kept the last of two --config files and dropped the first without a word."""
    with pytest.raises(SystemExit) as stop:
        _load(recipe).main(["--config", "a.yaml", "--config", "b.yaml"])
    assert stop.value.code == 2
    assert "--config given twice ('a.yaml', then 'b.yaml'): a run reads one config file" in capsys.readouterr().err


@pytest.mark.timeout(180)
@pytest.mark.parametrize("recipe", ["train", "evaluate"])
def test_ds_accelerator_cuda_without_a_gpu_is_a_message(recipe: str, tmp_path: Path) -> None:
    """Was ``AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'`` (rank 0
    failed, exit 1) under the DeepSpeed engine; now exit 2 with the fix, and no folder made."""
    env = {**_recipe.environment(), "DS_ACCELERATOR": "cuda", "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "run"
    cmd = [sys.executable, str(_recipe.REPO / "recipes" / f"{recipe}.py"), "--config", str(_recipe.SMOKE),
           f"output_dir={out}", "engine.deepspeed_config=ds_configs/zero3.json", *_recipe.SHORT]
    done = subprocess.run(cmd, cwd=_recipe.REPO, env=env, capture_output=True, text=True, timeout=150)
    text = done.stdout + done.stderr
    assert done.returncode == 2, text[-3000:]
    assert "error: DS_ACCELERATOR=cuda is set but torch sees no CUDA GPU (CUDA_VISIBLE_DEVICES='')" in text, text[-3000:]
    assert "Traceback" not in text and not out.exists()


def _ctrl_c_once(cmd: list[str], log: Path, marker: str, sig: int = signal.SIGINT) -> tuple[int, str]:
    """Starts ``cmd`` (``python SCRIPT ...``, forked from the preloaded interpreter: tests/_zygote.py)
    as from a terminal, where Ctrl-C is delivered, and sends Ctrl-C (or ``sig``) to its process
    group once ``marker`` is in its log."""
    with log.open("w") as fh:
        assert cmd[0] == sys.executable, cmd
        proc = start_python(cmd[1:], env=_recipe.environment(), cwd=_recipe.REPO, stdout=fh, sigint_default=True)
    try:
        deadline = time.monotonic() + 150
        while marker not in log.read_text():
            assert proc.poll() is None, f"ended (rc={proc.returncode}) before {marker!r}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, sig)
        rc = proc.wait(timeout=60)
    finally:
        _recipe.kill_group(proc)
    return rc, log.read_text()


@pytest.mark.timeout(300)
def test_ctrl_c_during_evaluation_is_a_message_and_keeps_the_run(tmp_path: Path, local_short: Path) -> None:
    """Ctrl-C while held-out episodes are scored, in training's final evaluation and in
    ``evaluate --run``: exit 130, one line, the checkpoint and adapter intact, no half report."""
    run = tmp_path / "run"
    shutil.copytree(local_short, run)
    before = _snapshot(run)
    evaluate = [sys.executable, str(_recipe.REPO / "recipes" / "evaluate.py"), "--run", str(run)]
    rc, text = _ctrl_c_once(evaluate, tmp_path / "evaluate.log", "evaluating ")
    assert rc == 130, text[-3000:]
    assert "stopped by Ctrl-C: no report was written and nothing else was changed" in text, text[-3000:]
    assert "Traceback" not in text and _snapshot(run) == before and not any(run.glob("eval-*"))
    # The same command that trained the run (all 8 meta-steps done), with its evaluation on.
    train = _recipe.command("python", [*_recipe.SHORT, "eval.enabled=true", f"output_dir={run}"])
    rc, text = _ctrl_c_once(train, tmp_path / "train.log", "evaluating ")
    assert rc == 130, text[-3000:]
    assert "stopped by Ctrl-C" in text and "Traceback" not in text, text[-3000:]
    ckpt = CheckpointManager(run / "fomaml" / "checkpoints").latest()
    assert ckpt is not None and ckpt.step == 7  # complete and verified
    assert _snapshot(run)["fomaml/adapter/adapter_model.safetensors"] == before["fomaml/adapter/adapter_model.safetensors"]
    assert not (run / ".fmmeta.lock").exists()


@pytest.mark.timeout(300)
def test_ctrl_c_while_methods_train_side_by_side_names_each_and_resumes(tmp_path: Path) -> None:
    """Ctrl-C with two methods training in worker processes (``engine.workers=2``): exit 130, each
    method's interrupted meta-step and last checkpoint named, no traceback, the folder released;
    the same command then resumes both to the end."""
    run = tmp_path / "run"
    args = ["methods=[fomaml,reptile]", "eval.enabled=false", "train.meta_steps=8",
            "train.checkpoint_every=2", "engine.workers=2", f"output_dir={run}"]
    rc, text = _ctrl_c_once(_recipe.command("python", args), tmp_path / "train.log", "meta-step 3 ")
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and not (run / ".fmmeta.lock").exists(), text[-3000:]
    for method in ("fomaml", "reptile"):
        assert f"{method} interrupted during meta-step" in text, text[-3000:]
    _recipe.run("python", args, timeout_s=180)
    steps = sorted((r["method"], r["step"]) for r in _recipe.records(run / "metrics.jsonl"))
    assert steps == sorted((m, s) for m in ("fomaml", "reptile") for s in range(8))
    assert all((run / m / "adapter" / "adapter_model.safetensors").exists() for m in ("fomaml", "reptile"))


@pytest.mark.timeout(300)
def test_sigterm_is_handled_as_ctrl_c_with_exit_143_and_resumes(tmp_path: Path, local_short: Path) -> None:
    """A scheduler's pre-emption (SIGTERM to the job's processes) exited 143 with no message; now
    it names each method's interrupted meta-step and last checkpoint, like Ctrl-C, and the same
    command resumes to the uninterrupted run's losses."""
    run = tmp_path / "run"
    args = [*_recipe.SHORT, f"output_dir={run}"]
    rc, text = _ctrl_c_once(_recipe.command("python", args), tmp_path / "train.log", "meta-step 3 ", signal.SIGTERM)
    assert rc == 143, text[-3000:]
    assert "fomaml stopped by SIGTERM during meta-step" in text and "Rerun the same command to resume" in text
    assert "Traceback" not in text and not (run / ".fmmeta.lock").exists(), text[-3000:]
    _recipe.run("python", args, timeout_s=180)
    assert _recipe.losses(run / "metrics.jsonl") == _recipe.losses(local_short / "metrics.jsonl")


@pytest.mark.timeout(300)
def test_evaluate_run_with_a_truncated_adapter_is_a_message(
    tmp_path: Path, local_short: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A final adapter cut short (a full disk, an interrupted copy) was a raw SafetensorError."""
    run = tmp_path / "run"
    shutil.copytree(local_short, run)
    adapter = run / "fomaml" / "adapter" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    assert _load("evaluate").main(["--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{adapter} cannot be read as an adapter" in err and "the file is cut short or damaged" in err, err
    assert "Traceback" not in err and not any(run.glob("eval-*"))


@pytest.mark.timeout(300)
def test_a_full_disk_while_checkpointing_is_a_message_and_resumes(
    tmp_path: Path, local_short: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ENOSPC while a checkpoint was written was a raw OSError traceback; the complete checkpoints
    were already kept, so the message says how to go on, and going on gives the uninterrupted run."""
    import errno

    from fmmeta.checkpoint import manager

    real = manager.CheckpointManager._save

    def full_disk(self, step, write, **kwargs):  # noqa: ANN001, ANN202 - the manager's writes, failing at step 5
        if step == 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.root / ".tmp_step_00000005"))
        return real(self, step, write, **kwargs)

    monkeypatch.setattr(manager.CheckpointManager, "_save", full_disk)
    run = tmp_path / "run"
    train = _load("train")
    args = ["--config", str(_recipe.SMOKE), *_recipe.SHORT, f"output_dir={run}"]
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert "writing checkpoint step_00000005 into" in err and "fomaml/checkpoints" in err, err
    assert "No space left on device" in err, err
    assert "it resumes from the last complete checkpoint" in err and "(after meta-step 3)" in err, err
    assert "Traceback" not in err and not (run / ".fmmeta.lock").exists()
    monkeypatch.setattr(manager.CheckpointManager, "_save", real)  # space freed
    assert train.main(args) == 0
    assert _recipe.losses(run / "metrics.jsonl") == _recipe.losses(local_short / "metrics.jsonl")


@pytest.mark.timeout(300)
def test_a_meta_training_task_removed_before_an_extension_is_refused_before_any_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A meta-training task removed from the data between a run and its extension was a raw
    ValueError from the sampler, after config.yaml had been rewritten."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    for name in ("add", "sub", "mul", "neg"):  # two meta-training tasks, one held out, one validation
        rows = [{"input": f"{a} {name} 2 =", "output": str(a)} for a in range(12)]
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    args = _data_run_args(data, run)
    train = _load("train")
    assert train.main(args) == 0
    (data / "sub.jsonl").rename(tmp_path / "sub.jsonl")  # gone from the data
    (data / "div.jsonl").write_text((tmp_path / "sub.jsonl").read_text().replace(" sub ", " div "))
    before = _snapshot(run)
    capsys.readouterr()
    assert train.main([*args, "train.meta_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "the meta-training data changed since the checkpoints were written; nothing was written" in err, err
    assert "whose sampler was saved over another meta-training pool (gone: ['sub']; new: ['div'])" in err
    assert "Traceback" not in err and _snapshot(run) == before


def _data_run_args(data: Path, run: Path) -> list[str]:
    """A short run on a collection of four files: two meta-training tasks, one validation, one held out
    (in this process, through the recipe's ``main``: the refusals are the recipe's, not a launcher's)."""
    return ["--config", str(_recipe.SMOKE), "methods=[fomaml]", "train.meta_steps=2", "eval.enabled=false", f"output_dir={run}",
            f"tasks.collection=[{{path: {data}, builder: dataset, shots: 2, query: 2}}]",
            "tasks.split.held_out=[mul]", "tasks.split.validation=[neg]", "sampler.meta_batch_size=2"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["deepspeed", "accelerate"])  # accelerate launches through torchrun
def test_ranks_launched_with_different_configs_are_refused_on_every_rank(
    launcher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 with another inner lr trained to the end and recorded rank 0's value; another
    lora.r died in a raw gloo abort. Now every rank refuses at start, naming the keys and values."""
    monkeypatch.setenv("RANK1_ARGS", "algorithm.inner_lr=0.5 lora.r=2")
    run = tmp_path / "run"
    args = [*_recipe.SHORT, f"output_dir={run}", "engine.collective_timeout_s=30"]
    start = time.monotonic()
    proc = _recipe.run(launcher, args, nprocs=2, check=False,
                       timeout_s=240, script_path=Path(__file__).with_name("rank_config_train.py"))
    assert proc.returncode != 0 and time.monotonic() - start < 200, proc.stdout[-3000:]
    said = ("the config differs between the 2 ranks (algorithm.inner_lr: rank 0 0.1, rank 1 0.5; "
            "lora.r: rank 0 4, rank 1 2): launch every rank with the same --config and overrides")
    assert proc.stdout.count(said) == 2, proc.stdout[-4000:]  # on each rank
    # No traceback of ours (accelerate's launcher prints its own when a rank exits non-zero).
    ours = [t for t in proc.stdout.split("Traceback")[1:] if "fmmeta/" in t.split("\n\n")[0]]
    assert not ours, ours[0][:2000]
    assert not (run / "config.yaml").exists()


def _rank_pid(run: Path, rank: int) -> int:
    """The process of ``rank`` of the run writing to ``run`` (deepspeed passes --local_rank; torchrun
    sets LOCAL_RANK in the worker's environment)."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    workers = [(int(line.split()[0]), line) for line in ps.splitlines()
               if str(run) in line and "recipes/train.py" in line and "torchrun" not in line.split()[1]]
    for pid, line in workers:
        if f"--local_rank={rank}" in line:
            return pid
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"LOCAL_RANK={rank}".encode() in env and "--local_rank=" not in line:
            return pid
    raise AssertionError(f"no rank {rank} among {workers}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun"])
def test_a_killed_rank_is_one_message_on_the_surviving_rank(tmp_path: Path, launcher: str) -> None:
    """One rank SIGKILLed: the other exited within seconds, but with gloo's "Connection reset by
    peer" traceback only; now it says the other rank is gone and where the last checkpoint is.
    torchrun stops the survivor itself (SIGTERM) and names the dead rank in its summary."""
    run = tmp_path / "run"
    cmd = _recipe.command(launcher, [*_recipe.SHORT, f"output_dir={run}", "train.meta_steps=40",
                                     "engine.collective_timeout_s=30"], nprocs=2)
    log = tmp_path / "train.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=_recipe.REPO, env=_recipe.environment(), stdout=fh,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while max(_recipe.steps(run / "metrics.jsonl"), default=-1) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        rank1 = _rank_pid(run, 1)
        killed = time.monotonic()
        os.kill(rank1, signal.SIGKILL)
        proc.wait(timeout=120)
        assert time.monotonic() - killed < 60  # bounded: well under the collective timeout's double
    finally:
        _recipe.kill_group(proc)
    text = log.read_text()
    if launcher == "deepspeed":
        # gloo says "reset" or "closed" by peer, as the timing of the kill falls
        assert re.search(r"the other rank \(rank 1\) stopped answering \(gloo: Connection (reset|closed) by peer\): it died or "
                         "was killed", text), text[-3000:]
        assert "Rerun the same command on every rank to resume" in text
    else:  # whichever comes first on the survivor: torchrun's SIGTERM or gloo's broken connection
        assert re.search(r"stopped by SIGTERM|the other rank \(rank 1\) stopped answering", text), text[-3000:]
        assert re.search(r"rank\s*: 1 \(local_rank: 1\)", text), text[-3000:]
    assert "Last checkpoint: " in text
    assert "Exception ignored in atexit" not in text


@pytest.mark.timeout(300)
def test_a_master_port_in_use_is_a_message(tmp_path: Path) -> None:
    """Was the TCPStore's raw DistNetworkError traceback ("address already in use") on rank 0."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cmd = _recipe.command("deepspeed", [*_recipe.SHORT, f"output_dir={tmp_path / 'run'}"], nprocs=2)
        cmd[cmd.index("--master_port") + 1] = str(port)
        done = subprocess.run(cmd, cwd=_recipe.REPO, env=_recipe.environment(), capture_output=True, text=True,
                              timeout=240)
    text = done.stdout + done.stderr
    assert done.returncode != 0, text[-3000:]
    assert f"MASTER_PORT={port} on 127.0.0.1 is already in use" in text and "--master_port N" in text, text[-3000:]
    ours = [t for t in text.split("Traceback")[1:] if "fmmeta/" in t.split("\n\n")[0]]
    assert not ours, ours[0][:2000]


@pytest.mark.timeout(300)
def test_an_extension_over_edited_data_is_refused_before_any_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same tasks with other examples (a data file edited between a run and its extension)
    trained on without a word: the checkpoint records the data's fingerprint."""
    import json

    data = tmp_path / "data"
    data.mkdir()

    def write(offset: int) -> None:
        for name in ("add", "sub", "mul", "neg"):
            rows = [{"input": f"{a} {name} 2 =", "output": str(a + offset)} for a in range(12)]
            (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(0)
    run = tmp_path / "run"
    args = _data_run_args(data, run)
    train = _load("train")
    assert train.main(args) == 0
    write(100)  # every answer changed, the tasks the same
    before = _snapshot(run)
    capsys.readouterr()
    assert train.main([*args, "train.meta_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "trained on the same tasks with other examples (their tokens differ" in err, err
    assert "Traceback" not in err and _snapshot(run) == before
    write(0)  # put back: the extension goes on
    assert train.main([*args, "train.meta_steps=4"]) == 0
    assert _recipe.steps(run / "metrics.jsonl") == [0, 1, 2, 3]
