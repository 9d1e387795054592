"""Same seed, same hand-built plans, a few meta-steps: every engine, ZeRO stage, process count,
launcher and pass layout must give the local engine's adapter with one task per pass (fp32,
relative 1e-5), for FOMAML, Reptile, the multi-task baseline and Meta-SGD (whose learned inner
step sizes, replicated on every rank, must match the local engine's too). Layouts (``_common.LAYOUTS``):
one task per pass, one sequence per pass, every task of a rank in one pass, and 3-row passes
that mix tasks while tasks span several passes; with 3 tasks on 2 ranks the task counts differ.

Three launches cover everything (each launch costs seconds of imports): one plain process for the
local reference and the one-rank DeepSpeed engines, ``deepspeed --num_gpus 2`` for the two-rank
engines, and ``accelerate launch`` (DeepSpeed plugin, torchrun underneath) for the accelerate path;
``gather_step``'s two-rank result is checked on the same launches (``ds3:all:gather``). A fourth
launch of 4 ranks runs rows across ranks.
The outer gradient clip (0.001) is below every step's meta-gradient norm, so DeepSpeed's clipping is
compared against the local engine's ``clip_grad_norm`` on every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed._common import build_plan, relative_error
from tests.distributed.launch import run_worker
from tests.distributed.worker import STEPS

TOL = 1e-5

METHODS = ("reptile", "multitask")
METASGD = ("local:all:metasgd", "local:all:uneven:metasgd")
# Each path runs once where it is strongest: every ZeRO stage (and the offload, the checkpoint
# resume, the packed layouts, each method) on 2 ranks; one process keeps the references, the
# packed layouts' local engine and one-rank DeepSpeed (ZeRO-3, the stage that partitions).
ONE_PROC = ["local:all", "local:one", "local:all:uneven", "ds3:all", "ds3:one", "ds3:all:bf16",
            "local:mixed", "local:spread", "local:spread:gc",
            *(f"local:{layout}:{m}" for m in METHODS for layout in ("all", "all:uneven")),
            *METASGD, "local:all:metaicl", "local:all:gather"]
TWO_PROC = ["ds0:all", "ds1:all", "ds2:all", "ds3:all", "ds3off:all", "ds3:one:gc:save", "ds3:all:uneven",
            "ds2:one:ckpt", "ds3:all:ckpt", "ds3:mixed:gc", "ds3:spread:uneven", "ds2:mixed",
            *(f"ds3:spread:uneven:{m}" for m in METHODS),
            "ds2:spread:reptile", "ds3:mixed:metasgd", "ds3:spread:uneven:metasgd", "ds3:all:gather"]
# Rows across ranks (``_common.build_rows_plan``): every rank holds every task and runs a share of
# each task's rows, the tasks' rows split unevenly over ranks; each against its one-process
# reference with one task per pass. (launch, spec, reference)
ROWS = [
    ("one_proc", "local:rows", "local:all"),
    ("one_proc", "local:rows:clip", "local:all:clip"),
    ("two_proc", "ds3:rows", "local:all"),
    ("two_proc", "ds2:rows:uneven", "local:all:uneven"),
    ("two_proc", "ds3:rows:uneven:clip", "local:all:uneven:clip"),
    ("two_proc", "ds3:rows:metasgd", "local:all:metasgd"),
    ("two_proc", "ds2:rows:uneven:reptile", "local:all:uneven:reptile"),
    ("two_proc", "ds3:rows:clip:reptile", "local:all:clip:reptile"),
    ("two_proc", "ds3:rows:multitask", "local:all:multitask"),
    ("two_proc", "ds3:rows:uneven:metaicl", "local:all:uneven:metaicl"),
    # 4 ranks: both stages, uneven splits with dummy passes, the clip, Meta-SGD and Reptile (the
    # other methods' rows are on 2 ranks; each launch of 4 costs 4 processes' imports)
    ("four_proc", "ds2:rows:clip", "local:all:clip"),
    ("four_proc", "ds3:rows:uneven:metasgd", "local:all:uneven:metasgd"),
    ("four_proc", "ds3:rows:uneven:reptile", "local:all:uneven:reptile"),
]
# Padding-free lines (``algorithm.padding_free``): several examples, of several tasks, per row of
# a pass; each against its reference with one task per pass and against the same layout padded.
LINES = [
    ("one_proc", "local:mixed:lines", "local:all", "local:mixed"),
    ("two_proc", "ds3:mixed:gc:lines", "local:all", "ds3:mixed:gc"),
    ("two_proc", "ds3:rows:uneven:clip:lines", "local:all:uneven:clip", "ds3:rows:uneven:clip"),
    ("two_proc", "ds2:spread:lines:reptile", "local:all:reptile", "ds2:spread:reptile"),
    ("two_proc", "ds3:rows:uneven:lines:metaicl", "local:all:uneven:metaicl", "ds3:rows:uneven:metaicl"),
]
ONE_PROC += sorted({ref for _, _, ref in ROWS} - set(ONE_PROC)) + [s for launch, s, _ in ROWS if launch == "one_proc"]
TWO_PROC += [s for launch, s, _ in ROWS if launch == "two_proc"]
ONE_PROC += [s for launch, s, _, _ in LINES if launch == "one_proc"]
TWO_PROC += [s for launch, s, _, _ in LINES if launch == "two_proc"]
FOUR_PROC = [s for launch, s, _ in ROWS if launch == "four_proc"]
ACCEL = ["acc:all", "acc:one:gc", *(f"acc:mixed:{m}" for m in METHODS), "acc:all:metasgd"]


def _load(out: Path, spec: str) -> tuple[list[torch.Tensor], dict]:
    tag = spec.replace(":", "_")
    t = load_file(str(out / f"{tag}.safetensors"))
    meta = json.loads((out / f"{tag}.json").read_text())
    return [t[f"p{i}"] for i in range(len(t))], meta


@pytest.fixture(scope="module")
def one_proc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one")
    run_worker(out, ONE_PROC, nprocs=1, launcher="python")
    return out


@pytest.fixture(scope="module")
def two_proc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two")
    run_worker(out, TWO_PROC, nprocs=2, launcher="deepspeed", pg_timeout_s=30)
    return out


@pytest.fixture(scope="module")
def four_proc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("four")
    run_worker(out, FOUR_PROC, nprocs=4, launcher="deepspeed", pg_timeout_s=60)
    return out


@pytest.fixture(scope="module")
def accel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("acc")
    run_worker(out, ACCEL, nprocs=2, launcher="accelerate", pg_timeout_s=30)
    return out


def _check(out: Path, spec: str, ref_dir: Path, ref: str, tol: float = TOL) -> dict:
    got, meta = _load(out, spec)
    want, ref_meta = _load(ref_dir, ref)
    err = relative_error(got, want)
    assert err < tol, f"{spec}: relative error {err:.3e} vs {ref} (tolerance {tol})"
    assert meta["shapes_after_init"] and meta["shapes_ok"], f"{spec}: an adapter tensor was [0] (a partitioned tensor, not pinned)"
    # the pre-clip norms agree (for "local:all" the clip is active on every step)
    if ref == "local:all":
        assert all(n > 0.001 for n in ref_meta["grad_norms"])
    for a, b in zip(meta["grad_norms"], ref_meta["grad_norms"], strict=True):
        assert abs(a - b) <= 1e-5 * b, f"{spec}: grad norms {meta['grad_norms']} vs {ref_meta['grad_norms']}"
    # each step's per-task meta-gradient statistics (fomaml, metasgd, reptile: None with rows across ranks)
    got_sq, want_sq = meta["grad_task_sq"], ref_meta["grad_task_sq"]
    if None not in got_sq and None not in want_sq:
        for a, b in zip(got_sq, want_sq, strict=True):
            assert abs(a - b) <= 1e-5 * b, f"{spec}: per-task squared norms {got_sq} vs {want_sq}"
    return meta


def test_reference_is_sensitive(one_proc: Path) -> None:
    """The comparison can fail: different work gives a clearly different adapter."""
    a, _ = _load(one_proc, "local:all")
    b, _ = _load(one_proc, "local:all:uneven")
    assert relative_error(b, a) > 100 * TOL
    assert relative_error(_load(one_proc, "local:one")[0], a) < TOL  # micro-batch 1 == all, local


@pytest.mark.parametrize("spec", ["ds3:all", "ds3:one"])
def test_one_process_deepspeed_matches_local(one_proc: Path, spec: str) -> None:
    _check(one_proc, spec, one_proc, "local:all")


@pytest.mark.parametrize("spec", ["ds2:one:ckpt", "ds3:all:ckpt"])
def test_resume_from_saved_adapter_and_optimizer_matches(two_proc: Path, one_proc: Path, spec: str) -> None:
    """Save adapter + optimizer before the last step, rebuild the engine, load, finish: same result
    (2 ranks: each saves and loads its own optimizer partition; ZeRO-2 with micro-batches of one)."""
    assert _check(two_proc, spec, one_proc, "local:all")["world"] == 2


def test_bf16_zero3_close_to_fp32(one_proc: Path) -> None:
    got, meta = _load(one_proc, "ds3:all:bf16")
    want, _ = _load(one_proc, "local:all")
    assert meta["dtype"] == "torch.bfloat16"
    assert relative_error(got, want) < 2e-2


@pytest.mark.parametrize("spec", ["ds0:all", "ds1:all", "ds2:all", "ds3:all", "ds3off:all", "ds3:one:gc:save"])
def test_two_processes_match_local(two_proc: Path, one_proc: Path, spec: str) -> None:
    meta = _check(two_proc, spec, one_proc, "local:all")
    assert meta["world"] == 2 and None not in meta["grad_task_sq"]  # the noise statistics were compared
    if ":gc" in spec:
        assert meta["gc_on"], "activation checkpointing was not enabled"


def test_uneven_work_finishes_and_matches(two_proc: Path, one_proc: Path) -> None:
    """3 tasks on 2 ranks: rank 1 holds one task and runs dummy passes; same result, no hang."""
    plan = build_plan(0, 2, 3, "all")
    assert [len(r.slots) for r in plan.ranks] == [2, 1]
    assert [p.is_dummy for p in plan.for_rank(1).support] == [False, True]
    _check(two_proc, "ds3:all:uneven", one_proc, "local:all:uneven")
    _check(two_proc, "ds3:spread:uneven", one_proc, "local:all:uneven")


@pytest.mark.parametrize("spec", ["local:mixed", "local:spread", "local:spread:gc"])
def test_packed_layouts_match_one_task_per_pass_on_one_process(one_proc: Path, spec: str) -> None:
    _check(one_proc, spec, one_proc, "local:all")


@pytest.mark.parametrize("spec", ["ds3:mixed:gc", "ds2:mixed"])
def test_packed_layouts_match_on_two_processes(two_proc: Path, one_proc: Path, spec: str) -> None:
    """Several tasks per pass on 2 ranks; with activation checkpointing the routed LoRA forward is
    recomputed inside the backward and must route the same rows."""
    meta = _check(two_proc, spec, one_proc, "local:all")
    assert meta["world"] == 2 and meta["gc_on"] == (":gc" in spec)


@pytest.mark.parametrize("method", METHODS)
def test_reptile_and_multitask_packed_match_their_reference(
    two_proc: Path, one_proc: Path, accel: Path, method: str
) -> None:
    """Each method on 2 processes under DeepSpeed ZeRO-2/3 and under accelerate (its DeepSpeed
    plugin, ZeRO-3) equals its one-process reference: every task of a rank in one pass
    (accelerate), and passes that mix tasks while tasks span passes (deepspeed)."""
    ref = f"local:all:{method}"
    assert _check(accel, f"acc:mixed:{method}", one_proc, ref)["world"] == 2
    _check(two_proc, f"ds3:spread:uneven:{method}", one_proc, f"local:all:uneven:{method}")
    if method == "reptile":
        _check(two_proc, "ds2:spread:reptile", one_proc, ref)
    # the comparison can fail: the methods differ from FOMAML
    a, _ = _load(one_proc, ref)
    b, _ = _load(one_proc, "local:all")
    assert relative_error(a, b) > 100 * TOL


def _check_metasgd(out: Path, spec: str, one_proc: Path, ref: str) -> None:
    """The adapter and the learned step sizes both match the local engine's."""
    meta = _check(out, spec, one_proc, ref)
    _, ref_meta = _load(one_proc, ref)
    got, want = torch.tensor(meta["step_sizes"]), torch.tensor(ref_meta["step_sizes"])
    assert relative_error([got], [want]) < TOL, f"{spec}: step sizes {got} vs {want}"


def test_metasgd_step_sizes_match_on_two_zero3_ranks(two_proc: Path, one_proc: Path) -> None:
    """Each rank sums its tasks' step-size gradients, one all-reduce adds the ranks, the sum is
    divided by the real tasks (3 on 2 ranks when uneven) and every rank takes the same step."""
    _check_metasgd(two_proc, "ds3:mixed:metasgd", one_proc, "local:all:metasgd")
    _check_metasgd(two_proc, "ds3:spread:uneven:metasgd", one_proc, "local:all:uneven:metasgd")
    # the comparison can fail: the lrs moved from inner_lr=0.05, and they differ between the plans
    lrs = torch.tensor(_load(one_proc, "local:all:metasgd")[1]["step_sizes"])
    uneven = torch.tensor(_load(one_proc, "local:all:uneven:metasgd")[1]["step_sizes"])
    # (the v_proj lrs move by ~1%; the q_proj ones barely: in this tiny model their step-size
    # gradients are ~1e-10, below Adam's eps)
    assert float((lrs / 0.05).log().abs().max()) > 100 * TOL
    assert relative_error([uneven], [lrs]) > 100 * TOL
    # The adapter alone could not tell: lrs 1% apart for two steps move it 4e-7 away from FOMAML's
    # (measured), below TOL. The lrs carry this test.


@pytest.mark.parametrize(("launch", "spec"), [
    ("one_proc", "local:spread"), ("one_proc", "local:spread:gc"), ("two_proc", "ds2:mixed"),
    ("two_proc", "ds3:mixed:gc"), ("two_proc", "ds3:one:gc:save"), ("accel", "acc:all"),
    ("accel", "acc:one:gc"),
])
def test_activation_checkpointing_recomputes_every_layer_in_the_backward(
    request: pytest.FixtureRequest, launch: str, spec: str
) -> None:
    """Not only a flag: with checkpointing on, every decoder layer runs again inside each pass's
    backward (every FOMAML pass has one), so the layers' MLPs run twice per pass; without it,
    once. A no-op checkpointing gives the second count and fails."""
    _, meta = _load(request.getfixturevalue(launch), spec)
    gc = ":gc" in spec
    assert meta["gc_on"] == gc and meta["layers"] == 2 and meta["passes"] > 0
    assert meta["layer_calls"] == (2 if gc else 1) * meta["layers"] * meta["passes"], meta


def test_two_rank_plan_covers_the_local_tasks() -> None:
    for step in range(3):
        for layout in ("all", "spread"):
            local = build_plan(step, 1, 4, layout)
            split = build_plan(step, 2, 4, layout)
            tasks = lambda p: sorted((s.task_id, s.episode) for s in p.slots)  # noqa: E731
            assert tasks(split) == tasks(local)
            assert len(split.for_rank(0).support) == len(split.for_rank(1).support)


@pytest.mark.parametrize("spec", ["acc:all", "acc:one:gc"])
def test_accelerate_launch_matches_local(accel: Path, one_proc: Path, spec: str) -> None:
    meta = _check(accel, spec, one_proc, "local:all")
    assert meta["world"] == 2


def test_accelerate_launch_metasgd_matches_local(accel: Path, one_proc: Path) -> None:
    _check_metasgd(accel, "acc:all:metasgd", one_proc, "local:all:metasgd")


def test_zero3_adapter_round_trips_through_peft(two_proc: Path) -> None:
    """The adapter saved from 2-rank ZeRO-3 is non-empty, loads with PeftModel.from_pretrained on a
    fresh base, and gives the logits of the trained adapter."""
    from peft import PeftModel

    from tests.distributed._common import build_base, build_model

    torch.set_num_threads(1)
    folder = two_proc / "ds3_one_gc_save_adapter"
    saved = load_file(str(folder / "adapter_model.safetensors"))
    assert saved and all(t.numel() > 0 for t in saved.values())
    trained, _ = _load(two_proc, "ds3:one:gc:save")
    assert sum(t.numel() for t in saved.values()) == sum(t.numel() for t in trained)

    loaded = PeftModel.from_pretrained(build_base(), str(folder)).eval()
    reference = build_model().eval()
    with torch.no_grad():
        for p, t in zip([p for p in reference.parameters() if p.requires_grad], trained, strict=True):
            p.copy_(t)
    fresh = build_model().eval()
    ids = torch.arange(1, 17).reshape(2, 8)
    with torch.no_grad():
        got = loaded(input_ids=ids).logits
        want = reference(input_ids=ids).logits
        untrained = fresh(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(untrained, want, atol=1e-4)  # the adapter carries the training


@pytest.mark.parametrize(("launch", "spec", "ref"), ROWS)
def test_rows_across_ranks_match_the_one_process_reference(
    request: pytest.FixtureRequest, one_proc: Path, launch: str, spec: str, ref: str
) -> None:
    """Every rank adapts every task on its share of the rows and the inner steps sum the stacked
    inner gradients over ranks (clipping by the whole task's norm after the sum): the adapter,
    the outer grad norms and Meta-SGD's learned step sizes equal one process with whole tasks."""
    out = request.getfixturevalue(launch)
    if spec.endswith("metasgd"):
        _check_metasgd(out, spec, one_proc, ref)
    else:
        _check(out, spec, one_proc, ref)
    if launch != "one_proc":
        assert _load(out, spec)[1]["world"] == {"two_proc": 2, "four_proc": 4}[launch]


def test_rows_plans_split_tasks_unevenly_and_clipping_acts(one_proc: Path) -> None:
    """The rows tests can fail: tasks' rows really are split unevenly over ranks (some ranks run
    dummy passes), the inner clip changes the result, and MetaICL differs from FOMAML."""
    from tests.distributed._common import build_rows_plan

    plan = build_rows_plan(0, 4, 3)
    per_task = [[sum(1 for p in r.support for t in p.slots if t == task) for r in plan.ranks] for task in range(3)]
    assert any(len(set(rows)) > 1 for rows in per_task), per_task
    assert any(p.is_dummy for r in plan.ranks for p in r.query)
    assert all(r.slots == plan.ranks[0].slots and r.shared for r in plan.ranks)
    # The clip moves the adapter by ~7e-5 relative (the outer step is small next to the weights),
    # far above the ~1e-7 the rows runs differ from their references by.
    for a, b, margin in (("local:all:clip", "local:all", 5), ("local:all:metaicl", "local:all", 100),
                         ("local:all:clip:reptile", "local:all:reptile", 5)):
        assert relative_error(_load(one_proc, a)[0], _load(one_proc, b)[0]) > margin * TOL, (a, b)


@pytest.mark.timeout(180)
def test_rank_leaving_early_fails_fast_not_hangs(tmp_path: Path) -> None:
    """The last rank exits 0 after one meta-step (torchrun launch): the other rank must fail within
    the short process-group timeout instead of waiting for minutes."""
    import time

    start = time.monotonic()
    with pytest.raises(AssertionError, match="failed with rc="):
        run_worker(tmp_path, ["ds3:all:exit_early"], nprocs=2, launcher="torchrun",
                   timeout_s=150, pg_timeout_s=15)
    assert time.monotonic() - start < 150
    assert not (tmp_path / "ds3_all_exit_early.safetensors").exists()


@pytest.mark.parametrize(("launch", "spec", "ref", "padded"), LINES)
def test_padding_free_lines_match_the_reference_with_fewer_padded_tokens(
    request: pytest.FixtureRequest, one_proc: Path, launch: str, spec: str, ref: str, padded: str
) -> None:
    """Padding-free passes (examples end to end, positions restarting, per-token task routing)
    give the one-process adapter with one task per pass, and process fewer padded tokens than the
    same layout padded."""
    out = request.getfixturevalue(launch)
    meta = _check(out, spec, one_proc, ref)
    assert meta["padded_tokens"] < _load(out, padded)[1]["padded_tokens"]


def _gathered(out: Path, spec: str, rank: int) -> list[dict]:
    return json.loads((out / f"{spec.replace(':', '_')}.gathered.{rank}.json").read_text())


def _tasks(observations: list[dict]) -> list[tuple[int, int, float]]:
    return sorted((o["step"], o["task_id"], o["query_loss"]) for o in observations if o["kind"] == "task")


def test_two_rank_gather_equals_one_process(two_proc: Path, one_proc: Path) -> None:
    """gather_step under 2-rank ZeRO-3 gives every rank the same result, made of each rank's own
    observations in rank order, equal to one process's for the same tasks: the task observations
    (losses to 1e-4), the real-token total. On every step, the second after an outer update, so the adapters moved alike too; padded
    tokens and pass observations differ by construction (all four tasks on one rank vs two each)."""
    import math

    local = _gathered(one_proc, "local:all:gather", 0)
    rank0, rank1 = _gathered(two_proc, "ds3:all:gather", 0), _gathered(two_proc, "ds3:all:gather", 1)
    assert len(local) == len(rank0) == len(rank1) == STEPS
    for step, (ref, a, b) in enumerate(zip(local, rank0, rank1, strict=True)):
        assert a["observations"] == b["observations"] == a["mine"] + b["mine"]
        assert {o["rank"] for o in a["observations"] if o["kind"] == "pass"} == {0, 1}
        assert a["n_real_tasks"] == ref["n_real_tasks"] == 4
        assert a["n_tokens"] == ref["n_tokens"] > 0
        rec = a["record"]
        assert rec["tokens"] == sum(rec["rank_tokens"]) == ref["n_tokens"]
        assert all(len(rec[k]) == 2 for k in ("rank_compute_s", "rank_collective_s", "rank_data_wait_s",
                                              "rank_tokens", "rank_peak_memory_mb"))
        got, want = _tasks(a["observations"]), _tasks(ref["observations"])
        assert [t[:2] for t in got] == [t[:2] for t in want] == [(step, t) for t in range(4)]
        for (_, _, x), (_, _, y) in zip(got, want, strict=True):
            assert math.isfinite(x) and abs(x - y) <= 1e-4 * abs(y), (step, got, want)
        assert rec["outer_loss"] == pytest.approx(ref["record"]["outer_loss"], rel=1e-4)
