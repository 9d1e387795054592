"""ZeRO-3 with the base built partitioned (2 real CPU processes, gloo, short timeouts).

* No rank ever holds a full base parameter: right after construction (tiny config, and
  ``from_pretrained`` of a folder) every parameter is a partition of ``ceil(numel / ranks)``
  elements with an empty placeholder, and the gathered weights equal a whole build. Once the
  engine wraps the model, the only base parameters held whole are those DeepSpeed's persistence
  threshold keeps resident, none larger than the largest LoRA tensor.
* One base per run: FOMAML, Reptile and multi-task trained on the one partitioned base (adapter
  reset per method, engines closed and re-made) equal the old way, a whole base deep-copied per
  method (fp32, relative 1e-5).
* Held-out evaluation split over 2 ranks, episodes of uneven sizes, equals one process's, also
  when only some adaptation steps are scored (``score_steps``) and with the episodes adapted in
  groups of two (the ranks then hold groups of different sizes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from tests.distributed._common import relative_error
from tests.distributed.launch import run_worker

WORKER = Path(__file__).with_name("partition_worker.py")
TOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama saved with save_pretrained (whole), for the from_pretrained path."""
    from fmmeta.config import ModelConfig
    from fmmeta.models import build_model_and_tokenizer

    path = tmp_path_factory.mktemp("folder")
    model, tok = build_model_and_tokenizer(ModelConfig(
        tiny=True, tokenizer="bytes", tiny_hidden_size=32, tiny_intermediate_size=64, tiny_seed=9))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Path:
    out = tmp_path_factory.mktemp("two")
    run_worker(out, None, nprocs=2, launcher="deepspeed", pg_timeout_s=30,
               extra=["--folder", str(folder)], worker=WORKER)
    return out


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Path:
    out = tmp_path_factory.mktemp("one")
    run_worker(out, None, nprocs=1, launcher="python",
               extra=["--folder", str(folder)], worker=WORKER)
    return out


def _build(two: Path) -> dict[str, Any]:
    return json.loads((two / "build.json").read_text())


@pytest.mark.parametrize("source", ["tiny", "folder"])
def test_no_rank_holds_a_full_base_parameter_after_construction(two: Path, source: str) -> None:
    report = _build(two)[source]
    world = report["world"]
    assert world == 2
    for name, p in report["params"].items():
        assert p["zero3"], name
        assert p["data"] == 0, (name, p)  # the placeholder: nothing gathered
        assert p["partition"] == math.ceil(p["full"] / world), (name, p)
    padding = world * len(report["params"])
    assert report["held"] <= report["full"] / world + padding, report["held"]


@pytest.mark.parametrize("source", ["tiny", "folder"])
def test_partitioned_weights_equal_the_whole_model(two: Path, source: str) -> None:
    assert _build(two)[source]["equal"]


def test_engine_keeps_only_small_base_parameters_whole(two: Path) -> None:
    report = _build(two)
    params = report["after_engine"]["params"]
    whole = {n: p for n, p in params.items() if p["data"] > 0 and "lora_" not in n}
    assert all(p["full"] <= report["threshold"] for p in whole.values()), whole
    big = [n for n, p in params.items() if p["full"] > report["threshold"]]
    assert big and all(params[n]["data"] == 0 for n in big)  # the matrices stay partitioned
    lora = {n: p for n, p in params.items() if "lora_" in n}
    assert lora and all(p["data"] == p["full"] for p in lora.values())  # the adapter stays resident


@pytest.mark.parametrize("method", ["fomaml", "reptile", "multitask"])
def test_one_shared_base_trains_the_same_adapters_as_a_copy_per_method(two: Path, method: str) -> None:
    old = load_file(str(two / "adapters_old.safetensors"))
    new = load_file(str(two / "adapters_new.safetensors"))
    keys = sorted((k for k in old if k.startswith(method + ".")), key=lambda k: int(k.split(".")[1]))
    assert keys and set(keys) == {k for k in new if k.startswith(method + ".")}
    a, b = [new[k] for k in keys], [old[k] for k in keys]
    assert relative_error(a, b) <= TOL
    # trained: LoRA B (every second tensor) left zero
    assert any(t.abs().max() > 0 for t in b[1::2])


def _close(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        # a paired difference of two losses is small next to them: its error is theirs
        scale = 1.0 if path.startswith(".comparisons") else max(abs(b), 1e-6)
        assert a == b or abs(a - b) <= TOL * scale, (path, a, b)
    else:
        assert a == b, (path, a, b)


def test_two_rank_evaluation_equals_one_process(two: Path, one: Path) -> None:
    split = json.loads((two / "eval.json").read_text())
    single = json.loads((one / "eval.json").read_text())
    assert len(single["records"]) == 3 * 3 * 3 * 3 + 3 * 3  # (base, trained, +demos) x 3 steps + in-context
    _close(split, single)
    # eval.score_steps=[1]: steps 1 and 2 only (in-context keeps its step 0), scored as before,
    # also with the episodes adapted two at a time instead of all together
    def key(r: dict) -> tuple:
        return r["method"], r["seed"], r["episode"], r["step"]

    every = {key(r): r for r in single["records"] if r["step"] > 0}
    for run in (single, split):
        few = [r for r in run["few_records"] if r["method"] != "in_context"]
        assert len(few) == 3 * 3 * 3 * 2 and {r["step"] for r in few} == {1, 2}
        for r in few:
            _close(r, every[key(r)], str(key(r)))
