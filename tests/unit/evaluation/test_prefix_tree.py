"""Prefix-tree scoring equals one sequence per forward pass (the layout it replaces)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eval_helpers import PAD, lora_params, random_episode, random_state, tiny_lora_llama

from fmmeta.evaluation.prefix_tree import build_tree
from fmmeta.evaluation.scoring import QuerySet, score_passes, score_query, score_query_sets
from fmmeta.tasks.episode import Episode, Example

torch.set_num_threads(1)


def test_shared_prefixes_are_one_run_of_nodes_and_each_node_sees_only_its_ancestors() -> None:
    tree = build_tree([((5, 6, 7), (8, 2)), ((5, 6, 9), (8, 2)), ((5, 6, 7), (10,))])
    # 5 6 7 8 2 | 9 8 2 | 10: the shared "5 6" and "5 6 7" are laid out once.
    assert tree.tokens.tolist() == [5, 6, 7, 8, 2, 9, 8, 2, 10]
    assert tree.positions.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 3]
    assert np.flatnonzero(tree.ancestors[7]).tolist() == [0, 1, 5, 6, 7]  # 5 6 9 8 2
    assert np.flatnonzero(tree.ancestors[8]).tolist() == [0, 1, 2, 8]  # 5 6 7 10
    # Each answer token is predicted by the node of the prefix before it.
    assert tree.predictor.tolist() == [2, 3, 5, 6, 2]
    assert tree.target.tolist() == [8, 2, 8, 2, 10]
    assert tree.sequence.tolist() == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="prompt"):
        build_tree([((), (3,))])


def _one_by_one(model: torch.nn.Module, pairs: list[tuple[tuple[int, ...], tuple[int, ...]]]
                ) -> tuple[list[float], list[bool]]:
    """Reference: every sequence alone in its own forward pass, no mask, no cache."""
    logprob, ok = [], []
    with torch.no_grad():
        for prompt, answer in pairs:
            ids = torch.tensor([prompt + answer])
            logits = model(input_ids=ids).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            p = len(prompt)
            logprob.append(sum(lp[p + j - 1, y].item() for j, y in enumerate(answer)))
            ok.append(all(int(logits[p + j - 1].argmax()) == y for j, y in enumerate(answer)))
    return logprob, ok


def _reference(model: torch.nn.Module, query: tuple[Example, ...],
               choices: tuple[tuple[int, ...], ...] | None) -> tuple[float, float]:
    if choices is None:
        lp, ok = _one_by_one(model, [(q.prompt_ids, q.answer_ids) for q in query])
        n = sum(len(q.answer_ids) for q in query)
        return -sum(lp) / n, float(np.mean(ok))
    correct, gold, n = 0, 0.0, 0
    for q in query:
        scores, _ = _one_by_one(model, [(q.prompt_ids, c) for c in choices])
        assert q.label is not None
        correct += int(scores[q.label] > max(s for i, s in enumerate(scores) if i != q.label))
        (g,), _ = _one_by_one(model, [(q.prompt_ids, q.answer_ids)])
        gold, n = gold + g, n + len(q.answer_ids)
    return -gold / n, correct / len(query)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("classification", [True, False])
@pytest.mark.parametrize("demonstrations", [False, True])
def test_tree_scores_equal_one_sequence_per_pass(attn: str, classification: bool,
                                                 demonstrations: bool) -> None:
    model = tiny_lora_llama(seed=4)
    model.base_model.model.config._attn_implementation = attn
    params = lora_params(model)
    with torch.no_grad():
        for p, v in zip(params, random_state(params, 5, scale=0.3)):
            p.copy_(v)
    model.eval()
    g = torch.Generator().manual_seed(6)
    ep = random_episode(g, "t", classification=classification, shots=2, n_query=3)
    query = ep.in_context_query() if demonstrations else ep.query
    want_loss, want_acc = _reference(model, query, ep.choices)
    for mbs in (1, 2, 8):
        s = score_query(model, query, PAD, choices=ep.choices, micro_batch_size=mbs)
        assert s.loss == pytest.approx(want_loss, rel=1e-5)
        assert s.accuracy == want_acc
        assert score_passes([QuerySet(query, ep.choices)], micro_batch_size=mbs) == -(-len(query) // mbs)


def test_gold_answer_outside_the_candidates_is_scored_in_the_same_row() -> None:
    model = tiny_lora_llama(seed=7)
    model.eval()
    choices = ((20, 2), (21, 2), (22, 23, 2))
    query = (Example((5, 6, 7), (30, 2), 0), Example((8, 9), (21, 2), 1))
    want_loss, want_acc = _reference(model, query, choices)
    s = score_query(model, query, PAD, choices=choices)
    assert s.loss == pytest.approx(want_loss, rel=1e-5)
    assert s.accuracy == want_acc and s.n_answer_tokens == 4
    assert score_passes([QuerySet(query, choices)]) == 1


def test_bf16_tree_scores_stay_close_to_fp32() -> None:
    """In bf16 the row's additive mask takes the model's dtype; scores move by rounding only."""
    model = tiny_lora_llama(seed=8)
    model.eval()
    g = torch.Generator().manual_seed(9)
    ep = random_episode(g, "t", classification=True, shots=2, n_query=3)
    query = ep.in_context_query()
    fp32 = score_query(model, query, PAD, choices=ep.choices)
    bf16 = score_query(model.to(torch.bfloat16), query, PAD, choices=ep.choices)
    assert bf16.loss == pytest.approx(fp32.loss, rel=2e-2)


def _mc_reference(model: torch.nn.Module, query: tuple[Example, ...]) -> tuple[float, float, float]:
    """(loss, accuracy by summed log-probability, accuracy by mean per token), each option alone."""
    correct = per_token = 0
    gold, n = 0.0, 0
    for q in query:
        assert q.options is not None and q.label is not None
        scores, _ = _one_by_one(model, [(q.prompt_ids, o) for o in q.options])
        means = [s / len(o) for s, o in zip(scores, q.options)]
        correct += int(scores[q.label] > max(s for i, s in enumerate(scores) if i != q.label))
        per_token += int(means[q.label] > max(s for i, s in enumerate(means) if i != q.label))
        gold, n = gold + scores[q.label], n + len(q.options[q.label])
    return -gold / n, correct / len(query), per_token / len(query)


@pytest.mark.parametrize("demonstrations", [False, True])
def test_multiple_choice_options_as_branches_equal_each_option_alone(demonstrations: bool) -> None:
    """Per-question options that share prefixes and differ in length, ranked two ways."""
    model = tiny_lora_llama(seed=10)
    params = lora_params(model)
    with torch.no_grad():
        for p, v in zip(params, random_state(params, 11, scale=0.3)):
            p.copy_(v)
    model.eval()
    opts = [((20, 21, 2), (20, 22, 23, 2), (24, 2)), ((30, 2), (30, 31, 2)),
            ((40, 41, 42, 43, 2), (40, 41, 2), (44, 2), (45, 46, 2)), ((20, 21, 2), (24, 2))]
    questions = tuple(Example((5 + i, 6, 7 + i), o[i % len(o)], i % len(o), o) for i, o in enumerate(opts))
    ep = Episode("quiz", support=questions[:2], query=questions[2:] + questions[:1], shots=2)
    query = ep.in_context_query() if demonstrations else ep.query
    want_loss, want_acc, want_per_token = _mc_reference(model, query)
    for mbs in (1, 3):
        s = score_query(model, query, PAD, micro_batch_size=mbs)
        assert s.loss == pytest.approx(want_loss, rel=1e-5)
        assert (s.accuracy, s.accuracy_per_token) == (want_acc, want_per_token)


def test_a_query_set_mixing_questions_with_options_and_without_is_refused() -> None:
    q = (Example((5,), (20, 2), 0, ((20, 2), (21, 2))), Example((6,), (22, 2)))
    with pytest.raises(ValueError, match="mixes multiple-choice questions"):
        QuerySet(q).check()
    with pytest.raises(ValueError, match="a task's choices"):
        QuerySet(q[:1], ((20, 2), (21, 2))).check()


def test_passes_bounded_by_tokens_score_the_same_and_are_counted_before_they_run() -> None:
    """Long rows go a few to a pass (dense attention over a row is what held memory); the scores
    do not change, and score_passes announces exactly the passes that run (ZeRO-3 lockstep)."""
    model = tiny_lora_llama(seed=12)
    model.eval()
    g = torch.Generator().manual_seed(13)
    sets = [QuerySet(ep.in_context_query(), ep.choices)
            for ep in (random_episode(g, f"t{i}", classification=i % 2 == 0, shots=3, n_query=5) for i in range(6))]
    widths: list[int] = []
    model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].numel()), with_kwargs=True)
    whole = score_query_sets(model, sets, micro_batch_size=2, max_tokens=10**9)
    assert len(widths) == score_passes(sets, micro_batch_size=2, max_tokens=10**9) == 3
    widest = max(widths) // len(sets)
    widths.clear()
    bounded = score_query_sets(model, sets, micro_batch_size=2, max_tokens=2 * widest)
    assert len(widths) == score_passes(sets, micro_batch_size=2, max_tokens=2 * widest) > 3
    assert max(widths) <= 2 * widest
    for a, b in zip(whole, bounded):
        assert b.loss == pytest.approx(a.loss, rel=1e-5) and (b.accuracy, b.n) == (a.accuracy, a.n)
