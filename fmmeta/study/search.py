"""Optuna as the study's search engine: its storage, sampler and pruner, one Optuna study per method.

Why one Optuna study per method: the choice is made per method, and the median pruner compares a
trial with earlier trials at the same meta-step; a Reptile trial judged against FOMAML's curves
would be stopped for being Reptile, not for its settings.

Why a sampler seeded afresh for every trial: Optuna's sampler draws from its own generator, which
a killed and resumed study would restart, so the trials after a resume would differ from an
uninterrupted study's. Seeded from (study seed, method, trials finished), a resumed study proposes
what the uninterrupted one would have, given the same finished trials.

Optuna is an optional extra (``pip install 'fmmeta[study]'``), imported by :func:`import_optuna`
only when a study runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from fmmeta.errors import UserInputError
from fmmeta.evaluation.metrics import get_metric
from fmmeta.study.config import Range, StudyConfig, key_type

__all__ = ["DIVERGED", "FOLDER", "STORAGE_FILE", "create_studies", "finished", "import_optuna", "next_folder",
           "open_study", "requeue_interrupted", "seed_sampler", "suggest"]

logger = logging.getLogger(__name__)

STORAGE_FILE = "study.db"
"""Optuna's storage (SQLite) inside the study folder: every trial, its values and its curve."""

FOLDER = "folder"
"""User attribute of a trial: its run folder's name (kept when a killed trial is run again)."""

DIVERGED = "diverged"
"""User attribute of a trial whose run stopped on a non-finite loss (a finished, failed trial)."""


def import_optuna() -> ModuleType:
    """Optuna, or a message saying how to install it.

    Raises:
        UserInputError: Optuna is not installed.
    """
    try:
        import optuna
    except ImportError:
        raise UserInputError(
            "fmmeta study needs Optuna, an optional extra: pip install 'fmmeta[study]' "
            "(or pip install optuna)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the study logs one line per trial itself
    return optuna


def open_study(optuna: ModuleType, folder: Path, method: str, study: StudyConfig, storage: Any = None) -> Any:
    """The Optuna study of ``method`` in ``folder``'s storage (``storage``: an open one), created
    or loaded (resume)."""
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=study.pruner_startup_trials)
              if study.pruner == "median" else optuna.pruners.NopPruner())
    return optuna.create_study(
        storage=storage or f"sqlite:///{(folder / STORAGE_FILE).resolve()}", study_name=method,
        direction=get_metric(study.metric).direction,
        pruner=pruner, load_if_exists=True,
    )


def create_studies(optuna: ModuleType, folder: Path, study: StudyConfig) -> None:
    """Creates the storage and every method's study, then closes every connection to it.

    Before methods search side by side in worker processes: two processes creating the storage's
    tables at once collide, and a database connection must not be shared across a fork (each
    worker opens its own).
    """
    storage = optuna.storages.RDBStorage(f"sqlite:///{(folder / STORAGE_FILE).resolve()}")
    try:
        for method in study.space:
            open_study(optuna, folder, method, study, storage)
    finally:
        storage.engine.dispose()


def finished(optuna: ModuleType, opt_study: Any) -> list[Any]:
    """The trials that count towards ``trials``: complete, pruned, or failed by diverging
    (a trial failed because the study was killed is run again instead)."""
    state = optuna.trial.TrialState
    return [t for t in opt_study.get_trials(deepcopy=False)
            if t.state in (state.COMPLETE, state.PRUNED)
            or (t.state == state.FAIL and t.user_attrs.get(DIVERGED))]


def requeue_interrupted(optuna: ModuleType, opt_study: Any) -> list[int]:
    """Marks trials left running by a killed study as failed and enqueues their values again,
    with their folder, so the rerun resumes from the folder's checkpoints; returns their numbers.

    Call it only while holding the study folder's lock: then no live process runs a trial.
    """
    requeued = []
    for t in opt_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        opt_study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        attrs = {FOLDER: t.user_attrs[FOLDER]} if FOLDER in t.user_attrs else {}
        opt_study.enqueue_trial(dict(t.params), user_attrs={**attrs, "rerun_of": t.number})
        requeued.append(t.number)
    return requeued


def next_folder(opt_study: Any) -> str:
    """The folder name of a new trial: ``trial_NNN``, numbered by distinct folders so far, so a
    resumed study names its trials as an uninterrupted one does."""
    used = {t.user_attrs[FOLDER] for t in opt_study.get_trials(deepcopy=False) if FOLDER in t.user_attrs}
    return f"trial_{len(used):03d}"


def seed_sampler(optuna: ModuleType, opt_study: Any, study: StudyConfig, method: str, n_finished: int) -> None:
    """A TPE sampler seeded from (study seed, trials finished, method), set for the next trial."""
    entropy = [study.seed, n_finished, *method.encode("utf-8")]
    seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    opt_study.sampler = optuna.samplers.TPESampler(seed=seed)


def suggest(trial: Any, keys: dict[str, Range]) -> dict[str, float | str]:
    """One value per searched key, drawn by Optuna (ints for int keys, words for word keys)."""
    values: dict[str, float | str] = {}
    for key, rng in keys.items():
        whole = key_type(key) is int
        if rng.choices:
            choices = [c if isinstance(c, str) else int(c) if whole else float(c) for c in rng.choices]
            values[key] = trial.suggest_categorical(key, choices)
        elif whole:
            values[key] = trial.suggest_int(key, int(rng.low or 0), int(rng.high or 0), log=rng.log)
        else:
            values[key] = trial.suggest_float(key, float(rng.low or 0), float(rng.high or 0), log=rng.log)
    return values
