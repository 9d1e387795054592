"""The smoke config end to end in one process, as a user runs it: ``python recipes/train.py``.

One run (all three methods, checkpoints, held-out evaluation) is shared by every assertion here.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from fmmeta.config import load_config
from fmmeta.models import build_model_and_tokenizer
from fmmeta.recipe_config import RecipeConfig
from tests.recipes import _recipe

SMOKE = load_config(RecipeConfig, _recipe.SMOKE)
METHODS = SMOKE.methods
STEPS = SMOKE.train.meta_steps
TASKS = SMOKE.sampler.meta_batch_size


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("smoke") / "run"
    return out, _recipe.run("python", [f"output_dir={out}"], timeout_s=180)


@pytest.mark.timeout(240)
def test_config_yaml_loads_back_to_the_same_config(smoke) -> None:
    out, proc = smoke
    assert proc.returncode == 0
    written = load_config(RecipeConfig, out / "config.yaml")
    assert written == load_config(RecipeConfig, _recipe.SMOKE, [f"output_dir={out}"])
    assert written.methods == RecipeConfig().methods and written.model.tiny


@pytest.mark.timeout(240)
def test_metrics_one_finite_line_per_method_and_step(smoke) -> None:
    out, _ = smoke
    recs = _recipe.records(out / "metrics.jsonl")
    assert [(r["method"], r["step"]) for r in recs] == [(m, s) for m in METHODS for s in range(STEPS)]
    for r in recs:
        for key in ("outer_loss", "query_loss_after", "tokens_per_s", "padding_efficiency",
                    "data_wait_fraction", "grad_norm"):
            assert isinstance(r[key], float) and math.isfinite(r[key]), (key, r)
        # The recipe measures it by default (algorithm.measure_query_before=true).
        assert isinstance(r["query_loss_before"], float) and math.isfinite(r["query_loss_before"])
        assert 0 < r["padding_efficiency"] <= 1 and r["tasks"] == TASKS and r["tokens"] > 0
        assert 0 < r["outer_loss"] < 10  # a byte-level LM starts near ln(vocab)
    # Meta-training learns something: every method ends with a lower outer loss than it started.
    for m in METHODS:
        first, last = (r["outer_loss"] for r in (recs[METHODS.index(m) * STEPS], recs[METHODS.index(m) * STEPS + STEPS - 1]))
        assert last < first, (m, first, last)


@pytest.mark.timeout(240)
def test_log_shows_banner_and_one_line_per_step(smoke) -> None:
    _, proc = smoke
    log = proc.stdout
    for m in METHODS:
        banner = re.search(rf"== {m} \| model tiny-llama.*\| params trainable ([\d,]+) / total ([\d,]+)"
                           rf".*\| world size 1 .*\| tasks per meta-step {TASKS} \(~{TASKS}\.0 per rank, packed into passes"
                           rf" of \d+ x longest sequence tokens, padding-free\)", log)
        assert banner, f"no banner for {m}:\n{log[-3000:]}"
        # Meta-steps are numbered from 0 everywhere (log, metrics.jsonl, step_XXXXXXXX), with
        # the count done in brackets.
        lines = re.findall(rf"^{m} meta-step (\d+) \((\d+)/{STEPS}\) \| outer [\d.]+ \| query \S+ -> [\d.]+"
                           r" \| \d+ tok, \d+ tok/s \| pad eff [\d.]+ \| data wait [\d.]+%", log, flags=re.M)
        assert lines == [(str(s), str(s + 1)) for s in range(STEPS)], (m, lines)
    assert "done in" in log and "Traceback" not in log


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", METHODS)
def test_adapter_is_peft_format_and_reloads_with_its_trained_logits(smoke, method: str) -> None:
    from peft import PeftModel

    torch.set_num_threads(1)
    out, _ = smoke
    folder = out / method / "adapter"
    assert json.loads((folder / "adapter_config.json").read_text())["peft_type"] == "LORA"
    tensors = _recipe.adapter(folder)
    assert tensors and all(t.numel() > 0 for t in tensors.values())  # the empty-save trap
    assert any(k.endswith("lora_B.weight") and t.abs().max() > 0 for k, t in tensors.items())  # trained

    cfg = load_config(RecipeConfig, out / "config.yaml")
    base, _ = build_model_and_tokenizer(cfg.model)
    ids = torch.arange(3, 40).reshape(1, -1) % base.config.vocab_size
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
        # The reference by hand: W + scaling * B @ A folded into a fresh copy of the base.
        by_hand, _ = build_model_and_tokenizer(cfg.model)
        weights = dict(by_hand.named_parameters())
        scaling = cfg.lora.alpha / cfg.lora.r
        folded = 0
        for key, a in tensors.items():
            if not key.endswith("lora_A.weight"):
                continue
            b = tensors[key.replace("lora_A", "lora_B")]
            target = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            weights[target].add_(scaling * (b @ a))
            folded += 1
        assert folded == len(tensors) // 2 > 0
        expected = by_hand(input_ids=ids).logits
        reloaded = PeftModel.from_pretrained(base, folder)(input_ids=ids).logits
    torch.testing.assert_close(reloaded, expected, rtol=1e-5, atol=1e-5)
    assert (reloaded - base_logits).abs().max() > 1e-4  # the adapter changes the model


@pytest.mark.timeout(240)
def test_eval_report_json_markdown_and_valid_pngs(smoke) -> None:
    out, _ = smoke
    report = json.loads((out / "eval" / "eval.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"eval.json holds {c}: not strict JSON"))
    assert report["methods"] == ["base", "in_context", *METHODS]
    assert set(report["summary"]) == set(report["methods"])
    for rec in report["records"]:
        assert math.isfinite(rec["loss"]) and 0 <= rec["accuracy"] <= 1
    md = (out / "eval" / "eval.md").read_text()
    for m in report["methods"]:
        assert re.search(rf"^\| {m} \| ", md, flags=re.M), m
    pngs = sorted((out / "eval").glob("*.png"))
    assert len(pngs) >= 2, pngs
    for png in pngs:
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100


@pytest.mark.timeout(60)
def test_help_lists_override_keys() -> None:
    proc = _recipe.run("python", ["--help"], timeout_s=50)
    for key in ("output_dir", "methods", "model.name_or_path", "train.meta_steps", "train.resume",
                "sampler.meta_batch_size", "engine.collective_timeout_s", "eval.enabled"):
        assert re.search(rf"^\s+{re.escape(key)} \(", proc.stdout, flags=re.M), key


_REPORTS_DATASETS = """import runpy, sys
sys.argv[0] = {train!r}
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("datasets imported:", "datasets" in sys.modules, flush=True)
"""


@pytest.mark.timeout(120)
def test_a_run_on_the_built_in_suite_never_imports_datasets(tmp_path: Path) -> None:
    """``datasets`` (with pandas and pyarrow: 1.3 s of a process's start) is imported only where
    rows are read: a run on a built-in suite, training, checkpoints and evaluation, reads none."""
    script = tmp_path / "train_reporting_datasets.py"
    script.write_text(_REPORTS_DATASETS.format(train=str(_recipe.TRAIN)))
    proc = _recipe.run("python", ["methods=[fomaml,metaicl]", "train.meta_steps=2", "eval.seeds=1",
                                  "eval.max_steps=1", "eval.lr_grid=[0.1]", f"output_dir={tmp_path / 'run'}"],
                       timeout_s=100, script_path=script)
    assert "held-out evaluation" in proc.stdout and proc.stdout.rstrip().endswith("datasets imported: False"), \
        proc.stdout[-2000:]


@pytest.mark.timeout(60)
def test_bad_overrides_exit_2_listing_every_problem_before_any_model(tmp_path: Path) -> None:
    out = tmp_path / "never"
    t0 = time.perf_counter()
    proc = _recipe.run("python", [f"output_dir={out}", "trian.meta_steps=3", "train.meta_steps=abc",
                                  "sampler.meta_batch_size=-1", "algorithm.inner_stpes=2"],
                       timeout_s=50, check=False)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stdout[-3000:]
    err = proc.stdout
    assert "4 problems" in err, err
    assert "'trian'" in err and "did you mean 'train'" in err
    assert "train.meta_steps='abc'" in err and "expected int" in err
    assert "meta_batch_size=-1" in err
    assert "inner_stpes" in err and "inner_steps" in err
    # Refused before anything is built or written: no output folder, no model log line, no traceback.
    assert not out.exists()
    assert "model and" not in err and "Traceback" not in err
    assert seconds < 30, seconds  # only interpreter start and imports (~4 s on 2 busy cores)


@pytest.mark.timeout(240)
def test_the_in_context_inner_loop_end_to_end(smoke, tmp_path: Path) -> None:
    """``algorithm.inner_format=in_context``: FOMAML meta-trains on the same draws with longer,
    in-context rows; multi-task keeps its plain rows; the report says which adapted in context."""
    plain, _ = smoke
    out = tmp_path / "in_context"
    _recipe.run_here(["algorithm.inner_format=in_context", "methods=[fomaml,multitask]", f"output_dir={out}"])
    tokens = {(r["method"], r["step"]): r["tokens"] for r in _recipe.records(out / "metrics.jsonl")}
    before = {(r["method"], r["step"]): r["tokens"] for r in _recipe.records(plain / "metrics.jsonl")}
    for step in range(STEPS):
        assert tokens[("fomaml", step)] > 2 * before[("fomaml", step)]  # demonstrations in every row
        assert tokens[("multitask", step)] == before[("multitask", step)]
    report = (out / "eval" / "eval.md").read_text()
    assert "fomaml: adapted on in-context rows" in report


@pytest.mark.timeout(240)
def test_padding_free_passes_equal_padded_ones_end_to_end(smoke, tmp_path: Path) -> None:
    """The default ``algorithm.padding_free=true`` processes the same draws as padded passes
    (``false``) in fewer padded tokens, with the same losses to float rounding (the model is
    checked before training: a Llama keeps packed examples apart)."""
    packed, log = smoke
    assert "padding-free)" in log.stdout  # the banner says so
    out = tmp_path / "padded"
    _recipe.run_here(["algorithm.padding_free=false", "methods=[fomaml,metaicl]", "eval.enabled=false",
                      f"output_dir={out}"])
    got = {(r["method"], r["step"]): r for r in _recipe.records(packed / "metrics.jsonl")}
    want = {(r["method"], r["step"]): r for r in _recipe.records(out / "metrics.jsonl")}
    for method in ("fomaml", "metaicl"):
        g, w = got[(method, 0)], want[(method, 0)]
        assert g["tokens"] == w["tokens"] and g["padding_efficiency"] > w["padding_efficiency"]
        assert g["query_loss_after"] == pytest.approx(w["query_loss_after"], rel=1e-4)
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-3)


@pytest.mark.timeout(240)
def test_methods_side_by_side_in_workers_equal_one_after_the_other(smoke, tmp_path: Path) -> None:
    """``engine.workers=2``: the methods train in two forked processes and evaluation shares out
    its episode groups; every loss, adapter tensor and score equals the one-process run's (one
    thread everywhere, so the sums are the same), and every metrics line is there once."""
    one, _ = smoke
    out = tmp_path / "workers"
    log = _recipe.run("python", ["engine.workers=2", f"output_dir={out}"], timeout_s=180)
    assert "2 worker processes of 1 thread(s)" in log.stdout
    steps = _recipe.deterministic_records
    assert steps(out) == steps(one) and len(steps(out)) == len(METHODS) * STEPS
    for method in METHODS:
        got, want = _recipe.adapter(out / method / "adapter"), _recipe.adapter(one / method / "adapter")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), method
    got, want = (json.loads((run / "eval" / "eval.json").read_text()) for run in (out, one))
    assert got["records"] == want["records"] and got["inner_lrs"] == want["inner_lrs"]
    telemetry = json.loads((out / "telemetry.json").read_text())
    assert sorted(telemetry) == sorted(METHODS)  # each worker added its entry
