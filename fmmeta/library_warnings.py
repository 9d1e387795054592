"""Library warnings (a FutureWarning from transformers, a UserWarning from torch) once per run.

Every rank runs the same code, so under a launcher each warning used to be printed once per rank
into one interleaved console. Warnings go through logging here, so they read like every other
line (with the rank); ranks other than 0 drop them, and drop the libraries' own logger warnings
too. Errors still show on every rank, and fmmeta's own warnings (a slow rank, a lock taken over)
are not library warnings: they keep showing on the rank that has something to say.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["LIBRARY_LOGGERS", "NOT_ACTIONABLE", "setup_logging", "show_library_warnings_once"]

LIBRARY_LOGGERS: tuple[str, ...] = (
    "py.warnings", "transformers", "torch", "DeepSpeed", "deepspeed", "accelerate", "peft",
    "datasets", "huggingface_hub", "urllib3",
)
"""Loggers silenced below ERROR on ranks > 0 (``py.warnings`` is where ``warnings`` land)."""

NOT_ACTIONABLE: tuple[str, ...] = (
    "`is_gradient_checkpointing` is deprecated",
    "will assume that the vocabulary was not modified",
    "`torch.distributed.all_gather_into_tensor` is deprecated",
    "`torch.distributed.reduce_scatter_tensor` is deprecated",
)
"""Library warnings dropped on every rank, as nothing a user sets can change them:

* peft 0.21's ``PeftModel`` reads transformers 5's deprecated ``is_gradient_checkpointing``
  whenever it wraps a model, so every run and every ``fmmeta adapt`` opened with a FutureWarning
  about code that is not theirs;
* saving an adapter, peft looks for the base model's ``config.json`` to learn whether the
  vocabulary was resized, and warns where there is none (the embedded SmolLM2 is a GGUF file).
  fmmeta never resizes it: the assumption peft then makes is the truth;
* DeepSpeed 0.19's ZeRO stages gather and scatter with collectives torch 2.13 deprecates, so every
  DeepSpeed run printed two FutureWarnings (fmmeta calls neither)."""


class _FirstTimeOnly(logging.Filter):
    """Passes each distinct warning text once, and none of :data:`NOT_ACTIONABLE`.

    Why not Python's own "default" filter: it forgets what it showed whenever the filters change,
    and every ``warnings.catch_warnings()`` block (torch and DeepSpeed run them around collectives)
    changes them, so a deprecated collective warned again on every meta-step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text in self.seen or any(known in text for known in NOT_ACTIONABLE):
            return False
        self.seen.add(text)
        return True


def show_library_warnings_once(rank: int) -> None:
    """Routes ``warnings`` into logging and keeps library warnings to rank 0, each shown once.

    Call it where logging is set up, on every rank (again after ``logging.basicConfig(force=True)``
    is harmless: the filter is installed once).
    """
    logging.captureWarnings(True)
    py_warnings = logging.getLogger("py.warnings")
    if not any(isinstance(f, _FirstTimeOnly) for f in py_warnings.filters):
        py_warnings.addFilter(_FirstTimeOnly())
    if rank == 0:
        return
    # A library may reset the filters to "always" inside its own code; the logger level below
    # still drops what reaches logging, and the filter saves formatting what is dropped.
    warnings.filterwarnings("ignore")
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def setup_logging(rank: int) -> None:
    """A training rank's logging: rank 0 logs at INFO, other ranks only warnings and errors, each
    line naming its rank; library warnings are shown once per run (rank 0), not once per rank.

    Why here: which rank says what is this module's one concern, and the train recipe calls it
    once it knows its rank.
    """
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    show_library_warnings_once(rank)
