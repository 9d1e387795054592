"""train.report_to: the config key, the records trackers get, TensorBoard files read back, wandb
offline, and the missing-package error naming the extra."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fmmeta.config import ConfigError, load_config
from fmmeta.recipe_config import RecipeConfig
from fmmeta.tracking import MetricsLog, open_trackers, report_evaluation, tracker_names
from fmmeta.tracking.records import evaluation_rows, step_scalars


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(RecipeConfig, None, list(overrides))
    return err.value.problems


def test_report_to_names() -> None:
    assert tracker_names("none") == ()
    assert tracker_names("tensorboard") == ("tensorboard",)
    assert tracker_names(("wandb", "tensorboard", "wandb")) == ("wandb", "tensorboard")
    assert load_config(RecipeConfig, None, []).train.report_to == "none"


def test_report_to_refuses_unknown_trackers_and_none_with_others() -> None:
    (problem,) = _problems("train.report_to=tensorbord")
    assert problem.startswith("train.report_to='tensorbord' is invalid") and "did you mean 'tensorboard'?" in problem
    (problem,) = _problems("train.report_to=[none,tensorboard]")
    assert "'none' cannot be listed with a tracker" in problem


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_missing_tracker_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, tracker: str) -> None:
    monkeypatch.setitem(sys.modules, tracker, None)  # `import tracker` fails, find_spec finds nothing
    (problem,) = _problems(f"train.report_to=[{tracker}]")
    assert problem.startswith("train.report_to=") and f"needs the '{tracker}' package" in problem
    assert "pip install fmmeta[tracking]" in problem and "train.report_to=none" in problem


def test_step_scalars_tags_numbers_and_per_rank_lists() -> None:
    record = {"method": "fomaml", "step": 3, "outer_loss": 2.5, "tasks": 4, "grad_norm": float("nan"),
              "step_s_per_rank": [1.0, 2.0], "skipped": 0.0, "flag": True, "hosts": ["a", "b"]}
    assert step_scalars(record) == {
        "train/outer_loss": 2.5, "train/tasks": 4.0, "train/skipped": 0.0,
        "per_rank/step_s_per_rank/rank0": 1.0, "per_rank/step_s_per_rank/rank1": 2.0,
    }


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _record(step: int, loss: float) -> dict:
    return {"method": "fomaml", "step": step, "outer_loss": loss, "tokens": 100 + step}


def test_metrics_log_feeds_tensorboard_and_a_resume_hides_the_dropped_steps(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path, rank=0, method="fomaml", keep_until=-1,
                    trackers=open_trackers("tensorboard", tmp_path, run="fomaml", first_step=0, rank=0)) as log:
        for step in range(4):
            log.write(_record(step, 3.0 - step))
    # Resumed from the checkpoint after step 1: steps 2 and 3 run again with other values.
    with MetricsLog(path, rank=0, method="fomaml", keep_until=1,
                    trackers=open_trackers(["tensorboard"], tmp_path, run="fomaml", first_step=2, rank=0)) as log:
        for step in (2, 3):
            log.write(_record(step, 10.0 + step))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    expected = [(r["step"], float(r["outer_loss"])) for r in lines]
    assert expected == [(0, 3.0), (1, 2.0), (2, 12.0), (3, 13.0)]
    scalars = _scalars(tmp_path / "tensorboard" / "fomaml")
    assert sorted(scalars) == ["train/outer_loss", "train/tokens"]
    assert scalars["train/outer_loss"] == expected  # the file and TensorBoard agree
    assert [s for s, _ in scalars["train/tokens"]] == [0, 1, 2, 3]


def test_other_ranks_open_no_tracker(tmp_path: Path) -> None:
    assert open_trackers(("tensorboard", "wandb"), tmp_path, run="fomaml", first_step=0, rank=1) == []
    log = MetricsLog(tmp_path / "metrics.jsonl", rank=1, method="fomaml", keep_until=-1)
    log.write(_record(0, 1.0))
    assert not any(tmp_path.iterdir())


def _eval_files(folder: Path) -> dict[str, Path]:
    folder.mkdir()
    cell = {"accuracy_interval": {"estimate": 0.5, "low": 0.25, "high": 0.75, "n": 4}, "accuracy_worst": 0.25,
            "loss_interval": {"estimate": 1.5, "low": 1.0, "high": 2.0, "n": 4}, "n_episodes": 4}
    (folder / "eval.json").write_text(json.dumps({"summary": {"fomaml": {"overall": {"0": cell, "1": cell}}}}))
    (folder / "eval.md").write_text("# Held-out evaluation\n\n| method | acc |\n|---|---|\n| fomaml | 0.5 |\n")
    pixels = np.zeros((20, 30, 3), dtype=np.uint8)
    pixels[:, :10, 0] = 255
    Image.fromarray(pixels).save(folder / "adaptation_curves.png")
    return {name: folder / name for name in ("eval.json", "eval.md", "adaptation_curves.png")}


def test_evaluation_report_goes_to_tensorboard_as_text_and_image(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    paths = _eval_files(tmp_path / "eval")
    assert [(r["method"], r["step"], r["accuracy_low"]) for r in evaluation_rows(paths["eval.json"])] == [
        ("fomaml", 0, 0.25), ("fomaml", 1, 0.25)]
    report_evaluation("tensorboard", tmp_path, paths, rank=0)
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "eval"))
    acc.Reload()
    (image,) = acc.Images("eval/adaptation_curves")
    assert (image.width, image.height) == (30, 20)
    decoded = np.asarray(Image.open(__import__("io").BytesIO(image.encoded_image_string)))
    assert decoded[0, 0, 0] == 255 and decoded[0, 20, 0] == 0
    text = acc.Tensors("eval/report/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| fomaml | 0.5 |" in text


def test_wandb_offline_writes_its_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed (pip install fmmeta[tracking])")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default must be offline
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog(tmp_path / "metrics.jsonl", rank=0, method="fomaml", keep_until=-1,
                     trackers=open_trackers("wandb", tmp_path, run="fomaml", first_step=0, rank=0))
    with log:
        for step in range(3):
            log.write(_record(step, 3.0 - step))
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (data,) = run_dir.glob("run-*.wandb")
    # wandb has no reader for its offline log: look for the logged values in its protobuf records
    # (history items: key, then field 16 holding the value as JSON; the summary repeats the last).
    found = re.findall(rb"train/outer_loss\x82\x01.([0-9.]+)", data.read_bytes(), flags=re.DOTALL)
    assert [float(v) for v in dict.fromkeys(found)] == [3.0, 2.0, 1.0]
