"""The evaluation report a person reads: ``eval.json``, ``eval.md`` and PNG plots.

``eval.json`` holds everything (summary and per-episode records) for machines; ``eval.md`` holds,
per family, a method x adaptation-steps table of every registered metric the family's episodes
carry (:mod:`fmmeta.evaluation.metrics`: accuracy, loss, multiple choice's per-token accuracy,
and any metric registered since), each cell ``mean [95% interval] (worst seed)``, and paired
differences against the baselines; the headline and the plots read the headline metric
(:data:`~fmmeta.evaluation.metrics.HEADLINE`, accuracy): the plots show held-out query accuracy
against adaptation steps per method, and the meta-training curves from ``metrics.jsonl``. Plots use matplotlib's Agg backend
(no display needed) through an explicit ``Figure``, so importing this module changes no global state.
"""

from __future__ import annotations

import io
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from fmmeta.atomic import replace_bytes, replace_text
from fmmeta.evaluation.intervals import N_BOOTSTRAP, Interval
from fmmeta.evaluation.methods import IN_CONTEXT, MULTITASK
from fmmeta.evaluation.metrics import HEADLINE, METRICS
from fmmeta.evaluation.replicated import Replicated
from fmmeta.evaluation.result import KINDS, OVERALL, Comparison, EvalResult
from fmmeta.strict_json import dumps_strict, read_json_lines

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

TRAINING_CURVE_KEYS: tuple[str, ...] = ("outer_loss", "query_loss_before", "query_loss_after")
"""``metrics.jsonl`` fields :func:`plot_training_curves` draws, whichever are present."""

STEP_KEYS: tuple[str, ...] = ("step", "meta_step")
"""``metrics.jsonl`` fields accepted as the x axis (the first present wins)."""


def _fmt(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else str(x)


def _interval(i: Interval, signed: bool = False) -> str:
    est = f"{i.estimate:+.3f}" if signed else _fmt(i.estimate)
    return f"{est} [{i.low:{'+' if signed else ''}.3f}, {i.high:{'+' if signed else ''}.3f}]"


def _difference(c: Comparison | None, metric: str) -> str:
    if c is None or metric not in c.metrics:
        return "-"
    i = c.interval(metric)
    text = _interval(i, signed=True)
    return f"**{text}**" if i.excludes_zero else text


def format_markdown(result: EvalResult) -> str:
    """The markdown report: settings, a table per metric per family, paired differences.

    Each table has one row per method and one column per adaptation step; a cell reads
    ``mean [95% interval] (worst seed)``. Methods that do not adapt have a step-0 cell only. The
    differences table compares every method at its headline step with the multi-task baseline and
    with in-context demonstrations on the same episodes; bold marks intervals that exclude 0.
    """
    return "\n".join(["# Held-out evaluation", "", *_headline(result), *_settings(result),
                      *_differences(result), *_score_tables(result),
                      *_lr_selection(result)])


def _headline(result: EvalResult) -> list[str]:
    """What a person reads first: whether the intervals count training variance, which accuracy
    comparisons hold (the 95% interval excludes 0) and which do not, and at what power."""
    # Tasks on which no method leaves chance would only add noise to every comparison: they are
    # named and kept out of this section (the tables below still hold them).
    chance = result.at_chance()
    full = result
    if chance and len(chance) < len({r.task for r in result.records}):
        result = result.without_tasks(list(chance))
    # Out-of-format families have a table of their own (against base); the comparisons per kind
    # stay on the tasks of the suite's format, comparable with a suite that has none.
    shifted = {r.task for r in result.records if r.family in result.format_shift}
    if shifted and len(shifted) < len({r.task for r in result.records}):
        result = result.without_tasks(list(shifted))
    # Per kind of task (overall is in the tables below), each contender against each baseline,
    # in_context - multitask left out as the mirror of multitask - in_context.
    families = [f for f in KINDS if f in result.families()] or [OVERALL]
    comparisons = [c for c in result.comparisons() if c.family in families and c.method != "base"
                   and (c.method, c.baseline) != (IN_CONTEXT, MULTITASK) and HEADLINE in c.metrics]
    comparisons.sort(key=lambda c: families.index(c.family))
    r = result.n_replicates
    if r > 1:
        seeds = f" (training seeds {', '.join(map(str, result.train_seeds))})" if result.train_seeds else ""
        scope = (f"{r} training replicates{seeds}, each scored on the same episodes: intervals count "
                 "the variance between replicates (training) and between episodes "
                 "(docs/evaluation.md, \"Intervals that count training variance\").")
    else:
        scope = ("One training replicate: every interval holds the trained adapters fixed, so it leaves "
                 "out training variance, which can be as large as the differences (train.replicates=3 "
                 "counts it).")
    lines = ["## What holds", "", scope, ""]
    if chance:
        named = ", ".join(f"{t} (chance {c:.2f})" for t, c in sorted(chance.items()))
        kept = "kept out of this section" if result is not full else "every task is at chance: nothing below tells methods apart"
        lines += [f"At chance, {kept}: {named}. On these tasks no method's 95% accuracy interval "
                  "leaves the chance rate (a uniform guess among the candidates).", ""]
    lines += _out_of_format(full)
    if not comparisons:
        return lines
    holds = [c for c in comparisons if c.interval(HEADLINE).excludes_zero]
    lines += [f"Holds ({HEADLINE}, the 95% interval excludes 0):"
              + ("" if holds else " none."), *(f"- {_sentence(c)}" for c in holds), ""]
    lines += [
        f"| {HEADLINE} difference | family | estimate [95%] | replicates for / against | holds | "
        "SD training / episode | resolvable at 80% power | to resolve 0.05 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        rep = c.replicated(HEADLINE)
        favour = f"{rep.favour[0]} / {rep.favour[1]}" if r > 1 else "-"
        training = "-" if rep.between_replicates is None else f"{rep.between_replicates ** 0.5:.3f}"
        lines.append(f"| {c.method} - {c.baseline} | {c.family} | {_interval(rep.interval, signed=True)} | "
                     f"{favour} | {'yes' if rep.interval.excludes_zero else 'no'} | "
                     f"{training} / {rep.between_episodes ** 0.5:.3f} | "
                     f"{rep.resolvable():.3f}{'' if r > 1 else ' (episodes only)'} | {_to_resolve(rep)} |")
    lines += ["", "SD training / episode: the standard deviations of a replicate's effect (training: "
              "initial adapter, episode draws, dropout) and of an episode's effect within its task, "
              "estimated from the differences themselves. Resolvable: the smallest true difference this "
              "evaluation detects with 80% power at the 5% level; to resolve 0.05: the replicates (at "
              "these episodes) or the episodes (at these replicates) that would"
              + (" (with one replicate training variance is unknown: both are lower bounds)." if r == 1 else "."),
              ""]
    return lines


def _out_of_format(result: EvalResult) -> list[str]:
    """Every method against the base model on the held-out families of a format no meta-training
    task has, apart from the rest: the held-out tasks above share the suite's templates and label
    words, and a method that leads there can trail the base model on a user's own format."""
    shifted = [c for c in result.against_base() if HEADLINE in c.metrics]
    if not shifted:
        return []
    lines = [f"Out of format ({', '.join(result.format_shift)}: a template and label words no meta-training task "
             f"has), each method against the base model, {HEADLINE} (the comparisons below leave these tasks "
             "out):", ""]
    lines += ["| method - base | family | estimate [95%] | holds |", "|---|---|---|---|"]
    for c in shifted:
        i = c.interval(HEADLINE)
        holds = ("yes, " + ("above" if i.estimate > 0 else "below")) if i.excludes_zero else "no"
        lines.append(f"| {c.method} | {c.family} | {_interval(i, signed=True)} | {holds} |")
    return [*lines, ""]


def _sentence(c: Comparison) -> str:
    rep = c.replicated(HEADLINE)
    side = "above" if rep.interval.estimate > 0 else "below"
    votes = (f", {max(rep.favour)} of {rep.replicates} replicates agree" if rep.replicates > 1 else "")
    return f"{c.method} {side} {c.baseline} on {c.family}: {_interval(rep.interval, signed=True)}{votes}"


def _to_resolve(rep: Replicated) -> str:
    """``"6 replicates or 240 episodes"`` (either alone is enough); ``-`` where nothing varies."""
    if rep.standard_error() == 0:
        return "-"
    r, e = rep.replicates_to_resolve(0.05), rep.episodes_to_resolve(0.05)
    parts = ([f"{r} replicate{'s' * (r != 1)}"] if r is not None else []) + (
        [f"{e} episode{'s' * (e != 1)}"] if e is not None else [])
    return " or ".join(parts) if parts else "more replicates and episodes together"


def _settings(result: EvalResult) -> list[str]:
    """How cells read, the budgets and the adaptation lrs (chosen or learned)."""
    how = (f"{N_BOOTSTRAP} stratified bootstrap resamples over episodes, by task" if result.n_replicates == 1
           else f"the variance between its {result.n_replicates} replicates and between episodes (a Student-t "
           "interval, docs/evaluation.md)")
    scored = result.scored_steps()
    present = {name for r in result.records for name in r.metrics}
    at = "" if scored == list(range(result.max_steps + 1)) else f" (scored after {scored})"
    lines = [
        f"Seeds (episode draws): {result.n_seeds}. Adaptation: {result.inner.inner_optimizer}, "
        f"clip norm {result.inner.inner_clip_norm}, 0..{result.max_steps} steps on the support set{at}; "
        f"cells are `mean [95% interval] (worst seed)`: the mean over episodes, its interval from "
        f"{how}, and the worst seed value (the lowest of a metric where higher is better, the highest "
        "of one where lower is). Every method is scored on the same episodes. Metrics: "
        + "; ".join(f"{m.name}, {m.description or 'registered'} ({'higher' if m.higher_is_better else 'lower'} "
                    "is better)" for m in METRICS.values() if m.name in present) + ".",
        "",
    ]
    if result.notes:
        lines += ["## Budgets", "", *(f"- {n}" for n in result.notes), ""]
    if result.inner_lrs and result.lr_selection is None:  # chosen ones are in the lr table
        lines.append(
            "Adaptation lr per method: "
            + ", ".join(f"{m} {lr:g}" for m, lr in result.inner_lrs.items())
            + " (fixed, not selected)."
        )
        lines.append("")
    for m, learned in result.step_sizes.items():
        ordered = sorted(learned)
        lines += [
            f"{m} adapts with its learned step sizes, one per adapter tensor ({len(learned)})"
            f"{' of replicate 0' if result.n_replicates > 1 else ''}: "
            f"min {ordered[0]:.3g}, median {ordered[len(ordered) // 2]:.3g}, max {ordered[-1]:.3g}.",
            "",
        ]
    return lines


def _differences(result: EvalResult) -> list[str]:
    """Paired differences against the baselines that were evaluated, one table per family."""
    comparisons = {(c.method, c.baseline, c.family): c for c in result.comparisons()}
    baselines = [b for b in (MULTITASK, IN_CONTEXT) if b in result.methods]
    if not baselines:
        return []
    lines = [
        "## Paired differences at each method's headline step",
        "",
        "A method's headline step is the most adaptation steps it was scored at (0 for methods "
        "that do not adapt). Differences above 0 favour the method in "
        + ", ".join(m.name for m in METRICS.values() if m.higher_is_better) + "; below 0 in "
        + ", ".join(m.name for m in METRICS.values() if not m.higher_is_better)
        + "; **bold**: the 95% interval excludes 0.",
        "",
    ]
    for fam in result.families():
        present = {name for c in comparisons.values() if c.family == fam for name in c.metrics}
        names = [name for name in METRICS if name in present]
        cols = [f"{metric} vs {b}" for metric in names for b in baselines]
        lines += [f"### {fam}", "", "| method | " + " | ".join(cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for m in result.methods:
            cells = [_difference(comparisons.get((m, b, fam)) if m != b else None, metric)
                     for metric in names for b in baselines]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _score_tables(result: EvalResult) -> list[str]:
    """Per family, a method x adaptation-steps table of every registered metric its cells have."""
    steps = result.scored_steps()
    summary = result.summary()
    header = "| method | " + " | ".join(f"{s} step{'' if s == 1 else 's'}" for s in steps) + " |"
    rule = "|---|" + "---|" * len(steps)
    lines: list[str] = []
    for fam in result.families():
        n_eps = max((c.n_episodes for m in summary.values() for c in m.get(fam, {}).values()), default=0)
        present = {name for m in summary.values() for c in m.get(fam, {}).values() for name in c.metrics}
        for metric in (name for name in METRICS if name in present):
            lines += [f"## {fam}: query {metric} ({n_eps} episodes)", "", header, rule]
            for m in result.methods:
                cells = []
                for s in steps:
                    cell = summary.get(m, {}).get(fam, {}).get(s)
                    cells.append(
                        "-"
                        if cell is None or metric not in cell.metrics
                        else f"{_interval(cell.interval(metric))} ({_fmt(cell.worst(metric))})"
                    )
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
            lines.append("")
    return lines


def _lr_selection(result: EvalResult) -> list[str]:
    """The mean validation query loss of every lr tried, and the one chosen, per method."""
    if result.lr_selection is None:
        return []
    sel = result.lr_selection
    grid = sorted({lr for t in sel.val_loss.values() for lr in t})
    several = len(result.replicate_lrs) > 1
    lines = [
        "## Adaptation lr selection (mean validation query loss)",
        "",
        f"Chosen on validation tasks {', '.join(sel.tasks)} at {sel.steps} steps, never on held-out ones"
        + ("; losses of replicate 0, and the lr each replicate chose for its own adapters." if several else "."),
        "",
        "| method | " + " | ".join(f"lr {lr:g}" for lr in grid) + f" | chosen{' per replicate' if several else ''} |",
        "|---|" + "---|" * (len(grid) + 1),
    ]
    for m, table in sel.val_loss.items():
        cells = [_fmt(table[lr]) if lr in table else "-" for lr in grid]
        chosen = (", ".join(f"{lrs[m]:g}" for lrs in result.replicate_lrs) if several else f"{sel.chosen[m]:g}")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {chosen} |")
    lines.append("")
    return lines


def _figure(n_axes: int, width_per_axis: float = 4.5) -> tuple[Figure, list[Axes]]:
    """A figure on the Agg canvas (no pyplot, no global backend switch) with ``n_axes`` panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_per_axis * n_axes, 3.8))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, n_axes, i + 1) for i in range(n_axes)]
    return fig, axes


def plot_adaptation_curves(result: EvalResult, path: str | Path) -> Path:
    """Held-out query accuracy vs adaptation steps, one line per method, one panel per family.

    Solid lines are the mean over seeds, dotted lines of the same colour the worst seed; a method
    that does not adapt (in-context demonstrations, MetaICL) is a horizontal dashed line at its
    step-0 accuracy.

    Returns:
        The written PNG's path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fams = result.families()
    fig, axes = _figure(len(fams))
    summary = result.summary()
    steps = result.scored_steps()
    for ax, fam in zip(axes, fams):
        for i, m in enumerate(result.methods):
            cells = summary.get(m, {}).get(fam, {})
            if not cells:
                continue
            color = f"C{i % 10}"
            if list(cells) == [0]:  # does not adapt: one score, drawn across
                ax.axhline(cells[0].mean(HEADLINE), color=color, linestyle="--", label=m)
                continue
            xs = [s for s in steps if s in cells]
            ax.plot(xs, [cells[s].mean(HEADLINE) for s in xs], color=color, marker="o", label=m)
            ax.plot(xs, [cells[s].worst(HEADLINE) for s in xs], color=color, linestyle=":")
        ax.plot([], [], color="gray", linestyle=":", label="worst seed")
        ax.set_title(f"{fam} (held-out)")
        ax.set_xlabel("adaptation steps")
        ax.set_ylabel(f"query {HEADLINE}")
        ax.set_xticks(steps)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    _save_png(fig, Path(path))
    return path


def _save_png(fig: Figure, path: Path) -> None:
    """The figure as a PNG, written only where its bytes changed (a rerun rewrites nothing)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    replace_bytes(path, buf.getvalue())


NOISE_CURVE_KEYS: tuple[str, ...] = ("noise_scale", "tasks")
"""Drawn on a second axis where a method records them: B_noise and the tasks of each meta-step."""


def plot_training_curves(metrics_jsonl: str | Path, path: str | Path) -> Path:
    """Meta-training curves: outer loss and query loss before/after adaptation vs meta-step, and
    where the method records it, the meta-gradient's noise scale B_noise beside the tasks per step.

    Reads one JSON object per line; draws whichever of :data:`TRAINING_CURVE_KEYS` are present,
    against the first of :data:`STEP_KEYS` (or the line number), one panel per ``method`` (a run
    trains several methods into one file; their steps restart at 0). Lines without a curve key
    (a banner, an eval line) are skipped.

    Raises:
        ValueError: if a line before the last is not JSON or no line has any curve key.
    """
    metrics_jsonl, path = Path(metrics_jsonl), Path(path)
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for number, row in enumerate(read_json_lines(metrics_jsonl), 1):  # a torn last line is dropped
        x = next((row[k] for k in STEP_KEYS if k in row), number)
        series = panels.setdefault(str(row.get("method", "")), {})
        for key in (*TRAINING_CURVE_KEYS, *NOISE_CURVE_KEYS):
            v = row.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                xs, ys = series.setdefault(key, ([], []))
                xs.append(float(x))
                ys.append(float(v))
    panels = {m: series for m, series in panels.items() if set(series) & set(TRAINING_CURVE_KEYS)}
    if not panels:
        raise ValueError(
            f"{metrics_jsonl} has no field among {list(TRAINING_CURVE_KEYS)}: it is not a "
            "meta-training metrics file (pass the run's metrics.jsonl)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = _figure(len(panels), width_per_axis=5.0)
    for ax, (method, series) in zip(axes, panels.items()):
        for key in TRAINING_CURVE_KEYS:
            if key in series:
                xs, ys = series[key]
                ax.plot(xs, ys, label=key.replace("_", " "))
        ax.set_xlabel("meta-step")
        ax.set_ylabel("loss per answer token (nats)")
        ax.set_title(f"meta-training: {method}" if method else "meta-training")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
        if "noise_scale" in series:  # the tasks per step past which more stop paying, beside the run's
            right = ax.twinx()
            right.plot(*series["noise_scale"], color="gray", linestyle="--", label="B_noise")
            right.plot(*series["tasks"], color="gray", linestyle=":", label="tasks per meta-step")
            right.set_ylabel("tasks")
            right.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    _save_png(fig, Path(path))
    return path


def write_report(
    result: EvalResult, out_dir: str | Path, *, metrics_jsonl: str | Path | None = None
) -> dict[str, Path]:
    """Writes ``eval.json``, ``eval.md``, ``adaptation_curves.png`` (and ``training_curves.png``).

    ``eval.json`` is strict JSON: a non-finite number (a diverged lr's validation loss) is ``null``.

    Each file is written to a temporary name and renamed, so a crash never leaves a half report.

    Args:
        result: the evaluation to report.
        out_dir: folder to write into (created if missing).
        metrics_jsonl: the run's meta-training metrics; when given, its curves are plotted too.

    Returns:
        Name -> path of every file written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}

    def _write_text(name: str, text: str) -> None:
        paths[name] = replace_text(out / name, text)

    _write_text("eval.json", dumps_strict(result.to_dict(), indent=2) + "\n")
    _write_text("eval.md", format_markdown(result))
    for name, draw in (
        ("adaptation_curves.png", lambda p: plot_adaptation_curves(result, p)),
        *(
            [("training_curves.png", lambda p: plot_training_curves(metrics_jsonl, p))]
            if metrics_jsonl is not None
            else []
        ),
    ):
        tmp = out / f".{name}.tmp.png"
        try:
            draw(tmp)
        except ValueError as err:  # a damaged metrics.jsonl costs its plot, not the evaluation
            logger.warning("no %s in the report: %s", name, err)
            tmp.unlink(missing_ok=True)
            continue
        tmp.replace(out / name)
        paths[name] = out / name
    logger.info("wrote evaluation report to %s", out)
    return paths
