"""The study's choice and its one report: ``study.json`` (everything) and ``study.md`` (to read).

The choice per method is the finished trial with the best validation score (equal scores to the
earlier folder; trials within one standard error of it reported as tied); the report says why,
next to every trial, and then the held-out table: each chosen configuration (under every training
replicate), the base model and in-context demonstrations on the very same held-out episodes, with
intervals over replicates and episodes and paired differences against multi-task and in-context
(:mod:`fmmeta.evaluation.replicated`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from fmmeta.atomic import replace_text
from fmmeta.config import to_dict
from fmmeta.errors import UserInputError
from fmmeta.evaluation.metrics import get_metric
from fmmeta.study.config import StudyConfig
from fmmeta.study.search import DIVERGED, FOLDER

__all__ = ["choose", "format_study", "trial_rows", "write_study"]


def trial_rows(opt_study: Any) -> list[dict[str, Any]]:
    """Every trial of one method's Optuna study as plain data, in trial order."""
    rows = []
    for t in opt_study.get_trials(deepcopy=False):
        state = t.state.name.lower()
        if state == "fail":
            state = "diverged" if t.user_attrs.get(DIVERGED) else "interrupted (run again)"
        rows.append({
            "number": t.number, "folder": t.user_attrs.get(FOLDER), "state": state,
            "params": dict(t.params), "value": t.value,
            "curve": {str(k): v for k, v in sorted(t.intermediate_values.items())},
            **({"rerun_of": t.user_attrs["rerun_of"]} if "rerun_of" in t.user_attrs else {}),
        })
    return rows


def choose(method: str, rows: Sequence[Mapping[str, Any]], study: StudyConfig) -> dict[str, Any]:
    """The chosen trial of ``method`` by its validation score alone, with the reason in words.

    Raises:
        UserInputError: no trial of the method finished complete (all pruned or diverged).
    """
    complete = [r for r in rows if r["state"] == "complete"]
    if not complete:
        raise UserInputError(f"no trial of {method} finished ({len(rows)} pruned, diverged or "
                             "interrupted): widen the space or raise trials")
    higher = get_metric(study.metric).higher_is_better
    sign = -1.0 if higher else 1.0  # best first; ties to the earlier folder
    ordered = sorted(complete, key=lambda r: (sign * r["value"], str(r["folder"])))
    best, runner = ordered[0], (ordered[1] if len(ordered) > 1 else None)
    se = best.get("standard_error")
    what = (f"{'highest' if higher else 'lowest'} mean validation {study.metric} "
            f"({study.family}, {study.seeds} seeds of episode draws) of {len(complete)} complete trials")
    why = f"{best['folder']}: {what}, {best['value']:.4f}" + ("" if se is None else f" (standard error {se:.4f})")
    if runner is not None:
        why += f"; next {runner['folder']} at {runner['value']:.4f} ({best['value'] - runner['value']:+.4f})"
    tied = [r for r in ordered[1:] if se is not None and abs(best["value"] - r["value"]) <= se]
    if tied:
        why += (f"; tied with {', '.join(str(r['folder']) for r in tied)} (within one standard error of "
                "the best: validation cannot tell them apart, the best score decides by rule)")
    return {"folder": best["folder"], "params": best["params"], "value": best["value"], "standard_error": se,
            "tied": [r["folder"] for r in tied], "why": why}


def write_study(folder: Path, study: StudyConfig, trials: Mapping[str, list[dict[str, Any]]],
                choice: Mapping[str, Any], held_out: Mapping[str, Any] | None,
                held_out_tasks: Sequence[str]) -> dict[str, Path]:
    """Writes ``study.json`` and ``study.md``; ``held_out`` is the held-out ``eval.json``."""
    data = {"study": to_dict(study), "trials": trials, "choice": choice,
            "held_out_tasks": list(held_out_tasks), "held_out": held_out}
    return {
        "study.json": replace_text(folder / "study.json", json.dumps(data, indent=2, default=str) + "\n"),
        "study.md": replace_text(folder / "study.md", format_study(data)),
    }


def _value(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}"


def _value3(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def _interval(i: Mapping[str, Any], signed: bool = False) -> str:
    f = "+.3f" if signed else ".3f"
    return f"{i['estimate']:{f}} [{i['low']:{f}}, {i['high']:{f}}]"


def _favour(comparison: Mapping[str, Any], metric: str, replicates: int) -> str:
    """``"2 / 1"``: the replicates whose mean difference in ``metric`` is above 0 / below 0."""
    favour = comparison.get(f"{metric}_replicated", {}).get("favour")
    return f"{favour[0]} / {favour[1]}" if favour and replicates > 1 else "-"


def format_study(data: Mapping[str, Any]) -> str:
    """``study.md``: the protocol, every trial, the choice and why, the held-out table."""
    s = data["study"]
    lines = ["# Study", "",
             f"Trials of the train recipe (base config {s['config'] or 'the embedded default'}"
             f"{', overrides ' + ' '.join(s['overrides']) if s['overrides'] else ''}), each scored on "
             f"validation tasks only: mean {s['metric']} on {s['family']} episodes over "
             f"{s['seeds']} seeds of episode draws x {s['episodes_per_task']} episode(s) per task. "
             "The choice per method was made on that score alone, before any held-out episode was "
             "drawn. Tie rule: a trial whose score is within one standard error (over validation "
             "episodes, of the best trial's score) of the best is reported as tied with it; the best "
             f"score is chosen. The choice was then trained under {s.get('replicates', 1)} training "
             "seed(s) and scored once on the held-out tasks "
             f"({', '.join(data['held_out_tasks'])}).", ""]
    for method, rows in data["trials"].items():
        keys = sorted({k for r in rows for k in r["params"]})
        lines += [f"## {method}", "", "| trial | state | " + " | ".join(keys) + " | curve | score | standard error |",
                  "|---" * (len(keys) + 5) + "|"]
        for r in rows:
            curve = ", ".join(f"{k}: {_value(v)}" for k, v in r["curve"].items())
            lines.append(f"| {r['folder']} | {r['state']} | "
                         + " | ".join(f"{r['params'].get(k, '-'):.4g}" if isinstance(r['params'].get(k), float)
                                      else str(r["params"].get(k, "-")) for k in keys)
                         + f" | {curve} | {_value(r['value'])} | {_value(r.get('standard_error'))} |")
        lines += ["", f"Chosen: {data['choice'][method]['why']}.", ""]
    lines += _held_out_lines(data["held_out"], s["metric"])
    return "\n".join(lines) + "\n"


def _metrics_in(cells: Any) -> list[str]:
    """The metrics ``eval.json`` summary cells or comparisons hold (``<metric>_interval`` keys of a
    cell, ``<metric>_replicated`` keys of a comparison), in their order."""
    names: dict[str, None] = {}
    for c in cells:
        names.update({k.rsplit("_", 1)[0]: None for k in c if k.endswith(("_interval", "_replicated"))})
    return list(names)


def _held_out_lines(held_out: Mapping[str, Any] | None, metric: str) -> list[str]:
    """The held-out tables: per family, each method's ``metric`` (the study's) with its interval
    and worst seed, then the mean of every other metric; the paired differences likewise."""
    if held_out is None:
        return ["## Held-out", "", "Not scored yet.", ""]
    replicates = len(held_out.get("train_seeds") or [0])
    how = ("95% stratified bootstrap interval over episodes, the trained adapters held fixed" if replicates == 1
           else f"95% interval over {replicates} training replicates and the episodes")
    lines = ["## Held-out (scored once)", "",
             f"{held_out['n_seeds']} seeds of episode draws; each row at its headline step "
             f"({metric}, {how}).", ""]
    for family in sorted({f for m in held_out["summary"].values() for f in m}):
        headline = {method: cells[max(cells, key=int)] for method, by_family in held_out["summary"].items()
                    if (cells := by_family.get(family))}
        others = [m for m in _metrics_in(headline.values()) if m != metric]
        lines += [f"### {family}", "", f"| method | step | {metric} | worst seed | " + " | ".join(others) + " |",
                  "|---|---|---|---|" + "---|" * len(others)]
        for method, c in headline.items():
            step = max(held_out["summary"][method][family], key=int)
            cell = (f"{_interval(c[f'{metric}_interval'])} | {c[f'{metric}_worst']:.3f}"
                    if f"{metric}_interval" in c else "- | -")
            lines.append(f"| {method} | {step} | {cell} | "
                         + " | ".join(_value3(c.get(f"{m}_mean")) for m in others) + " |")
        pairs = [c for c in held_out["comparisons"] if c["family"] == family and metric in c]
        if pairs:
            others = [m for m in _metrics_in(pairs) if m != metric]
            lines += ["", f"| paired difference | {metric} | replicates for / against | " + " | ".join(others) + " |",
                      "|---|---|---|" + "---|" * len(others)]
            lines += [f"| {c['method']} - {c['baseline']} | {_interval(c[metric], True)}"
                      + (" (excludes 0)" if c[metric]["low"] > 0 or c[metric]["high"] < 0 else "")
                      + f" | {_favour(c, metric, replicates)} | "
                      + " | ".join(_interval(c[m], True) if m in c else "-" for m in others) + " |" for c in pairs]
        lines.append("")
    lines += [f"- {n}" for n in held_out.get("notes", [])]
    return lines
