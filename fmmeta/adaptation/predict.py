"""Predictions for a user's queries through adapted fast weights: ranked candidates, greedy text.

Classification ranks every candidate by the sum of its tokens' log-probabilities, computed by the
evaluation's own scoring passes (:func:`~fmmeta.evaluation.scoring.score_sequences`: prompts
encoded once for all their candidates), so the label chosen here is the one the evaluation's
verbalizer ranking counts. A query whose label is known is counted correct by the evaluation's
rule: the gold candidate strictly highest (a tie is wrong).

Generation decodes greedily, one token per pass, to EOS or ``max_new_tokens``. Exact match under
teacher forcing (the evaluation's generation accuracy) is the same event as greedy decoding
producing the gold answer (the scoring module gives the induction), so where the answer is known
it is scored both ways and the two must agree.

The candidates of a query are the task's label words (``episode.choices``) or, for multiple
choice, the query's own options (``Example.options``), named by their texts.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fmmeta.algorithms.answer_loss import logits_at
from fmmeta.evaluation.scoring import score_sequences
from fmmeta.tasks.episode import Example

Route = Callable[[torch.Tensor], None]
DECODE_ROWS = 64
"""Queries decoded side by side in one pass (each row routed to its own task's fast weights)."""


def _candidates(ex: Example, choices: Sequence[tuple[int, ...]] | None) -> list[tuple[int, ...]]:
    """The sequences a query's answer is chosen among: its own options (multiple choice), else
    the task's choices."""
    if ex.options is not None:
        return [tuple(o) for o in ex.options]
    return [tuple(c) for c in choices] if choices is not None else []


def rank(model: nn.Module, route: Route | None, queries: Sequence[Sequence[Example]],
         choices: Sequence[Sequence[tuple[int, ...]]], labels: Sequence[Sequence[Sequence[str]]],
         known: Sequence[Sequence[bool]], micro_batch_size: int) -> list[list[dict[str, Any]]]:
    """Per task (query set ``g`` through fast weights ``g``), per query: the chosen label and every
    candidate's log-probability; with a known label also whether it is correct and its tokens.
    ``labels[g][i]`` names query ``i``'s candidates (a task's label set, or a question's options)."""
    per_set = [[[(tuple(ex.prompt_ids), c) for c in _candidates(ex, cs)] for ex in qs]
               for qs, cs in zip(queries, choices)]
    scored = score_sequences(model, per_set, micro_batch_size=micro_batch_size, route=route)
    out: list[list[dict[str, Any]]] = []
    for qs, task_words, ok, task_scores in zip(queries, labels, known, scored):
        rows = []
        for ex, words, is_known, s in zip(qs, task_words, ok, task_scores):
            lp = [float(x) for x in s.logprob]
            best = max(range(len(lp)), key=lambda i: lp[i])
            row: dict[str, Any] = {"prediction": words[best], "logprobs": dict(zip(words, lp))}
            if is_known and ex.label is not None:
                others = [x for i, x in enumerate(lp) if i != ex.label]
                row.update(label=words[ex.label], correct=bool(lp[ex.label] > max(others)),
                           answer_logprob=lp[ex.label], answer_tokens=int(s.n_tokens[ex.label]))
            rows.append(row)
        out.append(rows)
    return out


def teacher_forced(model: nn.Module, route: Route | None, queries: Sequence[Sequence[Example]],
                   known: Sequence[Sequence[bool]], micro_batch_size: int) -> list[list[dict[str, Any] | None]]:
    """Per task, per query with a known answer: its log-probability, tokens and exact match under
    teacher forcing (the evaluation's generation score); ``None`` for the others."""
    per_set = [[[(tuple(ex.prompt_ids), tuple(ex.answer_ids))] for ex, k in zip(qs, ok) if k]
               for qs, ok in zip(queries, known)]
    scored_sets = [g for g, qs in enumerate(per_set) if qs]  # a set with no known answer has no pass rows
    scored = (score_sequences(model, [per_set[g] for g in scored_sets], micro_batch_size=micro_batch_size,
                              route=None if route is None else subset_route(route, scored_sets)) if scored_sets else [])
    by_set = dict(zip(scored_sets, scored))
    out: list[list[dict[str, Any] | None]] = []
    for g, ok in enumerate(known):
        it = iter(by_set.get(g, []))
        out.append([_forced(next(it)) if k else None for k in ok])
    return out


def _forced(s: Any) -> dict[str, Any]:
    return {"answer_logprob": float(s.logprob[0]), "answer_tokens": int(s.n_tokens[0]),
            "exact_match": bool(s.all_argmax[0])}


def subset_route(route: Route, sets: Sequence[int]) -> Route:
    """``route`` for the listed sets only: set ``k`` of the sub-list is set ``sets[k]``."""
    index = torch.tensor(list(sets), dtype=torch.long)

    def sub(rows: torch.Tensor) -> None:
        route(index.to(rows.device)[rows])
    return sub

def _next_tokens(model: nn.Module, route: Route | None, seqs: Sequence[tuple[int, ...]], tasks: Sequence[int],
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass: the greedy next token of every sequence and its log-probability (fp32)."""
    device = next(model.parameters()).device
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    need = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):  # right-padded: every real token keeps its position
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        need[i, len(s) - 1] = True
    if route is not None:
        route(torch.tensor(list(tasks), dtype=torch.long, device=device))
    logits = logits_at(model, need.to(device), input_ids=ids.to(device), attention_mask=mask.to(device),
                       use_cache=False)
    logprob = F.log_softmax(logits.float(), dim=-1)
    token = logprob.argmax(dim=-1)
    return token.cpu(), logprob.gather(1, token[:, None])[:, 0].cpu()


def greedy_decode(model: nn.Module, route: Route | None, prompts: Sequence[tuple[int, ...]], tasks: Sequence[int],
                  *, eos_id: int | None, pad_id: int, max_new_tokens: int) -> list[tuple[list[int], float, bool]]:
    """Greedy continuations of ``prompts`` (prompt ``i`` through task ``tasks[i]``'s fast weights):
    per prompt its tokens (EOS included when reached), their summed log-probability and whether
    EOS stopped it (else ``max_new_tokens`` did)."""
    tokens: list[list[int]] = [[] for _ in prompts]
    logprob = [0.0] * len(prompts)
    stopped = [False] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for _ in range(max_new_tokens):
                live = [i for i in range(len(prompts)) if not stopped[i]]
                if not live:
                    break
                for lo in range(0, len(live), DECODE_ROWS):
                    chunk = live[lo : lo + DECODE_ROWS]
                    nxt, lp = _next_tokens(model, route, [tuple(prompts[i]) + tuple(tokens[i]) for i in chunk],
                                           [tasks[i] for i in chunk], pad_id)
                    for i, t, x in zip(chunk, nxt.tolist(), lp.tolist()):
                        tokens[i].append(int(t))
                        logprob[i] += float(x)
                        stopped[i] = eos_id is not None and int(t) == eos_id
    finally:
        model.train(was_training)
    return [(t, lp, s) for t, lp, s in zip(tokens, logprob, stopped)]


def generate(model: nn.Module, route: Route | None, queries: Sequence[Sequence[Example]],
             known: Sequence[Sequence[bool]], tokenizer: Any, *, micro_batch_size: int,
             max_new_tokens: int) -> list[list[dict[str, Any]]]:
    """Per task, per query: the greedy text, its log-probability and why it stopped; with a known
    answer also the answer, its teacher-forced score and whether the decoded text equals it."""
    flat = [(g, ex) for g, qs in enumerate(queries) for ex in qs]
    eos_id = getattr(tokenizer, "eos_token_id", None)
    decoded = iter(greedy_decode(model, route, [tuple(ex.prompt_ids) for _, ex in flat], [g for g, _ in flat],
                                 eos_id=eos_id, pad_id=int(tokenizer.pad_token_id), max_new_tokens=max_new_tokens))
    forced = teacher_forced(model, route, queries, known, micro_batch_size)
    out: list[list[dict[str, Any]]] = []
    for qs, tf in zip(queries, forced):
        rows = []
        for ex, gold in zip(qs, tf):
            toks, lp, eos = next(decoded)
            text = tokenizer.decode(toks[:-1] if eos else toks)
            row: dict[str, Any] = {"prediction": text, "logprob": lp, "stop": "eos" if eos else "max_new_tokens"}
            if gold is not None:
                row.update(answer=tokenizer.decode(list(ex.answer_ids[:-1] if eos_id is not None else ex.answer_ids)),
                           correct=tuple(toks) == tuple(ex.answer_ids), **gold)
            rows.append(row)
        out.append(rows)
    return out


__all__ = ["DECODE_ROWS", "generate", "greedy_decode", "rank", "subset_route", "teacher_forced"]
