#!/usr/bin/env python
"""Study how to meta-train: search on validation tasks, choose, then score the choice once held out.

    fmmeta study --config my_study.yaml                     # installed
    python recipes/study.py --config my_study.yaml trials=4
    fmmeta study --config recipes/configs/study_smoke.yaml output_dir=studies/smoke

The YAML declares the space (fmmeta.study.config): per method, which meta-training keys are
searched and over what range, on top of a train recipe config. The story, top to bottom: check
the declaration and every trial it could run; claim the study folder (refused once its held-out
tasks were scored); build the model and the task suite once; then per method, one Optuna study
(on a CPU the methods search side by side in worker processes, ``engine.workers``): each trial
is a normal run of the train recipe into its own folder, trained in segments of
``report_every`` meta-steps, each segment resuming the last one's checkpoint and scored on
validation tasks over several seeds of episode draws, so the pruner can stop a trial whose
validation curve trails. The choice per method (validation score alone, with its standard error;
trials within one of the best are reported as tied) is written before any held-out episode is
drawn; then each choice is trained under ``replicates - 1`` more training seeds (:func:`confirm`),
and only then are the chosen configurations, the base model and in-context demonstrations scored
once on the held-out tasks, every replicate on the same episodes, paired, and ``study.md`` /
``study.json`` say what was tried, what was chosen and why, and what it scored.

A killed study resumes where it stopped: rerun the same command. Optuna's storage
(``study.db``) keeps the finished trials; a trial killed mid-run is run again with the same
values into the same folder, where the train recipe resumes its checkpoints.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from fmmeta.startup import Terminated, ctrl_c_raises  # first: Ctrl-C during the imports below is a message

# isort: split
from fmmeta.atomic import replace_text
from fmmeta.config import ConfigError, describe_config, load_config
from fmmeta.errors import UserInputError
from fmmeta.exit_codes import BAD_INPUT, CTRL_C, NONFINITE, SIGTERM, exit_code
from fmmeta.library_warnings import show_library_warnings_once
from fmmeta.progress import Progress
from fmmeta.recipe_args import IMPORT_HELP, OneConfig, import_modules
from fmmeta.recipe_config import RecipeConfig
from fmmeta.recipes import train as train_recipe
from fmmeta.shipped import shipped_path
from fmmeta.strict_json import dumps_strict
from fmmeta.study import StudyConfig, recipe_problems, searched_keys
from fmmeta.study.config import trial_overrides
from fmmeta.study.folder import CHOICE_FILE, claim_study_dir, start_held_out
from fmmeta.study.report import choose, trial_rows, write_study
from fmmeta.study.scoring import Scorer, score_of, standard_error_of
from fmmeta.study.search import (
    DIVERGED,
    FOLDER,
    create_studies,
    finished,
    import_optuna,
    next_folder,
    open_study,
    requeue_interrupted,
    seed_sampler,
    suggest,
)

logger = logging.getLogger("fmmeta.study")

def parse_args(argv: list[str], prog: str | None = None) -> argparse.Namespace:
    """``--config`` (the study's YAML), ``--import`` modules and ``key=value`` overrides."""
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Search how to meta-train on validation tasks (Optuna), choose per method, "
        "then score the choice once on held-out tasks; writes study.md and study.json.",
        epilog="study keys (key=value; defaults shown):\n" + describe_config(StudyConfig()),
    )
    parser.add_argument("--config", help="the study's YAML (the space, the trials, the scoring)", action=OneConfig)
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help=IMPORT_HELP)
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. trials=4")
    args = parser.parse_args(argv)
    args.config = None if args.config is None else shipped_path(args.config)
    return args


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """What every entry point runs: ``python recipes/study.py``, ``python -m fmmeta.recipes.study``
    and ``fmmeta study``.

    Exit codes: 0 done, 2 bad input or a refusal (held-out tasks already scored), 130 stopped
    (Ctrl-C), 143 stopped by SIGTERM.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ctrl_c_raises()
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)
    show_library_warnings_once(0)  # as its trials do: each library warning once, as a log line
    with exit_code(logger, stopped) as outcome:
        import_modules(args.imports)
        run(load_config(StudyConfig, args.config, args.overrides))
    return outcome.code


def stopped(err: KeyboardInterrupt) -> None:
    """Optuna's storage and the trials' checkpoints keep what was done: say how to go on."""
    logger.warning("stopped%s; rerun the same command to resume the study",
                   " by SIGTERM" if isinstance(err, Terminated) else "")


def run(study: StudyConfig) -> None:
    """The study, top to bottom (see the module's docstring)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise UserInputError("fmmeta study runs in one process (its trials are one-process runs): "
                             "start it without a launcher")
    optuna = import_optuna()
    problems = recipe_problems(study)
    if problems:
        raise ConfigError(problems)
    folder, lock = claim_study_dir(study)
    try:
        base = load_config(RecipeConfig, _config(study), [
            *study.overrides, f"methods=[{','.join(study.space)}]", f"output_dir={folder}",
        ]).on_this_machine()
        scorer = Scorer(base, seeds=study.seeds, episodes_per_task=study.episodes_per_task,
                        family=study.family)
        try:
            # Each method has its own Optuna study: on a CPU the methods search side by side.
            create_studies(optuna, folder, study)
            methods = list(study.space)
            trials = dict(zip(methods, scorer.workers.map(
                lambda m: search(optuna, study, m, folder, scorer), methods)))
            choice = {m: choose(m, rows, study) for m, rows in trials.items()}
            # The choice is on disk before the first held-out episode is drawn.
            replace_text(folder / CHOICE_FILE, json.dumps(choice, indent=2) + "\n")
            write_study(folder, study, trials, choice, None, scorer.held_out_tasks())
            # It is confirmed under more training seeds before it is scored (validation alone chose it).
            replicates = confirm(study, choice, folder, scorer)
            report_dir = start_held_out(folder, choice)
            paths = scorer.held_out(replicates, report_dir, budget_notes(study, choice),
                                    {m: c["params"] for m, c in choice.items()})
            held_out = json.loads(paths["eval.json"].read_text(encoding="utf-8"))
            paths = write_study(folder, study, trials, choice, held_out, scorer.held_out_tasks())
        finally:
            scorer.close()
    finally:
        lock.release()
    logger.info("study done: %s", paths["study.md"])


def _config(study: StudyConfig) -> str | None:
    return None if study.config is None else shipped_path(study.config)


def search(optuna: Any, study: StudyConfig, method: str, folder: Path, scorer: Scorer) -> list[dict]:
    """Runs ``method``'s trials until ``study.trials`` have finished; returns every trial."""
    opt = open_study(optuna, folder, method, study)
    for number in requeue_interrupted(optuna, opt):
        logger.warning("%s trial %d was interrupted by a kill: running it again", method, number)
    while len(finished(optuna, opt)) < study.trials:
        seed_sampler(optuna, opt, study, method, len(finished(optuna, opt)))
        trial = opt.ask()
        name = trial.user_attrs.get(FOLDER) or next_folder(opt)
        trial.set_user_attr(FOLDER, name)
        values = suggest(trial, searched_keys(study.space[method], method))
        outcome, score = run_trial(study, method, values, folder / method / name, scorer, trial)
        if outcome == "complete":
            opt.tell(trial, score)
        elif outcome == "pruned":
            opt.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            trial.set_user_attr(DIVERGED, True)
            opt.tell(trial, state=optuna.trial.TrialState.FAIL)
        logger.info("%s %s: %s, validation %s %s | %s", method, name, outcome, study.metric,
                    "-" if score is None else f"{score:.4f}", values)
    return [{**row, "standard_error": last_standard_error(folder / method / str(row["folder"]))}
            for row in trial_rows(opt)]


def last_standard_error(trial_dir: Path) -> float | None:
    """The standard error of a trial's last validation score (None: never scored)."""
    scored = sorted((trial_dir / "validation").glob("step_*.json"))
    if not scored:
        return None
    return json.loads(scored[-1].read_text(encoding="utf-8")).get("standard_error")


def confirm(study: StudyConfig, choice: dict[str, dict], folder: Path, scorer: Scorer) -> list[dict[str, Path]]:
    """Trains each method's chosen configuration under ``study.replicates - 1`` more training
    seeds (``train.seed + r``, into ``<method>/replicates/replicate_<r>``; a killed one resumes);
    returns, per replicate, method -> adapter folder (replicate 0: the chosen trials' own)."""
    seed = scorer.cfg.train.seed
    jobs = [(m, r) for r in range(1, study.replicates) for m in choice]
    progress = Progress("confirmed", len(jobs), "trainings", every_s=0)

    def confirmed(job: tuple[str, int]) -> Path:
        method, r = job
        values = choice[method]["params"]
        out = folder / method / "replicates" / f"replicate_{r}"
        steps = int(float(values.get("train.meta_steps", study.meta_steps)))
        rc = train(study, method, values, steps, out, f"train.seed={seed + r}")
        if rc != 0:  # the choice trained to the end once: a refusal or a divergence now is news
            raise RuntimeError(f"the train recipe failed (exit {rc}) training {method}'s choice under "
                               f"training seed {seed + r} in {str(out)!r}; its message is above")
        return out / method / "adapter"

    if jobs:
        logger.info("confirming the choice under %d more training seed(s): %d trainings", study.replicates - 1,
                    len(jobs))
    trained = dict(zip(jobs, scorer.workers.map(confirmed, jobs, on_result=lambda _: progress.advance())))
    first = {m: folder / m / c["folder"] / m / "adapter" for m, c in choice.items()}
    return [first, *({m: trained[(m, r)] for m in choice} for r in range(1, study.replicates))]


def rungs(total: int, every: int) -> list[int]:
    """The meta-steps after which a trial is scored: every ``every`` (0: none) and the last."""
    return [*range(every, total, every), total] if every else [total]


def run_trial(study: StudyConfig, method: str, values: dict[str, float | str], trial_dir: Path,
              scorer: Scorer, trial: Any) -> tuple[str, float | None]:
    """Trains and scores one trial segment by segment; ``("complete" | "pruned" | "diverged", score)``."""
    total = int(float(values.get("train.meta_steps", study.meta_steps)))
    score: float | None = None
    for steps in rungs(total, study.report_every):
        score = segment(study, method, values, steps, trial_dir, scorer)
        if score is None:
            return "diverged", None
        trial.report(score, steps)
        if steps < total and trial.should_prune():
            return "pruned", score
    return "complete", score


def train(study: StudyConfig, method: str, values: dict[str, float | str], steps: int, out: Path,
          *extra: str) -> int:
    """One run of the train recipe for ``method`` with a trial's ``values`` into ``out`` (``extra``:
    more overrides); its exit code, a stop by Ctrl-C or SIGTERM raised again here."""
    config = _config(study)
    argv = [*(["--config", config] if config else []), *trial_overrides(study, method, values, steps, out), *extra]
    rc = train_recipe.main(argv, prog="fmmeta train")
    if rc in (CTRL_C, SIGTERM):
        raise Terminated if rc == SIGTERM else KeyboardInterrupt
    return rc


def segment(study: StudyConfig, method: str, values: dict[str, float | str], steps: int, trial_dir: Path,
            scorer: Scorer) -> float | None:
    """The trial trained to ``steps`` meta-steps (resuming its last checkpoint) and scored on
    validation tasks; None if it diverged. A segment scored before a kill is read back."""
    scored = trial_dir / "validation" / f"step_{steps:06d}.json"
    if scored.is_file():
        return float(json.loads(scored.read_text(encoding="utf-8"))["score"])
    rc = train(study, method, values, steps, trial_dir)
    if rc == NONFINITE:  # the trial diverged: a result, not a bug
        return None
    if rc == BAD_INPUT:
        raise UserInputError(f"the train recipe refused trial {str(trial_dir)!r}; its message is above")
    if rc != 0:  # 1: a bug in the run, whose traceback the recipe logged
        raise RuntimeError(f"the train recipe failed in trial {str(trial_dir)!r} (exit {rc}); its "
                           "traceback is above")
    result = scorer.validation(method, trial_dir / method / "adapter", values)
    score = score_of(result, method, study.metric, study.family)
    scored.parent.mkdir(parents=True, exist_ok=True)
    replace_text(scored, dumps_strict({"step": steps, "metric": study.metric, "family": study.family,
                                       "score": score, "standard_error": standard_error_of(
                                           result, method, study.metric, study.family),
                                       "validation": result.to_dict()}) + "\n")
    return score


def budget_notes(study: StudyConfig, choice: dict[str, dict]) -> list[str]:
    """How each chosen adapter was trained, for the held-out report."""
    notes = [f"{m}: {c['folder']} of the study, chosen on validation ({study.metric} "
             f"{c['value']:.4f}), trained with {c['params'] or 'the base config'}"
             + ("" if "train.meta_steps" in c["params"] else f", {study.meta_steps} meta-steps")
             for m, c in choice.items()]
    if study.replicates > 1:
        notes.append(f"Each choice trained under {study.replicates} training seeds (replicate 0: the chosen "
                     "trial itself), every replicate scored on the same held-out episodes.")
    return notes + ["base / in_context: each replicate's initial adapter (LoRA B = 0), no meta-training."]


def cli(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The same as :func:`main` (the name ``fmmeta`` called before the recipes had one ``main``)."""
    return main(argv, prog)


if __name__ == "__main__":
    sys.exit(main())
