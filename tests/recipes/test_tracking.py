"""train.report_to=tensorboard on real runs: the event files hold what metrics.jsonl holds, the
evaluation's report and plots, written by rank 0 only; library warnings show once per run."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.recipes import _recipe

pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install fmmeta[tracking])")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

SHORT_EVAL = [
    "methods=[fomaml]", "train.meta_steps=3", "train.checkpoint_every=0", "engine.collective_timeout_s=60",
    "train.report_to=tensorboard", "eval.seeds=1", "eval.max_steps=1", "eval.lr_grid=[0.1]",
]


def _events(folder: Path) -> EventAccumulator:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return acc


@pytest.mark.timeout(300)
def test_tensorboard_gets_every_metrics_line_and_the_evaluation(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _recipe.run("python", [*SHORT_EVAL, f"output_dir={out}"], timeout_s=240)
    records = _recipe.records(out / "metrics.jsonl")
    train = _events(out / "tensorboard" / "fomaml")
    tags = set(train.Tags()["scalars"])
    for key in ("outer_loss", "query_loss_after", "grad_norm", "lr", "tokens", "tokens_per_s", "data_wait_fraction"):
        assert f"train/{key}" in tags, (key, sorted(tags))
        logged = [(e.step, e.value) for e in train.Scalars(f"train/{key}")]
        assert [s for s, _ in logged] == [r["step"] for r in records], key
        assert [v for _, v in logged] == pytest.approx([r[key] for r in records], rel=1e-6), key  # float32
    assert [r["step"] for r in records] == [0, 1, 2]
    evaluation = _events(out / "tensorboard" / "eval")
    assert set(evaluation.Tags()["images"]) == {"eval/adaptation_curves", "eval/training_curves"}
    report = evaluation.Tensors("eval/report/text_summary")[0].tensor_proto.string_val[0].decode()
    assert report == (out / "eval" / "eval.md").read_text()


@pytest.mark.timeout(300)
def test_two_ranks_one_writer_and_each_library_warning_once(deepspeed_short: Path, deepspeed_short_log: str) -> None:
    """Under deepspeed with 2 ranks only rank 0 writes events, and a library warning (torch's
    deprecated collectives warn on every meta-step of every rank) is printed once in all. Read off
    the shared deepspeed run: 8 meta-steps with ``train.report_to=tensorboard``."""
    (events,) = (deepspeed_short / "tensorboard" / "fomaml").glob("events.out.tfevents.*")
    assert [e.step for e in _events(events.parent).Scalars("train/outer_loss")] == list(range(8))
    assert "world size 2 | ZeRO stage 3" in deepspeed_short_log, deepspeed_short_log[-3000:]
    warned = Counter(m.group(0) for m in re.finditer(r"\w+Warning: .*", deepspeed_short_log))
    assert all(n == 1 for n in warned.values()), warned.most_common(3)
    assert "[rank1] WARNING py.warnings" not in deepspeed_short_log
