"""Runs several engine configurations in one process (1 rank, or one rank of a launched group)
and writes each one's final adapter tensors and outer-step stats to ``--out``.

Each launch costs seconds of imports, so one launch runs every configuration it is given:
``--configs local:all,ds0:all,ds3:one:gc,...`` where a configuration is
``engine:layout[:gc][:uneven][:clip][:lines][:compile][:save][:gather][:reptile|:multitask|:metasgd|:metaicl]``
(engine: local, ds0, ds1, ds2, ds3, ds3off, acc; layout: a key of ``_common.LAYOUTS``, or ``rows``
for rows across ranks; ``clip``: inner clipping at norm 2e-4; ``lines``: padding-free passes
(``algorithm.padding_free``); ``compile``: decoder layers compiled as ``engine.compile`` does,
by the "aot_eager" backend; FOMAML unless an algorithm is named). The JSON holds the graphs
dynamo compiled and the graph breaks it took in each configuration; for metasgd the learned
step sizes too (``step_sizes``). With ``gather`` every rank writes what ``gather_step`` gave it
each step (``<tag>.gathered.<rank>.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fmmeta.engine.compiled import unique_graphs
from fmmeta.engine.distributed import init_distributed, strip_local_rank

STEPS = 2
"""Meta-steps per configuration: the second runs on an outer update, Adam's state and Meta-SGD's
learned step sizes from the first (and the ``ckpt`` configurations resume between the two); a third
added a quarter of each launch's time and no path the first two miss."""
N_TASKS = 4


def _graph_breaks() -> int:
    """Graph breaks dynamo took in this process so far (its graphs: ``unique_graphs``)."""
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def main() -> None:
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--grad-clip", type=float, default=0.001)
    args = parser.parse_args(strip_local_rank(sys.argv[1:]))
    logging.basicConfig(level=logging.WARNING)
    rank, _, world = init_distributed("gloo", args.timeout, sys.argv[1:])

    from safetensors.torch import save_file

    from fmmeta.algorithms.build import build_algorithm
    from fmmeta.algorithms.config import AlgorithmConfig
    from fmmeta.algorithms.gather import gather_step
    from fmmeta.algorithms.meta_step import meta_step
    from fmmeta.engine.optim import OuterOptimConfig
    from fmmeta.models.build import enable_activation_checkpointing
    from tests.distributed._common import build_model, build_plan, exit_worker

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    optim_cfg = OuterOptimConfig(outer_lr=1e-2, grad_clip=args.grad_clip)
    root = Path(__file__).resolve().parents[2]

    layer_calls = [0]  # forwards of the decoder layers' MLPs in the current configuration

    def count_layer_calls(model: torch.nn.Module) -> None:
        """Counts every forward of a decoder layer's MLP from now on, the recomputations that
        activation checkpointing runs inside the backward included. The MLP's own ``forward`` is
        wrapped: transformers checkpoints the layer's ``forward`` and module hooks do not run in
        the recomputation, so hooks would count once per pass whether or not it recomputes."""
        for mlp in (m for m in model.modules() if type(m).__name__.endswith("MLP")):
            def counted(*args, _forward=mlp.forward, **kwargs):  # type: ignore[no-untyped-def]
                layer_calls[0] += 1
                return _forward(*args, **kwargs)

            mlp.forward = counted

    def make_engine(kind: str, gc: bool, precision: str, compiled: bool = False):  # type: ignore[no-untyped-def]
        model = build_model()
        if gc:  # as the recipe does (model.gradient_checkpointing), before any engine wraps it
            enable_activation_checkpointing(model)
        if compiled:  # as build_engine does for engine.compile: in place, before any engine wraps it
            from fmmeta.engine.compiled import compile_layers

            compile_layers(model, backend="aot_eager")  # (no layer count: its wrapper would be traced)
        else:
            count_layer_calls(model)
        if kind == "local":
            from fmmeta.engine.local import LocalEngine

            return LocalEngine(model, optim_cfg), 1
        if kind == "acc":
            from fmmeta.engine.accelerate_engine import build_accelerate_engine

            return build_accelerate_engine(model, optim_cfg, precision=precision), world
        from fmmeta.engine.deepspeed_engine import DeepSpeedEngine

        name = {"ds3off": "zero3_offload.json", "ds3": "zero3.json"}.get(kind, "zero2.json")
        cfg = json.loads((root / "ds_configs" / name).read_text())
        if kind in ("ds0", "ds1"):
            cfg["zero_optimization"]["stage"] = int(kind[2])
        return DeepSpeedEngine(model, optim_cfg, cfg, precision=precision), world

    for spec in args.configs.split(","):
        parts = spec.split(":")
        kind, micro, flags = parts[0], parts[1], set(parts[2:])
        tag = spec.replace(":", "_")
        gc = "gc" in flags
        compiled = "compile" in flags
        if compiled:  # each compiled configuration starts from no graphs and no recompiles
            torch._dynamo.reset()
        graphs_before, breaks_before = unique_graphs(), _graph_breaks()
        precision = "bf16" if "bf16" in flags else "fp32"
        layer_calls[0] = 0
        engine, plan_world = make_engine(kind, gc, precision, compiled)
        shapes_after_init = all(p.numel() > 0 for p in engine.adapter_parameters())
        # the test behind transformers' is_activation_checkpointing (its older name warns: deprecated)
        gc_on = any(getattr(m, "gradient_checkpointing", False) is True for m in engine.model.modules())
        n_tasks = 3 if "uneven" in flags else N_TASKS
        method = next((m for m in ("reptile", "multitask", "metasgd", "metaicl") if m in flags), "fomaml")
        clip = 2e-4 if "clip" in flags else None  # below the inner gradients' norms: it acts
        algo = build_algorithm(method, AlgorithmConfig(inner_steps=2, inner_lr=0.05, inner_clip_norm=clip,
                                                       padding_free="lines" in flags), pad_id=0)
        norms: list[float] = []
        task_sq: list[float | None] = []  # each step's mean squared per-task meta-gradient norm
        passes = padded_tokens = 0
        shapes_ok = True
        gathered = []
        for step in range(STEPS):
            if "exit_early" in flags and step == 1 and rank == world - 1:
                # a rank that leaves with rc 0 while the others still need it
                logging.getLogger(__name__).warning("rank %d leaving early on purpose", rank)
                os._exit(0)
            if "ckpt" in flags and step == STEPS - 1:
                # resume from a checkpoint: a fresh engine, adapter + optimizer state loaded
                engine.save_adapter(out / f"{tag}_ckpt" / "adapter")
                files = engine.save_optimizer(out / f"{tag}_ckpt" / "optim")
                for f in files:
                    torch.load(f, weights_only=True)  # the contract: weights_only loads
                del engine
                engine, plan_world = make_engine(kind, gc, precision, compiled)
                engine.load_adapter(out / f"{tag}_ckpt" / "adapter")
                engine.load_optimizer(out / f"{tag}_ckpt" / "optim")
            plan = build_plan(step, plan_world, n_tasks, micro)
            stats = meta_step(engine, algo, plan)
            if "gather" in flags:
                g = gather_step(engine, stats)
                gathered.append({"observations": [o.to_dict() for o in g.observations],
                                 "n_real_tasks": g.n_real_tasks, "n_tokens": g.n_tokens,
                                 "record": g.record(), "mine": [o.to_dict() for o in stats.observations]})
            norms.append(stats.outer["grad_norm"])
            task_sq.append(stats.outer.get("grad_task_sq"))
            passes += stats.n_passes
            padded_tokens += stats.n_padded_tokens
            shapes_ok &= all(p.numel() > 0 for p in engine.adapter_parameters())
        params = engine.adapter_parameters()
        if gathered:
            (out / f"{tag}.gathered.{rank}.json").write_text(json.dumps(gathered))
        if "save" in flags:
            engine.save_adapter(out / f"{tag}_adapter")
        if rank == 0:
            tensors = {f"p{i}": p.detach().float().cpu().contiguous() for i, p in enumerate(params)}
            save_file(tensors, str(out / f"{tag}.safetensors"))
            (out / f"{tag}.json").write_text(json.dumps({
                "grad_norms": norms, "grad_task_sq": task_sq, "world": world, "shapes_ok": shapes_ok,
                "shapes_after_init": shapes_after_init, "gc_on": gc_on,
                "dtype": str(params[0].dtype), "passes": passes, "padded_tokens": padded_tokens, "layer_calls": layer_calls[0],
                "layers": sum(type(m).__name__.endswith("MLP") for m in engine.model.modules()),
                "graphs": unique_graphs() - graphs_before,
                "graph_breaks": _graph_breaks() - breaks_before,
                "step_sizes": algo.step_sizes.values(len(params)) if method == "metasgd" else None,
            }))
        del engine
    exit_worker()


if __name__ == "__main__":
    main()
