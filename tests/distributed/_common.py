"""Shared fixtures of the distributed equivalence tests: a tiny Llama with LoRA, hand-built
episodes and plans, all drawn from generators we own, so every process (and the in-test local
reference) builds bit-identical starting points."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import torch
from torch import nn

from fmmeta.sampling.plan import DUMMY_PASS, MetaBatchPlan, PackedPass, RankPlan, TaskSlot
from fmmeta.tasks.episode import Episode, Example

VOCAB = 128
N_SUPPORT = 4
N_QUERY = 2
SEED = 1234


def exit_worker(code: int = 0) -> NoReturn:
    """Ends a launched worker once its results are written: the ranks meet, the process group
    goes, and the process exits with ``code`` without the interpreter's finalization (``os._exit``).

    A plain return can abort the process after everything is written, when a gloo thread is
    still letting go of a finished collective (docs/design.md, "A finished gloo run must not abort
    at exit"). The product narrows that window at exit; a worker must never lose the race, since
    CI would read the abort as a failed launch, so it skips finalization instead.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def build_model(seed: int = SEED) -> nn.Module:
    """A 2-layer Llama (hidden 32) with LoRA r=4 on q/v; every weight drawn from ``seed``."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(
        base,
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                   init_lora_weights=False),
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def build_base(seed: int = SEED) -> nn.Module:
    """The same base weights as :func:`build_model`, without LoRA (for peft round trips)."""
    from peft import PeftModel

    model = build_model(seed)
    if not isinstance(model, PeftModel):
        raise TypeError("build_model() must return a PeftModel")
    base = model.unload()  # removes the LoRA layers without merging them
    if hasattr(base, "peft_config"):
        del base.peft_config
    return base


def _example(gen: torch.Generator) -> Example:
    p = int(torch.randint(2, 7, (1,), generator=gen))
    a = int(torch.randint(1, 4, (1,), generator=gen))
    ids = torch.randint(1, VOCAB, (p + a,), generator=gen).tolist()
    return Example(tuple(ids[:p]), tuple(ids[p:]))


def build_episode(step: int, task: int) -> Episode:
    gen = torch.Generator().manual_seed(SEED * 1000 + step * 100 + task)
    return Episode(
        task=f"t{task}",
        support=tuple(_example(gen) for _ in range(N_SUPPORT)),
        query=tuple(_example(gen) for _ in range(N_QUERY)),
        shots=N_SUPPORT,
    )


def _rows_to_passes(slots: tuple[TaskSlot, ...], rows: list[tuple[int, int]], per_pass: int | None,
                    query: bool) -> list[PackedPass]:
    """Cuts ``rows`` (task, example) into passes of ``per_pass`` rows (``None``: one pass per task)."""
    if per_pass is None:
        groups = [[r for r in rows if r[0] == t] for t in range(len(slots))]
    else:
        groups = [rows[i : i + per_pass] for i in range(0, len(rows), per_pass)]
    out = []
    for g in groups:
        sets = [s.episode.query if query else s.episode.support for s in slots]
        lens = [sets[t][e].n_tokens for t, e in g]
        out.append(PackedPass(tuple(t for t, _ in g), tuple(e for _, e in g), max(lens), sum(lens)))
    return out


LAYOUTS = {
    "all": None,  # each task's set in one pass of its own
    "one": 1,  # one sequence per pass
    "mixed": 1000,  # every task of the rank in one pass
    "spread": 3,  # 3 rows per pass, tasks dealt round-robin: tasks span passes, passes mix tasks
}


def build_rows_plan(step: int, world: int, n_tasks: int) -> MetaBatchPlan:
    """Rows across ranks: every rank holds all ``n_tasks`` tasks; each phase's rows, task by task,
    are cut into runs of 3 dealt round-robin to the ranks, so a task's rows split unevenly over
    ranks (and some ranks run dummy passes); each rank packs its rows 3 per pass (mixing tasks)."""
    slots = tuple(TaskSlot(build_episode(step, t), t) for t in range(n_tasks))
    phases = []
    for n_rows, query in ((N_SUPPORT, False), (N_QUERY, True)):
        rows = [(t, e) for t in range(n_tasks) for e in range(n_rows)]
        mine = [[r for k, r in enumerate(rows) if (k // 3) % world == rank] for rank in range(world)]
        phases.append([_rows_to_passes(slots, m, 3, query) for m in mine])
    n_s = max(len(s) for s in phases[0])
    n_q = max(len(q) for q in phases[1])
    return MetaBatchPlan(
        step=step,
        ranks=tuple(RankPlan(slots, tuple(s) + (DUMMY_PASS,) * (n_s - len(s)),
                             tuple(q) + (DUMMY_PASS,) * (n_q - len(q)), shared=True)
                    for s, q in zip(*phases)),
        n_real_tasks=n_tasks, placement="rows",
    )


def build_plan(step: int, world: int, n_tasks: int, micro: str) -> MetaBatchPlan:
    """``n_tasks`` tasks dealt round-robin to ``world`` ranks, laid out into passes by ``micro``
    (a key of :data:`LAYOUTS`, or ``"rows"`` for :func:`build_rows_plan`); ranks with fewer
    passes get dummy passes, so counts match."""
    if micro == "rows":
        return build_rows_plan(step, world, n_tasks)
    per_pass = LAYOUTS[micro]
    ranks = []
    for r in range(world):
        slots = tuple(TaskSlot(build_episode(step, t), t) for t in range(r, n_tasks, world))
        order = range(max(N_SUPPORT, N_QUERY))
        sup = [(t, e) for e in order for t in range(len(slots)) if e < N_SUPPORT]
        qry = [(t, e) for e in order for t in range(len(slots)) if e < N_QUERY]
        ranks.append((slots, _rows_to_passes(slots, sup, per_pass, False),
                      _rows_to_passes(slots, qry, per_pass, True)))
    n_s = max(len(s) for _, s, _ in ranks)
    n_q = max(len(q) for _, _, q in ranks)
    return MetaBatchPlan(
        step=step,
        ranks=tuple(RankPlan(slots, tuple(s) + (DUMMY_PASS,) * (n_s - len(s)),
                             tuple(q) + (DUMMY_PASS,) * (n_q - len(q))) for slots, s, q in ranks),
        n_real_tasks=n_tasks,
    )


def relative_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all tensors together."""
    num = sum(float((x.double() - y.double()).pow(2).sum()) for x, y in zip(a, b, strict=True))
    den = sum(float(y.double().pow(2).sum()) for y in b)
    return (num / den) ** 0.5
