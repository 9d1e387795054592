"""Engine kinds are registered objects: a new one is built through the factory with no other module
edited, an unknown name is refused with the registered ones listed, and the registry is read live."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fmmeta.config import ConfigError, EngineConfig, LoraConfig, ModelConfig, load_config
from fmmeta.engine import ENGINE_KINDS, EngineFactory, EngineKind, EngineRequest, register_engine_kind
from fmmeta.engine.build import build_engine
from fmmeta.engine.kinds import engine_kind, resolve_engine_kind
from fmmeta.engine.optim import OuterOptimConfig
from fmmeta.errors import UserInputError
from fmmeta.models import add_lora, initial_adapter
from fmmeta.recipe_config import RecipeConfig


class ToyEngine:
    """Not an engine at all: it keeps what it was asked to build, for the test to look at."""

    def __init__(self, request: EngineRequest) -> None:
        self.request = request


@pytest.fixture
def toy() -> Iterator[EngineKind]:
    """The kind "toy", registered for one test and removed after it (no other test sees it)."""
    kind = register_engine_kind(EngineKind("toy", build=ToyEngine, distributed=False))
    try:
        yield kind
    finally:
        del ENGINE_KINDS[kind.name]


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for var in [v for v in os.environ if v.startswith("ACCELERATE_")] + [
            "WORLD_SIZE", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"]:
        monkeypatch.delenv(var, raising=False)


def test_a_toy_kind_is_accepted_by_the_config_and_built_through_the_factory(toy: EngineKind) -> None:
    cfg = load_config(RecipeConfig, None, ["engine.kind=toy"])
    engines = EngineFactory(cfg.engine, cfg.optim, precision="fp32")
    assert engines.kind is toy and not engines.distributed and engines.join() == 0
    base, _ = engines.build_base(ModelConfig(tiny=True, tokenizer="bytes"))  # whole: the kind has no DeepSpeed
    model = add_lora(base, LoraConfig(r=2, target_modules=("q_proj",)), seed=0)
    engine: Any = engines.engine(model, initial_adapter(model, 0))
    assert isinstance(engine, ToyEngine)
    assert engine.request.model is model and engine.request.optim_cfg is cfg.optim
    assert (engine.request.precision, engine.request.device, engine.request.pack_weights) == ("fp32", "cpu", False)
    # an engine built in code, without a factory, resolves the kind from the section alike
    assert isinstance(build_engine(EngineConfig(kind="toy"), torch.nn.Linear(2, 2), OuterOptimConfig(),
                                   precision="fp32"), ToyEngine)


def test_an_unknown_kind_is_refused_with_the_registered_kinds(toy: EngineKind) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(RecipeConfig, None, ["engine.kind=deepspeeed"])
    (problem,) = err.value.problems
    assert problem.startswith("engine.kind='deepspeeed' is invalid: allowed values are 'auto', 'local', "
                              "'deepspeed', 'accelerate', 'toy'"), problem
    assert problem.endswith("did you mean 'deepspeed'?"), problem
    with pytest.raises(UserInputError, match=r"engine.kind='mpi' is invalid: allowed values are 'auto', 'local'"):
        resolve_engine_kind(EngineConfig(kind="mpi"))  # a section built in code, not loaded


def test_the_registry_is_read_live(toy: EngineKind) -> None:
    """Registered after every module was imported, the kind is a value ``engine.kind`` takes and
    is in every face's registry: the package's face reads the registry's own dict."""
    import fmmeta

    assert engine_kind("toy") is toy and fmmeta.ENGINE_KINDS["toy"] is toy
    assert fmmeta.ENGINE_KINDS is ENGINE_KINDS and fmmeta.register_engine_kind is register_engine_kind
    del ENGINE_KINDS["toy"]
    with pytest.raises(ConfigError, match="engine.kind='toy' is invalid"):
        load_config(RecipeConfig, None, ["engine.kind=toy"])
    register_engine_kind(toy)  # back, for the fixture to remove
    assert load_config(RecipeConfig, None, ["engine.kind=toy"]).engine.kind == "toy"


def test_a_name_is_registered_once_and_auto_is_no_kind(toy: EngineKind) -> None:
    for name in ("toy", "local", "auto"):
        with pytest.raises(ValueError, match=f"engine kind {name!r} is registered already"):
            register_engine_kind(EngineKind(name, build=ToyEngine, distributed=False))


def test_auto_asks_the_kinds_newest_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A plain process is local; a distributed launcher or a DeepSpeed JSON deepspeed; accelerate
    launch accelerate (it sets WORLD_SIZE too); and a kind registered later, whose test holds,
    comes before them all."""
    auto = EngineConfig()
    assert resolve_engine_kind(auto).name == "local"
    assert resolve_engine_kind(EngineConfig(deepspeed_config=str(tmp_path / "z.json"))).name == "deepspeed"
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_engine_kind(auto).name == "deepspeed"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert resolve_engine_kind(auto).name == "accelerate"
    mine = register_engine_kind(EngineKind("mine", build=ToyEngine, distributed=True, implied=lambda cfg: True))
    try:
        assert resolve_engine_kind(auto) is mine
    finally:
        del ENGINE_KINDS["mine"]
    assert resolve_engine_kind(auto).name == "accelerate"


def test_a_kind_without_deepspeed_refuses_a_deepspeed_json(toy: EngineKind, tmp_path: Any) -> None:
    """The local engine's old check, now every kind's that runs without DeepSpeed."""
    ds = tmp_path / "z.json"
    ds.write_text("{}")
    for name in ("local", "toy"):
        (problem,) = EngineConfig(kind=name, deepspeed_config=str(ds)).validate()
        assert f"is set but kind={name!r} runs without DeepSpeed, so it would be ignored" in problem
    assert EngineConfig(kind="deepspeed", deepspeed_config=str(ds)).validate() == []


def test_import_fmmeta_stays_light_and_its_registries_load_when_read() -> None:
    code = ("import sys, fmmeta\n"
            "assert 'torch' not in sys.modules, 'import fmmeta imported torch'\n"
            "assert {'fomaml', 'reptile'} <= set(fmmeta.METHODS) and 'local' in fmmeta.ENGINE_KINDS\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
