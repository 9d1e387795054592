"""``engine.compile``: regionally compiled decoder layers give eager's losses and gradients, and a
run of varying tasks compiles a bounded number of graphs (fmmeta.engine.compiled).

Compiling costs seconds per graph on a CPU, so most tests use dynamo's "aot_eager" backend (the
same traced forward and backward graphs as inductor, run by eager kernels) or "eager" (dynamo's
tracing and guards only, which is what the graph count is about); one test runs inductor.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fmmeta.algorithms.build import build_algorithm
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.inner_loop import adapt, restore, snapshot
from fmmeta.algorithms.passes import collate_pass
from fmmeta.engine.compiled import (
    CACHE_FOLDER,
    compile_layers,
    decoder_layers,
    use_cache_dir,
)
from fmmeta.evaluation.support_fit import support_fit

from ._tiny import PAD_ID, build_tiny_peft, make_episode, make_mixed_rank, make_rank
from .reference import trainable


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test counts its own graphs, and leaves no compiled code to the next."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _works(algo, seed: int, n: int) -> list:
    """``n`` meta-batches of 1-4 tasks, alternately one task per pass and tasks mixed in passes."""
    rng = random.Random(seed)
    works = []
    for i in range(n):
        eps = [make_episode(rng, f"t{i}.{t}", n_support=rng.randint(1, 5), n_query=rng.randint(1, 4))
               for t in range(rng.randint(1, 4))]
        rank = make_mixed_rank(eps, rng.randint(2, 4)) if i % 2 else make_rank(eps, rng.randint(1, 3), 2)
        works.append(algo.prepare(rank))
    return works


def _close(compiled: list[torch.Tensor], eager: list[torch.Tensor]) -> None:
    for c, e in zip(compiled, eager, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-7)


def test_compiled_meta_steps_and_adaptation_equal_eager_in_fp32() -> None:
    """Meta-steps (losses before and after adapting, meta-gradients), a one-adapter adaptation
    and evaluation's adaptation and scoring: compiled layers give eager's figures to 1e-5 in fp32. On
    the recipe's padding-free lines (which fall back to padded rows where lines save little, so
    both kinds of pass run)."""
    padding_free = True
    model = build_tiny_peft(dtype=torch.float32)
    params = trainable(model)
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=2, measure_query_before=True,
                                                     padding_free=padding_free), PAD_ID)
    works = _works(algo, seed=1, n=2)
    episode = make_episode(random.Random(5), "held_out", n_support=3)
    support = [collate_pass(episode.support, PAD_ID, padding_free=padding_free)]
    theta = snapshot(params)

    def run() -> list[torch.Tensor]:
        out = []
        for work in works:
            r = algo.rank_gradient(model, params, work)
            out += [*r.grads, r.query_loss_after, r.query_loss_before]
        adapt(model, params, support, algo.cfg.inner_loop, steps=2)  # one adapter, in place
        out += [p.detach().clone() for p in params]
        restore(params, theta)
        # evaluation's adaptation: stacked fast weights through TaskLoRA, then scoring (no grad)
        fit = support_fit(model, params, [episode], algo.cfg.inner_loop, 2, PAD_ID, score_steps=[2])
        out += [torch.tensor([f.support_loss, f.query_loss], dtype=torch.float64) for f in fit]
        return out

    eager = run()
    compiled = compile_layers(model, backend="aot_eager")
    _close(run(), eager)
    assert compiled.layers == 2 and compiled.graphs > 0  # the layers did run compiled


def test_graph_count_stays_bounded_over_meta_steps_of_varying_tasks() -> None:
    """Task counts, row counts, lengths and one-task vs mixed passes vary from step to step; the
    graphs compiled stop growing once each guard family (grad mode, one row or more, attention
    mask or none, one task or more) has been met, instead of one per shape or task index."""
    model = build_tiny_peft(dtype=torch.float32)
    params = trainable(model)
    algo = build_algorithm("fomaml", AlgorithmConfig(inner_steps=1, measure_query_before=True), PAD_ID)
    compiled = compile_layers(model, backend="eager")
    counts = []
    for work in _works(algo, seed=2, n=10):
        algo.rank_gradient(model, params, work)
        counts.append(compiled.graphs)
    assert counts[-1] <= 16, counts  # 2 x 2 x 2 x 2 families at most
    assert counts[-1] == counts[5], counts  # the last four meta-steps compiled nothing


def test_inductor_compiled_pass_equals_eager_in_fp32(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend the recipe uses: one forward and backward through inductor-compiled layers."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # nothing left outside the test
    model = build_tiny_peft(dtype=torch.float32)
    params = trainable(model)
    ids = torch.randint(1, 100, (3, 9), generator=torch.Generator().manual_seed(0))

    def grads() -> list[torch.Tensor]:
        loss = model(input_ids=ids, labels=ids).loss
        return [loss.detach(), *torch.autograd.grad(loss, params)]

    eager = grads()
    compiled = compile_layers(model)
    _close(grads(), eager)
    assert compiled.graphs >= 1 and compiled.seconds > 0


def test_the_cache_goes_into_the_run_folder_unless_the_environment_names_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert use_cache_dir(tmp_path) == tmp_path / CACHE_FOLDER
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / CACHE_FOLDER)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_cache_dir(tmp_path / "run2") == tmp_path / "mine"


def test_torchs_default_in_the_environment_is_not_a_users_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing peft makes torch write its default (the temp dir) into the environment: the
    run's cache must still go where fmmeta keeps it, not where a reboot empties it."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(os, "makedirs", lambda *a, **k: None)  # no folder left in the temp dir
    cache_dir()  # what peft's import does
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.path.abspath(default_cache_dir())
    assert use_cache_dir(tmp_path) == tmp_path / CACHE_FOLDER


def test_the_default_cache_is_the_venvs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every run and resume of a checkout shares one cache: its venv's (none outside a venv)."""
    from fmmeta.engine.compiled import venv_cache_dir

    monkeypatch.setattr("sys.prefix", str(tmp_path / ".venv"))
    monkeypatch.setattr("sys.base_prefix", "/usr")
    assert venv_cache_dir() == tmp_path / ".venv" / CACHE_FOLDER
    monkeypatch.setattr("sys.base_prefix", str(tmp_path / ".venv"))
    assert venv_cache_dir() is None


def test_a_model_without_a_repeated_block_is_refused() -> None:
    assert len(decoder_layers(build_tiny_peft())) == 2
    with pytest.raises(ValueError, match="engine.compile: false"):
        decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_engine_compile_compiles_the_layers_once_and_the_telemetry_reports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine.compile=true``: the engine's build compiles every layer in place (each method's
    engine wraps the same model: compiled once), inductor's cache is kept where the run says, and
    the per-method telemetry carries the graph count and compile seconds."""
    from fmmeta.config import EngineConfig
    from fmmeta.engine import compiled as compiled_module
    from fmmeta.engine.build import build_engine
    from fmmeta.engine.optim import OuterOptimConfig
    from fmmeta.telemetry import RankWatch

    monkeypatch.setattr(compiled_module, "_COMPILED", None)  # this process's state, restored after
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = build_tiny_peft()
    assert "compile_graphs" not in RankWatch("fomaml", ["h"], window=4, margin=0.25).summary()
    build_engine(EngineConfig(kind="local"), model, OuterOptimConfig(), precision="fp32")
    assert not any(compiled_module._is_compiled(m) for m in decoder_layers(model))  # off: untouched
    for _ in range(2):
        build_engine(EngineConfig(kind="local", compile=True), model, OuterOptimConfig(), precision="fp32")
    assert all(compiled_module._is_compiled(m) for m in decoder_layers(model))
    state = compiled_module._COMPILED
    assert state is not None and state.layers == 2
    summary = RankWatch("fomaml", ["h"], window=4, margin=0.25).summary()
    assert summary["compile_layers"] == 2 and summary["compile_graphs"] == 0  # lazy: nothing ran yet


def test_auto_compiles_only_where_compiling_was_measured_to_pay(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``engine.compile="auto"`` (the recipe's default) compiles a big enough model in one
    process on a CPU in bf16 with a C++ compiler, and leaves eager a small model (the recipe
    tests'), fp32, a GPU, a DeepSpeed engine and a machine without a compiler; it logs its
    choice once."""
    import logging

    from fmmeta.config import EngineConfig, load_config
    from fmmeta.engine import build
    from fmmeta.engine import compiled as compiled_module
    from fmmeta.engine.optim import OuterOptimConfig
    from fmmeta.recipe_config import RecipeConfig

    assert load_config(RecipeConfig, None, []).engine.compile == "auto"
    assert EngineConfig().compile is False  # engines built in code stay eager unless asked
    monkeypatch.setattr(compiled_module, "_COMPILED", None)
    monkeypatch.setattr(build, "_AUTO_LOGGED", set())
    auto = EngineConfig(kind="local", compile="auto")
    model = build_tiny_peft()
    n = sum(p.numel() for p in model.parameters())
    on, why = build.auto_compile(auto, model, "bf16")
    assert not on and f"{n / 1e6:.3g}M parameters, fewer than the 100M" in why, why
    with caplog.at_level(logging.INFO, logger="fmmeta.engine.build"):
        for _ in range(2):
            build.build_engine(auto, model, OuterOptimConfig(), precision="bf16")
    assert not any(compiled_module._is_compiled(m) for m in decoder_layers(model))
    assert [r.getMessage() for r in caplog.records].count(f"engine.compile=auto -> false: {why}") == 1

    monkeypatch.setattr(build, "AUTO_COMPILE_MIN_PARAMETERS", n)  # as if the model were big enough
    on, why = build.auto_compile(auto, model, "bf16")
    assert on and why.startswith("one process on a CPU") and "C++ compiler" in why, why
    assert build.auto_compile(auto, model, "fp32") == (
        False, "compiling is measured to pay in bf16 only, and this run computes in fp32")
    assert not build.auto_compile(EngineConfig(kind="deepspeed", compile="auto"), model, "bf16")[0]
    build.build_engine(auto, model, OuterOptimConfig(), precision="fp32")
    assert not any(compiled_module._is_compiled(m) for m in decoder_layers(model))
    build.build_engine(auto, model.to(torch.bfloat16), OuterOptimConfig(), precision="bf16")
    assert all(compiled_module._is_compiled(m) for m in decoder_layers(model))
    monkeypatch.setattr(build, "cxx_compiler", lambda: None)
    assert build.auto_compile(auto, model, "bf16") == (
        False, "inductor finds no C++ compiler to build CPU kernels with")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert build.auto_compile(auto, model, "bf16") == (
        False, "compiling is measured to pay on a CPU only, and this run has a GPU")


def test_the_lines_check_compiles_nothing() -> None:
    """check_lines' one eval-mode forward runs eager: compiled, it was a graph family of its own
    that no pass of the run met again."""
    from fmmeta.algorithms.answer_loss import check_lines

    model = build_tiny_peft(dtype=torch.float32)
    compiled = compile_layers(model, backend="eager")
    check_lines(model)
    assert compiled.graphs == 0
    model(input_ids=torch.ones(2, 5, dtype=torch.long))  # the layers are compiled: a pass compiles
    assert compiled.graphs > 0
