"""What a study searches, declared in YAML: :class:`StudyConfig` and the searched keys.

A study is a small YAML file read by the same loader as a run's config (strict keys, the closest
valid key suggested, every problem reported at once). It names the train recipe's config every
trial starts from, and under ``space`` one entry per method to tune, each listing the keys
searched for that method, in the sections the recipe uses::

    config: recipes/configs/smoke.yaml
    trials: 8
    space:
      fomaml:
        algorithm: {inner_lr: {low: 0.01, high: 0.3, log: true}, inner_steps: {choices: [2, 4]}}
        optim: {outer_lr: {low: 1.0e-3, high: 1.0e-2, log: true}}
      reptile:
        optim: {outer_lr: {low: 1.0e-3, high: 3.0e-2, log: true}}   # Reptile's interpolation rate
      metasgd:
        settings: {step_size_lr: {low: 0.01, high: 0.1, log: true}}  # algorithm.metasgd.step_size_lr
      multitask: {}                                                 # the baseline, as configured

Why the searched keys are a closed list: a study is only honest if every trial is scored by the
same protocol on the same tasks, so keys that change the evaluation (``eval.*``), the task split
(``tasks.*``), the model or the adapter's shape are not searchable; :data:`SEARCHED` holds those
that only change how an adapter is meta-trained, and a method's own settings (``settings``: the keys
of its section ``algorithm.<method>``, typed by that section). Reptile's interpolation rate is its
``optim.outer_lr``: the outer step on ``theta - phi`` (epsilon of the Reptile paper under an SGD
outer step; fmmeta's outer AdamW normalises it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from fmmeta.algorithms.build import method_of
from fmmeta.config import ConfigError, load_config
from fmmeta.config.schema import hints
from fmmeta.evaluation.metrics import METRICS
from fmmeta.recipe_config import RecipeConfig
from fmmeta.shipped import shipped_path

__all__ = ["SEARCHED", "AlgorithmSpace", "MethodSpace", "OptimSpace", "Range", "StudyConfig",
           "TrainSpace", "key_type", "recipe_config", "recipe_problems", "searched_keys"]

SEARCHED: dict[str, type] = {
    "algorithm.inner_steps": int,
    "algorithm.inner_lr": float,
    "algorithm.inner_format": str,
    "optim.outer_lr": float,
    "train.meta_steps": int,
}
"""Every shared key a study may search, with its type in the train recipe's config (a method's
own settings are searched too: :func:`key_type`)."""

SET_BY_STUDY = ("output_dir", "methods", "eval.enabled", "train.resume", "train.meta_steps")
"""Train-recipe keys the study sets for each trial; ``overrides`` may not set them (the value
would be overwritten: a key that lies). ``train.meta_steps`` is searched, or set by ``meta_steps``."""


@dataclass(kw_only=True)
class Range:
    """One searched key: ``low``..``high`` (log-uniform with ``log``), or a list of ``choices``."""

    low: float | None = None
    """Smallest value tried (with ``high``; not with ``choices``)."""
    high: float | None = None
    """Largest value tried (>= low)."""
    log: bool = False
    """Draw on a log scale (low > 0): for learning rates."""
    choices: tuple[float | str, ...] = ()
    """The values tried, instead of a range (one or more; words for a word key such as
    ``inner_format``)."""

    def validate(self) -> list[str]:
        """Either a range or choices, each well formed."""
        has_range = self.low is not None or self.high is not None
        if self.choices and has_range:
            return [f"choices={list(self.choices)} is invalid with low/high: give a range "
                    "(low, high) or a list of choices, not both"]
        if self.choices:
            return [] if not self.log else ["log=true is invalid with choices: it applies to a range"]
        if self.low is None or self.high is None:
            return [f"low={self.low} high={self.high} is invalid: give both low and high, or choices"]
        if self.low > self.high:
            return [f"low={self.low} is invalid: above high={self.high}; swap them"]
        if self.log and not self.low > 0:
            return [f"low={self.low} is invalid with log=true: a log scale needs low > 0"]
        return []

    def values(self) -> tuple[float | str, ...]:
        """The extremes a trial can draw (both ends of a range, or every choice)."""
        if self.choices:
            return self.choices
        return (self.low, self.high) if self.low is not None and self.high is not None else ()


@dataclass(kw_only=True)
class AlgorithmSpace:
    """Searched keys of the ``algorithm`` section (the meta-training inner loop)."""

    inner_steps: Range | None = None
    """Inner steps on the support set per task in meta-training (int)."""
    inner_lr: Range | None = None
    """Inner learning rate in meta-training."""
    inner_format: Range | None = None
    """Rows the inner loop adapts on: choices among ``plain`` and ``in_context`` (FOMAML, Meta-SGD,
    Reptile); a trial is scored on validation in the format it trained in."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {"step_size_lr": "space.metasgd.settings.step_size_lr"}
    """Keys that became a method's own setting."""


@dataclass(kw_only=True)
class OptimSpace:
    """Searched keys of the ``optim`` section (the outer update)."""

    outer_lr: Range | None = None
    """Outer lr (for Reptile: its interpolation rate, the step towards the adapted weights)."""


@dataclass(kw_only=True)
class TrainSpace:
    """Searched keys of the ``train`` section."""

    meta_steps: Range | None = None
    """Meta-steps of the trial (int); otherwise the study's ``meta_steps``."""


@dataclass(kw_only=True)
class MethodSpace:
    """The keys searched for one method; an empty entry trains the method as configured."""

    algorithm: AlgorithmSpace = field(default_factory=AlgorithmSpace)
    """Searched keys of the algorithm section."""
    optim: OptimSpace = field(default_factory=OptimSpace)
    """Searched keys of the optim section."""
    train: TrainSpace = field(default_factory=TrainSpace)
    """Searched keys of the train section."""
    settings: dict[str, Range] = field(default_factory=dict)
    """Searched keys of the method's own section, ``algorithm.<method>.<key>`` (e.g. metasgd's
    ``step_size_lr``, anil's ``layers``)."""


def searched_keys(space: MethodSpace, method: str) -> dict[str, Range]:
    """Dotted key (``algorithm.inner_lr``, ``algorithm.metasgd.step_size_lr``) -> its range, for
    the keys ``space`` searches for ``method``."""
    out: dict[str, Range] = {}
    for section in dataclasses.fields(space):
        part = getattr(space, section.name)
        if isinstance(part, dict):
            out.update({f"algorithm.{method}.{k}": v for k, v in part.items()})
            continue
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if value is not None:
                out[f"{section.name}.{f.name}"] = value
    return out


def key_type(key: str) -> type:
    """The type of a searched key in the train recipe's config: a shared key's from
    :data:`SEARCHED`, a method's own setting's from its section (``algorithm.<method>.<key>``).

    Raises:
        KeyError: a key no study searches.
    """
    if key in SEARCHED:
        return SEARCHED[key]
    section, method, name = key.split(".", 2)
    settings = _settings_of(method) if section == "algorithm" else None
    tp = hints(settings).get(name) if settings is not None else None
    if not isinstance(tp, type):
        raise KeyError(key)
    return tp


def _settings_of(method: str) -> type | None:
    """The class of ``method``'s own config section (``None``: no such method, or no section)."""
    registered = method_of(method)
    return registered.settings if registered is not None else None


def _settings_problems(method: str, space: MethodSpace) -> list[str]:
    """Refuses searched settings the method does not have (or a method with none)."""
    if not space.settings:
        return []
    settings = _settings_of(method)
    known = [f.name for f in dataclasses.fields(settings)] if settings is not None else []
    return [f"space.{method}.settings.{name} is invalid: {method} has "
            + (f"the settings {known}" if known else "no settings of its own") + "; remove it"
            for name in space.settings if name not in known]


@dataclass(kw_only=True)
class StudyConfig:
    """One study: where it writes, what each trial starts from, what is searched and how scored."""

    output_dir: str = "studies/default"
    """The study folder: Optuna's storage (study.db), one folder per trial, the report."""
    config: str | None = None
    """The train recipe's YAML every trial starts from (null = the recipe's embedded default)."""
    overrides: tuple[str, ...] = ()
    """Train-recipe overrides (section.key=value) shared by every trial."""
    space: dict[str, MethodSpace] = field(default_factory=dict)
    """Method -> the keys searched for it (one or more methods; see the module docstring)."""
    trials: int = 8
    """Finished trials per method (>= 1; pruned ones count)."""
    meta_steps: int = 20
    """Meta-steps of a trial whose method does not search train.meta_steps (>= 1)."""
    seeds: int = 3
    """Seeds of validation episode draws each trial is scored over (>= 3)."""
    episodes_per_task: int = 1
    """Validation episodes per task per seed (>= 1)."""
    metric: str = "accuracy"
    """What a trial is chosen by: the mean validation value of a registered metric
    (:mod:`fmmeta.evaluation.metrics`: accuracy, loss, accuracy_per_token or one registered
    since), maximised where higher is better, else minimised."""
    family: str = "overall"
    """Which validation episodes score a trial: overall, classification, generation or a task
    family of the suite."""
    report_every: int = 0
    """Meta-steps between validation scorings that the pruner judges (>= 0; 0 = the end only)."""
    pruner: Literal["median", "none"] = "median"
    """Optuna's pruner on the validation curves: median stops a trial whose score at a step is
    worse than the median of earlier trials' at that step."""
    pruner_startup_trials: int = 2
    """Trials per method that run to the end before the pruner judges any (>= 0)."""
    seed: int = 0
    """Seeds Optuna's sampler (the trials' draws)."""
    replicates: int = 3
    """Training seeds each method's chosen configuration is trained under before the held-out
    scoring (>= 1; the chosen trial is the first, the others train with train.seed + 1, + 2, ...):
    held-out intervals then count training variance, and a choice that won by one lucky training
    draw shows it."""

    def validate(self) -> list[str]:
        """Range checks, the searched keys' types, and overrides that the study sets itself."""
        problems: list[str] = []
        for key, least in (("trials", 1), ("meta_steps", 1), ("seeds", 3), ("episodes_per_task", 1),
                           ("report_every", 0), ("pruner_startup_trials", 0), ("replicates", 1)):
            if not getattr(self, key) >= least:
                why = " (a mean and a worst case over seeds of episode draws)" if key == "seeds" else ""
                problems.append(f"{key}={getattr(self, key)} is invalid: must be >= {least}{why}")
        if self.metric not in METRICS:
            problems.append(f"metric={self.metric!r} is invalid: registered metrics are {list(METRICS)}")
        if not self.space:
            problems.append("space={} is invalid: name one or more methods to study, e.g. "
                            "space: {fomaml: {algorithm: {inner_lr: {low: 0.01, high: 0.3}}}}")
        for method, space in self.space.items():
            settings = _settings_problems(method, space)
            problems.extend(settings)
            for key, rng in searched_keys(space, method).items():
                if not settings or not key.startswith(f"algorithm.{method}."):
                    problems.extend(_type_problems(f"space.{method}.{key}", key_type(key), rng))
        for i, item in enumerate(self.overrides):
            key = item.partition("=")[0].strip()
            if key in SET_BY_STUDY:
                problems.append(f"overrides[{i}]={item!r} is invalid: the study sets {key} for each "
                                "trial (methods are the keys of space, meta-steps are meta_steps "
                                "or space.<method>.train.meta_steps); remove it")
        return problems

    def meta_steps_of(self, method: str) -> Range | None:
        """The searched meta-steps of ``method``, or None when it trains ``meta_steps``."""
        return self.space[method].train.meta_steps


def _type_problems(key: str, tp: type, rng: Range) -> list[str]:
    """Refuses values of the wrong kind: a word for a number key or a number for a word key (which
    takes choices only), non-integers for an int key, non-finite numbers."""
    name, values = key.rsplit(".", 1)[1], rng.values()
    if tp is str:
        if not rng.choices or any(not isinstance(v, str) for v in values):
            return [f"{key}={list(values)} is invalid: {name} is a word; give its choices, e.g. "
                    "choices: [plain, in_context]"]
        return []
    words = [v for v in values if isinstance(v, str)]
    if words:
        return [f"{key}={list(values)} is invalid: {name} is a number, got {words}"]
    numbers = [float(v) for v in values]
    problems = []
    if tp is int and any(not v.is_integer() for v in numbers):
        problems.append(f"{key}={list(values)} is invalid: {name} is a whole "
                        "number; give integer low/high or choices")
    if any(not math.isfinite(v) for v in numbers):
        problems.append(f"{key}={list(values)} is invalid: every value must be finite")
    return problems


def recipe_config(study: StudyConfig, method: str, values: dict[str, float | str], meta_steps: int,
                  output_dir: str | Path) -> RecipeConfig:
    """The train recipe's config of one trial (or one of its segments) of ``method``."""
    return load_config(RecipeConfig, _config_path(study),
                       trial_overrides(study, method, values, meta_steps, output_dir))


def _config_path(study: StudyConfig) -> str | None:
    """``config`` as the train recipe reads it (a shipped file where the path names one)."""
    return None if study.config is None else shipped_path(study.config)


def trial_overrides(study: StudyConfig, method: str, values: dict[str, float | str], meta_steps: int,
                    output_dir: str | Path) -> list[str]:
    """The train recipe's overrides for one trial: the shared ones, the trial's values, and what
    the study sets (one method, no held-out evaluation, resume on, the segment's meta-steps)."""
    drawn = [f"{k}={_plain(k, v)}" for k, v in values.items() if k != "train.meta_steps"]
    # Held-out scoring's rows with demonstrations are not a trial's business (it scores nothing).
    return [*study.overrides, *drawn, f"methods=[{method}]", "eval.enabled=false", "eval.with_demonstrations=[]",
            "train.resume=auto", f"train.meta_steps={meta_steps}", f"output_dir={output_dir}"]


def _plain(key: str, value: float | str) -> str:
    """A drawn value as an override: ints of int keys without a decimal point, words as they are."""
    if isinstance(value, str):
        return value
    return str(int(value)) if key_type(key) is int else repr(float(value))


def recipe_problems(study: StudyConfig) -> list[str]:
    """Every problem the train recipe finds in a trial the study could run.

    Why: a range that reaches a value the recipe refuses (``inner_lr`` of 0, an unknown method)
    would fail only when a trial draws it, maybe hours in; here each method is checked at every
    end of every searched range, with the recipe's own messages, before anything runs.
    """
    try:
        load_config(RecipeConfig, _config_path(study), list(study.overrides))
    except ConfigError as err:  # the shared part first: said once, not once per method
        return [f"config={study.config!r} with overrides: the train recipe refuses it: {p}"
                for p in err.problems]
    problems: list[str] = []
    for method, space in study.space.items():
        checks: list[tuple[str, dict[str, float | str]]] = [(f"space.{method}", {})]
        for key, rng in searched_keys(space, method).items():
            checks.extend((f"space.{method}.{key}={_plain(key, v)}", {key: v}) for v in rng.values())
        for where, values in checks:
            steps = int(float(values.get("train.meta_steps", study.meta_steps)))
            try:
                recipe_config(study, method, values, steps, study.output_dir)
            except ConfigError as err:
                problems.extend(f"{where}: the train recipe refuses it: {p}" for p in err.problems)
    return problems
