"""ANIL over LoRA: the inner loop adapts only the top layers' adapter tensors.

Raghu et al. (2020, "Rapid Learning or Feature Reuse?") found that MAML's inner loop barely moves
the lower layers of a network: almost all of what it adapts per task is in the head, so adapting
only the head ("Almost No Inner Loop") learns as well at a fraction of the inner loop's cost. Here
the head is the adapter tensors of the top ``k`` decoder layers (``algorithm.anil.layers``):

* the inner loop adapts only those, and the other adapter tensors do not require grad while it
  runs, so a support pass records no graph below the lowest adapted layer and its backward stops
  there (an inner step costs the forward plus the backward of ``k`` layers, not of all of them);
* the outer step is FOMAML's: the query-loss gradient of every adapter tensor at the adapted
  weights, so the layers below learn the features the adapted top reuses;
* evaluation adapts the same top tensors (the method says so:
  :meth:`~fmmeta.algorithms.build.Method.adapted_tensors`).

With ``k`` at least the model's depth every tensor adapts and ANIL is FOMAML, bit for bit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import nn

from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.first_order import FOMAML
from fmmeta.errors import UserInputError

__all__ = ["ANIL", "top_layer_tensors"]

_LAYER = re.compile(r"\.(\d+)\.")
"""The first numbered module in a parameter's name is its decoder layer (``...layers.7.self_attn``
in Llama-style models, ``...h.7.attn`` in GPT-2-style ones)."""


def top_layer_tensors(names: Sequence[str], layers: int) -> list[int]:
    """Indices of the tensors (named ``names``) that belong to the top ``layers`` decoder layers.

    Raises:
        ValueError: a name without a layer number (an adapter on a module outside the decoder
            layers, which ANIL could not place above or below the others).
        UserInputError: more layers than the model has (ANIL would quietly be FOMAML).
    """
    index: list[int] = []
    for name in names:
        found = _LAYER.search(name)
        if found is None:
            raise ValueError(f"adapter tensor {name!r} is in no numbered decoder layer: anil adapts "
                             "the top layers' adapter tensors, so put LoRA on layer modules only "
                             "(lora.target_modules) or use fomaml")
        index.append(int(found.group(1)))
    present = sorted(set(index))
    if layers > len(present):
        raise UserInputError(f"algorithm.anil.layers={layers} is invalid: the model has {len(present)} decoder layers "
                             f"with adapter tensors: with anil adapting every one of them it is fomaml, and more cannot "
                             f"be adapted. Use fewer than {len(present)} layers, or fomaml")
    top = present[-layers:]
    return [i for i, layer in enumerate(index) if layer in top]


class ANIL(FOMAML):
    """First-order MAML whose inner loop adapts only the top layers' adapter tensors.

    Example:
        >>> algo = build_algorithm("anil", AlgorithmConfig(anil=ANILConfig(layers=2)), pad_id=0)
        >>> result = algo.rank_gradient(engine.model, engine.adapter_parameters(), work)
    """

    def __init__(self, cfg: AlgorithmConfig, pad_id: int) -> None:
        super().__init__(cfg, pad_id)
        self._adapted: tuple[int, list[int]] | None = None

    @staticmethod
    def inner_tensors(cfg: AlgorithmConfig, names: Sequence[str]) -> list[int]:
        """The indices, among adapter tensors named ``names``, that the inner loop adapts: the top
        ``algorithm.anil.layers`` layers'. Training asks it here, evaluation through the method's
        record (:meth:`~fmmeta.algorithms.build.Method.adapted_tensors`): one rule for both."""
        return top_layer_tensors(names, cfg.anil.layers)

    def adapted_tensors(self, model: nn.Module, params: Sequence[nn.Parameter]) -> list[int]:
        """:meth:`inner_tensors` of ``params`` (found once per model)."""
        if self._adapted is None or self._adapted[0] != id(model):
            names = {id(p): n for n, p in model.named_parameters()}
            self._adapted = (id(model), self.inner_tensors(self.cfg, [names[id(p)] for p in params]))
        return self._adapted[1]
