"""Scoring many sequences that share prefixes in one row: a token trie with an ancestor mask.

Scoring a query set is mostly repeated work when sequences are laid out one per row: a
classification query is scored once per label word, so its prompt is encoded once per candidate,
and an in-context query carries the whole support set before it, encoded again for every query
and every candidate. Yet under a causal model a token's hidden state depends only on the tokens
before it in its own sequence. :func:`build_tree` therefore merges the sequences into a trie (a
shared prefix becomes one run of nodes) and lays the trie out as one row in which every node
attends only to its ancestors (itself included) and sits at its depth as position id. Each node's
hidden state is then exactly what it is in its own sequence, up to float rounding, and every
answer token is read off the node of the prefix that predicts it.

An episode's 6 queries x 3 label words become one row of about 100 tokens instead of 18 sequences
(216 tokens before padding); with the support set in context the demonstrations are encoded once,
not 18 times. The attention mask is materialised (``[B, 1, T, T]``), so a row is kept to the
sequences of one micro-batch of queries, and a pass holds one such row per episode scored
together, up to a bound on the pass's padded tokens (see :mod:`fmmeta.evaluation.scoring`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PrefixTree:
    """A trie over token sequences, laid out as one row (nodes in insertion order).

    Attributes:
        tokens: ``[T]`` token id of each node.
        positions: ``[T]`` depth of each node (its position in every sequence through it).
        ancestors: ``[T, T]`` bool, ``ancestors[i, j]`` when node ``j`` is node ``i`` or one of
            its ancestors (the attention mask: a node sees its own sequence's prefix only).
        predictor: ``[M]`` node whose output predicts each answer token.
        target: ``[M]`` the answer token it predicts.
        sequence: ``[M]`` the sequence (index into the input) that answer token belongs to.
    """

    tokens: np.ndarray
    positions: np.ndarray
    ancestors: np.ndarray
    predictor: np.ndarray
    target: np.ndarray
    sequence: np.ndarray

    @property
    def n_nodes(self) -> int:
        """Tokens in the row."""
        return int(self.tokens.shape[0])


def build_tree(sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> PrefixTree:
    """The trie of ``(prompt, answer)`` sequences, each answer token tied to its predictor node.

    Raises:
        ValueError: on no sequences, or a sequence with an empty prompt or answer (the first
            answer token is predicted from the prompt's last token).
    """
    if not sequences:
        raise ValueError("build_tree() got no sequences: pass one or more (prompt, answer) pairs")
    children: list[dict[int, int]] = [{}]  # node 0 is a virtual root, not laid out
    tokens: list[int] = [-1]
    depth: list[int] = [-1]
    parent: list[int] = [-1]
    predictor: list[int] = []
    target: list[int] = []
    sequence: list[int] = []
    for s, (prompt, answer) in enumerate(sequences):
        if len(prompt) == 0 or len(answer) == 0:
            raise ValueError(
                f"sequence {s} has {len(prompt)} prompt and {len(answer)} answer tokens: each "
                "needs >= 1 of both"
            )
        node = 0
        full = [*prompt, *answer]
        for i, tok in enumerate(full):
            if i >= len(prompt):  # the node reached so far predicts this answer token
                predictor.append(node)
                target.append(int(tok))
                sequence.append(s)
            nxt = children[node].get(int(tok))
            if nxt is None:
                nxt = len(tokens)
                children[node][int(tok)] = nxt
                children.append({})
                tokens.append(int(tok))
                depth.append(depth[node] + 1)
                parent.append(node)
            node = nxt
    n = len(tokens) - 1
    ancestors = np.zeros((n + 1, n + 1), dtype=bool)
    for i in range(1, n + 1):  # parents come first in insertion order
        ancestors[i] = ancestors[parent[i]]
        ancestors[i, i] = True
    return PrefixTree(
        tokens=np.asarray(tokens[1:], dtype=np.int64),
        positions=np.asarray(depth[1:], dtype=np.int64),
        ancestors=ancestors[1:, 1:],
        predictor=np.asarray(predictor, dtype=np.int64) - 1,
        target=np.asarray(target, dtype=np.int64),
        sequence=np.asarray(sequence, dtype=np.int64),
    )


def count_nodes(sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> int:
    """The nodes :func:`build_tree` lays out for ``sequences`` (a pass's width), counted without
    building the ancestor matrix, so passes can be planned before any is run."""
    root: dict[int, dict] = {}
    n = 0
    for prompt, answer in sequences:
        node = root
        for tok in (*prompt, *answer):
            nxt = node.get(tok)
            if nxt is None:
                nxt = node[tok] = {}
                n += 1
            node = nxt
    return n


def tree_inputs(trees: Sequence[PrefixTree], dtype: torch.dtype, device: torch.device | str
                ) -> dict[str, torch.Tensor]:
    """The model inputs of a pass with one tree per row: ``input_ids`` and ``position_ids``
    ``[B, T]`` and an additive ``[B, 1, T, T]`` attention mask in the model's ``dtype`` (0 where
    a node attends, the dtype's lowest value elsewhere; transformers passes a 4D mask to
    attention as it is). Rows shorter than the longest are padded with nodes that attend only
    to themselves (their outputs are never read; a row of the mask with no allowed entry would
    give NaN in some attention kernels)."""
    width = max(t.n_nodes for t in trees)
    ids = torch.zeros((len(trees), width), dtype=torch.long)
    pos = torch.zeros((len(trees), width), dtype=torch.long)
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(trees), 1, 1)
    for i, t in enumerate(trees):
        n = t.n_nodes
        ids[i, :n] = torch.from_numpy(t.tokens)
        pos[i, :n] = torch.from_numpy(t.positions)
        allowed[i, :n, :n] = torch.from_numpy(t.ancestors)
    mask = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype).masked_fill_(allowed, 0.0)
    return {
        "input_ids": ids.to(device),
        "position_ids": pos.to(device),
        "attention_mask": mask[:, None].to(device),
    }


__all__ = ["PrefixTree", "build_tree", "count_nodes", "tree_inputs"]
