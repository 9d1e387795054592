"""evaluate_methods / select_inner_lr: same inner loop, exact restore, no peeking at held-out tasks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from eval_helpers import PAD, lora_params, random_episode, random_state, tiny_lora_llama
from torch import nn

from fmmeta.algorithms.config import InnerLoopConfig
from fmmeta.algorithms.inner_loop import adapt, restore, snapshot
from fmmeta.evaluation import (
    IN_CONTEXT,
    AdaptPlan,
    EpisodeRecord,
    EvalMethod,
    EvalResult,
    EvalSettings,
    evaluate_held_out,
    evaluate_methods,
    select_inner_lr,
)
from fmmeta.evaluation.report import format_markdown
from fmmeta.evaluation.scoring import score_query
from fmmeta.tasks.episode import collate

torch.set_num_threads(1)


def _settings(inner: InnerLoopConfig, max_steps: int, **kw) -> EvalSettings:
    return EvalSettings(inner=inner, max_steps=max_steps, pad_id=PAD, **kw)


def _episodes(seed: int, n_seeds: int = 3, prefix: str = "test", **kw):
    g = torch.Generator().manual_seed(seed)
    return [
        [
            random_episode(g, f"{prefix}_cls", classification=True, **kw),
            random_episode(g, f"{prefix}_gen", classification=False, **kw),
        ]
        for _ in range(n_seeds)
    ]


def _reference(model, params, state, ep, lr, steps, inner):
    """Direct computation: load the state, adapt with the inner loop, score the query."""
    restore(params, state)
    cfg = dataclasses.replace(inner, inner_lr=lr)
    adapt(model, params, [collate(ep.support, PAD)], cfg, steps=steps)
    return score_query(model, ep, PAD)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_records_equal_direct_adaptation_and_params_are_restored(optimizer: str) -> None:
    model = tiny_lora_llama(seed=0)
    params = lora_params(model)
    model.eval()
    before = snapshot(params)
    trained = random_state(params, seed=1)
    # "trained" last: a missing final restore would leave its adapted weights behind
    methods = {"base": None, IN_CONTEXT: None, "trained": trained}
    eps = _episodes(seed=2)
    inner = InnerLoopConfig(inner_steps=2, inner_lr=0.2, inner_optimizer=optimizer, inner_clip_norm=5.0)
    model.train()
    res = evaluate_methods(model, params, methods, eps, _settings(inner, 2, micro_batch_size=8),
                           inner_lrs={"trained": 0.05}, progress=True)
    assert model.training  # mode restored
    for p, q in zip(params, before):
        assert torch.equal(p, q)
    assert res.inner_lrs == {"base": 0.2, "trained": 0.05}
    assert len(res.records) == 2 * 6 * 3 + 6

    by_key = {(r.method, r.seed, r.episode, r.step): r for r in res.records}
    model.eval()
    for method, state, lr in (("base", before, 0.2), ("trained", trained, 0.05)):
        for step in (0, 2):
            ref = _reference(model, params, state, eps[1][0], lr, step, inner)
            rec = by_key[(method, 1, 0, step)]
            assert rec.metrics["loss"] == pytest.approx(ref.loss, rel=1e-5, abs=1e-6)
            assert rec.metrics["accuracy"] == ref.accuracy and rec.kind == "classification"
    # adaptation really happens: the base model's support-trained loss moves
    assert by_key[("base", 0, 1, 2)].metrics["loss"] != by_key[("base", 0, 1, 0)].metrics["loss"]
    # in-context: base state, support as demonstrations, step 0 only
    restore(params, before)
    ep = eps[2][1]
    ref = score_query(model, ep.in_context_query(), PAD, choices=ep.choices)
    rec = by_key[(IN_CONTEXT, 2, 1, 0)]
    assert rec.metrics["loss"] == pytest.approx(ref.loss, rel=1e-6) and rec.kind == "generation"
    assert (IN_CONTEXT, 2, 1, 1) not in by_key


def _rec(method: str, seed: int, kind: str, loss: float, acc: float, step: int = 0) -> EpisodeRecord:
    return EpisodeRecord(method=method, seed=seed, episode=0, task=kind, kind=kind,
                         step=step, metrics={"loss": loss, "accuracy": acc}, n=4)


def test_summary_is_mean_and_worst_over_seed_means() -> None:
    recs = [
        _rec("m", 0, "classification", 1.0, 1.0), _rec("m", 0, "generation", 3.0, 0.0),
        _rec("m", 1, "classification", 2.0, 0.5), _rec("m", 1, "generation", 2.0, 0.5),
        _rec("m", 2, "classification", 0.5, 0.75), _rec("m", 2, "generation", 4.0, 0.25),
    ]
    res = EvalResult(records=recs, methods=["m"], max_steps=0, n_seeds=3, inner_lrs={"m": 0.1},
                     inner=InnerLoopConfig())
    cls = res.get("m", 0, "classification")
    assert cls.mean("accuracy") == pytest.approx(0.75) and cls.worst("accuracy") == 0.5
    assert cls.mean("loss") == pytest.approx(3.5 / 3) and cls.worst("loss") == 2.0
    overall = res.get("m", 0)  # seed means: acc 0.5, 0.5, 0.5; loss 2.0, 2.0, 2.25
    assert overall.mean("accuracy") == pytest.approx(0.5) and overall.worst("accuracy") == pytest.approx(0.5)
    assert overall.mean("loss") == pytest.approx(6.25 / 3) and overall.worst("loss") == 2.25
    assert overall.n_seeds == 3 and overall.n_episodes == 6
    with pytest.raises(KeyError, match="step=1"):
        res.get("m", 1)


class _Recorder(nn.Module):
    """Delegates to the model and logs whether each forward pass saw the sentinel token."""

    def __init__(self, module: nn.Module, sentinel: int) -> None:
        super().__init__()
        self.module = module
        self.sentinel = sentinel
        self.saw: list[bool] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kw):  # type: ignore[no-untyped-def]
        self.saw.append(bool((input_ids == self.sentinel).any()))
        return self.module(input_ids=input_ids, attention_mask=attention_mask, **kw)


SENTINEL = 127


def test_lr_selection_never_touches_held_out_episodes() -> None:
    model = tiny_lora_llama(seed=3)
    params = lora_params(model)
    rec = _Recorder(model, SENTINEL)
    methods = {"base": None, "trained": random_state(params, seed=4), IN_CONTEXT: None}
    val = [ep for eps in _episodes(5, n_seeds=1, prefix="val", forbid=SENTINEL) for ep in eps]
    test = _episodes(6, prefix="test", forbid=SENTINEL, extra_prompt=(SENTINEL,))
    inner = InnerLoopConfig(inner_steps=1, inner_lr=0.1)
    grid = (0.01, 0.3)

    alone = select_inner_lr(rec, params, methods, val, _settings(inner, 1, lr_grid=grid))
    n_select = len(rec.saw)
    assert n_select > 0 and not any(rec.saw)
    rec.saw.clear()

    res = evaluate_held_out(rec, params, methods, val, test, _settings(inner, 1, lr_grid=grid))
    # every selection pass ran before the first held-out pass, and none saw a held-out token
    assert rec.saw[:n_select] == [False] * n_select and all(rec.saw[n_select:])
    assert res.lr_selection is not None and res.lr_selection.chosen == alone.chosen
    assert res.inner_lrs == alone.chosen and res.lr_selection.tasks == ("val_cls", "val_gen")
    assert set(alone.chosen) == {"base", "trained"}
    for m, table in alone.val_loss.items():
        assert alone.chosen[m] == min(table, key=lambda lr: (table[lr], lr))
    # a held-out set that shares a task with validation is refused
    with pytest.raises(ValueError, match=r"tasks \['val_cls'\] are both validation and held-out"):
        evaluate_held_out(rec, params, methods, val, [[val[0]]] * 3, _settings(inner, 1, lr_grid=grid))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_lr_selection_table_equals_direct_validation_loss(optimizer: str) -> None:
    """The grid's lrs are tried side by side (one task per (lr, episode)), each equal to
    adapting at that lr alone."""
    model = tiny_lora_llama(seed=7)
    params = lora_params(model)
    model.eval()
    before = snapshot(params)
    val = _episodes(8, n_seeds=1, prefix="val")[0]
    inner = InnerLoopConfig(inner_steps=2, inner_lr=0.1, inner_optimizer=optimizer)
    sel = select_inner_lr(model, params, {"base": None}, val, _settings(inner, 2, lr_grid=(0.05, 1.0)))
    for p, q in zip(params, before):
        assert torch.equal(p, q)
    for lr in (0.05, 1.0):
        want = sum(_reference(model, params, before, ep, lr, 2, inner).loss for ep in val) / len(val)
        assert sel.val_loss["base"][lr] == pytest.approx(want, rel=1e-5)
    restore(params, before)


def test_invalid_evaluation_inputs_name_the_problem() -> None:
    model = tiny_lora_llama(seed=9)
    params = lora_params(model)
    eps = _episodes(10)
    inner = InnerLoopConfig()
    with pytest.raises(ValueError, match="min_seeds=3"):
        evaluate_methods(model, params, {"base": None}, eps[:2], _settings(inner, 1))
    bad = [t[..., :1] for t in random_state(params, 1)]
    with pytest.raises(ValueError, match=r"methods\['x'\]\[0\] has shape"):
        evaluate_methods(model, params, {"x": bad}, eps, _settings(inner, 1))
    with pytest.raises(ValueError, match="validation_episodes is empty"):
        select_inner_lr(model, params, {"base": None}, [], _settings(inner, 1))
    with pytest.raises(ValueError, match="lr_grid"):
        select_inner_lr(model, params, {"base": None}, eps[0], _settings(inner, 1, lr_grid=(0.0,)))


def test_every_method_sees_the_same_episodes_and_demonstrations_follow_adaptation() -> None:
    model = tiny_lora_llama(seed=11)
    params = lora_params(model)
    model.eval()
    before = snapshot(params)
    trained = random_state(params, seed=12)
    rec = _Recorder(model, SENTINEL)
    methods = {
        "base": None,
        IN_CONTEXT: None,
        "trained": trained,
        "trained+demos": EvalMethod(trained, demonstrations=True),
        "icl_only": EvalMethod(trained, demonstrations=True, adapt=False),
    }
    eps = _episodes(13)
    inner = InnerLoopConfig(inner_steps=2, inner_lr=0.1)
    res = evaluate_methods(rec, params, methods, eps, _settings(inner, 2, icl_max_length=10_000),
                           families={"test_cls": "fam_a", "test_gen": "fam_b"})
    keys = {m: {(r.seed, r.episode, r.task) for r in res.records if r.method == m} for m in methods}
    assert all(k == keys["base"] for k in keys.values()) and len(keys["base"]) == 6
    assert res.steps_of("icl_only") == [0] and res.steps_of("trained+demos") == [0, 1, 2]
    assert res.families() == ["classification", "generation", "fam_a", "fam_b", "overall"]
    by_key = {(r.method, r.seed, r.episode, r.step): r for r in res.records}
    ep = eps[1][0]
    # step 0 with demonstrations is the in-context score of that state ...
    restore(params, trained)
    icl = score_query(model, ep.in_context_query(), PAD, choices=ep.choices)
    assert by_key[("icl_only", 1, 0, 0)].metrics["loss"] == pytest.approx(icl.loss, rel=1e-6)
    assert by_key[("trained+demos", 1, 0, 0)].metrics["loss"] == pytest.approx(icl.loss, rel=1e-6)
    # ... and after 2 steps it is the adapted weights' in-context score
    adapt(model, params, [collate(ep.support, PAD)], inner, steps=2)
    adapted = score_query(model, ep.in_context_query(), PAD, choices=ep.choices)
    assert by_key[("trained+demos", 1, 0, 2)].metrics["loss"] == pytest.approx(adapted.loss, rel=1e-5)
    restore(params, before)
    # paired differences at headline steps: the hand computation on the same episodes
    c = res.compare("trained+demos", IN_CONTEXT, "classification")
    assert (c.method_step, c.baseline_step) == (2, 0)
    want = [by_key[("trained+demos", s, 0, 2)].metrics["accuracy"] - by_key[(IN_CONTEXT, s, 0, 0)].metrics["accuracy"]
            for s in range(3)]
    assert c.interval("accuracy").estimate == pytest.approx(sum(want) / 3) and c.interval("accuracy").n == 3
    assert {(x.method, x.baseline) for x in res.comparisons()} == {
        (m, IN_CONTEXT) for m in methods if m != IN_CONTEXT}
    cell = res.get("trained", 2, "fam_a")
    assert cell.interval("accuracy").low <= cell.mean("accuracy") <= cell.interval("accuracy").high


def test_a_difference_needs_the_same_episodes() -> None:
    recs = [_rec("a", 0, "classification", 1.0, 1.0), _rec("b", 1, "classification", 1.0, 0.0)]
    res = EvalResult(records=recs, methods=["a", "b"], max_steps=0, n_seeds=2, inner_lrs={},
                     inner=InnerLoopConfig())
    with pytest.raises(ValueError, match="different classification episodes"):
        res.compare("a", "b", "classification")


def test_learned_step_sizes_are_used_as_they_are_and_not_tuned() -> None:
    model = tiny_lora_llama(seed=14)
    params = lora_params(model)
    model.eval()
    before = snapshot(params)
    trained = random_state(params, seed=15)
    learned = [0.02 * (1 + i % 3) for i in range(len(params))]
    methods = {"plain": trained, "learned": EvalMethod(trained, step_sizes=learned)}
    val = _episodes(16, n_seeds=1, prefix="val")[0]
    test = _episodes(17)
    inner = InnerLoopConfig(inner_steps=2, inner_lr=0.1)
    res = evaluate_held_out(model, params, methods, val, test, _settings(inner, 2, lr_grid=(0.01, 0.3)))
    assert set(res.lr_selection.chosen) == {"plain"} and set(res.inner_lrs) == {"plain"}
    assert res.step_sizes == {"learned": learned}
    ep = test[0][1]
    restore(params, trained)
    adapt(model, params, [collate(ep.support, PAD)], inner, steps=2, step_sizes=learned)
    ref = score_query(model, ep, PAD)
    rec = next(r for r in res.records if (r.method, r.seed, r.episode, r.step) == ("learned", 0, 1, 2))
    assert rec.metrics["loss"] == pytest.approx(ref.loss, rel=1e-5)
    restore(params, before)
    with pytest.raises(ValueError, match="step sizes for"):
        evaluate_methods(model, params, {"x": EvalMethod(trained, step_sizes=[0.1])}, test, _settings(inner, 1))
    assert "learned step sizes, one per adapter tensor" in format_markdown(res)


def test_scoring_a_few_steps_gives_the_same_scores_at_those_steps() -> None:
    """score_steps skips scoring, not adaptation: the steps it keeps score exactly as when every
    step is scored, the headline step always is, and the report shows only the scored steps."""
    model = tiny_lora_llama(seed=0)
    params = lora_params(model)
    methods = {"base": None, "trained": random_state(params, seed=1)}
    eps = _episodes(seed=3)
    inner = InnerLoopConfig(inner_steps=3, inner_lr=0.2, inner_clip_norm=5.0)
    every = evaluate_methods(model, params, methods, eps, _settings(inner, 3))
    few = evaluate_methods(model, params, methods, eps, _settings(inner, 3, score_steps=(1,)))
    assert few.scored_steps() == [1, 3] and every.scored_steps() == [0, 1, 2, 3]
    full = {(r.method, r.seed, r.episode, r.step): r for r in every.records}
    assert len(few.records) == len(every.records) // 2
    for r in few.records:
        assert r == full[(r.method, r.seed, r.episode, r.step)]
    text = format_markdown(few)
    assert "(scored after [1, 3])" in text and "| 1 step | 3 steps |" in text and "0 steps" not in text
    with pytest.raises(ValueError, match="score_steps=\\[4\\] is invalid"):
        evaluate_methods(model, params, methods, eps, _settings(inner, 3, score_steps=(4,)))


@pytest.mark.parametrize(("optimizer", "padding_free"), [("sgd", False), ("adam", False), ("adam", True)])
def test_episodes_adapted_together_score_as_one_at_a_time(optimizer: str, padding_free: bool, monkeypatch) -> None:
    """Groups of episodes share passes (rows routed to each episode's own fast weights): the
    records equal one episode per pass (rel 1e-6), with uneven groups (5 episodes per seed in
    groups of 2), support sets of different sizes split into several passes, learned step sizes,
    demonstrations and per-episode clipping; also when the groups' passes are padding-free lines
    (each token routed to its episode) and the reference's are padded.

    In float64: the two layouts sum in different orders, and Adam's normalised step turns fp32
    rounding of a tiny gradient entry into a whole step, so in fp32 the records differed by 1.4e-5
    on one CPU (AVX-512/AMX) and by less on another; the comparison is about the arithmetic."""
    from fmmeta.tasks import lines

    monkeypatch.setattr(lines, "MIN_SAVING", 0.0)  # lines wherever they save a token
    model = tiny_lora_llama(seed=0).double()
    params = lora_params(model)
    trained = random_state(params, seed=1)
    learned = [0.05 * (1 + i % 3) for i in range(len(params))]
    g = torch.Generator().manual_seed(7)
    eps = [[random_episode(g, f"t{i}", classification=i % 2 == 0, shots=1 + i % 3, n_query=1 + i % 2)
            for i in range(5)] for _ in range(3)]
    methods = {"base": None, "trained+demos": EvalMethod(trained, demonstrations=True),
               "learned": EvalMethod(trained, step_sizes=learned)}
    inner = InnerLoopConfig(inner_steps=2, inner_lr=0.2, inner_optimizer=optimizer, inner_clip_norm=0.5)

    def run(per_pass: int, padding_free: bool = False) -> dict:
        cfg = dataclasses.replace(inner, padding_free=padding_free)
        res = evaluate_methods(model, params, methods, eps,
                               _settings(cfg, 2, micro_batch_size=2, episodes_per_pass=per_pass))
        return {(r.method, r.seed, r.episode, r.step): r for r in res.records}

    alone, together = run(1), run(2, padding_free)
    if padding_free:  # the groups' passes really are lines
        from fmmeta.evaluation.adaptation import support_passes

        assert any(p.batch.lines is not None for p in support_passes(eps[0][:2], PAD, 2, padding_free=True))
    assert alone.keys() == together.keys() and len(alone) == 3 * 5 * 3 * 3
    for key, r in alone.items():
        assert together[key].metrics["loss"] == pytest.approx(r.metrics["loss"], rel=1e-6, abs=1e-7), key
        assert together[key].metrics["accuracy"] == r.metrics["accuracy"], key


def test_support_passes_sort_rows_by_length_within_the_token_budget(monkeypatch) -> None:
    """Every support row of the group exactly once, routed to its episode, passes padded to
    similar lengths and never over the budget (one row longer than it still gets a pass)."""
    from fmmeta.evaluation import adaptation

    monkeypatch.setattr(adaptation, "SUPPORT_PASS_TOKENS", 40)
    g = torch.Generator().manual_seed(3)
    eps = [random_episode(g, f"t{i}", classification=False, shots=2 + i % 3, prompt_len=2 + 3 * i)
           for i in range(4)]
    passes = adaptation.support_passes(eps, PAD, micro_batch_size=8)
    seen = []
    for p in passes:
        lengths = p.batch.attention_mask.sum(dim=1).tolist()
        width = p.batch.input_ids.shape[1]
        assert width * len(lengths) <= 40 or len(lengths) == 1
        for row, task, n in zip(p.batch.input_ids.tolist(), p.rows.tolist(), lengths):
            seen.append((task, tuple(row[:n])))
    want = [(t, tuple(ex.prompt_ids) + tuple(ex.answer_ids)) for t, ep in enumerate(eps) for ex in ep.support]
    assert sorted(seen) == sorted(want) and len(passes) > 1
    longest = [p.batch.input_ids.shape[1] for p in passes]
    assert longest == sorted(longest)  # short rows together, long rows together


def test_a_method_trained_in_context_adapts_and_is_scored_in_that_format() -> None:
    """``EvalMethod(in_context_support=True, demonstrations=True)`` (``inner_format=in_context``)
    gives the scores of the plain path on the episodes formatted beforehand
    (``Episode.in_context``: leave-one-out support rows, in-context queries), in evaluation and in
    the lr choice alike; and not the plain-row adaptation's."""
    model = tiny_lora_llama(seed=21)
    params = lora_params(model)
    model.eval()
    trained = random_state(params, seed=22)
    eps = _episodes(23, n_seeds=3)
    formatted = [[ep.in_context(200) for ep in seed] for seed in eps]
    inner = InnerLoopConfig(inner_steps=2, inner_lr=0.1)
    settings, families = _settings(inner, 2, icl_max_length=200), {"test_cls": "fam_a", "test_gen": "fam_b"}
    ours = evaluate_methods(model, params, {"m": EvalMethod(trained, demonstrations=True, in_context_support=True)},
                            eps, settings, families=families)
    ref = evaluate_methods(model, params, {"m": EvalMethod(trained)}, formatted, settings, families=families)
    assert len(ours.records) == len(ref.records) == 3 * 2 * 3
    for a, b in zip(ours.records, ref.records, strict=True):
        assert (a.seed, a.episode, a.step, a.metrics["accuracy"]) == (b.seed, b.episode, b.step, b.metrics["accuracy"])
        assert a.metrics["loss"] == pytest.approx(b.metrics["loss"], rel=1e-5)
    demos_only = evaluate_methods(model, params, {"m": EvalMethod(trained, demonstrations=True)},
                                  eps, settings, families=families)
    after = [r.metrics["loss"] for r in ours.records if r.step == 2]
    assert max(abs(x - r.metrics["loss"]) for x, r in zip(after, [r for r in demos_only.records if r.step == 2])) > 1e-4
    val = [ep for seed in eps for ep in seed]
    grid = (0.05, 0.3)
    chose = select_inner_lr(model, params, {"m": EvalMethod(trained, demonstrations=True, in_context_support=True)},
                            val, _settings(inner, 2, lr_grid=grid, icl_max_length=200))
    chose_ref = select_inner_lr(model, params, {"m": EvalMethod(trained)}, [ep.in_context(200) for ep in val],
                                _settings(inner, 2, lr_grid=grid))
    for lr in grid:
        assert chose.val_loss["m"][lr] == pytest.approx(chose_ref.val_loss["m"][lr], rel=1e-5)


@pytest.mark.parametrize("padding_free", [False, True])
def test_the_lr_choice_takes_each_episodes_first_gradient_once(padding_free: bool, monkeypatch) -> None:
    """One episode at several lrs starts from the same weights, so its first gradient is the
    same for every lr: it is computed once per episode (the first step runs each support row
    once, not once per lr), and the losses equal those of distinct copies of the episode, with
    Adam and per-episode clipping, also in padding-free lines (float64: the comparison is about
    the arithmetic, not rounding)."""
    import copy

    from fmmeta.algorithms.task_lora import TaskLoRA
    from fmmeta.evaluation.adaptation import adapt_and_score
    from fmmeta.evaluation.lockstep import Lockstep, OneRank
    from fmmeta.tasks import lines

    monkeypatch.setattr(lines, "MIN_SAVING", 0.0)  # lines wherever they save a token
    model = tiny_lora_llama(seed=3).double()
    params = lora_params(model)
    model.eval()
    g = torch.Generator().manual_seed(5)
    eps = [random_episode(g, f"v{i}", classification=i % 2 == 0, shots=1 + i % 3) for i in range(3)]
    grid = (0.05, 0.3, 1.0)
    cfg = InnerLoopConfig(inner_steps=2, inner_lr=0.1, inner_optimizer="adam", inner_clip_norm=0.5,
                          padding_free=padding_free)
    rows: list[int] = []
    model.register_forward_pre_hook(lambda m, a, kw: rows.append(len(kw["input_ids"])), with_kwargs=True)

    def final_losses(episodes: list) -> tuple[list[float], int]:
        rows.clear()
        scored = adapt_and_score(model, TaskLoRA(model, params), params, [p.detach() for p in params], episodes,
                                 AdaptPlan(inner=cfg, pad_id=PAD, micro_batch_size=2), 2,
                                 Lockstep(model, params, OneRank()), score_steps=(),
                                 task_lrs=[lr for lr in grid for _ in eps])
        return [sc[0][1].loss for sc in scored], sum(rows)

    shared, shared_rows = final_losses([ep for _ in grid for ep in eps])
    apart, apart_rows = final_losses([copy.copy(ep) for _ in grid for ep in eps])  # nothing to share
    assert shared == pytest.approx(apart, rel=1e-10)
    assert len(set(shared)) == len(shared)  # the lrs did give different trajectories
    if padding_free:
        assert shared_rows < apart_rows
    else:
        assert apart_rows - shared_rows == (len(grid) - 1) * sum(len(ep.support) for ep in eps)


def test_an_adapter_of_another_model_width_is_refused_with_both_shapes(tmp_path) -> None:
    """peft's ``size mismatch`` traceback, raised after the model loaded, is one message naming the file."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fmmeta.errors import UserInputError
    from fmmeta.evaluation.run import read_adapter_state

    wide = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))
    get_peft_model(wide, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path)
    with pytest.raises(UserInputError, match=r"does not fit this model's adapter \(size mismatch .*64.*32") as err:
        read_adapter_state(tiny_lora_llama(), tmp_path)
    assert "adapter_model.safetensors" in str(err.value) and "more" in str(err.value)
