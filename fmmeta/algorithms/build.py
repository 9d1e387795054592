"""Which algorithms exist, what each spends per episode, and the factory that builds one by name.

The recipe trains every method it lists (``methods``) from the one ``algorithm`` section; this
module is the only place that maps a name to a class, so adding a method is one entry in
:data:`ALGORITHMS`, one in :data:`BUDGET_RULES` and one in :func:`build_algorithm`.
"""

from __future__ import annotations

from fmmeta.algorithms.baselines import MetaICL, MultiTask
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.first_order import FOMAML, Reptile
from fmmeta.algorithms.meta_sgd import MetaSGD
from fmmeta.algorithms.protocol import MetaAlgorithm
from fmmeta.config import raise_if_invalid

__all__ = ["ALGORITHMS", "BUDGET_RULES", "adapts_in_context", "build_algorithm"]

ALGORITHMS = ("fomaml", "metasgd", "reptile", "multitask", "metaicl")
"""Every method name ``methods`` accepts."""

_BUILT_ALONE: dict[str, type[FOMAML | Reptile | MultiTask | MetaICL]] = {
    "fomaml": FOMAML, "reptile": Reptile, "multitask": MultiTask, "metaicl": MetaICL,
}
_CLASSES: dict[str, type[FOMAML | MetaSGD | Reptile | MultiTask | MetaICL]] = {**_BUILT_ALONE, "metasgd": MetaSGD}
"""The class behind each name (what it is, e.g. its ``fast_weights``). MetaSGD is built around a
FOMAML, so :func:`build_algorithm` composes it; the others are built alone."""

BUDGET_RULES: dict[str, str] = {
    "fomaml": "{k} inner steps over the support set, then the query gradient at the adapted weights.",
    "metasgd": "{k} inner steps over the support set at its learned per-tensor step sizes, then the "
    "query gradient at the adapted weights (the step sizes' gradient reuses those tensors).",
    "reptile": "{k} inner steps over the support set; theta - phi is the meta-gradient.",
    "multitask": "the same support rows as {k} inner steps, spent on {k} distinct support sets "
    "(not one set {k} times), plus the query, all at theta.",
    "metaicl": "the query rows with the support prepended as demonstrations (longer rows, no "
    "support passes).",
}
"""The compute each method spends per episode, as the evaluation report states it (``{k}``:
inner steps)."""


def build_algorithm(name: str, cfg: AlgorithmConfig, pad_id: int) -> MetaAlgorithm:
    """Builds the meta-algorithm ``name`` (one of :data:`ALGORITHMS`).

    Args:
        name: which algorithm; one of :data:`ALGORITHMS`.
        cfg: algorithm settings (identical on every rank).
        pad_id: the tokenizer's padding id, used when collating passes.

    Raises:
        ValueError: for an unknown name; ConfigError for an invalid ``cfg``.

    Example:
        >>> algo = build_algorithm("reptile", AlgorithmConfig(inner_steps=5), pad_id=tok.pad_token_id)
    """
    if name not in _CLASSES:
        raise ValueError(f"algorithm {name!r} is unknown: choose one of {list(ALGORITHMS)}")
    raise_if_invalid(cfg)
    if name == "metasgd":  # FOMAML plus learned step sizes: composed, not subclassed
        return MetaSGD(FOMAML(cfg, pad_id), cfg)
    return _BUILT_ALONE[name](cfg, pad_id)


def adapts_in_context(name: str, cfg: AlgorithmConfig) -> bool:
    """Whether method ``name`` adapts, and is scored, on in-context rows: ``cfg.inner_format`` is
    ``"in_context"`` and the method has fast weights (FOMAML, Meta-SGD, Reptile; multi-task and
    MetaICL keep their own rows)."""
    return cfg.inner_format == "in_context" and name in _CLASSES and _CLASSES[name].fast_weights
