"""Loading a config: defaults, then a YAML file, then overrides; every problem reported at once.

See the package docstring (:mod:`fmmeta.config`) for the rules every section follows. Reading the
user's input is :mod:`fmmeta.config.reading`; questions about the schema's types and defaults are
:mod:`fmmeta.config.schema`; this module checks the input against the schema and builds it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from fmmeta.atomic import replace_text
from fmmeta.config.errors import ConfigError
from fmmeta.config.reading import merge, parse_overrides, read_config_file
from fmmeta.config.schema import all_keys, default_of, hints, is_union, section_keys, type_name

__all__ = ["build_config", "flat_config", "load_config", "parse_overrides", "save_resolved", "to_dict"]

T = TypeVar("T")


def load_config(
    schema_cls: type[T], yaml_path: str | Path | None = None, overrides: Sequence[str] = ()
) -> T:
    """Builds a validated config from schema defaults, a YAML file and CLI overrides.

    Args:
        schema_cls: the top-level keyword-only dataclass.
        yaml_path: a YAML mapping holding only what differs from the defaults; None = defaults.
        overrides: ``section.key=value`` strings (values parsed as YAML, so ``[q_proj,v_proj]``
            is a list and ``null`` is None); a top-level field such as ``output_dir=PATH`` has no
            section. Applied after the YAML file.

    Returns:
        An instance of ``schema_cls``.

    Raises:
        ConfigError: listing every problem: unreadable YAML, malformed overrides, unknown keys
            (with the closest valid key), wrong types, and each section's validation problems.

    Example:
        >>> cfg = load_config(TrainConfig, None, ["keep_last=3"])
        >>> cfg.keep_last
        3
    """
    problems: list[str] = []
    data = read_config_file(Path(yaml_path), problems) if yaml_path is not None else {}
    data = merge(data, parse_overrides(overrides, problems))
    cfg = _build(schema_cls, data, "", problems, all_keys(schema_cls))
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, cfg)


def build_config(schema_cls: type[T], data: Mapping[str, Any]) -> T:
    """Builds and validates a config from a plain mapping (e.g. a resolved config read back).

    Raises:
        ConfigError: listing every problem, as :func:`load_config`.
    """
    problems: list[str] = []
    cfg = _build(schema_cls, dict(data), "", problems, all_keys(schema_cls))
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, cfg)


class _Invalid(Exception):
    """Internal: a value does not match its declared type (the message names the key; empty
    when the problems are already recorded)."""


# --------------------------------------------------------------------------------------------
# Values: one converter per kind of type
# --------------------------------------------------------------------------------------------


def _coerce(value: Any, tp: Any, key: str, problems: list[str], keys: list[str]) -> Any:
    """Converts ``value`` to ``tp`` or raises :class:`_Invalid` with a message naming the key."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if is_union(tp):
        return _coerce_union(value, tp, key, problems, keys)
    if origin is Literal:
        return _coerce_literal(value, typing.get_args(tp), key)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise _Invalid(f"{key}={value!r} has the wrong type: expected a mapping (section {tp.__name__})")
        return _section(tp, value, key, problems, keys, None)
    if tp in _SCALARS:
        return _SCALARS[tp](value, key)
    if origin in (tuple, list):
        return _coerce_sequence(value, tp, key, problems, keys)
    if origin is dict:
        return _coerce_mapping(value, tp, key, problems, keys)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _Invalid(f"{key}={value!r} has the wrong type: expected {tp.__name__}")
    return value


def _coerce_union(value: Any, tp: Any, key: str, problems: list[str], keys: list[str]) -> Any:
    """The first member type ``value`` converts to (``None`` where the union allows it)."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    for arg in options:
        try:
            return _coerce(value, arg, key, problems, keys)
        except _Invalid as err:
            if len(options) == 1 and typing.get_origin(arg) is Literal:
                raise _Invalid(f"{err} (or null)") from None  # names the allowed values
    raise _Invalid(f"{key}={value!r} has the wrong type: expected {type_name(tp)}")


def _coerce_literal(value: Any, allowed: tuple[Any, ...], key: str) -> Any:
    """``value`` if it is one of ``allowed`` (same type too: ``1`` is not ``True``)."""
    for option in allowed:
        if type(value) is type(option) and value == option:
            return value
    strings = [a for a in allowed if isinstance(a, str)]
    close = difflib.get_close_matches(value, strings, n=1) if isinstance(value, str) else []
    raise _Invalid(
        f"{key}={value!r} is invalid: allowed values are "
        + ", ".join(repr(a) for a in allowed)
        + (f"; did you mean {close[0]!r}?" if close else "")
    )


def _coerce_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _Invalid(f"{key}={value!r} has the wrong type: expected bool (true or false)")


def _coerce_int(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _Invalid(f"{key}={value!r} has the wrong type: expected int")


def _coerce_float(value: Any, key: str) -> float:
    """A finite float; ints and YAML 1.1's dotless ``1e-3`` (a string there) are accepted."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise _Invalid(f"{key}={value!r} has the wrong type: expected float")
    if not math.isfinite(number):
        # No setting means "unbounded" by inf, and a nan fails every range check silently
        # (nan > 0 is False, so is nan <= 0): refuse both here, for every float key.
        raise _Invalid(f"{key}={value!r} is invalid: must be a finite number (not inf or nan)")
    return number


def _coerce_str(value: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    raise _Invalid(f"{key}={value!r} has the wrong type: expected str")


def _coerce_path(value: Any, key: str) -> Path:
    if isinstance(value, (str, Path)):
        return Path(value)
    raise _Invalid(f"{key}={value!r} has the wrong type: expected a path (str)")


_SCALARS: dict[Any, Callable[[Any, str], Any]] = {
    bool: _coerce_bool, int: _coerce_int, float: _coerce_float, str: _coerce_str, Path: _coerce_path,
}


def _coerce_sequence(value: Any, tp: Any, key: str, problems: list[str], keys: list[str]) -> Any:
    """A ``list[X]``, ``tuple[X, ...]`` or fixed-length ``tuple[X, Y]``, item by item."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise _Invalid(f"{key}={value!r} has the wrong type: expected a list ({type_name(tp)})")
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise _Invalid(
                f"{key}={value!r} has the wrong length: expected {len(args)} items ({type_name(tp)})"
            )
        item_types = list(args)
    else:
        item_types = [args[0] if args else Any] * len(value)
    items = [_coerce(v, a, f"{key}[{i}]", problems, keys) for i, (v, a) in enumerate(zip(value, item_types))]
    return tuple(items) if origin is tuple else items


def _coerce_mapping(value: Any, tp: Any, key: str, problems: list[str], keys: list[str]) -> dict[Any, Any]:
    """A ``dict[K, V]``, key by key and value by value."""
    if not isinstance(value, Mapping):
        raise _Invalid(f"{key}={value!r} has the wrong type: expected a mapping")
    args = typing.get_args(tp)
    ktp, vtp = args if args else (Any, Any)
    return {
        _coerce(k, ktp, f"{key}.<key>", problems, keys): _coerce(v, vtp, f"{key}.{k}", problems, keys)
        for k, v in value.items()
    }


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def _prefix(path: str, problem: str) -> str:
    """Prepends the section path to a problem that starts with one of its field names."""
    return f"{path}.{problem}" if path else problem


def _unknown_key_problem(key: Any, path: str, fields: Sequence[str], keys: list[str]) -> str:
    """The problem for a key the section does not have, with the likeliest intended key."""
    dotted = f"{path}.{key}" if path else key
    if not isinstance(key, str):
        return f"{dotted!s}: keys must be strings"
    # The same key name in another section is the likeliest intent (model.r -> lora.r).
    elsewhere = [k for k in keys if k.rsplit(".", 1)[-1] == key and k != dotted]
    close = difflib.get_close_matches(key, list(fields), n=1)
    suggestion: str | None = None
    if elsewhere:
        suggestion = elsewhere[0]
    elif close:
        suggestion = f"{path}.{close[0]}" if path else close[0]
    else:
        # Maybe it belongs to another section (train.lr -> outer_optim.lr); never suggest this
        # section itself or one of its parents.
        parents = {".".join(dotted.split(".")[:i]) for i in range(1, dotted.count(".") + 1)}
        near = difflib.get_close_matches(dotted, [k for k in keys if k not in parents], n=1)
        suggestion = near[0] if near else None
    hint = f"; did you mean {suggestion!r}?" if suggestion else ""
    return f"unknown key {dotted!r}{hint} (valid keys{' in ' + path if path else ''}: {', '.join(fields)})"


def _moved_key_problem(key: str, path: str, to: str) -> str:
    """The problem for a key a section's ``MOVED_KEYS`` says has moved: where it lives now."""
    dotted = f"{path}.{key}" if path else key
    return f"{dotted} has moved to {to}: write it there (same value)"


def _section(cls: type, value: Mapping[str, Any], path: str, problems: list[str], keys: list[str],
             base: Any) -> Any:
    """A nested section built from ``value``; :class:`_Invalid` (already recorded) if it cannot be."""
    section = _build(cls, dict(value), path, problems, keys, base)
    if section is None:
        raise _Invalid("")  # its problems are already recorded
    return section


def _field_value(f: dataclasses.Field[Any], tp: Any, value: Any, path: str, problems: list[str],
                 keys: list[str], base: Any) -> Any:
    """The value a user gave for field ``f``, converted; :class:`_Invalid` if it is refused."""
    dotted = f"{path}.{f.name}" if path else f.name
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        # Keys apply on top of the section's own default, which may differ from its class
        # defaults (a schema whose model section defaults to tiny=True).
        sub_base = default_of(f, base)
        return _section(tp, value, dotted, problems, keys,
                        sub_base if dataclasses.is_dataclass(sub_base) else None)
    return _coerce(value, tp, dotted, problems, keys)


def _gather_section_keys(fields: Mapping[str, dataclasses.Field[Any]], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the keys of a gathering field's sections (:func:`section_keys`) moved under that
    field: the YAML writes them flat, beside the section's own keys; which of them apply is the
    section's ``validate()`` to say."""
    for name, f in fields.items():
        known = {k.name for _, section in section_keys(f) for k in dataclasses.fields(section)}
        moved = {k: v for k, v in data.items() if k in known and k not in fields}
        if known:
            given = data.get(name)
            gathered = dict(given) if isinstance(given, Mapping) else {}
            data = {**{k: v for k, v in data.items() if k not in moved}, name: {**gathered, **moved}}
    return data


def _build(cls: type, data: dict[str, Any], path: str, problems: list[str], keys: list[str],
           base: Any = None) -> Any:
    """Builds one section, appending every problem; returns None if it cannot be built.

    ``base`` is the section's default instance (from the parent's ``default_factory``); absent
    keys take its values.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init or f.metadata.get("sections")}
    field_types = hints(cls)
    moved: Mapping[str, str] = getattr(cls, "MOVED_KEYS", {})
    data = _gather_section_keys(fields, data)
    problems.extend(_moved_key_problem(k, path, moved[k]) if k in moved else
                    _unknown_key_problem(k, path, list(fields), keys) for k in data if k not in fields)
    kwargs: dict[str, Any] = {}
    complete = True
    refused: set[str] = set()
    for name, f in fields.items():
        if name in data:
            try:
                kwargs[name] = _field_value(f, field_types[name], data[name], path, problems, keys, base)
                continue
            except _Invalid as err:
                refused.add(name)
                if str(err):
                    problems.append(str(err))
        # Absent or invalid: fall back to the default so the rest of this section is still
        # validated (every problem is reported in one go).
        default = default_of(f, base)
        if default is not dataclasses.MISSING:
            kwargs[name] = default
        else:
            if name not in data:
                dotted = f"{path}.{name}" if path else name
                problems.append(f"{dotted} is required but missing: set it in the YAML or as {dotted}=VALUE")
            complete = False
    if not complete:
        return None
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        # A problem about a field whose value was already refused is about its fallback default,
        # not about what the user wrote: leave it out. Every problem starts with its field's name
        # (the contract of validate(), see the package docstring), so that name tells which.
        problems.extend(
            _prefix(path, p) for p in validate() if p.split("=")[0].split(" ")[0] not in refused
        )
    return obj


# --------------------------------------------------------------------------------------------
# Writing a config back
# --------------------------------------------------------------------------------------------


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain YAML/JSON-safe data (tuples -> lists, paths -> str)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if not section_keys(f)}
            for f in dataclasses.fields(value):  # gathered keys go back beside the others, as written
                out.update(plain(getattr(value, f.name)) if section_keys(f) else {})
            return out
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, Path):
            return str(value)
        return value

    out = plain(cfg)
    if not isinstance(out, dict):
        raise TypeError(f"to_dict expects a dataclass instance, got {type(cfg).__name__}")
    return out


def flat_config(cfg: Any) -> dict[str, Any]:
    """:func:`to_dict` flattened to dotted keys (``{"lora.r": 8, ...}``; lists stay values), for
    comparing two configs key by key."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}{k}.", v)
        else:
            out[prefix[:-1]] = node

    walk("", to_dict(cfg))
    return out


def save_resolved(cfg: Any, path: str | Path) -> Path:
    """Writes the fully resolved config as YAML (loadable again with :func:`load_config`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
