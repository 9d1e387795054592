"""scripts/plot_run.py: a curve equal to the query loss after adaptation at every meta-step is left
out of its method's panel, a curve that differs anywhere stays whole, and the PNG is written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "plot_run.py"


def _script():
    spec = importlib.util.spec_from_file_location("plot_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records() -> list[dict]:
    rows = []
    for step in range(3):
        after = 3.0 - step
        # fomaml: outer loss is the query loss after; adapting lowers the loss, so before differs.
        rows.append({"method": "fomaml", "step": step, "outer_loss": after,
                     "query_loss_before": after + 1.0, "query_loss_after": after})
        # multitask: does not adapt, so before == after == outer.
        rows.append({"method": "multitask", "step": step, "outer_loss": after,
                     "query_loss_before": after, "query_loss_after": after})
        # reptile: the outer loss differs at one step only: the whole curve stays.
        rows.append({"method": "reptile", "step": step, "outer_loss": after + (0.5 if step == 1 else 0.0),
                     "query_loss_before": after + 1.0, "query_loss_after": after})
    return rows


def test_repeated_curves_are_dropped_per_method_and_only_when_equal_everywhere() -> None:
    script = _script()
    records, dropped = script.without_repeated_curves(_records())
    assert dropped == {"fomaml": ["outer_loss"], "multitask": ["outer_loss", "query_loss_before"], "reptile": []}
    by_method: dict[str, set[str]] = {}
    for r in records:
        by_method.setdefault(r["method"], set()).update(r)
    assert "outer_loss" not in by_method["fomaml"] and "query_loss_before" in by_method["fomaml"]
    assert not {"outer_loss", "query_loss_before"} & by_method["multitask"]
    assert {"outer_loss", "query_loss_before", "query_loss_after"} <= by_method["reptile"]
    assert [r["query_loss_after"] for r in records] == [r["query_loss_after"] for r in _records()]


def test_main_writes_the_png_and_names_what_it_left_out(tmp_path: Path, capsys) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    png = tmp_path / "curves.png"
    assert _script().main([str(metrics), str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "multitask: not drawn, equal to query_loss_after at every meta-step: outer_loss, query_loss_before" in out
    assert "reptile:" not in out
    assert metrics.read_text().count("outer_loss") == 9  # the input is left as it was
