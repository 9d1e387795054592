"""Which adapter a finished run hands a user, and how its evaluation adapted it.

``fmmeta adapt --run RUN --method M`` must adapt exactly as the run's held-out evaluation did, or
the evaluation's numbers say nothing about what the user gets. So everything here is read from
the run, nothing is chosen anew: the adapter ``<run>/<method>/adapter`` (of the chosen training
replicate), the adaptation lr the evaluation chose for it on validation tasks (``eval.json``'s
``inner_lrs``, or ``replicate_lrs`` of a replicate), Meta-SGD's learned step sizes (saved with
its adapter), the number of steps (the evaluation's ``max_steps``) and whether the method adapts
on in-context rows or only takes the support as demonstrations
(:func:`~fmmeta.evaluation.run.eval_methods` decides, as it does for the report).

All of it is checked before any model loads, so a method the run did not train, a replicate it
does not have or an lr nobody chose is refused in a second, not after minutes of loading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fmmeta.algorithms.build import method_of
from fmmeta.algorithms.meta_sgd import load_step_sizes
from fmmeta.checkpoint.lock import RunLock, RunLockError
from fmmeta.config import ConfigError, load_config
from fmmeta.errors import UserInputError
from fmmeta.evaluation.methods import IN_CONTEXT
from fmmeta.recipe_config import RecipeConfig

ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class RunMethod:
    """One method of a run, as its evaluation adapts it.

    Attributes:
        run: the run folder.
        cfg: the run's config as the chosen replicate's one-replicate run (its ``train.seed`` is
            that replicate's, whose initial adapter is ``base``).
        method: the method's name (a trained method, ``base`` or ``in_context``).
        adapter: its adapter folder; ``None`` for ``base`` / ``in_context`` (the initial adapter).
        lr: the adaptation lr; ``None`` where it takes no steps or steps at learned step sizes.
        steps: adaptation steps (0 for demonstrations-only methods).
        lr_source: where ``lr`` (or the steps) came from, for the log and the summary.
    """

    run: Path
    cfg: RecipeConfig
    method: str
    adapter: Path | None
    lr: float | None
    steps: int
    lr_source: str


def load_run_config(run: Path) -> RecipeConfig:
    """The run's own ``config.yaml``, as training wrote it.

    Raises:
        UserInputError: the folder is not a run, or its config no longer loads.
    """
    if not run.is_dir():
        raise UserInputError(f"--run {str(run)!r} is not a folder: give the output_dir of a finished run")
    config = run / "config.yaml"
    if not config.is_file():
        raise UserInputError(f"--run {str(run)!r} has no config.yaml: not a run folder written by fmmeta train")
    try:
        return load_config(RecipeConfig, str(config), []).on_this_machine()
    except ConfigError as err:
        raise UserInputError(f"--run {str(run)!r}: its config.yaml does not load ({err})") from None


def _replicate(run: Path, cfg: RecipeConfig, replicate: int) -> tuple[RecipeConfig, Path]:
    """The replicate's config and folder (a one-replicate run is its own replicate 0)."""
    configs = cfg.replicate_configs()
    if not 0 <= replicate < len(configs):
        raise UserInputError(f"--replicate {replicate} is invalid: the run {str(run)!r} trained "
                             f"{len(configs)} replicate(s), numbered 0..{len(configs) - 1}")
    folder = run if len(configs) == 1 else run / Path(configs[replicate].output_dir).name
    return configs[replicate], folder


def _evaluation(run: Path) -> tuple[dict, Path] | None:
    """The run's newest evaluation report: training's ``eval/eval.json`` or a re-evaluation's
    ``eval-*/eval.json``, whichever was written last (an extension trained without evaluating,
    then evaluated with ``fmmeta evaluate --run``, has its lrs in the re-evaluation)."""
    found = sorted((p for p in [run / "eval" / "eval.json", *run.glob("eval-*/eval.json")] if p.is_file()),
                   key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for path in found:
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8")), path
            except (OSError, ValueError) as err:
                raise UserInputError(f"{str(path)!r} cannot be read ({err}): evaluate the run again "
                                     "(fmmeta evaluate --run RUN), or pass --lr") from None
    return None


def _not_training(run: Path) -> None:
    """Refuses a run that a training still writes into (its lock held): its adapters and its
    evaluation are not final. A run folder that cannot be locked (read-only) cannot be trained
    into either, so it is read as it is."""
    try:
        RunLock.acquire(run).release()
    except RunLockError as err:
        raise UserInputError(f"--run {str(run)!r} is in use ({err}). Its adapters and the lrs its evaluation chose "
                             "are not final while it trains: wait for it to finish (or stop it), then adapt") from None
    except OSError:
        pass


def _stale_evaluation(method: str, adapter: Path, evaluation: str) -> str | None:
    """Why the evaluation's lr does not fit ``adapter``: it was written before the adapter (the run
    was extended after it was evaluated, e.g. with ``eval.enabled=false``), so it chose an lr for
    an earlier adapter of the method."""
    made, scored = (adapter / ADAPTER_FILE).stat().st_mtime_ns, Path(evaluation).stat().st_mtime_ns
    if scored >= made:
        return None
    return (f"--method {method}: the evaluation {evaluation!r} is older than the adapter {str(adapter)!r} (the run was "
            "trained on after it was evaluated), so its lr was chosen for an earlier adapter: evaluate the run again "
            "(fmmeta evaluate --run RUN), or pass --lr")


def _chosen_lr(run: Path, method: str, replicate: int) -> tuple[float, int, str] | None:
    """The lr the run's evaluation chose for ``method`` on validation, its steps, and the file."""
    found = _evaluation(run)
    if found is None:
        return None
    report, path = found
    per_replicate = report.get("replicate_lrs") or []
    lrs = per_replicate[replicate] if replicate < len(per_replicate) else report.get("inner_lrs", {})
    if method not in lrs:
        return None
    return float(lrs[method]), int(report.get("max_steps", 0)), str(path)


def _made_with(folder: Path) -> Path | None:
    """The config of the run an adapter folder was made in: ``adapt.json``'s run (an adapter
    ``fmmeta adapt`` wrote), else the run two levels up (``<run>/<method>/adapter``)."""
    about = folder / "adapt.json"
    if about.is_file():
        try:
            config = Path(json.loads(about.read_text(encoding="utf-8"))["run"]) / "config.yaml"
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return config if config.is_file() else None
    config = folder.parent.parent / "config.yaml"
    return config if config.is_file() else None


def foreign_adapter_problems(folder: Path, cfg: RecipeConfig) -> list[str]:
    """Why an adapter folder cannot be adapted under the run's config: its LoRA shape and scale
    (``adapter_config.json``), and the base model and LoRA of the run it was made in, compared in
    the words training uses to refuse a resume over changed settings."""
    from fmmeta.checkpoint.resume import ADAPTER_KEYS, resume_differences, resume_facts

    problems: list[str] = []
    try:
        peft = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [f"{str(folder)!r} has no readable adapter_config.json: not a peft adapter folder"]
    then = {"lora.r": peft.get("r"), "lora.alpha": float(peft.get("lora_alpha") or 0),
            "lora.target_modules": sorted(peft.get("target_modules") or [])}
    now = {"lora.r": cfg.lora.r, "lora.alpha": float(cfg.lora.alpha), "lora.target_modules": sorted(cfg.lora.target_modules)}
    problems += [d.replace(" in the checkpoint,", " in the adapter,") for d in resume_differences(then, now)]
    made = _made_with(folder)
    if made is not None:
        try:
            then_cfg = load_config(RecipeConfig, str(made), [])
        except ConfigError as err:
            return [*problems, f"the config it was made with, {str(made)!r}, does not load ({err})"]
        before = {k: v for k, v in resume_facts(then_cfg, "").items() if k in ADAPTER_KEYS}
        current = {k: v for k, v in resume_facts(cfg, "").items() if k in ADAPTER_KEYS}
        problems += [d.replace(" in the checkpoint,", f" in {str(made)!r},") for d in resume_differences(before, current)
                     if not d.startswith(tuple(then))]
    return problems


def _adapter(run: Path, folder: Path, method: str, given: Path | None, cfg: RecipeConfig) -> Path | None:
    """The adapter to adapt: ``given`` (checked against the run's config), else the method's own."""
    if given is None:
        return None if method in ("base", IN_CONTEXT) else folder / method / "adapter"
    if method in ("base", IN_CONTEXT):
        raise UserInputError(f"--adapter with --method {method}: base and {IN_CONTEXT} use the run's initial "
                             "adapter; name the method whose way of adapting the given adapter takes")
    if not (given / ADAPTER_FILE).is_file():
        raise UserInputError(f"--adapter {str(given)!r} has no {ADAPTER_FILE}: give a peft adapter folder")
    problems = foreign_adapter_problems(given, cfg)
    if problems:
        raise UserInputError(f"--adapter {str(given)!r} was made with other settings than the run {str(run)!r}'s "
                             "config (its model and LoRA): " + "; ".join(problems) + ". Adapt it with the run "
                             "it was trained in")
    return given


class EditedRunError(UserInputError):
    """The run's ``config.yaml`` was edited after training: no method of it can be adapted."""


def _check_config_fits(run: Path, folder: Path, method: str, adapter: Path, cfg: RecipeConfig) -> None:
    """Refuses a run whose ``config.yaml`` no longer describes its own adapter (edited after
    training: another model, LoRA shape or scale). The adapter's ``adapter_config.json`` and the
    method's newest checkpoint record what it was made with; loading it under the edited config
    failed deep in peft after the model loaded, or, for ``lora.alpha``, scaled it wrongly without
    a word."""
    from fmmeta.checkpoint.resume import ADAPTER_KEYS, RESUME_FACTS, facts_checkpoint, resume_differences, resume_facts

    peft = (adapter / "adapter_config.json").is_file()
    problems = foreign_adapter_problems(adapter, cfg) if peft else []
    ckpt = facts_checkpoint(cfg, folder, method)
    if ckpt is not None:
        now = {k: v for k, v in resume_facts(cfg, method).items() if k in ADAPTER_KEYS}
        problems += [d.replace("in the checkpoint", f"in its checkpoint {ckpt.path.name}")
                     for d in resume_differences(ckpt.meta[RESUME_FACTS], now)
                     if not (peft and d.startswith(("lora.r:", "lora.alpha:", "lora.target_modules:")))]
    problems = [d.replace(" now", " in config.yaml") for d in dict.fromkeys(problems)]
    if problems:
        raise EditedRunError(f"--run {str(run)!r}: its config.yaml no longer fits its {method} adapter, so it was "
                             "edited after training (" + "; ".join(problems) + "). Put config.yaml back as training "
                             "wrote it; to adapt under other settings, train a run with them")


MAX_LR = 1e3
"""The largest adaptation lr adapt takes: the evaluation's grid tops out at 1, and an lr of 1e30
(or inf) turned every query's log-probability into NaN."""


def resolve_method(run: Path, method: str, *, replicate: int = 0, steps: int | None = None,
                   lr: float | None = None, adapter: Path | None = None) -> RunMethod:
    """How the run's evaluation adapts ``method``, with ``steps`` / ``lr`` overriding it.

    ``adapter``: another adapter folder (a copy, or one ``fmmeta adapt`` wrote) to adapt the way
    ``method`` adapts, in place of the method's own; the run's config says which model and LoRA
    it must fit.

    Raises:
        UserInputError: a folder that is not a run, a replicate or a method it does not have, an
            adapter that is missing or made with another model or LoRA, overrides that do not
            apply to the method, or no chosen lr.
    """
    cfg = load_run_config(run)
    _not_training(run)
    rep_cfg, folder = _replicate(run, cfg, replicate)
    known = ("base", IN_CONTEXT, *cfg.methods)
    if method not in known:
        raise UserInputError(f"--method {method!r} is not a method of the run {str(run)!r}: it trained "
                             f"{list(cfg.methods)} (base and {IN_CONTEXT} use its initial adapter)")
    own = adapter is None  # the run's own adapter of the method, which its evaluation scored
    adapter = _adapter(run, folder, method, adapter, cfg)
    if adapter is not None and not (adapter / ADAPTER_FILE).is_file():
        raise UserInputError(f"--method {method!r}: {str(adapter / ADAPTER_FILE)!r} does not exist: the run did "
                             "not finish that method; rerun training to resume it, or pick another method")
    if own and adapter is not None:
        _check_config_fits(run, folder, method, adapter, rep_cfg)
    if steps is not None and steps < 0:
        raise UserInputError(f"--steps {steps} is invalid: must be >= 0 (0 = no adaptation)")
    if lr is not None and not 0 < lr <= MAX_LR:
        raise UserInputError(f"--lr {lr} is invalid: must be > 0 and <= {MAX_LR:g} (a larger step overflows the "
                             "fp32 fast weights: every log-probability comes out NaN)")
    if _takes_no_steps(method):
        if steps or lr is not None:
            raise UserInputError(f"--method {method} takes the support as in-context demonstrations, with no "
                                 "gradient step: drop --steps and --lr (or pick a method that adapts)")
        return RunMethod(run, rep_cfg, method, adapter, None, 0, "demonstrations, no steps")
    if adapter is not None and load_step_sizes(adapter) is not None:
        if lr is not None:
            raise UserInputError(f"--lr with --method {method}: it adapts at the step sizes it learned "
                                 f"(saved with {str(adapter)!r}); drop --lr")
        chosen = _chosen_lr(run, method, replicate)
        n = steps if steps is not None else (chosen[1] if chosen else cfg.eval.max_steps)
        return RunMethod(run, rep_cfg, method, adapter, None, n, "learned step sizes")
    chosen = _chosen_lr(run, method, replicate)
    source = "--lr"
    if lr is None:
        if chosen is None:
            raise UserInputError(f"--method {method}: the run has no evaluation that chose its adaptation lr "
                                 f"(no eval/eval.json in {str(run)!r} names it): evaluate the run first "
                                 "(fmmeta evaluate --run RUN) or pass --lr")
        stale = _stale_evaluation(method, adapter, chosen[2]) if own and adapter is not None else None
        if stale is not None:
            raise UserInputError(stale)
        lr, source = chosen[0], f"chosen on validation ({chosen[2]})"
    default_steps = chosen[1] if chosen else cfg.eval.max_steps
    return RunMethod(run, rep_cfg, method, adapter, lr, steps if steps is not None else default_steps, source)


AUTO = "auto"
"""``--method auto``: the candidate that does best in cross-validation on the user's support rows."""


def candidate_methods(run: Path, replicate: int = 0) -> tuple[dict[str, RunMethod], dict[str, str]]:
    """Every method of the run ``--method auto`` can compare, as its evaluation adapts each: base,
    in_context and each method the run trained, in that order (the simplest first); and why each
    other one cannot be (e.g. no evaluation chose its lr).

    Raises:
        UserInputError: the run or replicate is refused as a whole (not a run, still training,
            its config edited), or no candidate is left.
    """
    cfg = load_run_config(run)
    _not_training(run)
    _replicate(run, cfg, replicate)
    plans, skipped = {}, {}
    for method in ("base", IN_CONTEXT, *cfg.methods):
        try:
            plans[method] = resolve_method(run, method, replicate=replicate)
        except EditedRunError:
            raise
        except UserInputError as err:
            skipped[method] = str(err)
    if not plans:
        raise UserInputError(f"--method {AUTO}: no method of the run {str(run)!r} can be adapted: "
                             + "; ".join(skipped.values()))
    return plans, skipped


def _takes_no_steps(method: str) -> bool:
    """Whether the method's evaluation takes the support as demonstrations and no gradient step
    (the in-context row; a method scored with demonstrations, as MetaICL)."""
    registered = method_of(method)
    return method == IN_CONTEXT or (registered is not None and registered.scoring == "demonstrations")


__all__ = ["AUTO", "EditedRunError", "RunMethod", "candidate_methods", "foreign_adapter_problems", "load_run_config",
           "resolve_method"]
