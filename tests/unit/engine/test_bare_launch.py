"""Launchers that start every copy of the script themselves (mpirun, srun) without WORLD_SIZE
are refused before any process group exists: each copy would otherwise train alone."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from fmmeta.engine.distributed import all_gather_object, init_distributed, refuse_bare_multiprocess_launch


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("var,launcher", [("OMPI_COMM_WORLD_SIZE", "mpirun"), ("PMI_SIZE", "mpirun"),
                                          ("SLURM_STEP_NUM_TASKS", "srun")])
def test_several_bare_copies_are_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch, var: str,
                                                      launcher: str) -> None:
    monkeypatch.setenv(var, "4")
    with pytest.raises(RuntimeError) as err:
        init_distributed("gloo", 5.0)
    msg = str(err.value)
    assert f"{var}=4" in msg and launcher in msg and "torchrun --nnodes" in msg and "--no_ssh" in msg
    assert not dist.is_initialized()


def test_the_recipe_refuses_them_even_for_a_local_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from fmmeta.config import EngineConfig
    from fmmeta.engine.kinds import resolve_engine_kind

    assert resolve_engine_kind(EngineConfig(kind="local")).name == "local"
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")  # `srun -n 4 python recipes/train.py`
    with pytest.raises(RuntimeError, match="srun started 4 copies"):
        resolve_engine_kind(EngineConfig(kind="local"))
    monkeypatch.setenv("WORLD_SIZE", "4")  # srun around a launcher: its workers know their world
    assert resolve_engine_kind(EngineConfig(kind="local")).name == "local"


def test_world_size_without_a_launcher_is_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """``WORLD_SIZE=2 python recipes/train.py`` (no launcher): refused with the fix, not a raw
    ValueError from torch's env:// rendezvous."""
    from fmmeta.errors import UserInputError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserInputError, match=r"WORLD_SIZE=2 is set but RANK, MASTER_ADDR, "
                                             r"MASTER_PORT are not.*unset WORLD_SIZE"):
        init_distributed("gloo", 5.0)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(UserInputError, match="MASTER_PORT is not"):
        init_distributed("gloo", 5.0)
    assert not dist.is_initialized()


def test_one_copy_or_a_real_launcher_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # `srun -n 1 python recipes/train.py`
    refuse_bare_multiprocess_launch()
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "not a number")
    refuse_bare_multiprocess_launch()


def test_all_gather_object_without_a_group_is_this_process_alone() -> None:
    assert not dist.is_initialized()
    assert all_gather_object({"a": 1}) == [{"a": 1}]


def test_an_accelerator_the_machine_lacks_is_refused_for_every_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """``DS_ACCELERATOR=cuda`` without a GPU was a raw AttributeError from inside torch under
    DeepSpeed, and a silent CPU run under the local engine; a name DeepSpeed does not know is
    refused alike. (Where torch sees a GPU, ``cuda`` is accepted.)"""
    import torch

    from fmmeta.config import EngineConfig
    from fmmeta.engine.kinds import resolve_engine_kind
    from fmmeta.errors import UserInputError

    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for kind in ("local", "deepspeed"):
        with pytest.raises(UserInputError, match=r"DS_ACCELERATOR=cuda is set but torch sees no CUDA "
                                                 r"GPU \(CUDA_VISIBLE_DEVICES=''\).*set DS_ACCELERATOR=cpu"):
            resolve_engine_kind(EngineConfig(kind=kind))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_engine_kind(EngineConfig(kind="local")).name == "local"
    monkeypatch.setenv("DS_ACCELERATOR", "gpu")
    with pytest.raises(UserInputError, match=r"DS_ACCELERATOR='gpu' is not an accelerator DeepSpeed "
                                             r"knows: use .*\(cuda for NVIDIA GPUs, cpu\)"):
        resolve_engine_kind(EngineConfig(kind="local"))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert resolve_engine_kind(EngineConfig(kind="local")).name == "local"
