"""The help text of a config, generated from the config itself so it cannot drift."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

from fmmeta.config.schema import dataclass_in, default_of, hints, list_item_dataclass, section_keys, type_name

__all__ = ["describe_config", "field_docs"]


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its one-line doc (the string literal under the field in the class body).

    Why parse source: attribute docstrings keep each field's doc next to its default, where a
    reader looks, without ``field(metadata=...)`` noise on every line. A section that extends
    another (``AlgorithmConfig`` the inner loop's) documents inherited fields in its base's
    body, so every class of the MRO is read, the subclass last (its docs win).
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """:func:`field_docs` of the fields written in ``cls``'s own body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe_config(config: Any, prefix: str = "") -> str:
    """One line per key, ``dotted.key (type, default): doc``, for ``--help`` texts.

    Args:
        config: the instance whose values are shown. Pass the recipe's default instance (e.g.
            ``RecipeConfig()``): a recipe overrides some of its sections' class defaults, and
            ``--help`` must show the values a run uses. A class is accepted too (for the items of a
            list of sections, which have no default instance): its fields show their own defaults.
        prefix: dotted path of ``config`` inside the whole config.
    """
    cls = config if isinstance(config, type) else type(config)
    instance = None if isinstance(config, type) else config
    field_types = hints(cls)
    docs = field_docs(cls)
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        doc = docs.get(f.name, "")
        value = default_of(f, instance)
        sections = section_keys(f)
        if sections:  # keys written beside this section's own, one section of them per choice
            for name, section in sections:
                lines.append(f"{prefix}<keys of builder {name}>: {(section.__doc__ or doc).strip().splitlines()[0]}")
                lines.append(describe_config(section, prefix))
            continue
        sub = dataclass_in(field_types[f.name])
        if sub is not None:
            lines.append(f"{dotted}: {doc or (sub.__doc__ or '').strip().splitlines()[0]}")
            lines.append(describe_config(value if isinstance(value, sub) else sub, dotted + "."))
            continue
        item = list_item_dataclass(field_types[f.name])
        if item is not None:  # a list of sections (tasks.collection): describe one item's keys
            lines.append(f"{dotted}: a list, each item: {doc}")
            lines.append(describe_config(item, dotted + "[]."))
            continue
        shown = "<required>" if value is dataclasses.MISSING else repr(value)
        lines.append(f"  {dotted} ({type_name(field_types[f.name])}, default {shown}): {doc}")
    return "\n".join(lines)
