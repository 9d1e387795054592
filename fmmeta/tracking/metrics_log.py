"""``metrics.jsonl`` and the trackers: one record per method and meta-step, written in one place."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any, Mapping, Sequence

from fmmeta.atomic import locked, replace_text
from fmmeta.errors import UserInputError
from fmmeta.strict_json import dumps_strict, read_json_lines
from fmmeta.tracking.protocol import Tracker
from fmmeta.tracking.records import step_scalars


class MetricsLog:
    """``metrics.jsonl`` on rank 0, and the same records to every tracker of the method's run.

    On resume, lines of this method after the checkpoint's step are dropped so the file reads as
    if the run had never stopped (the trackers hide those steps the same way). Use it as a context
    manager: leaving it closes the trackers' runs, marking them failed on an exception.

    Example:
        >>> with MetricsLog(out / "metrics.jsonl", rank=0, method="fomaml", keep_until=-1) as log:
        ...     log.write({"method": "fomaml", "step": 0, "outer_loss": 2.5})
    """

    def __init__(self, path: Path, *, rank: int, method: str, keep_until: int,
                 trackers: Sequence[Tracker] = ()) -> None:
        self.path, self.rank, self.trackers = path, rank, list(trackers)
        self.history: list[dict[str, Any]] = []
        """This method's records kept from before ``keep_until`` (rank 0; a resume replays what
        it averages over steps from them, as the run that never stopped had it)."""
        if rank != 0:
            return
        with locked(path):  # methods training side by side share the file
            if not path.exists():
                return
            try:
                records = read_json_lines(path)  # a torn last line (killed mid-write) is dropped
            except ValueError as err:
                raise UserInputError(f"{err} (the run appends to it and cannot resume over it)") from None
            kept = [r for r in records if r.get("method") != method or r.get("step", -1) <= keep_until]
            replace_text(path, "".join(dumps_strict(r) + "\n" for r in kept))  # a crash keeps the history
            self.history = [r for r in kept if r.get("method") == method]

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends ``record`` (one meta-step over all ranks) to the file and logs it to every tracker."""
        if self.rank != 0:
            return
        with locked(self.path), self.path.open("a") as fh:
            fh.write(dumps_strict(dict(record)) + "\n")
        scalars = step_scalars(record)
        for tracker in self.trackers:
            tracker.log_step(int(record["step"]), scalars)

    def close(self, failed: bool = False) -> None:
        """Ends every tracker's run (each once)."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close(failed=failed)

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(failed=kind is not None)
