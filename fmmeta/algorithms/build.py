"""Every meta-learning method fmmeta trains, each one :class:`Method` object, registered here.

A method is everything the toolkit knows about it, kept together: the class that computes its
meta-gradient, its own config section (``algorithm.<method>.<key>``, a field of
:class:`~fmmeta.algorithms.config.AlgorithmConfig` named after it), the compute it spends per
episode (the report's budget rule), the checks it puts on the shared settings, and how evaluation
adapts and scores it. Training, evaluation, the study and the report ask the method object, never
its name, so adding a method is its module plus one :func:`register_method` call at the end of
this file (and its section, if it has settings).

The record is the one home of a method's facts: its name, whether it has fast weights, how it is
scored. The algorithm classes compute and hold only what their settings decide per run
(``support_draws``, ``support_repeats``). :data:`METHODS` is read live: a method registered after
import (from another module, or a test) is one ``methods`` accepts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fmmeta.algorithms.anil import ANIL
from fmmeta.algorithms.baselines import MetaICL, MultiTask
from fmmeta.algorithms.config import AlgorithmConfig
from fmmeta.algorithms.first_order import FOMAML, Reptile
from fmmeta.algorithms.meta_sgd import MetaSGD
from fmmeta.algorithms.protocol import MetaAlgorithm
from fmmeta.config import raise_if_invalid
from fmmeta.config.schema import hints

__all__ = ["METHODS", "Method", "build_algorithm", "method_of", "register_method"]

Scoring = Literal["adapted", "demonstrations"]
"""How evaluation scores a method: ``"adapted"`` (adapt on the support, score the query; on
in-context rows where the method trains on them) or ``"demonstrations"`` (no step: the support is
prepended to each query, as MetaICL trains)."""


@dataclass(frozen=True)
class Method:
    """One meta-learning method, as every part of fmmeta sees it.

    Attributes:
        name: the name ``methods`` lists it by (and its run folder, its report row).
        build: makes its algorithm from the ``algorithm`` section and the tokenizer's pad id.
        budget: the compute it spends per episode, as the report states it: a format string with
            ``{k}`` (inner steps) and ``{cfg}`` (the ``algorithm`` section).
        fast_weights: it adapts a copy of the adapter per task, so it adapts (and is scored) on
            in-context rows when ``algorithm.inner_format`` says so, and with rows across ranks
            every rank holds every task's copy and all-reduces their gradients each inner step
            (the planner prices it).
        scoring: how evaluation scores it (:data:`Scoring`).
        adapted: which adapter tensors its inner loop adapts, given the section and the tensors'
            names (indices in their order); ``None``: every one.
        problems: what it refuses in the shared settings (Reptile learns nothing from 0 inner
            steps), one line per problem naming the key.
    """

    name: str
    build: Callable[[AlgorithmConfig, int], MetaAlgorithm]
    budget: str
    fast_weights: bool
    scoring: Scoring = "adapted"
    adapted: Callable[[AlgorithmConfig, Sequence[str]], list[int]] | None = None
    problems: Callable[[AlgorithmConfig], list[str]] = lambda cfg: []

    def budget_rule(self, cfg: AlgorithmConfig) -> str:
        """The budget sentence for the report, filled in from ``cfg``."""
        return self.budget.format(k=cfg.inner_steps, cfg=cfg)

    def adapts_in_context(self, cfg: AlgorithmConfig) -> bool:
        """Whether it adapts, and is scored, on in-context rows (``cfg.inner_format`` is
        ``"in_context"`` and it has fast weights; multi-task and MetaICL keep their own rows)."""
        return cfg.inner_format == "in_context" and self.fast_weights

    def adapted_tensors(self, cfg: AlgorithmConfig, names: Sequence[str]) -> list[int] | None:
        """The indices of the adapter tensors (named ``names``) its inner loop adapts, in training
        and in evaluation alike; ``None``: all of them."""
        return None if self.adapted is None else self.adapted(cfg, names)

    @property
    def settings(self) -> type | None:
        """Its own config section's class (``algorithm.<name>``), or ``None`` if it has none."""
        tp = hints(AlgorithmConfig).get(self.name)
        return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


METHODS: dict[str, Method] = {}
"""Every registered method by name, in registration order (the order of ``methods``' default)."""


def register_method(method: Method) -> Method:
    """Adds ``method`` to :data:`METHODS` (a name may be registered once)."""
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is registered twice")
    METHODS[method.name] = method
    return method


def method_of(name: str) -> Method | None:
    """The registered method ``name``, or ``None`` for a row that is no method (``base``, an
    adapter a user names)."""
    return METHODS.get(name)


def build_algorithm(name: str, cfg: AlgorithmConfig, pad_id: int) -> MetaAlgorithm:
    """Builds the meta-algorithm ``name`` (one of :data:`METHODS`).

    Args:
        name: which method.
        cfg: algorithm settings (identical on every rank).
        pad_id: the tokenizer's padding id, used when collating passes.

    Raises:
        ValueError: for an unknown name; ConfigError for an invalid ``cfg``.

    Example:
        >>> algo = build_algorithm("reptile", AlgorithmConfig(inner_steps=5), pad_id=tok.pad_token_id)
    """
    method = method_of(name)
    if method is None:
        raise ValueError(f"algorithm {name!r} is unknown: choose one of {list(METHODS)}")
    raise_if_invalid(cfg)
    return method.build(cfg, pad_id)


def _reptile_problems(cfg: AlgorithmConfig) -> list[str]:
    if cfg.inner_steps == 0:
        return ["algorithm.inner_steps=0 is invalid with reptile in methods: Reptile moves the "
                "adapter towards the weights after the inner steps, so with none it learns nothing "
                "(gradient 0 every meta-step); use inner_steps >= 1 or leave reptile out"]
    return []


register_method(Method(
    "fomaml", FOMAML, fast_weights=True,
    budget="{k} inner steps over the support set, then the query gradient at the adapted weights."))
register_method(Method(
    "metasgd", lambda cfg, pad_id: MetaSGD(FOMAML(cfg, pad_id), cfg), fast_weights=True,
    budget="{k} inner steps over the support set at its learned per-tensor step sizes, then the "
    "query gradient at the adapted weights (the step sizes' gradient reuses those tensors)."))
register_method(Method(
    "reptile", Reptile, fast_weights=True, problems=_reptile_problems,
    budget="{k} inner steps over the support set; theta - phi is the meta-gradient."))
register_method(Method(
    "multitask", MultiTask, fast_weights=False,
    budget="the same support rows as {k} inner steps, spent on {k} distinct support sets "
    "(not one set {k} times), plus the query, all at theta."))
register_method(Method(
    "metaicl", MetaICL, fast_weights=False, scoring="demonstrations",
    budget="the query rows with the support prepended as demonstrations (longer rows, no "
    "support passes)."))
register_method(Method(
    "anil", ANIL, fast_weights=True,
    adapted=ANIL.inner_tensors,
    budget="{k} inner steps over the support set adapting only the top {cfg.anil.layers} layers' "
    "adapter tensors (backward stops below them), then the query gradient of every tensor at the "
    "adapted weights."))


def __getattr__(name: str) -> Any:
    """``ALGORITHMS``, the method names, read when asked: it was a tuple taken at import, which
    missed every method registered later (benchmarks/precision.py still imports it)."""
    if name == "ALGORITHMS":
        return tuple(METHODS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
