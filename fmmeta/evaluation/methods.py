"""What one row of the report is: an adapter state and how it is scored (:class:`EvalMethod`).

Callers name each row and pass either an :class:`EvalMethod` or just the adapter state
(:data:`MethodSpec`); :func:`prepare_methods` turns them into checked :class:`EvalMethod` s once, so
lr selection and the held-out evaluation read them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from fmmeta.algorithms.inner_loop import check_step_sizes

BASE = "base"
"""Name of the row of the initial adapter (LoRA B = 0): no meta-training."""
IN_CONTEXT = "in_context"
"""Name of the method that uses the support set as demonstrations instead of adapting on it."""
MULTITASK = "multitask"
"""The same-compute baseline every meta-learned method is compared with."""



@dataclass(frozen=True)
class EvalMethod:
    """How one row of the report is scored.

    Attributes:
        state: adapter tensors to load (``None`` = the adapter as it is, e.g. the base model's
            zero-B LoRA).
        demonstrations: score each query with the episode's support prepended as in-context
            demonstrations (MetaICL style), after adaptation if ``adapt``.
        adapt: adapt on the support for 1..max_steps steps and score after each; ``False``
            scores at step 0 only.
        in_context_support: adapt on the support rows in the in-context format (each with the
            other support examples as demonstrations), as ``algorithm.inner_format=in_context``
            trains; normally with ``demonstrations``.
        step_sizes: one adaptation step size per adapter tensor, learned in meta-training
            (``metasgd``, :func:`~fmmeta.algorithms.meta_sgd.load_step_sizes`); used as they are,
            so no lr is chosen from the grid for this method. ``None``: a single lr.
        adapted: the adapter tensors adaptation updates, as indices in the adapter's order (ANIL
            adapts its top layers' only, as it was meta-trained); ``None``: every one.
    """

    state: Sequence[torch.Tensor] | None = None
    demonstrations: bool = False
    adapt: bool = True
    in_context_support: bool = False
    step_sizes: Sequence[float] | None = None
    adapted: Sequence[int] | None = None


def as_eval_method(name: str, value: EvalMethod | Sequence[torch.Tensor] | None) -> EvalMethod:
    """``value`` as an :class:`EvalMethod`: a bare state (or ``None``) adapts without
    demonstrations, except under the name ``"in_context"``, which scores with demonstrations and
    no adaptation."""
    if isinstance(value, EvalMethod):
        return value
    if name == IN_CONTEXT:
        return EvalMethod(value, demonstrations=True, adapt=False)
    return EvalMethod(value)


MethodSpec = EvalMethod | Sequence[torch.Tensor] | None
"""What callers pass per method name: an :class:`EvalMethod` or just a state (see
:func:`as_eval_method`)."""



def prepare_methods(
    params: Sequence[torch.Tensor], methods: Mapping[str, MethodSpec]
) -> dict[str, EvalMethod]:
    """Every row as an :class:`EvalMethod`, checked against the adapter ``params`` it loads into.

    Raises:
        ValueError: on no methods, a state that does not fit ``params`` (count or shape), or
            learned step sizes that are not one positive, finite lr per adapter tensor.
    """
    specs = {name: as_eval_method(name, value) for name, value in methods.items()}
    _check_states(params, specs)
    for name, spec in specs.items():
        if spec.step_sizes is not None:
            check_step_sizes(spec.step_sizes, len(params))  # one positive, finite lr per adapter tensor
    return specs


def needs_lr(specs: Mapping[str, EvalMethod]) -> list[str]:
    """Methods that adapt with one lr (to choose), not with learned per-tensor ones."""
    return [m for m, spec in specs.items() if spec.adapt and spec.step_sizes is None]


def _check_states(params: Sequence[torch.Tensor], methods: Mapping[str, EvalMethod]) -> None:
    if not methods:
        raise ValueError("methods is empty: pass at least one adapter state, e.g. {'base': None}")
    for name, method in methods.items():
        state = method.state
        if state is None:
            continue
        if len(state) != len(params):
            raise ValueError(
                f"methods[{name!r}] has {len(state)} tensors for {len(params)} adapter parameters: "
                "pass a state saved from the same adapter (same LoRA targets and rank), in order"
            )
        for i, (p, t) in enumerate(zip(params, state)):
            if tuple(p.shape) != tuple(t.shape):
                raise ValueError(
                    f"methods[{name!r}][{i}] has shape {tuple(t.shape)} but adapter parameter {i} has "
                    f"shape {tuple(p.shape)}: the state belongs to a different adapter configuration"
                )

