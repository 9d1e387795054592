"""Reading a schema: the dataclass types, defaults and key names that loading and ``--help`` share.

A schema is a tree of keyword-only dataclasses; these helpers answer the questions both the loader
(:mod:`fmmeta.config.loader`) and the help text (:mod:`fmmeta.config.describe`) ask of it, so the
two cannot disagree about which default a key has or how its type is named.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union


def hints(cls: type) -> dict[str, Any]:
    """The resolved type of every field of ``cls`` (``from __future__`` annotations evaluated)."""
    return typing.get_type_hints(cls)


def all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema (for suggestions across sections)."""
    keys: list[str] = []
    field_types = hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        keys.append(dotted)
        sub = dataclass_in(field_types.get(f.name))
        if sub is not None:
            keys.extend(all_keys(sub, dotted + "."))
    return keys


def is_union(tp: Any) -> bool:
    """Whether ``tp`` is ``X | Y`` (either spelling)."""
    return typing.get_origin(tp) in (Union, types.UnionType)


def dataclass_in(tp: Any) -> type | None:
    """The dataclass type in ``tp`` (``X`` or ``X | None``), if any."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if is_union(tp):
        for arg in typing.get_args(tp):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                return arg
    return None


def list_item_dataclass(tp: Any) -> type | None:
    """The dataclass ``X`` of a ``list[X]`` field, if any."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return typing.cast(type, args[0])
    return None


def section_keys(f: dataclasses.Field[Any]) -> list[tuple[str, type]]:
    """The sections whose keys field ``f`` gathers: ``(name, section)`` from the callable in its
    ``sections`` metadata (a source's builder keys, written beside its own), else none."""
    sections = f.metadata.get("sections")
    return list(sections()) if callable(sections) else []


def type_name(tp: Any) -> str:
    """A type as a user reads it in a message or in ``--help`` (``int | null``, ``one of 'a', 'b'``)."""
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if is_union(tp):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    return str(tp).replace("typing.", "")


def default_of(f: dataclasses.Field[Any], base: Any) -> Any:
    """A field's default: from the enclosing default instance if any, else the field's own."""
    if base is not None:
        return getattr(base, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING
