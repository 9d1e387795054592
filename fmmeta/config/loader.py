"""Loading a config: defaults, then a YAML file, then overrides; every problem reported at once.

See the package docstring (:mod:`fmmeta.config`) for the rules every section follows.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from fmmeta.config.errors import ConfigError

__all__ = ["build_config", "load_config", "parse_overrides", "save_resolved", "to_dict"]

T = TypeVar("T")


def parse_overrides(overrides: Sequence[str], problems: list[str]) -> dict[str, Any]:
    """Turns ``["a.b=1", "c=x"]`` into a nested dict; values are parsed with ``yaml.safe_load``.

    Malformed overrides are appended to ``problems`` (not raised) so they are reported together
    with every other problem.
    """
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(
                f"override {item!r} is malformed: write section.key=value "
                "(e.g. train.meta_steps=10 or output_dir=runs/x)"
            )
            continue
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            problems.append(f"override {item!r}: the value is not valid YAML ({err})")
            continue
        parts = key.split(".")
        node = tree
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(
                    f"override {item!r} conflicts with an earlier override that set "
                    f"{'.'.join(parts[: depth + 1])} to a value"
                )
                break
            node = child
        else:
            node[parts[-1]] = value
    return tree


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that records every key written twice in one mapping.

    Why: PyYAML keeps the last of two equal keys without a word, so a file that sets
    ``meta_steps`` twice (or ``sampler:`` twice, dropping the first block) runs with whichever
    came last. ``duplicates`` collects them so they are reported with every other problem.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *anchor" merges a mapping; its keys may be overridden
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                self.duplicates.append(f"key {key!r} on line {line} repeats line {seen[key]}")
            elif isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path, problems: list[str]) -> Any:
    """Parses a YAML file; each key written twice in one mapping becomes a problem."""
    loader = _UniqueKeyLoader(path.read_text(encoding="utf-8"))
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    problems.extend(
        f"config file {str(path)!r}: {dup}: a key may appear once per section; delete one"
        for dup in loader.duplicates
    )
    return data


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``update`` wins; nested mappings merge key by key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


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
    data: dict[str, Any] = {}
    if yaml_path is not None:
        path = Path(yaml_path)
        try:
            loaded = _load_yaml(path, problems)
        except FileNotFoundError:
            problems.append(f"config file {str(path)!r} does not exist: check the --config path")
            loaded = None
        except yaml.YAMLError as err:
            problems.append(f"config file {str(path)!r} is not valid YAML: {err}")
            loaded = None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            problems.append(
                f"config file {str(path)!r} must hold a mapping of sections, got "
                f"{type(loaded).__name__}"
            )
            loaded = {}
        data = loaded
    data = _merge(data, parse_overrides(overrides, problems))
    cfg = _build(schema_cls, data, "", problems, _all_keys(schema_cls))
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, cfg)


def build_config(schema_cls: type[T], data: Mapping[str, Any]) -> T:
    """Builds and validates a config from a plain mapping (e.g. a resolved config read back).

    Raises:
        ConfigError: listing every problem, as :func:`load_config`.
    """
    problems: list[str] = []
    cfg = _build(schema_cls, dict(data), "", problems, _all_keys(schema_cls))
    if problems:
        raise ConfigError(problems)
    return typing.cast(T, cfg)


class _Invalid(Exception):
    """Internal: a value does not match its declared type."""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema (for suggestions across sections)."""
    keys: list[str] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        keys.append(dotted)
        sub = _dataclass_in(hints.get(f.name))
        if sub is not None:
            keys.extend(_all_keys(sub, dotted + "."))
    return keys


def _dataclass_in(tp: Any) -> type | None:
    """The dataclass type in ``tp`` (``X`` or ``X | None``), if any."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if _is_union(tp):
        for arg in typing.get_args(tp):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                return arg
    return None


def _list_item_dataclass(tp: Any) -> type | None:
    """The dataclass ``X`` of a ``list[X]`` field, if any."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return typing.cast(type, args[0])
    return None


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, problems: list[str], all_keys: list[str]) -> Any:
    """Converts ``value`` to ``tp`` or raises :class:`_Invalid` with a message naming the key."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if _is_union(tp):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for arg in options:
            try:
                return _coerce(value, arg, key, problems, all_keys)
            except _Invalid as err:
                if len(options) == 1 and typing.get_origin(arg) is Literal:
                    raise _Invalid(f"{err} (or null)") from None  # names the allowed values
        raise _Invalid(f"{key}={value!r} has the wrong type: expected {_type_name(tp)}")
    if origin is Literal:
        for allowed in args:
            if type(value) is type(allowed) and value == allowed:
                return value
        close = (
            difflib.get_close_matches(value, [a for a in args if isinstance(a, str)], n=1)
            if isinstance(value, str)
            else []
        )
        raise _Invalid(
            f"{key}={value!r} is invalid: allowed values are "
            + ", ".join(repr(a) for a in args)
            + (f"; did you mean {close[0]!r}?" if close else "")
        )
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise _Invalid(
                f"{key}={value!r} has the wrong type: expected a mapping (section {tp.__name__})"
            )
        section = _build(tp, dict(value), key, problems, all_keys)
        if section is None:
            raise _Invalid("")  # its problems are already recorded
        return section
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected bool (true or false)")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected int")
    if tp is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            # PyYAML follows YAML 1.1, where "1e-3" (no dot) is a string: accept it as a float.
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
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected str")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise _Invalid(f"{key}={value!r} has the wrong type: expected a path (str)")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise _Invalid(f"{key}={value!r} has the wrong type: expected a list ({_type_name(tp)})")
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _Invalid(
                    f"{key}={value!r} has the wrong length: expected {len(args)} items "
                    f"({_type_name(tp)})"
                )
            items = [
                _coerce(v, a, f"{key}[{i}]", problems, all_keys)
                for i, (v, a) in enumerate(zip(value, args))
            ]
        else:
            item_tp = args[0] if args else Any
            items = [_coerce(v, item_tp, f"{key}[{i}]", problems, all_keys) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _Invalid(f"{key}={value!r} has the wrong type: expected a mapping")
        ktp, vtp = args if args else (Any, Any)
        return {
            _coerce(k, ktp, f"{key}.<key>", problems, all_keys): _coerce(
                v, vtp, f"{key}.{k}", problems, all_keys
            )
            for k, v in value.items()
        }
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Invalid(f"{key}={value!r} has the wrong type: expected {tp.__name__}")
    return value


def _prefix(path: str, problem: str) -> str:
    """Prepends the section path to a problem that starts with one of its field names."""
    return f"{path}.{problem}" if path else problem


def _default_of(f: dataclasses.Field[Any], base: Any) -> Any:
    """A field's default: from the enclosing default instance if any, else the field's own."""
    if base is not None:
        return getattr(base, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _build(
    cls: type,
    data: dict[str, Any],
    path: str,
    problems: list[str],
    all_keys: list[str],
    base: Any = None,
) -> Any:
    """Builds one section, appending every problem; returns None if it cannot be built.

    ``base`` is the section's default instance (from the parent's ``default_factory``); absent
    keys take its values.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    for key in data:
        if key not in fields:
            dotted = f"{path}.{key}" if path else key
            if not isinstance(key, str):
                problems.append(f"{dotted!s}: keys must be strings")
                continue
            # The same key name in another section is the likeliest intent (model.r -> lora.r).
            elsewhere = [k for k in all_keys if k.rsplit(".", 1)[-1] == key and k != dotted]
            close = difflib.get_close_matches(key, list(fields), n=1)
            if elsewhere:
                suggestion: str | None = elsewhere[0]
            elif close:
                suggestion = f"{path}.{close[0]}" if path else close[0]
            else:
                suggestion = None
            if suggestion is None:
                # Maybe it belongs to another section (train.lr -> outer_optim.lr); never
                # suggest this section itself or one of its parents.
                parents = {".".join(dotted.split(".")[:i]) for i in range(1, dotted.count(".") + 1)}
                candidates = [k for k in all_keys if k not in parents]
                near = difflib.get_close_matches(dotted, candidates, n=1)
                suggestion = near[0] if near else None
            hint = f"; did you mean {suggestion!r}?" if suggestion else ""
            valid = ", ".join(fields)
            problems.append(
                f"unknown key {dotted!r}{hint} (valid keys{' in ' + path if path else ''}: {valid})"
            )
    kwargs: dict[str, Any] = {}
    complete = True
    refused: set[str] = set()
    for name, f in fields.items():
        dotted = f"{path}.{name}" if path else name
        if name in data:
            value = data[name]
            sub = hints[name]
            try:
                if (
                    isinstance(sub, type)
                    and dataclasses.is_dataclass(sub)
                    and isinstance(value, Mapping)
                ):
                    # Keys apply on top of the section's own default, which may differ from its
                    # class defaults (a schema whose model section defaults to tiny=True).
                    sub_base = _default_of(f, base)
                    section = _build(
                        sub, dict(value), dotted, problems, all_keys,
                        sub_base if dataclasses.is_dataclass(sub_base) else None,
                    )
                    if section is None:
                        raise _Invalid("")  # its problems are already recorded
                    kwargs[name] = section
                else:
                    kwargs[name] = _coerce(value, sub, dotted, problems, all_keys)
                continue
            except _Invalid as err:
                refused.add(name)
                if str(err):
                    problems.append(str(err))
        # Absent or invalid: fall back to the default so the rest of this section is still
        # validated (every problem is reported in one go).
        default = _default_of(f, base)
        if default is not dataclasses.MISSING:
            kwargs[name] = default
        else:
            if name not in data:
                problems.append(
                    f"{dotted} is required but missing: set it in the YAML or as {dotted}=VALUE"
                )
            complete = False
    if not complete:
        return None
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        # A problem about a field whose value was already refused is about its fallback
        # default, not about what the user wrote: leave it out.
        problems.extend(
            _prefix(path, p) for p in validate() if p.split("=")[0].split(" ")[0] not in refused
        )
    return obj


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain YAML/JSON-safe data (tuples -> lists, paths -> str)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
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


def save_resolved(cfg: Any, path: str | Path) -> Path:
    """Writes the fully resolved config as YAML (loadable again with :func:`load_config`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)
    return path
