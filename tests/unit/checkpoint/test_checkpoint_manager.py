"""Atomic checkpoints: crash at every file boundary, corruption, keep-last-N, model/LoRA checks."""

from __future__ import annotations

import json
import logging
import random
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from fmmeta.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointManager,
    CheckpointMismatchError,
    CheckpointWriter,
    load_rng_state,
    safe_torch_load,
    save_rng_state,
    step_dirname,
)

torch.set_num_threads(1)

WORLD = 2


class Crash(RuntimeError):
    """The simulated crash."""


def _payload(step: int, rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {"lora_A": torch.randn(4, 8, generator=g), "lora_B": torch.randn(8, 4, generator=g)}


def _write(step: int) -> Callable[[CheckpointWriter], None]:
    def write(w: CheckpointWriter) -> None:
        w.save_json(f"state_rank{w.rank}.json", {"step": step, "rank": w.rank})
        w.save_tensors(f"adapter_rank{w.rank}.safetensors", _payload(step, w.rank))
        # A file written by someone else (as engine.save_optimizer does), then reported.
        other = w.directory / f"optim_rank{w.rank}.pt"
        torch.save({"exp_avg": torch.full((3,), float(step))}, other)
        w.add_files([other])

    return write


def _save_all_ranks(
    root: Path, step: int, hook: Callable[[str], None] | None = None, keep_last: int = 2
) -> list[BaseException | None]:
    """Runs ``save`` on WORLD ranks (threads sharing a barrier); returns each rank's exception."""
    barrier = threading.Barrier(WORLD, timeout=20)
    errors: list[BaseException | None] = [None] * WORLD

    def run(rank: int) -> None:
        mgr = CheckpointManager(
            root, keep_last=keep_last, rank=rank, world_size=WORLD, barrier=barrier.wait,
            fault_hook=hook,
        )
        try:
            mgr.save(step, _write(step), meta={"model_id": "tiny", "lora_shapes": {"a": [4, 8]}})
        except BaseException as err:  # noqa: BLE001 - recorded and checked by the test
            errors[rank] = err
            barrier.abort()  # the other rank fails fast instead of waiting (as a collective timeout would)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a rank hung"
    return errors


def _check_content(mgr: CheckpointManager, step: int) -> None:
    ckpt = mgr.latest()
    assert ckpt is not None and ckpt.step == step
    for rank in range(WORLD):
        assert ckpt.load_json(f"state_rank{rank}.json") == {"step": step, "rank": rank}
        got = ckpt.load_tensors(f"adapter_rank{rank}.safetensors")
        want = _payload(step, rank)
        assert set(got) == set(want)
        for k in want:
            assert torch.equal(got[k], want[k])
        optim = safe_torch_load(ckpt.file(f"optim_rank{rank}.pt"))
        assert torch.equal(optim["exp_avg"], torch.full((3,), float(step)))


def _boundaries(tmp_path: Path) -> list[str]:
    """Every file-boundary label of a 2-rank save that also prunes, in call order."""
    labels: list[str] = []
    lock = threading.Lock()

    def record(label: str) -> None:
        with lock:
            labels.append(label)

    root = tmp_path / "probe"
    assert _save_all_ranks(root, 0) == [None, None]
    assert _save_all_ranks(root, 1) == [None, None]
    assert _save_all_ranks(root, 2, hook=record) == [None, None]
    return list(dict.fromkeys(labels))


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    assert _save_all_ranks(tmp_path, 3) == [None, None]
    mgr = CheckpointManager(tmp_path)
    _check_content(mgr, 3)
    manifest = json.loads((tmp_path / step_dirname(3) / MANIFEST).read_text())
    assert set(manifest["ranks"]) == {"0", "1"}
    assert "optim_rank1.pt" in manifest["ranks"]["1"]
    assert all(len(e["sha256"]) == 64 for e in manifest["files"].values())
    assert not list(tmp_path.glob(".tmp_*"))


def _expected_boundaries() -> list[str]:
    labels = []
    for r in range(WORLD):
        labels.append(f"rank{r}:begin")
        for name in (f"state_rank{r}.json", f"adapter_rank{r}.safetensors"):
            labels += [f"rank{r}:{when}:{name}" for when in ("before", "partial", "after")]
        labels.append(f"rank{r}:after:add_files")
        labels += [f"rank{r}:{when}:rank_{r:05d}.files.json" for when in ("before", "partial", "after")]
    labels += [f"rank0:{when}:{MANIFEST}" for when in ("before", "partial", "after")]
    labels += ["rank0:before:rename", "rank0:after:rename", "rank0:before:prune:step_00000000"]
    return labels


BOUNDARIES = _expected_boundaries()
COMPLETE_FROM = {"rank0:after:rename", "rank0:before:prune:step_00000000"}


def test_boundary_list_is_exhaustive(tmp_path: Path) -> None:
    """The parametrized crash test below covers every boundary a real save passes."""
    assert sorted(_boundaries(tmp_path)) == sorted(BOUNDARIES)


@pytest.mark.parametrize("label", BOUNDARIES)
def test_crash_at_file_boundary_keeps_previous_checkpoint(tmp_path: Path, label: str) -> None:
    root = tmp_path
    assert _save_all_ranks(root, 0) == [None, None]
    assert _save_all_ranks(root, 1) == [None, None]

    def crash(seen: str) -> None:
        if seen == label:
            raise Crash(label)

    errors = _save_all_ranks(root, 2, hook=crash)
    crashed_rank = int(label[4])
    assert isinstance(errors[crashed_rank], Crash), errors
    mgr = CheckpointManager(root)
    _check_content(mgr, 2 if label in COMPLETE_FROM else 1)
    # The next save of the same step succeeds despite the debris the crash left.
    assert _save_all_ranks(root, 2) == [None, None]
    _check_content(mgr, 2)
    assert not list(root.glob(".tmp_*")) and not list(root.glob(".trash_*"))
    assert mgr.complete_steps() == [2, 1]


def _two_checkpoints(root: Path) -> CheckpointManager:
    assert _save_all_ranks(root, 1) == [None, None]
    assert _save_all_ranks(root, 2) == [None, None]
    return CheckpointManager(root)


def test_truncated_file_is_detected_and_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mgr = _two_checkpoints(tmp_path)
    victim = tmp_path / step_dirname(2) / "adapter_rank1.safetensors"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 7])
    with pytest.raises(CheckpointError, match="adapter_rank1.safetensors has .* bytes.*truncated"):
        mgr.open(tmp_path / step_dirname(2))
    with caplog.at_level(logging.WARNING, logger="fmmeta.checkpoint.manager"):
        ckpt = mgr.latest()
    assert ckpt is not None and ckpt.step == 1
    assert "adapter_rank1.safetensors" in caplog.text
    assert "falling back to checkpoint step_00000001" in caplog.text


@pytest.mark.parametrize("name", ["adapter_rank0.safetensors", "state_rank1.json", "optim_rank0.pt"])
def test_flipped_byte_is_detected_and_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    mgr = _two_checkpoints(tmp_path)
    victim = tmp_path / step_dirname(2) / name
    data = bytearray(victim.read_bytes())
    data[len(data) - 3] ^= 0x01  # inside the payload: safetensors itself would load this fine
    victim.write_bytes(bytes(data))
    problems = mgr.verify(tmp_path / step_dirname(2))
    assert problems == [f"step_00000002/{name} is corrupt: its SHA-256 does not match the manifest"]
    with caplog.at_level(logging.WARNING, logger="fmmeta.checkpoint.manager"):
        ckpt = mgr.latest()
    assert ckpt is not None and ckpt.step == 1
    assert name in caplog.text and "falling back" in caplog.text
    _check_content(mgr, 1)


def test_missing_file_and_no_manifest(tmp_path: Path) -> None:
    mgr = _two_checkpoints(tmp_path)
    (tmp_path / step_dirname(2) / "state_rank0.json").unlink()
    assert mgr.verify(tmp_path / step_dirname(2)) == ["step_00000002/state_rank0.json is missing"]
    (tmp_path / step_dirname(1) / MANIFEST).unlink()
    assert "no manifest.json" in mgr.verify(tmp_path / step_dirname(1))[0]
    assert mgr.latest() is None


def test_keep_last_n(tmp_path: Path) -> None:
    for step in range(1, 6):
        assert _save_all_ranks(tmp_path, step, keep_last=3) == [None, None]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        step_dirname(3), step_dirname(4), step_dirname(5)
    ]
    with pytest.raises(ValueError, match="keep_last=1 is invalid"):
        CheckpointManager(tmp_path, keep_last=1)


def test_old_checkpoints_deleted_only_after_new_one_complete(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)

    def crash(label: str) -> None:
        if label == "rank0:before:rename":
            raise Crash(label)

    _save_all_ranks(tmp_path, 3, hook=crash)
    assert CheckpointManager(tmp_path).complete_steps() == [2, 1]


def test_multi_rank_needs_barrier_and_every_rank_report(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a barrier"):
        CheckpointManager(tmp_path, rank=0, world_size=2)
    # Rank 0 alone (rank 1 never wrote): the manifest is refused, nothing looks complete.
    mgr = CheckpointManager(tmp_path, rank=0, world_size=2, barrier=lambda: None)
    with pytest.raises(CheckpointError, match="rank 1 did not report its files"):
        mgr.save(1, _write(1))
    assert mgr.latest() is None


def test_wrong_model_or_lora_shape_is_refused(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    shapes = {"layers.0.q_proj.lora_A": [8, 64], "layers.0.q_proj.lora_B": [64, 8]}
    ckpt = mgr.save(1, _write(1), meta={"model_id": "tiny-llama-64", "lora_shapes": shapes})
    ckpt.check_compatible(model_id="tiny-llama-64", lora_shapes=shapes)  # same: accepted
    with pytest.raises(CheckpointMismatchError, match="written for model 'tiny-llama-64'.*'smollm2'"):
        ckpt.check_compatible(model_id="smollm2", lora_shapes=shapes)
    r4 = {"layers.0.q_proj.lora_A": [4, 64], "layers.0.q_proj.lora_B": [64, 4]}
    with pytest.raises(CheckpointMismatchError, match=r"shape \[8, 64\] there, \[4, 64\] here"):
        mgr.latest().check_compatible(model_id="tiny-llama-64", lora_shapes=r4)
    more = dict(shapes, **{"layers.0.v_proj.lora_A": [8, 64]})
    with pytest.raises(CheckpointMismatchError, match="1 adapter tensors of this run are not in it"):
        ckpt.check_compatible(model_id="tiny-llama-64", lora_shapes=more)


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(4, lambda w: w.save_json("s.json", {"v": 1}))
    mgr.save(4, lambda w: w.save_json("s.json", {"v": 2}))
    assert mgr.latest().load_json("s.json") == {"v": 2}
    assert mgr.complete_steps() == [4]


def test_file_names_must_stay_inside(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    for bad in ("../escape.json", "/abs.json", MANIFEST):
        with pytest.raises(CheckpointError, match="is invalid"):
            mgr.save(1, lambda w, b=bad: w.save_json(b, {}))


def test_rng_states_round_trip(tmp_path: Path) -> None:
    py = random.Random(1)
    pcg = np.random.default_rng(2)
    mt = np.random.Generator(np.random.MT19937(3))
    tg = torch.Generator().manual_seed(4)
    gens = dict(python={"sampler": py}, numpy={"episodes": pcg, "mt": mt}, torch_generators={"init": tg})
    for _ in range(3):  # advance away from the seeds
        py.random(), pcg.random(), mt.random(), torch.rand(2, generator=tg), torch.rand(2)
    mgr = CheckpointManager(tmp_path)
    ckpt = mgr.save(1, lambda w: save_rng_state(w, **gens))

    def draw() -> list[float]:
        return [
            py.random(), float(pcg.random()), float(mt.random()),
            *torch.rand(2, generator=tg).tolist(), *torch.rand(2).tolist(),
        ]

    want = draw()
    draw()  # move everything on
    load_rng_state(ckpt, 0, **gens)
    assert draw() == want
    with pytest.raises(CheckpointError, match="no python generator 'other'"):
        load_rng_state(ckpt, 0, python={"other": random.Random()})


def test_safe_torch_load_refuses_pickled_objects(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"obj": Crash("x")}, path)
    with pytest.raises(Exception, match="[Ww]eights only"):
        safe_torch_load(path)


def test_relative_root_accepts_files_reported_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative output_dir (the recipe's default ``runs/default``) must work: files an engine
    writes into ``writer.directory`` come back as paths relative to the working directory."""
    monkeypatch.chdir(tmp_path)
    manager = CheckpointManager("runs/ckpts", keep_last=2)

    def write(w: CheckpointWriter) -> None:
        target = w.directory / "engine" / "state.bin"  # as engine.save_optimizer(w.directory) does
        target.parent.mkdir(parents=True)
        target.write_bytes(b"abc")
        w.add_files([target, *(p for p in (w.directory / "engine").iterdir())])

    ckpt = manager.save(0, write)
    assert ckpt.file("engine/state.bin").read_bytes() == b"abc"
    assert manager.latest() is not None and manager.latest().step == 0
