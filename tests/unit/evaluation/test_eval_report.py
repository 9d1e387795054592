"""The report: eval.json / eval.md carry EvalResult's numbers; the plots are valid PNGs."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.evaluation import IN_CONTEXT, EpisodeRecord, EvalResult, LrSelection
from fmmeta.evaluation.report import format_markdown, plot_training_curves, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CELL = r"(\S+) \[(\S+), (\S+)\] \((\S+)\)"
"""A table cell: ``mean [low, high] (worst)``."""


def _result() -> EvalResult:
    recs: list[EpisodeRecord] = []
    for m_i, method in enumerate(["base", "fomaml", IN_CONTEXT]):
        for seed in range(3):
            for fam_i, fam in enumerate(["classification", "generation"]):
                for step in [0] if method == IN_CONTEXT else [0, 1, 2]:
                    acc = min(1.0, 0.1 * (m_i + 1) + 0.2 * step + 0.05 * seed + 0.1 * fam_i)
                    loss = 3.0 - 0.5 * step - 0.3 * m_i + 0.1 * seed + 0.2 * fam_i
                    recs.append(EpisodeRecord(method=method, seed=seed, episode=fam_i, task=f"t{fam_i}",
                                              kind=fam, step=step, metrics={"loss": loss, "accuracy": acc}, n=4))
    sel = LrSelection(chosen={"base": 0.1, "fomaml": 0.03},
                      val_loss={"base": {0.03: 2.5, 0.1: 2.0}, "fomaml": {0.03: 1.5, 0.1: math.inf}},
                      steps=2, tasks=("val_a", "val_b"))
    return EvalResult(records=recs, methods=["base", "fomaml", IN_CONTEXT], max_steps=2, n_seeds=3,
                      inner_lrs=sel.chosen, inner=InnerLoopConfig(), lr_selection=sel)


def _table(md: str, title: str) -> dict[str, list[str]]:
    """Rows of the markdown table under the heading that starts with ``title``: method -> cells."""
    block = md.split(f"{title}", 1)[1].split("\n#", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in rows}


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(np.std(img)) > 0.01  # something was drawn


def test_report_files_carry_the_result_numbers(tmp_path: Path) -> None:
    res = _result()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        json.dumps({"event": "banner", "world_size": 1}) + "\n"
        + "".join(json.dumps({"step": s, "outer_loss": 3.0 - 0.1 * s, "query_loss_before": 3.2 - 0.1 * s,
                              "query_loss_after": 2.9 - 0.1 * s}) + "\n" for s in range(10))
    )
    paths = write_report(res, tmp_path / "eval", metrics_jsonl=metrics)
    assert set(paths) == {"eval.json", "eval.md", "adaptation_curves.png", "training_curves.png"}
    assert not list((tmp_path / "eval").glob(".*tmp*"))

    data = json.loads(paths["eval.json"].read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    summary = res.summary()
    for m, by_fam in summary.items():
        for fam, by_step in by_fam.items():
            for step, cell in by_step.items():
                got = data["summary"][m][fam][str(step)]
                assert got["accuracy_mean"] == pytest.approx(cell.mean("accuracy"))
                assert got["accuracy_worst"] == pytest.approx(cell.worst("accuracy"))
                assert got["loss_mean"] == pytest.approx(cell.mean("loss"))
                assert got["loss_worst"] == pytest.approx(cell.worst("loss"))
    assert len(data["records"]) == len(res.records) and data["inner_lrs"] == {"base": 0.1, "fomaml": 0.03}
    assert data["lr_selection"]["val_loss"]["fomaml"]["0.1"] is None  # inf -> null: strict JSON

    md = paths["eval.md"].read_text()
    assert md == format_markdown(res)
    for fam in ("classification", "generation", "overall"):
        acc = _table(md, f"## {fam}: query accuracy (")
        loss = _table(md, f"## {fam}: query loss (")
        assert set(acc) == {"base", "fomaml", IN_CONTEXT}
        for m in ("base", "fomaml"):
            for step in (0, 1, 2):
                cell = summary[m][fam][step]
                for metric, text in (("accuracy", acc[m][step]), ("loss", loss[m][step])):
                    mean, low, high, worst = map(float, re.fullmatch(CELL, text).groups())
                    interval = cell.interval(metric)
                    assert mean == pytest.approx(cell.mean(metric), abs=5e-4)
                    assert (low, high) == pytest.approx((interval.low, interval.high), abs=5e-4)
                    assert worst == pytest.approx(cell.worst(metric), abs=5e-4)
        assert acc[IN_CONTEXT][1:] == ["-", "-"]
    # the worst case really differs from the mean in this data, so the test can tell them apart
    assert summary["base"]["overall"][0].worst("accuracy") < summary["base"]["overall"][0].mean("accuracy")
    # paired differences against in-context: the numbers of EvalResult.compare, bold if they exclude 0
    diffs = _table(md, "### overall\n")
    c = res.compare("fomaml", IN_CONTEXT)
    text = diffs["fomaml"][0]
    assert text.startswith("**") == c.interval("accuracy").excludes_zero
    est, low, high = map(float, re.fullmatch(r"\**(\S+) \[(\S+), (\S+)\]\**", text).groups())
    assert (est, low, high) == pytest.approx((c.interval("accuracy").estimate, c.interval("accuracy").low, c.interval("accuracy").high), abs=5e-4)
    assert diffs[IN_CONTEXT] == ["-", "-"]
    assert data["comparisons"][0]["accuracy"]["estimate"] == pytest.approx(res.comparisons()[0].interval("accuracy").estimate)
    lr_rows = _table(md, "## Adaptation lr selection (mean validation query loss)")
    assert lr_rows["fomaml"] == ["1.500", "inf", "0.03"] and lr_rows["base"][-1] == "0.1"
    _assert_png(paths["adaptation_curves.png"])
    _assert_png(paths["training_curves.png"])


def test_training_curves_reject_a_file_without_curves(tmp_path: Path) -> None:
    bad = tmp_path / "metrics.jsonl"
    bad.write_text(json.dumps({"step": 1, "tokens_per_s": 10.0}) + "\n")
    with pytest.raises(ValueError, match="has no field among"):
        plot_training_curves(bad, tmp_path / "x.png")
    good = json.dumps({"method": "fomaml", "step": 0, "outer_loss": 2.5}) + "\n"
    bad.write_text("{not json\n" + good)
    with pytest.raises(ValueError, match=":1 is not JSON"):
        plot_training_curves(bad, tmp_path / "x.png")
    # A torn last line (a write cut short by a kill) is dropped, not fatal: the run rewrites it.
    bad.write_text(good + good.replace("0", "1")[:25])
    _assert_png(plot_training_curves(bad, tmp_path / "x.png"))


def test_training_curves_draw_one_panel_per_method(tmp_path) -> None:
    """A run trains several methods into one metrics.jsonl; their steps restart at 0, so one
    line across methods would zig-zag back. Each method gets its own panel."""
    import json as _json
    import struct

    def png_width(path) -> int:
        return struct.unpack(">I", path.read_bytes()[16:20])[0]

    rows = [{"method": m, "step": s, "outer_loss": 3.0 - 0.1 * s} for m in ("a", "b", "c") for s in range(4)]
    three, one = tmp_path / "three.jsonl", tmp_path / "one.jsonl"
    three.write_text("".join(_json.dumps(r) + "\n" for r in rows))
    one.write_text("".join(_json.dumps(r) + "\n" for r in rows if r["method"] == "a"))
    from fmmeta.evaluation.report import plot_training_curves

    w3 = png_width(plot_training_curves(three, tmp_path / "three.png"))
    w1 = png_width(plot_training_curves(one, tmp_path / "one.png"))
    assert w3 == 3 * w1


def test_the_report_opens_with_what_holds_over_replicates_or_says_the_adapters_are_fixed() -> None:
    """Three replicates of a method that beats the baseline by 0.2 on every episode, give or take:
    the headline counts the replicates for each side and says it holds; one replicate's report
    says its intervals hold the adapters fixed."""
    from fmmeta.evaluation.result import merge_replicates

    rng = np.random.default_rng(0)
    hard = np.random.default_rng(1).normal(0, 0.05, (3, 8))  # an episode's own effect, the same in every replicate

    def one(shift: float) -> EvalResult:
        recs = [EpisodeRecord(method=m, seed=s, episode=e, task=f"t{e % 4}", kind="classification", step=2,
                              n=4, metrics={"loss": 1.0, "accuracy": float(
                                  np.clip(base + (m == "fomaml") * hard[s, e] + rng.normal(0, 0.02), 0, 1))})
                for m, base in (("multitask", 0.4), ("fomaml", 0.6 + shift)) for s in range(3) for e in range(8)]
        return EvalResult(records=recs, methods=["fomaml", "multitask"], max_steps=2, n_seeds=3,
                          inner_lrs={"fomaml": 0.1, "multitask": 0.1}, inner=InnerLoopConfig())

    three = merge_replicates([one(0.0), one(0.03), one(-0.02)], [0, 1, 2])
    md = format_markdown(three)
    assert md.index("## What holds") < md.index("Seeds (episode draws)")
    assert "3 training replicates (training seeds 0, 1, 2), each scored on the same episodes" in md
    assert "- fomaml above multitask on classification: +0.2" in md and "3 of 3 replicates agree" in md
    row = next(line for line in md.splitlines() if line.startswith("| fomaml - multitask | classification"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[3] == "3 / 0" and cells[4] == "yes"
    training, episode = (float(x) for x in cells[5].split(" / "))
    assert 0 < training < 0.1 and 0 < episode < 0.2 and float(cells[6]) > 0
    single = format_markdown(one(0.0))
    assert "One training replicate: every interval holds the trained adapters fixed" in single
    row = next(line for line in single.splitlines() if line.startswith("| fomaml - multitask"))
    assert "| - |" in row and "(episodes only)" in row


def test_an_eval_json_reads_back_to_the_same_report(tmp_path: Path) -> None:
    res = _result()
    paths = write_report(res, tmp_path)
    again = EvalResult.from_dict(json.loads(paths["eval.json"].read_text()))
    assert format_markdown(again) == format_markdown(res)
    assert again.lr_selection is not None and again.lr_selection.val_loss["fomaml"][0.1] == math.inf


def test_tasks_where_no_method_leaves_chance_are_named_and_kept_out_of_the_headline() -> None:
    """Two-way tasks: on 'coin' every method sits near 0.5, on 'easy' fomaml is far above it and
    multitask near it; the headline's comparison is made on 'easy' alone."""
    rng = np.random.default_rng(0)
    recs = []
    for method, easy in (("fomaml", 0.9), ("multitask", 0.55)):
        for task, mean in (("coin", 0.5), ("easy", easy)):
            for seed in range(3):
                for episode in range(8):
                    acc = float(np.clip(mean + rng.normal(0, 0.1), 0, 1))
                    recs.append(EpisodeRecord(method=method, seed=seed, episode=episode, task=task,
                                              kind="classification", step=1, metrics={"loss": 1.0, "accuracy": acc}, n=8,
                                              chance=0.5))
    result = EvalResult(records=recs, methods=["fomaml", "multitask"], max_steps=1, n_seeds=3,
                        inner_lrs={}, inner=InnerLoopConfig())
    assert result.at_chance() == {"coin": 0.5}
    headline = format_markdown(result).split("## What holds", 1)[1].split("\n## ", 1)[0]
    assert "At chance, kept out of this section: coin (chance 0.50)" in headline
    (c,) = [c for c in result.without_tasks(["coin"]).comparisons() if c.family == "classification"]
    assert f"{c.interval('accuracy').estimate:+.3f}" in headline  # the comparison on 'easy' alone
    everything = [c for c in result.comparisons() if c.family == "classification"][0]
    assert f"{everything.interval('accuracy').estimate:+.3f}" not in headline


def test_summary_keys_come_in_the_same_order_in_every_process() -> None:
    """eval.json's summary is the same bytes whatever the process's string hashing (it iterated
    a set of family names, so two runs with equal scores wrote their keys in different orders)."""
    import subprocess
    import sys

    code = (
        "import json\n"
        "from fmmeta.evaluation.result import EpisodeRecord, summarise\n"
        "records = [EpisodeRecord(method=m, seed=s, episode=0, task=t, kind=k, family=f, step=0,\n"
        "                         metrics={'loss': 1.0 + s, 'accuracy': 0.5}, n=2) for m in ('a', 'b') for s in range(3)\n"
        "           for t, k, f in (('t1', 'classification', 'fam-x'), ('t2', 'generation', 'fam-y'))]\n"
        "print(json.dumps({m: list(v) for m, v in summarise(records).items()}))\n"
    )
    outputs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(seed)},
                              capture_output=True, text=True, check=True).stdout for seed in range(6)}
    assert len(outputs) == 1, outputs
    assert json.loads(outputs.pop())["a"] == ["overall", "classification", "fam-x", "generation", "fam-y"]


def test_an_out_of_format_family_is_scored_apart_against_the_base_model(tmp_path: Path) -> None:
    """A method that leads the base model on the suite's own families and trails it on the out-of-format
    family: the headline lists the second apart, with the paired difference computed by hand."""
    rng = np.random.default_rng(0)
    recs = []
    for method, own, shifted in (("base", 0.5, 0.8), ("reptile", 0.8, 0.4), (IN_CONTEXT, 0.5, 0.6)):
        for task, family, mean in (("langid", "cldr-langid", own), ("words-1", "word-categories", shifted)):
            for seed in range(3):
                for episode in range(6):
                    acc = float(np.clip(mean + rng.normal(0, 0.05), 0, 1))
                    recs.append(EpisodeRecord(method=method, seed=seed, episode=episode, task=task, family=family,
                                              kind="classification", step=0, metrics={"loss": 1.0, "accuracy": acc}, n=6))
    result = EvalResult(records=recs, methods=["base", "reptile", IN_CONTEXT], max_steps=0, n_seeds=3,
                        inner_lrs={}, inner=InnerLoopConfig(), format_shift=["word-categories"])
    by_hand = {m: np.mean([r.metrics["accuracy"] for r in recs if r.method == m and r.family == "word-categories"])
               for m in ("base", "reptile")}
    (c, icl) = result.against_base()
    assert (c.method, c.baseline, c.family) == ("reptile", "base", "word-categories")
    assert c.interval("accuracy").estimate == pytest.approx(by_hand["reptile"] - by_hand["base"]) and c.interval("accuracy").high < 0
    md = format_markdown(result)
    headline = md.split("## What holds", 1)[1].split("\n## ", 1)[0]
    assert "Out of format (word-categories: a template and label words no meta-training task has)" in headline
    assert f"| reptile | word-categories | {c.interval('accuracy').estimate:+.3f}" in headline and "yes, below |" in headline
    assert icl.method == IN_CONTEXT
    paths = write_report(result, tmp_path)
    raw = json.loads(paths["eval.json"].read_text())
    assert raw["format_shift"] == ["word-categories"] and raw["against_base"][0]["method"] == "reptile"
    assert format_markdown(EvalResult.from_dict(raw)) == md


def test_the_comparisons_per_kind_leave_the_out_of_format_tasks_out() -> None:
    recs = [EpisodeRecord(method=m, seed=s, episode=e, task=t, family=f, kind="classification", step=0,
                          metrics={"loss": 1.0, "accuracy": acc}, n=4)
            for m, own, shifted in (("reptile", 0.9, 0.1), ("multitask", 0.5, 0.9), ("base", 0.5, 0.9))
            for t, f, acc in (("langid", "cldr-langid", own), ("words-1", "word-categories", shifted))
            for s in range(3) for e in range(4)]
    result = EvalResult(records=recs, methods=["base", "reptile", "multitask"], max_steps=0, n_seeds=3,
                        inner_lrs={}, inner=InnerLoopConfig(), format_shift=["word-categories"])
    headline = format_markdown(result).split("## What holds", 1)[1].split("\n## ", 1)[0]
    assert "- reptile above multitask on classification: +0.400" in headline  # langid alone
    assert "| reptile | word-categories | -0.800" in headline


def test_training_curves_draw_the_noise_scale_beside_the_tasks_per_step(tmp_path, monkeypatch) -> None:
    """A method that records B_noise gets a second axis with it and its tasks per step; one that
    records none (multi-task) is drawn as before."""
    import matplotlib.axes

    from fmmeta.evaluation.report import plot_training_curves

    drawn: list[str] = []
    plot = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):  # noqa: ANN001, ANN202 - matplotlib's signature
        drawn.append(str(kwargs.get("label")))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    rows = [{"method": "fomaml", "step": s, "outer_loss": 3.0 - 0.1 * s, "tasks": 4, "noise_scale": 10.0 + s}
            for s in range(4)] + [{"method": "multitask", "step": s, "outer_loss": 3.0, "tasks": 4} for s in range(4)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_training_curves(tmp_path / "m.jsonl", tmp_path / "m.png")
    assert drawn == ["outer loss", "B_noise", "tasks per meta-step", "outer loss"]
    (tmp_path / "n.jsonl").write_text(json.dumps({"step": 0, "noise_scale": 3.0, "tasks": 4}) + "\n")
    with pytest.raises(ValueError, match="has no field among"):
        plot_training_curves(tmp_path / "n.jsonl", tmp_path / "n.png")
