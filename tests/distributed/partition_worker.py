"""One launch of the partitioned-base checks (1 plain process, or each rank of a 2-rank group).

With 2 ranks (ZeRO-3, CPU/gloo) it writes, per check, what rank 0 saw:

* ``build_tiny.json`` / ``build_folder.json``: how much of every base parameter each rank holds
  right after construction (tiny config; ``from_pretrained`` of ``--folder``), whether the gathered
  weights equal a whole build, and which base parameters the engine later keeps whole;
* ``adapters_old.safetensors`` / ``adapters_new.safetensors``: FOMAML, Reptile and multi-task
  adapters after a few meta-steps, trained the old way (a whole base deep-copied per method, an
  engine each) and the new way (one partitioned base, the adapter reset per method, engines
  closed and re-made on the same model);
* ``eval.json``: a held-out evaluation with episodes of uneven sizes split over the ranks.

With one plain process it writes only ``eval.json``, from the local engine on a whole base: the
reference the 2-rank evaluation must equal.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fmmeta.engine.distributed import init_distributed, strip_local_rank

METHODS = ("fomaml", "reptile", "multitask")
STEPS = 2
N_TASKS = 4


def model_cfg(**kw: Any) -> Any:
    from fmmeta.config import ModelConfig

    return ModelConfig(tiny=True, tokenizer="bytes", tiny_hidden_size=32, tiny_intermediate_size=64,
                       tiny_seed=5, **kw)


def lora_cfg() -> Any:
    from fmmeta.config import LoraConfig

    return LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj"))


def holdings(model: torch.nn.Module, world: int) -> dict[str, Any]:
    """Per parameter: full elements, elements in this rank's partition, elements held whole."""
    from fmmeta.engine.zero import held_elements, is_zero3_param

    params = {}
    for name, p in model.named_parameters():
        params[name] = {
            "zero3": is_zero3_param(p),
            "full": int(getattr(p, "ds_numel", p.numel())),
            "partition": int(p.ds_tensor.numel()) if is_zero3_param(p) else int(p.numel()),
            "data": int(p.data.numel()),
        }
    held, full = held_elements(model.parameters())
    return {"params": params, "held": held, "full": full, "world": world}


def gathered_equal(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> bool:
    import deepspeed

    ok = True
    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            ok &= torch.equal(p.data, reference[name])
    return ok


def train(engine: Any, pad_id: int, method: str) -> list[torch.Tensor]:
    from fmmeta.algorithms.build import build_algorithm
    from fmmeta.algorithms.config import AlgorithmConfig
    from fmmeta.algorithms.meta_step import meta_step
    from tests.distributed._common import build_plan

    algo = build_algorithm(method, AlgorithmConfig(inner_steps=2, inner_lr=0.05), pad_id=pad_id)
    for step in range(STEPS):
        meta_step(engine, algo, build_plan(step, engine.world_size, N_TASKS, "one"))
    return [p.detach().float().cpu().clone() for p in engine.adapter_parameters()]


def episodes(n: int, offset: int) -> list[Any]:
    """Episodes of uneven support and query sizes (1-4 support, 1-2 query), so ranks differ in
    passes per phase and must pad."""
    import dataclasses

    from tests.distributed._common import build_episode

    out = []
    for i in range(n):
        ep = build_episode(99, offset + i)
        out.append(dataclasses.replace(ep, support=ep.support[: 1 + (i * 3) % 4],
                                       query=ep.query[: 1 + i % 2], shots=1 + (i * 3) % 4))
    return out


def evaluate(engine: Any) -> dict[str, Any]:
    import dataclasses

    from fmmeta.algorithms.config import InnerLoopConfig
    from fmmeta.evaluation import EvalMethod, EvalSettings, evaluate_held_out

    params = engine.adapter_parameters()
    trained = [p.detach().clone() + 0.01 * torch.ones_like(p) for p in params]
    # adapted, then scored with the demonstrations: other pass counts than plain scoring
    demos = EvalMethod(trained, demonstrations=True)
    methods = {"base": None, "in_context": None, "trained": trained, "trained+demos": demos}
    val, test = episodes(5, 0), [episodes(3, 10 + 3 * s) for s in range(3)]
    inner = InnerLoopConfig(inner_steps=2, inner_lr=0.05)
    settings = EvalSettings(inner=inner, max_steps=2, pad_id=0, lr_grid=(0.01, 0.05), micro_batch_size=1)
    result = evaluate_held_out(engine.model, params, methods, val, test, settings, ranks=engine)
    # scoring fewer steps runs fewer passes; every rank must still run the same ones. Groups of
    # 2 episodes: rank 0 adapts two together while rank 1 adapts one (other pass counts).
    few = evaluate_held_out(engine.model, params, methods, val, test,
                            dataclasses.replace(settings, score_steps=(1,), episodes_per_pass=2), ranks=engine)
    return {**result.to_dict(), "few_records": few.to_dict()["records"]}


def main() -> None:
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(strip_local_rank(sys.argv[1:]))
    logging.basicConfig(level=logging.WARNING)
    rank, _, world = init_distributed("gloo", args.timeout, sys.argv[1:])
    out = Path(args.out)

    from safetensors.torch import load_file, save_file

    from fmmeta.config import EngineConfig, ModelConfig
    from fmmeta.engine.deepspeed_engine import DeepSpeedEngine
    from fmmeta.engine.kinds import DEFAULT_DS_CONFIG
    from fmmeta.engine.optim import OuterOptimConfig
    from fmmeta.engine.partition import partitioned_build
    from fmmeta.engine.zero import scatter_adapter
    from fmmeta.models import add_lora, build_model_and_tokenizer
    from tests.distributed._common import exit_worker

    optim = OuterOptimConfig(outer_lr=1e-2, grad_clip=0.001)
    # Whole builds first: while a PartitionedBuild is alive, transformers builds every model
    # partitioned.
    whole, tok = build_model_and_tokenizer(model_cfg())
    whole_state = {n: p.detach().clone() for n, p in whole.named_parameters()}
    if world == 1:
        from fmmeta.engine.local import LocalEngine

        engine = LocalEngine(add_lora(whole, lora_cfg(), seed=3), optim)
        (out / "eval.json").write_text(json.dumps(evaluate(engine)))
        return

    old: dict[str, torch.Tensor] = {}
    for method in METHODS:
        engine = DeepSpeedEngine(add_lora(copy.deepcopy(whole), lora_cfg(), seed=3), optim,
                                 DEFAULT_DS_CONFIG)
        old.update({f"{method}.{i}": t for i, t in enumerate(train(engine, tok.pad_token_id, method))})
        engine.close()
        del engine

    build = partitioned_build(EngineConfig(kind="deepspeed"), optim, precision="fp32")
    assert build is not None
    report: dict[str, Any] = {}
    base, _ = build_model_and_tokenizer(model_cfg(), partitioned=build)
    report["tiny"] = {**holdings(base, world), "equal": gathered_equal(base, whole_state)}
    folder_model, _ = build_model_and_tokenizer(ModelConfig(name_or_path=args.folder), partitioned=build)
    saved = load_file(str(Path(args.folder) / "model.safetensors"))
    report["folder"] = {**holdings(folder_model, world), "equal": gathered_equal(folder_model, saved)}
    del folder_model

    model = add_lora(base, lora_cfg(), seed=3)
    adapter = [p for p in model.parameters() if p.requires_grad]
    initial = [p.detach().clone() for p in adapter]
    new: dict[str, torch.Tensor] = {}
    for method in METHODS:
        scatter_adapter(adapter, initial)
        engine = DeepSpeedEngine(model, optim, DEFAULT_DS_CONFIG)
        if method == METHODS[0]:
            report["after_engine"] = holdings(engine.model, world)
            report["threshold"] = engine.ds_config["zero_optimization"]["stage3_param_persistence_threshold"]
        new.update({f"{method}.{i}": t for i, t in enumerate(train(engine, tok.pad_token_id, method))})
        engine.close()

    scatter_adapter(adapter, initial)
    engine = DeepSpeedEngine(model, optim, DEFAULT_DS_CONFIG)
    result = evaluate(engine)
    engine.close()
    if rank == 0:
        save_file({k: v.contiguous() for k, v in old.items()}, str(out / "adapters_old.safetensors"))
        save_file({k: v.contiguous() for k, v in new.items()}, str(out / "adapters_new.safetensors"))
        (out / "build.json").write_text(json.dumps(report))
        (out / "eval.json").write_text(json.dumps(result))
    exit_worker()


if __name__ == "__main__":
    main()
