"""The shared-folder check at start-up: ranks are threads here, each with its own view of the
filesystem (its own folder path), which is what ranks on nodes with local disks have."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fmmeta.checkpoint.shared_folder import MARKER, SharedFolderError, check_shared_folder


def _run_ranks(folders: list[Path], wait_s: float = 0.2) -> list[BaseException | None]:
    """Runs the check on one thread per rank; rank r looks at ``folders[r]``; returns each
    rank's exception (None if it passed)."""
    world = len(folders)
    slots: list[Any] = [None] * world
    barrier = threading.Barrier(world, timeout=30)

    def gather(rank: int, obj: Any) -> list[Any]:
        slots[rank] = obj
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    errors: list[BaseException | None] = [None] * world

    def body(rank: int) -> None:
        try:
            check_shared_folder(folders[rank], rank=rank, wait_s=wait_s,
                                all_gather=lambda obj: gather(rank, obj))
        except BaseException as err:  # noqa: BLE001 - reported to the test
            errors[rank] = err

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung in the check"
    return errors


def test_one_shared_folder_passes_and_leaves_no_marker(tmp_path: Path) -> None:
    run = tmp_path / "run"  # rank 0 creates it
    assert _run_ranks([run] * 3) == [None, None, None]
    assert run.is_dir() and not (run / MARKER).exists()


def test_a_rank_with_its_own_folder_fails_every_rank_with_the_fix(tmp_path: Path) -> None:
    shared, local = tmp_path / "shared" / "run", tmp_path / "node1" / "run"
    errors = _run_ranks([shared, shared, local, local])
    assert all(isinstance(e, SharedFolderError) for e in errors), errors
    assert len({str(e) for e in errors}) == 1, "every rank reports the same verdict"
    msg = str(errors[0])
    assert "rank 2 on " in msg and "rank 3 on " in msg and "rank 1 on" not in msg
    assert f"looked in {local}: no such folder" in msg
    assert "absolute path" in msg and "filesystem all nodes mount" in msg
    assert not (shared / MARKER).exists()


def test_a_stale_marker_of_another_run_is_not_mistaken_for_a_shared_folder(tmp_path: Path) -> None:
    shared, other = tmp_path / "a", tmp_path / "b"
    other.mkdir()
    (other / MARKER).write_text("left by a crashed run")
    errors = _run_ranks([shared, other])
    assert isinstance(errors[1], SharedFolderError)
    assert "rank 1 on" in str(errors[1]) and "a marker of another run" in str(errors[1])


def test_rank_0_unable_to_write_fails_every_rank(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the folder should be: mkdir fails
    errors = _run_ranks([blocker / "run"] * 2)
    assert all(isinstance(e, SharedFolderError) and "could not write" in str(e) for e in errors), errors


def test_a_marker_that_appears_late_is_waited_for(tmp_path: Path) -> None:
    # A network filesystem may show the marker to other clients only after a while: a rank whose
    # view is another path (rank 1 here) sees the token once it is copied there, within wait_s.
    shared, late = tmp_path / "shared", tmp_path / "late"
    late.mkdir()

    def copy_later() -> None:
        import time

        deadline = time.monotonic() + 5
        while not (shared / MARKER).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        (late / MARKER).write_text((shared / MARKER).read_text())

    copier = threading.Thread(target=copy_later)
    copier.start()
    errors = _run_ranks([shared, late], wait_s=5.0)
    copier.join()
    assert errors == [None, None]
