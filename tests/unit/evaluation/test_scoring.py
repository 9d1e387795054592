"""score_query: loss by hand, exact match against greedy decoding, verbalizer ranking."""

from __future__ import annotations

import math

import pytest
import torch
from eval_helpers import PAD, VOCAB, lora_params, random_state, tiny_lora_llama

from fmmeta.evaluation.scoring import QueryScore, score_query
from fmmeta.tasks.episode import Episode, Example

torch.set_num_threads(1)


def _bias(**tokens: float) -> torch.Tensor:
    b = torch.zeros(VOCAB)
    for k, v in tokens.items():
        b[int(k[1:])] = v
    return b


def _set_state(model: torch.nn.Module, seed: int) -> None:
    params = lora_params(model)
    with torch.no_grad():
        for p, v in zip(params, random_state(params, seed, scale=0.3)):
            p.copy_(v)


def test_loss_equals_hand_computation_on_constant_logits() -> None:
    g = torch.Generator().manual_seed(3)
    b = torch.randn(VOCAB, generator=g) * 2
    model = tiny_lora_llama(lm_bias=b)
    examples = [
        Example((5, 6, 7), (9, 2)),
        Example((10,), (11, 12, 2)),
        Example((13, 14, 15, 16, 17), (2,)),
    ]
    bd = b.double()
    lse = torch.logsumexp(bd, 0).item()
    nll = [lse - bd[y].item() for ex in examples for y in ex.answer_ids]
    for mbs in (1, 2, 8):
        s = score_query(model, examples, PAD, micro_batch_size=mbs)
        assert s.n == 3 and s.n_answer_tokens == 6
        assert s.loss == pytest.approx(sum(nll) / len(nll), rel=1e-5)


def test_loss_and_exact_match_equal_manual_teacher_forcing_on_random_llama() -> None:
    model = tiny_lora_llama(seed=1)
    _set_state(model, seed=2)
    examples = [
        Example((5, 6, 7, 8), (9, 10, 2)),
        Example((20, 21), (22, 2)),
        Example((30, 31, 32, 33, 34, 35), (36, 37, 38, 2)),
    ]
    tot, n_tok = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([ex.prompt_ids + ex.answer_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            p = len(ex.prompt_ids)
            for j, y in enumerate(ex.answer_ids):
                tot -= logp[p + j - 1, y].item()
                n_tok += 1
    s = score_query(model, examples, PAD, micro_batch_size=2)  # padding inside a micro-batch
    assert s.loss == pytest.approx(tot / n_tok, rel=1e-4)
    assert s.accuracy == 0.0  # a random model does not produce these answers


def _greedy(model: torch.nn.Module, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return tuple(ids[len(prompt) :])


def test_exact_match_agrees_with_greedy_decoding() -> None:
    model = tiny_lora_llama(seed=4)
    _set_state(model, seed=5)
    prompts = [(5, 6, 7), (40, 41, 42, 43), (60,)]
    greedy = [_greedy(model, p, 3) for p in prompts]
    right = [Example(p, a) for p, a in zip(prompts, greedy)]
    assert score_query(model, right, PAD, micro_batch_size=2).accuracy == 1.0
    # Change one answer token (the last, so the prefix still matches): that query is wrong.
    last = greedy[1][-1]
    wrong_answer = greedy[1][:-1] + ((last + 1) % VOCAB,)
    mixed = [right[0], Example(prompts[1], wrong_answer), right[2]]
    assert score_query(model, mixed, PAD, micro_batch_size=2).accuracy == pytest.approx(2 / 3)


def test_exact_match_on_a_model_that_knows_and_one_that_does_not() -> None:
    knows = tiny_lora_llama(lm_bias=_bias(t7=20.0))
    does_not = tiny_lora_llama(lm_bias=_bias(t9=20.0))
    examples = [Example((3, 4), (7, 7)), Example((5,), (7,))]
    assert score_query(knows, examples, PAD).accuracy == 1.0
    assert score_query(does_not, examples, PAD).accuracy == 0.0
    # One wrong token in the answer is enough to miss.
    assert score_query(knows, [Example((3, 4), (7, 9))], PAD).accuracy == 0.0


def _episode(labels: list[int], choices: tuple[tuple[int, ...], ...]) -> Episode:
    query = tuple(Example((10 + i, 11 + i), choices[lab], lab) for i, lab in enumerate(labels))
    return Episode("cls", (), query, shots=1, ways=len(choices), choices=choices)


def test_verbalizer_ranking_sums_every_candidate_token() -> None:
    b = _bias(t5=0.0, t7=5.0, t8=5.0, t9=-20.0)
    model = tiny_lora_llama(lm_bias=b)
    lp = torch.log_softmax(b.double(), 0)
    # (7, 8) outscores (5,) although it is longer: label 1 right, label 0 wrong.
    ep = _episode([1, 0], ((5,), (7, 8)))
    s = score_query(model, ep, PAD, micro_batch_size=3)
    assert s.accuracy == 0.5 and s.n == 2
    gold_nll = -(lp[7] + lp[8] + lp[5]).item()
    assert s.loss == pytest.approx(gold_nll / 3, rel=1e-5)
    # (7, 9) starts like the favourite but its second token is very unlikely: the sum decides.
    ep2 = _episode([0, 0, 1], ((5,), (7, 9)))
    assert score_query(model, ep2, PAD, micro_batch_size=1).accuracy == pytest.approx(2 / 3)


def test_verbalizer_ranking_model_that_does_not_know_and_ties() -> None:
    ep = _episode([1, 1], ((5,), (6,)))
    assert score_query(tiny_lora_llama(lm_bias=_bias(t6=3.0)), ep, PAD).accuracy == 1.0
    assert score_query(tiny_lora_llama(lm_bias=_bias(t5=3.0)), ep, PAD).accuracy == 0.0
    # A model that cannot tell the candidates apart gets no credit from the tie-break.
    assert score_query(tiny_lora_llama(lm_bias=torch.zeros(VOCAB)), ep, PAD).accuracy == 0.0


def test_classification_loss_when_gold_answer_is_not_a_candidate() -> None:
    model = tiny_lora_llama(seed=6)
    query = (Example((10, 11), (5, 2), 0), Example((12,), (6, 2), 1))
    ep = Episode("cls", (), query, shots=1, ways=2, choices=((5,), (6,)))
    s_cls = score_query(model, ep, PAD)
    s_gen = score_query(model, list(query), PAD)
    assert s_cls.loss == pytest.approx(s_gen.loss, rel=1e-6)
    assert s_cls.n_answer_tokens == 4


def test_scoring_leaves_model_mode_and_grads_alone() -> None:
    model = tiny_lora_llama(seed=7)
    model.train()
    before = [p.detach().clone() for p in lora_params(model)]
    score_query(model, [Example((3,), (4,))], PAD)
    assert model.training
    for p, q in zip(lora_params(model), before):
        assert p.grad is None and torch.equal(p, q)


def test_invalid_inputs_name_the_problem() -> None:
    model = tiny_lora_llama(lm_bias=torch.zeros(VOCAB))
    with pytest.raises(ValueError, match="no query examples"):
        score_query(model, [], PAD)
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        score_query(model, [Example((3,), (4,))], PAD, micro_batch_size=0)
    with pytest.raises(ValueError, match=r"query\[0\].label=None"):
        score_query(model, [Example((3,), (4,))], PAD, choices=((4,), (5,)))
    assert isinstance(score_query(model, [Example((3,), (4,))], PAD), QueryScore)
    assert math.isfinite(score_query(model, [Example((3,), (4,))], PAD).loss)


def test_loss_is_the_inner_loops_query_loss() -> None:
    from fmmeta.algorithms.inner_loop import evaluate_loss
    from fmmeta.tasks.episode import collate

    model = tiny_lora_llama(seed=8)
    _set_state(model, seed=9)
    model.eval()
    examples = [Example((5, 6, 7), (9, 10, 2)), Example((20,), (22, 2)), Example((30, 31), (2,))]
    batches = [collate(examples[:2], PAD), collate(examples[2:], PAD)]
    want = evaluate_loss(model, lora_params(model), batches)
    assert score_query(model, examples, PAD, micro_batch_size=2).loss == pytest.approx(want, rel=1e-5)
